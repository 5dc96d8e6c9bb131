// PyTorch's tensor printing (torch/_tensor_str.py with the default print options) as a pure
// function over a host copy of the values, so that printing a lazyfuse tensor reads exactly like
// printing the same torch.Tensor: users diff the two outputs, and any drift looks like a bug.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lazyfuse/ir/shape.h"

namespace lazyfuse {

// Host copy of a tensor's values, contiguous row-major, as PyTorch's formatter needs them.
struct FormatInput {
  Shape shape;                      // empty = 0-d scalar
  std::vector<double> values;       // used when is_floating or is_bool (bool as 0/1)
  std::vector<int64_t> int_values;  // used for integer dtypes (exact int64)
  bool is_floating = false;         // float32/64/16/bfloat16
  bool is_bool = false;
  std::string dtype_suffix;  // "" when PyTorch does not show dtype, else e.g. "dtype=torch.float64"
  std::string device_suffix;  // "" for cpu, else e.g. "device='cuda:0'"
  // "" unless the tensor requires grad: "grad_fn=<MulBackward0>", or "requires_grad=True" for
  // a leaf.
  std::string grad_suffix;
};

// Returns what `print(t)` prints for the equivalent torch.Tensor, without the trailing newline,
// e.g. "tensor([1., 2., 3.])" or "tensor([1, 2], device='cuda:0', dtype=torch.int32)".
//
// Half-precision values must already be widened to double exactly (PyTorch formats them as
// float32, and every float32 is exact in a double). Suffixes come after the data in the order
// device, size, dtype, grad; "size=(...)" is added here for empty tensors that are not 1-D, as
// PyTorch does, while whether to show the dtype is the caller's call (note that PyTorch shows it
// for an empty tensor of any dtype other than the default float, int64 included). Like PyTorch, a
// suffix that would push the last line past 80 columns goes on its own line.
//
// Bool tensors read `values` (or `int_values` when only that one has numel() entries).
// Throws ShapeError when the value vector the dtype reads does not hold numel(shape) values.
std::string format_tensor(const FormatInput& in);

}  // namespace lazyfuse
