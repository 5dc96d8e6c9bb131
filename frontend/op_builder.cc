// Building pending nodes.
#include "lazyfuse/frontend/op_builder.h"

#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autocast.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/checkpoint.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse::detail {

void rethrow_at(const Loc& where) {
  std::string at = absl::StrCat(" (at ", SourceLoc::from(where).str(), ")");
  try {
    throw;
  } catch (const ShapeError& e) {
    throw ShapeError(e.what() + at);
  } catch (const DTypeError& e) {
    throw DTypeError(e.what() + at);
  } catch (const DeviceIndexError& e) {
    throw DeviceIndexError(e.what() + at);
  } catch (const DeviceStringError& e) {
    throw DeviceStringError(e.what() + at);
  }
}

namespace {

// PyTorch's promotion counts a 0-d operand only where its category is higher than the other
// operands' (promote_operands in ir/dtype.h: float32[3] * float64[] is float32). The IR's rule
// is rank-blind (infer_result_dtype), since passes change ranks: such an operand is cast to the
// result's dtype first, which both rules then agree on. The dtype to cast to, or nothing where
// the rules agree already (every op with a scalar: its constant took its dtype from the tensor).
// On the path of every op: no allocation, one pass over the operands.
std::optional<DType> zero_dim_cast_target(Op op, std::span<const Tensor> operands) {
  const DTypeRule rule = op_dtype_rule(op);
  if (rule != DTypeRule::Promote && rule != DTypeRule::FloatPromote && rule != DTypeRule::Compare &&
      rule != DTypeRule::Where)
    return std::nullopt;
  const size_t first = rule == DTypeRule::Where ? 1 : 0;  // where's condition is not promoted
  std::optional<DType> with_dims, zero_dim;
  for (size_t k = first; k < operands.size(); ++k) {
    const Node& node = operands[k].value()->node;
    std::optional<DType>& group = node.shape.empty() ? zero_dim : with_dims;
    group = group ? promote_types(*group, node.dtype) : node.dtype;
  }
  if (!with_dims || !zero_dim) return std::nullopt;
  const DType both[2] = {*with_dims, *zero_dim};
  const int64_t ranks[2] = {1, 0};
  const DType wanted = promote_operands(both, ranks);
  if (wanted == promote_types(*with_dims, *zero_dim)) return std::nullopt;
  return wanted;
}

}  // namespace

Tensor make_op(Op op, std::span<const Tensor> operands, Attrs attrs, const Loc& where, Shape given,
               DType explicit_dtype, Device device) {
  // Mixed precision: the op's operands as autocast's policy for it asks (frontend/autocast.h).
  absl::InlinedVector<Tensor, 3> autocast_operands;
  if (autocast_active())
    if (const AutocastPolicy policy = autocast_policy(op); policy != AutocastPolicy::Keep) {
      const std::vector<Tensor> cast = autocast(operands, policy);
      autocast_operands.assign(cast.begin(), cast.end());
      operands = autocast_operands;
    }
  absl::InlinedVector<Tensor, 3> cast;
  if (const std::optional<DType> target = zero_dim_cast_target(op, operands)) {
    cast.assign(operands.begin(), operands.end());
    const size_t first = op_dtype_rule(op) == DTypeRule::Where ? 1 : 0;
    for (size_t k = first; k < cast.size(); ++k)
      if (cast[k].dim() == 0 && cast[k].dtype() != *target) cast[k] = cast[k].to(*target, where);
    operands = cast;
  }
  // Ops other than cat have at most three operands: these stay off the heap (the host cost of
  // an op counts when a small expression is evaluated in a loop).
  LazyInputs inputs;
  absl::InlinedVector<DType, 3> dtypes;
  absl::InlinedVector<const Shape*, 3> shapes;
  for (const Tensor& operand : operands) {
    inputs.push_back(operand.value());  // throws for an undefined tensor
    dtypes.push_back(operand.dtype());
    shapes.push_back(&operand.sizes());
  }
  Node node;
  node.op = op;
  node.where = SourceLoc::from(where);
  // A transfer lives on its target; any other op where its first operand is.
  node.device = operands.empty() || op == Op::To ? device : operands.front().device();
  Strides strides;
  try {
    node.dtype = infer_result_dtype(op, dtypes, explicit_dtype);
    node.shape = infer_shape(op, shapes, attrs, given);
    // A reference, not a copy: the first operand's strides are read only by the views.
    static const Strides kNone;
    const Strides& in = inputs.empty() ? kNone : inputs[0]->strides;
    switch (op) {
      case Op::Reshape:
        if (!view_strides(*shapes[0], in, node.shape, &strides))
          throw ShapeError(
              "view size is not compatible with input tensor's size and stride (at least one "
              "dimension spans across two contiguous subspaces). Use .reshape(...) instead.");
        break;
      case Op::Permute: {
        const std::vector<int64_t>& dims = attrs.get_ints("dims");
        for (int64_t d : dims)
          strides.push_back(in[normalize_dim(d, static_cast<int64_t>(in.size()), "permute")]);
        break;
      }
      case Op::Expand:
        strides = broadcast_strides(*shapes[0], in, node.shape);
        break;
      case Op::Narrow:
        strides = in;
        break;
      default:
        strides = contiguous_strides(node.shape);
    }
  } catch (const Error&) {
    rethrow_at(where);
  }
  node.attrs = std::move(attrs);
  LazyRef value = make_pending(std::move(node), std::move(inputs), std::move(strides));
  // A pending graph past a bound is evaluated now (Note [Bounding pending work] in lazy.cc).
  evaluate_if_past_pending_bound(value);
  Tensor result(std::move(value));
  record_gradient(op, result, operands);
  record_on_tape(op, result, operands);
  return result;
}

Tensor constant(const Scalar& value, DType dtype, Shape shape, Device device, const Loc& where) {
  Attrs attrs;
  if (dtype == DType::Bool) {
    attrs.set("value", value.to_double() != 0);
  } else if (is_integral(dtype)) {
    attrs.set("value", value.to_int());
  } else {
    attrs.set("value", value.to_double());
  }
  return make_op(Op::Const, {}, std::move(attrs), where, std::move(shape), dtype, device);
}

Tensor scalar_operand(const Scalar& value, const Tensor& like, const Loc& where) {
  return constant(value, promote_with_scalar(like.dtype(), value.kind()), {}, like.device(), where);
}

}  // namespace lazyfuse::detail
