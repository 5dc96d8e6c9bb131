// The shape rule of every op, written once: the frontend uses it to give a new node its shape,
// the verifier to check a graph. Each throws ShapeError with PyTorch's wording.
#pragma once

#include <span>

#include "lazyfuse/ir/graph.h"

namespace lazyfuse {

// `given` is the node's own shape, needed where the attributes do not determine the result:
// generators, reshape, expand and narrow. For those the rule checks `given` against the operand.
// The operands' shapes come by pointer: the frontend reads them where they are, uncopied.
Shape infer_shape(Op op, std::span<const Shape* const> inputs, const Attrs& attrs,
                  const Shape& given);

// The dims a reduction reduces, normalized and sorted; all dims when the attribute is empty.
std::vector<int64_t> reduction_dims(const Attrs& attrs, int64_t rank);
// Whether sorted reduced `dims` of a rank-`rank` operand are its last ones (each result element
// then reduces a contiguous run of the operand's elements), or its first ones and not all (a
// column reduction: each result element reduces elements one row of kept dims apart).
bool reduces_trailing_dims(const std::vector<int64_t>& dims, int64_t rank);
bool reduces_leading_dims(const std::vector<int64_t>& dims, int64_t rank);

}  // namespace lazyfuse
