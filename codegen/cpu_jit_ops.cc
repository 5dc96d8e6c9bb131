// The CPU JIT's op functions: each elementwise op applied to one vector, from the same
// expressions and vector math as the interpreter's kernels (cpu_op_expr.inc, cpu_math.h). Not
// part of any library: clang compiles this file to LLVM bitcode once per instruction set, and
// the JIT (cpu_jit.cc) links that bitcode into each program it compiles and inlines these
// functions into the program's loop, so a fused chain's values stay in vector registers while
// every op computes what its interpreter kernel does, bit for bit.
//
// lf_jit_<Op>_<f32|f64>(a, b, c, out): one vector from each operand in, one vector out. Defined
// for every op; one without a vector form (has_vector_loop false) traps, and the JIT never
// calls it (it asks the kernel table, whose stream kernels exist exactly for these).
#include <type_traits>

#include "lazyfuse/codegen/cpu_math.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse::cpu_jit_ops {
namespace {

using namespace lazyfuse::cpu_math;

#include "lazyfuse/codegen/cpu_op_expr.inc"

template <Op op, typename T>
inline __attribute__((always_inline)) void apply_vector(const T* a, const T* b, const T* c,
                                                        T* out) {
  if constexpr (has_vector_loop<op, T>()) {
    using V = VectorOf<T>;
    V::store(out, Expr<op>::eval(V::load(a), V::load(b), V::load(c)));
  } else {
    __builtin_trap();
  }
}

}  // namespace
}  // namespace lazyfuse::cpu_jit_ops

extern "C" {

#define LF_ELEMENTWISE(Name, mnemonic, arity, dtype_rule, bool_ok, expression)               \
  void lf_jit_##Name##_f32(const float* a, const float* b, const float* c, float* out) {     \
    lazyfuse::cpu_jit_ops::apply_vector<lazyfuse::Op::Name, float>(a, b, c, out);            \
  }                                                                                          \
  void lf_jit_##Name##_f64(const double* a, const double* b, const double* c, double* out) { \
    lazyfuse::cpu_jit_ops::apply_vector<lazyfuse::Op::Name, double>(a, b, c, out);           \
  }
#include "lazyfuse/ir/ops.def"

// A vector written past the caches (a result larger than they are: CpuResult::stream), to a
// 64-byte aligned address.
void lf_jit_stream_f32(float* out, const float* value) {
  using V = lazyfuse::cpu_math::VectorOf<float>;
  V::stream(out, V::load(value));
}
void lf_jit_stream_f64(double* out, const double* value) {
  using V = lazyfuse::cpu_math::VectorOf<double>;
  V::stream(out, V::load(value));
}
// The lanes of a vector of each type, which the JIT's loop steps by.
extern const int lf_jit_lanes_f32 = lazyfuse::cpu_math::VectorOf<float>::lanes;
extern const int lf_jit_lanes_f64 = lazyfuse::cpu_math::VectorOf<double>::lanes;

}  // extern "C"
