// The op table's ir/ columns, and the dtype rules.
#include "lazyfuse/ir/op.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

struct OpInfo {
  const char* name;
  OpKind kind;
  int arity;
  DTypeRule rule;
  bool accepts_bool;
};

constexpr std::array<OpInfo, kNumOps> kOpInfo = {{
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule) \
  {mnemonic, OpKind::kind, arity, DTypeRule::dtype_rule, true},
#define LF_ELEMENTWISE(Name, mnemonic, arity, dtype_rule, bool_ok, expression) \
  {mnemonic, OpKind::Elementwise, arity, DTypeRule::dtype_rule, bool_ok},
#include "lazyfuse/ir/ops.def"
}};

const OpInfo& info(Op op) { return kOpInfo[static_cast<int>(op)]; }

struct ReductionEntry {
  Op op;
  ReductionMeaning meaning;
};
constexpr ReductionEntry kReductions[] = {
#define LF_REDUCTION(Name, mnemonic, dtype_rule, accumulator, identity, combine, finish) \
  {Op::Name,                                                                             \
   {ReductionAccumulator::accumulator, ReductionIdentity::identity, #combine,            \
    ReductionFinish::finish}},
#include "lazyfuse/ir/ops.def"
};

}  // namespace

const ReductionMeaning& reduction_meaning(Op op) {
  for (const ReductionEntry& entry : kReductions)
    if (entry.op == op) return entry.meaning;
  throw VerifierError(absl::StrCat(op_name(op), " is not a reduction"));
}

DType reduction_accumulator(Op op, DType in) {
  if (reduction_meaning(op).accumulator == ReductionAccumulator::Wide || in == DType::Bool)
    return is_floating(in) ? DType::Float64 : DType::Int64;
  return compute_dtype(in);
}

bool reduction_order_shows(Op op, DType operand, DType acc) {
  return is_floating(acc) && acc == operand &&
         reduction_meaning(op).identity == ReductionIdentity::Zero;
}

const char* op_name(Op op) { return info(op).name; }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return "sum";
    case ReduceOp::AVG:
      return "avg";
    case ReduceOp::MAX:
      return "max";
    case ReduceOp::MIN:
      return "min";
  }
  return "?";
}
OpKind op_kind(Op op) { return info(op).kind; }
int op_arity(Op op) { return info(op).arity; }
DTypeRule op_dtype_rule(Op op) { return info(op).rule; }
bool op_accepts_bool(Op op) { return info(op).accepts_bool; }

std::optional<Op> op_from_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i) {
    if (std::string_view(kOpInfo[i].name) == name) return static_cast<Op>(i);
  }
  return std::nullopt;
}

DType infer_result_dtype(Op op, std::span<const DType> inputs, DType explicit_dtype) {
  auto reject = [&](std::string_view why) {
    std::string types;
    for (DType d : inputs)
      absl::StrAppend(&types, types.empty() ? "" : ", ", std::string(dtype_torch_name(d)));
    return DTypeError(
        absl::StrCat(std::string(op_name(op)), ": ", std::string(why), " (operands: ", types, ")"));
  };
  if (!op_accepts_bool(op)) {
    for (DType d : inputs) {
      if (d == DType::Bool) throw reject("not supported for bool tensors");
    }
  }
  DType promoted = inputs.empty() ? explicit_dtype : inputs[0];
  for (size_t i = 1; i < inputs.size(); ++i) promoted = promote_types(promoted, inputs[i]);
  switch (op_dtype_rule(op)) {
    case DTypeRule::Explicit:
      return explicit_dtype;
    case DTypeRule::Same:
      return inputs[0];
    case DTypeRule::Promote:
      return promoted;
    case DTypeRule::FloatPromote:
      return is_floating(promoted) ? promoted : DType::Float32;
    case DTypeRule::Compare:
      return DType::Bool;
    case DTypeRule::Where:
      if (inputs[0] != DType::Bool) throw reject("the condition must be a bool tensor");
      return promote_types(inputs[1], inputs[2]);
    case DTypeRule::SumReduce:
      return is_floating(inputs[0]) ? inputs[0] : DType::Int64;
    case DTypeRule::MeanReduce:
      if (!is_floating(inputs[0]))
        throw reject(
            "could not infer output dtype. Input dtype must be either a floating point or "
            "complex dtype");
      return inputs[0];
    case DTypeRule::SameOperands:
      if (inputs[0] != inputs[1]) throw reject("expected both operands to have the same dtype");
      if (inputs[0] == DType::Bool) throw reject("not supported for bool tensors");
      return inputs[0];
    case DTypeRule::IndexOperand:
      // PyTorch's messages: gather(): Expected dtype int64 for index; scatter_add(): Expected
      // self.dtype to be equal to src.dtype.
      if (inputs[1] != DType::Int64) throw reject("expected dtype int64 for index");
      for (size_t i = 2; i < inputs.size(); ++i)
        if (inputs[i] != inputs[0]) throw reject("expected self.dtype to be equal to src.dtype");
      return inputs[0];
    case DTypeRule::Attention:
    case DTypeRule::AttentionStatistic:
      if (inputs.size() < 3 || inputs[1] != inputs[0] || inputs[2] != inputs[0] ||
          !is_floating(inputs[0]))
        throw reject("query, key and value must have one floating dtype");
      for (size_t i = 3; i < inputs.size(); ++i) {
        // A gradient's operand 5 is the forward's logsumexp, in the compute dtype.
        const bool lse = i == 5 && is_attention_gradient(op);
        if (lse ? inputs[i] != compute_dtype(inputs[0])
                : inputs[i] != inputs[0] && inputs[i] != DType::Bool)
          throw reject("a mask must be bool, a bias of the query's dtype");
      }
      return op_dtype_rule(op) == DTypeRule::Attention ? inputs[0] : compute_dtype(inputs[0]);
  }
  return promoted;
}

DType op_input_compute_dtype(Op op, std::span<const DType> inputs, DType result) {
  switch (op_dtype_rule(op)) {
    case DTypeRule::Compare: {
      DType promoted = inputs[0];
      for (size_t i = 1; i < inputs.size(); ++i) promoted = promote_types(promoted, inputs[i]);
      return compute_dtype(promoted);
    }
    case DTypeRule::Explicit:
      // A cast reads its operand as it is; the conversion happens when its value is stored.
      return inputs.empty() ? compute_dtype(result) : compute_dtype(inputs[0]);
    default:
      return compute_dtype(result);
  }
}

}  // namespace lazyfuse
