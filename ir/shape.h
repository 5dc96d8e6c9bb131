// Shapes, strides and PyTorch's broadcasting.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace lazyfuse {

// Sizes and strides live inline up to rank 6: every lazy value, buffer and graph node carries
// both, and a heap allocation for each was most of an evaluation's host cost after the launch.
inline constexpr size_t kInlineRank = 6;
using Shape = absl::InlinedVector<int64_t, kInlineRank>;
using Strides = absl::InlinedVector<int64_t, kInlineRank>;

int64_t numel(const Shape& shape);
// The element count, or -1 when a size is negative or the sizes (zeros counted as one, as
// contiguous strides count them) multiply past int64: what must be ruled out before numel()
// or contiguous_strides() is called on a shape from outside.
int64_t checked_numel(const Shape& shape);
// " (zeros counted as one, as strides count them)" when `shape` has a zero size, else "": what
// a message about checked_numel's -1 adds for a shape with no elements.
std::string zeros_as_ones(const Shape& shape);
Strides contiguous_strides(const Shape& shape);
// "[2, 3]" as PyTorch prints sizes in messages.
std::string shape_str(const Shape& shape);

// The broadcast of two shapes, or nullopt-like failure: returns false when they do not
// broadcast (the caller raises ShapeError with its own context).
bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out);

// Strides that read a tensor of shape `from` (with `strides`) as the broadcast shape `to`:
// size-1 and missing leading dims get stride 0.
Strides broadcast_strides(const Shape& from, const Strides& strides, const Shape& to);

// PyTorch's view rule (computeStride): the strides of `new_shape` viewing a tensor of `old_shape`
// and `old_strides` without a copy; returns false when no such strides exist.
bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape,
                  Strides* out);

// A negative dim counts from the end; throws ShapeError naming `what` when out of range.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* what);

}  // namespace lazyfuse

namespace absl {
// Sizes print as PyTorch prints a shape: torch.Size([2, 3]). Shape is abseil's InlinedVector, so
// argument-dependent lookup finds the operator only here, in its namespace: declared in lazyfuse,
// `std::cout << t.sizes()` would not compile outside it. (Strides, the same type, print the same.)
std::ostream& operator<<(std::ostream& os,
                         const InlinedVector<int64_t, lazyfuse::kInlineRank>& shape);
}  // namespace absl
