// Op, its kind and its dtype rule, generated from the one table in ops.def.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "lazyfuse/ir/dtype.h"

namespace lazyfuse {

// The arity of an op that takes any number of operands, at least one (cat).
inline constexpr int kVariadic = -1;

enum class Op : uint8_t {
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule) Name,
#include "lazyfuse/ir/ops.def"
};

inline constexpr int kNumOps = 0
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule) +1
#include "lazyfuse/ir/ops.def"
    ;

enum class OpKind : uint8_t {
  Source,
  Elementwise,
  Reduction,
  Matmul,
  View,
  Transfer,
  Index,
  Collective,
  Attention
};

// How an op's result dtype follows from its operands.
enum class DTypeRule : uint8_t {
  Explicit,      // given by the node (params, generators, casts)
  Same,          // the operand's dtype
  Promote,       // promote_types over the operands
  FloatPromote,  // promoted, and integers or bool become float32 (true division, exp of ints)
  Compare,       // bool; operands compared in their promoted dtype
  Where,         // operand 0 is a bool condition; the result promotes operands 1 and 2
  SumReduce,     // integers and bool sum to int64
  MeanReduce,    // floating only
  SameOperands,  // both operands must have one dtype (matmul)
  IndexOperand,  // operand 0's dtype; operand 1 is an int64 index; any other has operand 0's
  // q, k, v (operands 0-2) of one floating dtype, the rest bool or of that dtype: that dtype
  // (Attention) or its compute dtype (AttentionStatistic: a statistic of float32 sums).
  Attention,
  AttentionStatistic,
};

const char* op_name(Op op);
std::optional<Op> op_from_name(std::string_view name);
OpKind op_kind(Op op);
// The number of operands, or kVariadic.
int op_arity(Op op);
DTypeRule op_dtype_rule(Op op);
// Whether an elementwise op accepts bool operands.
bool op_accepts_bool(Op op);

inline bool is_elementwise(Op op) { return op_kind(op) == OpKind::Elementwise; }
inline bool is_reduction(Op op) { return op_kind(op) == OpKind::Reduction; }
inline bool is_view(Op op) { return op_kind(op) == OpKind::View; }
inline bool is_index(Op op) { return op_kind(op) == OpKind::Index; }
inline bool is_collective(Op op) { return op_kind(op) == OpKind::Collective; }
inline bool is_attention(Op op) { return op_kind(op) == OpKind::Attention; }
inline bool is_attention_gradient(Op op) {
  return op == Op::AttentionGradQ || op == Op::AttentionGradK || op == Op::AttentionGradV;
}

// How a collective combines the processes' values (its `reduce_op` attribute), as
// c10d::ReduceOp: AVG is the sum divided by the process count (floating dtypes only).
enum class ReduceOp : int64_t { SUM = 0, AVG = 1, MAX = 2, MIN = 3 };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"
// Generators compute each element from its index alone: fusable like elementwise ops.
inline bool is_generator(Op op) {
  return op == Op::Const || op == Op::Arange || op == Op::Rand || op == Op::Randn;
}
// What the fusion pass may put in one elementwise kernel.
inline bool is_fusable_elementwise(Op op) { return is_elementwise(op) || is_generator(op); }

// What a reduction means, from ops.def's LF_REDUCTION columns: every backend reads it here.
enum class ReductionAccumulator : uint8_t {
  Wide,     // float64 for floating operands, int64 for integers and bool
  Compute,  // the operand's compute dtype (bool counts as int64)
};
enum class ReductionIdentity : uint8_t {
  Zero,
  Lowest,   // -infinity, or the accumulator type's minimum
  Highest,  // +infinity, or the accumulator type's maximum
};
enum class ReductionFinish : uint8_t { None, DivideByCount };
struct ReductionMeaning {
  ReductionAccumulator accumulator;
  ReductionIdentity identity;
  const char* combine;  // an expression over accumulators x and y (ops.def)
  ReductionFinish finish;
};
// Throws VerifierError for an op that is not a reduction.
const ReductionMeaning& reduction_meaning(Op op);
// The dtype a reduction `op` of an operand of dtype `in` accumulates in.
DType reduction_accumulator(Op op, DType in);
// Whether the order of a reduction's combinations can change its result's bits: a floating sum
// or mean accumulating in `acc` that is its operand's own dtype. A wider accumulator rounds the
// differences of order away; a max, a min and an integer sum have none.
bool reduction_order_shows(Op op, DType operand, DType acc);

// The dtype an op's inputs are converted to before it computes (the promoted dtype, in its
// compute form: half types compute in float32).
DType op_input_compute_dtype(Op op, std::span<const DType> inputs, DType result);

// The result dtype by the op's rule; throws DTypeError naming the op when the operands are not
// accepted. `explicit_dtype` is used for DTypeRule::Explicit. Operands promote by
// promote_types whatever their ranks: the frontend casts a 0-d operand that PyTorch's rule
// (promote_operands) would not let raise the result to the result's dtype first, so that the
// IR's dtypes never depend on ranks, which passes change (a view moved past an op).
DType infer_result_dtype(Op op, std::span<const DType> inputs, DType explicit_dtype);

}  // namespace lazyfuse
