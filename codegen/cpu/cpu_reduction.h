// A reduction's meaning on the CPU, instantiated from the op table (ir/ops.def's LF_REDUCTION
// columns): its accumulator type, identity and combining expression, per op at compile time so
// that the inner loops inline them.
#pragma once

#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_math.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse {

template <Op kOp>
struct CpuReduction;

#define LF_REDUCTION(Name, mnemonic, dtype_rule, accumulator_kind, identity_kind, combine_expr, \
                     finish_kind)                                                               \
  template <>                                                                                   \
  struct CpuReduction<Op::Name> {                                                               \
    static constexpr ReductionAccumulator accumulator = ReductionAccumulator::accumulator_kind; \
    static constexpr ReductionIdentity identity = ReductionIdentity::identity_kind;             \
    static constexpr ReductionFinish finish = ReductionFinish::finish_kind;                     \
    template <typename T>                                                                       \
    static T combine(T x, T y) {                                                                \
      using namespace cpu_math;                                                                 \
      return static_cast<T>(combine_expr);                                                      \
    }                                                                                           \
  };
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule)
#include "lazyfuse/ir/ops.def"

// The accumulator type of reduction kOp over storage type S: reduction_accumulator() (ir/op.h)
// at compile time.
template <Op kOp, typename S>
using CpuAccumulator = std::conditional_t<
    CpuReduction<kOp>::accumulator == ReductionAccumulator::Wide || std::is_same_v<S, bool>,
    std::conditional_t<std::is_floating_point_v<ComputeOf<S>>, double, int64_t>, ComputeOf<S>>;

// Whether reduction kOp over storage type S sums in float32 stretches before its float64
// lanes (kCpuReduceStretch in codegen/cpu/cpu_kernels.h): a wide sum of float32 values. Half types
// keep float64 throughout, so that under LAZYFUSE_HALF_ROUNDING=each_op a sum rounds to the
// same half value whichever order a device adds in (docs/design.md, Note [Half types]).
template <Op kOp, typename S>
inline constexpr bool kCpuSumsInStretches =
    CpuReduction<kOp>::accumulator == ReductionAccumulator::Wide&& std::is_same_v<S, float>;

template <typename Acc>
Acc reduction_identity_value(ReductionIdentity identity) {
  constexpr bool floating = std::is_floating_point_v<Acc>;
  switch (identity) {
    case ReductionIdentity::Zero:
      return Acc(0);
    case ReductionIdentity::Lowest:
      if constexpr (floating) return -std::numeric_limits<Acc>::infinity();
      return std::numeric_limits<Acc>::lowest();
    case ReductionIdentity::Highest:
      if constexpr (floating) return std::numeric_limits<Acc>::infinity();
      return std::numeric_limits<Acc>::max();
  }
  return Acc(0);
}

// Calls f.template operator()<kOp>() with kOp the reduction `op`.
template <typename F>
decltype(auto) dispatch_reduction(Op op, F&& f) {
  switch (op) {
#define LF_REDUCTION(Name, mnemonic, dtype_rule, accumulator, identity, combine, finish) \
  case Op::Name:                                                                         \
    return f.template operator()<Op::Name>();
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule)
#include "lazyfuse/ir/ops.def"
    default:
      break;
  }
  throw VerifierError(absl::StrCat(op_name(op), " is not a reduction"));
}

}  // namespace lazyfuse
