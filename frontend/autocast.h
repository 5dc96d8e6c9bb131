// Mixed precision as torch.autocast: a rewrite of the graph as it is built, not of the model's
// code. Within an AutocastGuard for a device type, each op on tensors of that type takes its
// floating operands as its policy says (torch.autocast's CUDA lists, on both device types):
//  - Lower: products and attention (matmul, linear, scaled_dot_product_attention) in the
//    guard's dtype, the tensor cores' type;
//  - Float32: what needs float32's range or precision: exp, log, log1p, expm1, pow, rsqrt, sum,
//    softmax, log_softmax, logsumexp, layer_norm, rms_norm, normalize and the losses;
//  - everything else as its operands are, promoted as usual (a bfloat16 activation plus a
//    float32 residual is float32).
// float64 operands keep their dtype, as PyTorch's. The casts are nodes of the graph: parameters
// stay float32, each use reads a cast, and gradients flow back through the casts to float32.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse {

class AutocastGuard {
 public:
  // Mixed precision for ops on `device_type`'s tensors in `dtype` (float16 or bfloat16, else a
  // DTypeError; PyTorch's defaults: float16 on CUDA, bfloat16 on the CPU), or, with enabled
  // false, none: a guard inside another turns it off. The previous state comes back when the
  // guard goes.
  explicit AutocastGuard(DeviceType device_type, std::optional<DType> dtype = std::nullopt,
                         bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool was_enabled_;
  DType was_dtype_;
};

// Whether autocast is on for `device_type` on this thread, and its dtype.
bool is_autocast_enabled(DeviceType device_type);
DType get_autocast_dtype(DeviceType device_type);

namespace detail {

enum class AutocastPolicy { Keep, Lower, Float32 };
// An IR op's policy (Matmul and Attention lower, Exp, Log, Log1p, Expm1, Pow, Rsqrt and Sum
// float32).
AutocastPolicy autocast_policy(Op op);
// Whether any autocast is on on this thread: the one test on the path of every op.
bool autocast_active();
// `operands` cast as `policy` asks where autocast is on for their device type (the first
// floating operand's), unchanged otherwise.
std::vector<Tensor> autocast(std::span<const Tensor> operands, AutocastPolicy policy);
inline Tensor autocast(const Tensor& operand, AutocastPolicy policy) {
  return autocast_active() ? autocast(std::span<const Tensor>(&operand, 1), policy)[0] : operand;
}
// The composite ops' entries (functional.cc): their floating operands in float32, or in the
// lower dtype (an undefined tensor, an absent weight or bias, stays undefined).
inline Tensor autocast_float32(const Tensor& operand) {
  return autocast(operand, AutocastPolicy::Float32);
}
inline Tensor autocast_lower(const Tensor& operand) {
  return autocast(operand, AutocastPolicy::Lower);
}

}  // namespace detail
}  // namespace lazyfuse
