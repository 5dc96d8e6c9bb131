// The iteration space shared by every backend: merging dims, classifying operand access.
#include "codegen/kernel_plan.h"

#include <algorithm>

namespace lazyfuse {

IterationSpace merge_dims(const Shape& space, std::span<const Shape> shapes,
                          std::span<const Strides> strides) {
  IterationSpace merged;
  merged.numel = numel(space);
  const size_t operands = shapes.size();
  std::vector<Strides> full;
  full.reserve(operands);
  for (size_t k = 0; k < operands; ++k)
    full.push_back(broadcast_strides(shapes[k], strides[k], space));
  merged.strides.resize(operands);
  for (size_t d = 0; d < space.size(); ++d) {
    const int64_t size = space[d];
    if (size == 1) continue;
    // A dim continues the one before it when every operand steps from the last element of one
    // row of it to the first of the next by the same stride.
    bool merge = !merged.sizes.empty();
    for (size_t k = 0; merge && k < operands; ++k)
      merge = merged.strides[k].back() == full[k][d] * size;
    if (merge) {
      merged.sizes.back() *= size;
      for (size_t k = 0; k < operands; ++k) merged.strides[k].back() = full[k][d];
    } else {
      merged.sizes.push_back(size);
      for (size_t k = 0; k < operands; ++k) merged.strides[k].push_back(full[k][d]);
    }
  }
  if (merged.sizes.empty()) {
    merged.sizes.push_back(1);
    for (Strides& s : merged.strides) s.push_back(0);
  }
  return merged;
}

OperandAccess classify_access(const Shape& sizes, const Strides& strides, int64_t* period) {
  const Strides dense = contiguous_strides(sizes);
  const size_t leading_zeros =
      std::find_if(strides.begin(), strides.end(), [](int64_t x) { return x != 0; }) -
      strides.begin();
  if (leading_zeros == strides.size()) return OperandAccess::Broadcast;
  if (!std::equal(strides.begin() + leading_zeros, strides.end(), dense.begin() + leading_zeros))
    return OperandAccess::Strided;
  if (leading_zeros == 0) return OperandAccess::Contiguous;
  *period = dense[leading_zeros] * sizes[leading_zeros];
  return OperandAccess::Repeated;
}

}  // namespace lazyfuse
