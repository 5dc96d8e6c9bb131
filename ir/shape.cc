// Shapes, strides, broadcasting and the view rule.
#include "lazyfuse/ir/shape.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t checked_numel(const Shape& shape) {
  // The sizes with each zero counted as one are what contiguous strides multiply: a shape with
  // no elements still needs strides that an int64 holds.
  int64_t span = 1;
  bool empty = false;
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(span, std::max<int64_t>(s, 1), &span)) return -1;
    empty = empty || s == 0;
  }
  return empty ? 0 : span;
}

std::string zeros_as_ones(const Shape& shape) {
  return std::find(shape.begin(), shape.end(), 0) != shape.end()
             ? " (zeros counted as one, as strides count them)"
             : "";
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out) {
  size_t rank = std::max(a.size(), b.size());
  Shape result(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    result[i] = da == 1 ? db : da;
  }
  *out = std::move(result);
  return true;
}

Strides broadcast_strides(const Shape& from, const Strides& strides, const Shape& to) {
  Strides result(to.size(), 0);
  size_t offset = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    result[offset + i] = from[i] == 1 && to[offset + i] != 1 ? 0 : strides[i];
  }
  return result;
}

bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape,
                  Strides* out) {
  Strides result(new_shape.size());
  // No elements, or one element with no dims (a 0-d tensor viewed as [1, 1]): any strides do.
  if (numel(old_shape) == 0 || old_shape.empty()) {
    *out = contiguous_strides(new_shape);
    return true;
  }
  // Walk chunks of old dims that are contiguous among themselves and match them with runs of
  // new dims of the same element count (PyTorch's computeStride).
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        result[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return false;
  *out = std::move(result);
  return true;
}

int64_t normalize_dim(int64_t dim, int64_t rank, const char* what) {
  int64_t bound = std::max<int64_t>(rank, 1);
  if (dim < -bound || dim >= bound)
    throw ShapeError(absl::StrCat(what, ": Dimension out of range (expected to be in range of [",
                                  -bound, ", ", bound - 1, "], but got ", dim, ")"));
  return dim < 0 ? dim + bound : dim;
}

}  // namespace lazyfuse

namespace absl {
std::ostream& operator<<(std::ostream& os,
                         const InlinedVector<int64_t, lazyfuse::kInlineRank>& shape) {
  return os << "torch.Size(" << lazyfuse::shape_str(shape) << ")";
}
}  // namespace absl
