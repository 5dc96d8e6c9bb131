// torch.autocast's policies applied as ops are built (frontend/autocast.h).
#include "lazyfuse/frontend/autocast.h"

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

// Each device type's state on this thread.
struct AutocastState {
  bool enabled[2] = {false, false};
  DType dtype[2] = {kBFloat16, kBFloat16};
};
thread_local AutocastState state;

int slot(DeviceType type) { return type == DeviceType::CPU ? 0 : 1; }

}  // namespace

AutocastGuard::AutocastGuard(DeviceType device_type, std::optional<DType> dtype, bool enabled)
    : device_type_(device_type),
      was_enabled_(state.enabled[slot(device_type)]),
      was_dtype_(state.dtype[slot(device_type)]) {
  const DType type = dtype.value_or(device_type == DeviceType::CUDA ? kFloat16 : kBFloat16);
  if (enabled && type != kBFloat16 && type != kFloat16)
    throw DTypeError(absl::StrCat("AutocastGuard: autocast takes float16 or bfloat16, not ",
                                  dtype_torch_name(type)));
  state.enabled[slot(device_type)] = enabled;
  if (enabled) state.dtype[slot(device_type)] = type;
}

AutocastGuard::~AutocastGuard() {
  state.enabled[slot(device_type_)] = was_enabled_;
  state.dtype[slot(device_type_)] = was_dtype_;
}

bool is_autocast_enabled(DeviceType device_type) { return state.enabled[slot(device_type)]; }
DType get_autocast_dtype(DeviceType device_type) { return state.dtype[slot(device_type)]; }

namespace detail {

AutocastPolicy autocast_policy(Op op) {
  switch (op) {
    case Op::Matmul:
    case Op::Attention:
      return AutocastPolicy::Lower;
    case Op::Exp:
    case Op::Log:
    case Op::Log1p:
    case Op::Expm1:
    case Op::Pow:
    case Op::Rsqrt:
    case Op::Sum:
      return AutocastPolicy::Float32;
    default:
      return AutocastPolicy::Keep;
  }
}

bool autocast_active() { return state.enabled[0] || state.enabled[1]; }

std::vector<Tensor> autocast(std::span<const Tensor> operands, AutocastPolicy policy) {
  std::vector<Tensor> cast(operands.begin(), operands.end());
  if (policy == AutocastPolicy::Keep || !autocast_active()) return cast;
  // The device type of the first floating operand decides, as PyTorch's dispatch key does.
  const Tensor* first = nullptr;
  for (const Tensor& t : cast)
    if (t.defined() && is_floating(t.dtype())) {
      first = &t;
      break;
    }
  if (first == nullptr) return cast;
  const DeviceType type = first->device().type();
  if (!is_autocast_enabled(type)) return cast;
  const DType target = policy == AutocastPolicy::Lower ? get_autocast_dtype(type) : kFloat32;
  for (Tensor& t : cast)
    // float64 stays float64, as PyTorch's autocast leaves it.
    if (t.defined() && is_floating(t.dtype()) && t.dtype() != kFloat64 && t.dtype() != target &&
        t.device().type() == type)
      t = t.to(target);
  return cast;
}

}  // namespace detail
}  // namespace lazyfuse
