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
#include <cstdint>
#include <type_traits>

#include "lazyfuse/codegen/cpu/cpu_math.h"
#include "lazyfuse/codegen/half.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse::cpu_jit_ops {
namespace {

using namespace lazyfuse::cpu_math;

#include "lazyfuse/codegen/cpu/cpu_op_expr.inc"

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

// A row program's reductions (LfJitPhase), as the interpreter's (reduce_run in
// cpu_kernels_impl.inc, reduce_part and finish_row in runtime/cpu/cpu_library.cc) compute them: 16
// accumulators a set, element p of the row into lane p % 16 of set (p / 16) % sets; a sum of
// float32 values through each lane's float32 stretch of 16 values first (kCpuReduceStretch),
// added into the lane at every 256th element and at the row's end (flush); the sets merged in
// order into the first; the lanes combined in a fixed tree; the result combined onto the
// identity and finished.
template <Op op>
struct Combine;
#define LF_REDUCTION(Name, mnemonic, dtype_rule, accumulator_kind, identity_kind, combine,       \
                     finish_kind)                                                                \
  template <>                                                                                    \
  struct Combine<Op::Name> {                                                                     \
    static constexpr bool wide =                                                                 \
        ReductionAccumulator::accumulator_kind == ReductionAccumulator::Wide;                    \
    static constexpr ReductionIdentity identity = ReductionIdentity::identity_kind;              \
    static constexpr bool mean = ReductionFinish::finish_kind == ReductionFinish::DivideByCount; \
    template <typename T>                                                                        \
    static T eval(T x, T y) {                                                                    \
      return static_cast<T>(combine);                                                            \
    }                                                                                            \
  };
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule)
#include "lazyfuse/ir/ops.def"

template <Op op, typename T>
using Accumulator = std::conditional_t<Combine<op>::wide, double, T>;
// kCpuSumsInStretches (codegen/cpu/cpu_reduction.h) for the JIT's types.
template <Op op, typename T>
inline constexpr bool kInStretches = (Combine<op>::wide && std::is_same_v<T, float>);
constexpr int kLanesPerSet = 16;  // kCpuReduceLanes

// A vector of accumulators, one per lane of a vector of T, set to the identity.
// The reduction's identity (the op table's, as reduction_identity_value in cpu_reduction.h
// reads it for the interpreter) as its accumulator.
template <Op op, typename A>
inline __attribute__((always_inline)) A identity_of() {
  if constexpr (Combine<op>::identity == ReductionIdentity::Lowest) return -__builtin_inf();
  if constexpr (Combine<op>::identity == ReductionIdentity::Highest) return __builtin_inf();
  return A(0);
}

template <Op op, typename T>
inline __attribute__((always_inline)) void init_vector(Accumulator<op, T>* __restrict acc,
                                                       T* __restrict stretch) {
  for (int j = 0; j < VectorOf<T>::lanes; ++j) {
    acc[j] = identity_of<op, Accumulator<op, T>>();
    stretch[j] = T(0);
  }
}

// A vector of values combined into a vector of accumulators (or of stretches), lane by lane.
// No pointer aliases another, so that the loop is one vector operation.
template <Op op, typename T>
inline __attribute__((always_inline)) void combine_vector(Accumulator<op, T>* __restrict acc,
                                                          T* __restrict stretch,
                                                          const T* __restrict v) {
  using A = Accumulator<op, T>;
  for (int j = 0; j < VectorOf<T>::lanes; ++j) {
    if constexpr (kInStretches<op, T>)
      stretch[j] = stretch[j] + v[j];
    else
      acc[j] = Combine<op>::eval(acc[j], static_cast<A>(v[j]));
  }
}

// A vector of stretches added into its accumulators and begun anew (CpuReduceState::flush).
template <Op op, typename T>
inline __attribute__((always_inline)) void flush_vector(Accumulator<op, T>* __restrict acc,
                                                        T* __restrict stretch) {
  if constexpr (kInStretches<op, T>) {
    for (int j = 0; j < VectorOf<T>::lanes; ++j) {
      acc[j] = acc[j] + static_cast<double>(stretch[j]);
      stretch[j] = T(0);
    }
  }
}

// Lanes combined pairwise, into[l] with from[l]: apart, so that the loop is vector operations.
template <Op op, typename A, int kLanes>
inline __attribute__((always_inline)) void combine_lanes(A* __restrict into,
                                                         const A* __restrict from) {
  for (int l = 0; l < kLanes; ++l) into[l] = Combine<op>::eval(into[l], from[l]);
}

// The row's value from `sets` sets of 16 accumulators, in every lane of `out`: the sets merged
// in order into the first, then its lanes in the tree of reduce_part (width 8, 4, 2, 1).
template <Op op, typename T>
inline __attribute__((always_inline)) void finish_row(const Accumulator<op, T>* accumulators,
                                                      int sets, double count, T* out) {
  using A = Accumulator<op, T>;
  A acc[4 * kLanesPerSet];
  for (int l = 0; l < sets * kLanesPerSet; ++l) acc[l] = accumulators[l];
  for (int k = 1; k < sets; ++k) combine_lanes<op, A, kLanesPerSet>(acc, acc + k * kLanesPerSet);
  combine_lanes<op, A, 8>(acc, acc + 8);
  combine_lanes<op, A, 4>(acc, acc + 4);
  combine_lanes<op, A, 2>(acc, acc + 2);
  combine_lanes<op, A, 1>(acc, acc + 1);
  A value = Combine<op>::eval(identity_of<op, A>(), acc[0]);
  if constexpr (Combine<op>::mean)
    value = count == 0 ? __builtin_nan("") : value / static_cast<A>(count);
  const T rounded = static_cast<T>(value);
  for (int j = 0; j < VectorOf<T>::lanes; ++j) out[j] = rounded;
}

// Note [Division by a reciprocal]: a / b where b is the same in every lane (a constant, a 0-d
// operand, a row's value: a softmax's sum), from y = 1 / b rounded, which the loop computes once:
//   q0 = a y,  q1 = q0 + (a - b q0) y,  q = q1 + (a - b q1) y,
// each bracket and sum one fma. q1 is within an ulp of a / b, so by Markstein's theorem (y
// within half an ulp of 1 / b and q1 within an ulp of a / b make the remainder a - b q1 exact
// and q + (a - b q) y round to a / b) q is the quotient correctly rounded: IEEE division's bits,
// for about half a vector division's cost (1.65 against 3.0 ns a vector of 16 floats on the
// 2-core Intel machine). (q0 alone can be 1.5 ulps off, when y's error and the product's
// rounding add up, hence the second step.) The theorem needs nothing to overflow or
// underflow, which holds where |a| and |b| lie in [2^-60, 2^61) (float32; [2^-500, 2^501) for
// float64): the quotient, each remainder and y are normal numbers then. A vector with a lane
// outside (a zero, a subnormal, an infinity, a NaN) is divided as it stands, so every lane
// gets a / b either way.

// Whether every lane of `x` lies in the range of Note [Division by a reciprocal], from the
// exponent fields of its lanes.
template <typename V>
inline __attribute__((always_inline)) bool divides_by_reciprocal_exactly(V x) {
  constexpr bool single = sizeof(x.v[0]) == 4;
  using Bits = std::conditional_t<single, int32_t, int64_t>;
  using BitsVector = Bits __attribute__((vector_size(sizeof(x.v))));
  constexpr int mantissa = single ? 23 : 52;
  constexpr Bits bias = single ? 127 : 1023, reach = single ? 60 : 500;
  const BitsVector exponent = (reinterpret_cast<BitsVector>(x.v) >> mantissa) & (2 * bias + 1);
  const BitsVector outside = (exponent < bias - reach) | (exponent > bias + reach);
  Bits any = 0;
  for (size_t j = 0; j < sizeof(x.v) / sizeof(Bits); ++j) any |= outside[j];
  return any == 0;
}
template <typename T>
inline __attribute__((always_inline)) void divide_by_reciprocal(const T* a, const T* b,
                                                                const T* reciprocal, T* out) {
  if constexpr (has_vector_loop<Op::Div, T>()) {
    using V = VectorOf<T>;
    const auto x = V::load(a), divisor = V::load(b), y = V::load(reciprocal);
    if (!divides_by_reciprocal_exactly(x) || !divides_by_reciprocal_exactly(divisor))
      return V::store(out, x / divisor);
    const auto q0 = x * y;
    const auto q1 = lf_fma(lf_fma(-divisor, q0, x), y, q0);
    V::store(out, lf_fma(lf_fma(-divisor, q1, x), y, q1));
  } else {
    __builtin_trap();
  }
}

}  // namespace
}  // namespace lazyfuse::cpu_jit_ops

namespace {
// A vector of half-type bits written past the caches: its 2 * lanes bytes at `out`, aligned to
// as many (a result 64-byte aligned, at a whole vector's element).
inline __attribute__((always_inline)) void stream_half_vector(uint16_t* out, const uint16_t* bits) {
#ifdef __AVX512F__
  _mm256_stream_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_load_si256(reinterpret_cast<const __m256i*>(bits)));
#else
  _mm_stream_si128(reinterpret_cast<__m128i*>(out),
                   _mm_load_si128(reinterpret_cast<const __m128i*>(bits)));
#endif
}
}  // namespace

extern "C" {

// lf_jit_div_by_reciprocal_<f32|f64>(a, b, y, out): a / b for b the same in every lane and y
// its reciprocal (Note [Division by a reciprocal]).
void lf_jit_div_by_reciprocal_f32(const float* a, const float* b, const float* y, float* out) {
  lazyfuse::cpu_jit_ops::divide_by_reciprocal(a, b, y, out);
}
void lf_jit_div_by_reciprocal_f64(const double* a, const double* b, const double* y, double* out) {
  lazyfuse::cpu_jit_ops::divide_by_reciprocal(a, b, y, out);
}

#define LF_ELEMENTWISE(Name, mnemonic, arity, dtype_rule, bool_ok, expression)               \
  void lf_jit_##Name##_f32(const float* a, const float* b, const float* c, float* out) {     \
    lazyfuse::cpu_jit_ops::apply_vector<lazyfuse::Op::Name, float>(a, b, c, out);            \
  }                                                                                          \
  void lf_jit_##Name##_f64(const double* a, const double* b, const double* c, double* out) { \
    lazyfuse::cpu_jit_ops::apply_vector<lazyfuse::Op::Name, double>(a, b, c, out);           \
  }
#include "lazyfuse/ir/ops.def"

// lf_jit_<init|combine|flush|finish>_<Op>_<f32|f64>: a row program's reductions (LfJitPhase).
#define LF_REDUCTION_FUNCTIONS(Name, T, suffix)                                            \
  void lf_jit_init_##Name##_##suffix(void* acc, T* stretch) {                              \
    using namespace lazyfuse;                                                              \
    cpu_jit_ops::init_vector<Op::Name, T>(                                                 \
        static_cast<cpu_jit_ops::Accumulator<Op::Name, T>*>(acc), stretch);                \
  }                                                                                        \
  void lf_jit_combine_##Name##_##suffix(void* acc, T* stretch, const T* v) {               \
    using namespace lazyfuse;                                                              \
    cpu_jit_ops::combine_vector<Op::Name, T>(                                              \
        static_cast<cpu_jit_ops::Accumulator<Op::Name, T>*>(acc), stretch, v);             \
  }                                                                                        \
  void lf_jit_flush_##Name##_##suffix(void* acc, T* stretch) {                             \
    using namespace lazyfuse;                                                              \
    cpu_jit_ops::flush_vector<Op::Name, T>(                                                \
        static_cast<cpu_jit_ops::Accumulator<Op::Name, T>*>(acc), stretch);                \
  }                                                                                        \
  void lf_jit_finish_##Name##_##suffix(const void* acc, int sets, double count, T* out) {  \
    using namespace lazyfuse;                                                              \
    cpu_jit_ops::finish_row<Op::Name, T>(                                                  \
        static_cast<const cpu_jit_ops::Accumulator<Op::Name, T>*>(acc), sets, count, out); \
  }
#define LF_REDUCTION(Name, mnemonic, dtype_rule, accumulator, identity, combine, finish) \
  LF_REDUCTION_FUNCTIONS(Name, float, f32)                                               \
  LF_REDUCTION_FUNCTIONS(Name, double, f64)
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule)
#include "lazyfuse/ir/ops.def"
#undef LF_REDUCTION_FUNCTIONS

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
// A float32 program's vectors kept in memory as bfloat16 or float16 (kLfJitMemoryBFloat16,
// kLfJitMemoryHalf): half.h's conversions lane by lane, as the interpreter's loads and stores
// convert (convert_value), and a register rounded to the half type and back (Kind::Round). No
// pointer aliases another (each instruction has a slot of its own), so that each is one vector
// operation, kept in registers.
#define LF_HALF_MEMORY_FUNCTIONS(suffix, Storage, to_float, from_float, vector_loop)          \
  void lf_jit_load_##suffix(const uint16_t* __restrict in, float* __restrict out) {           \
    for (int j = 0; j < lazyfuse::cpu_math::VectorOf<float>::lanes; ++j)                      \
      out[j] = lazyfuse::to_float(Storage{in[j]});                                            \
  }                                                                                           \
  void lf_jit_load_one_##suffix(const uint16_t* __restrict in, float* __restrict out) {       \
    const float value = lazyfuse::to_float(Storage{in[0]});                                   \
    for (int j = 0; j < lazyfuse::cpu_math::VectorOf<float>::lanes; ++j) out[j] = value;      \
  }                                                                                           \
  void lf_jit_store_##suffix(uint16_t* __restrict out, const float* __restrict value) {       \
    vector_loop for (int j = 0; j < lazyfuse::cpu_math::VectorOf<float>::lanes; ++j) out[j] = \
        lazyfuse::from_float(value[j]).bits;                                                  \
  }                                                                                           \
  void lf_jit_stream_##suffix(uint16_t* __restrict out, const float* __restrict value) {      \
    alignas(32) uint16_t bits[lazyfuse::cpu_math::VectorOf<float>::lanes];                    \
    lf_jit_store_##suffix(bits, value);                                                       \
    stream_half_vector(out, bits);                                                            \
  }                                                                                           \
  void lf_jit_round_##suffix##_f32(const float* __restrict a, const float*, const float*,     \
                                   float* __restrict out) {                                   \
    vector_loop for (int j = 0; j < lazyfuse::cpu_math::VectorOf<float>::lanes; ++j) out[j] = \
        lazyfuse::to_float(lazyfuse::from_float(a[j]));                                       \
  }
// bfloat16's conversions are a few integer operations without a branch: asked to be one vector
// operation each, since with AVX2's eight lanes clang otherwise unrolled them into scalar code,
// slower compiled than interpreted (docs/benchmarks.md, "The CPU JIT"). float16's
// portable conversions branch and stay scalar.
LF_HALF_MEMORY_FUNCTIONS(bf16, lazyfuse::BFloat16, bfloat16_to_float, float_to_bfloat16,
                         _Pragma("clang loop vectorize(enable)"))
LF_HALF_MEMORY_FUNCTIONS(f16, lazyfuse::Half, half_to_float, float_to_half, )
#undef LF_HALF_MEMORY_FUNCTIONS
// A register's vector as it stands (a copy the interpreter makes so that rounding one reader's
// value leaves the others' alone).
void lf_jit_copy_f32(const float* __restrict a, const float*, const float*, float* __restrict out) {
  for (int j = 0; j < lazyfuse::cpu_math::VectorOf<float>::lanes; ++j) out[j] = a[j];
}

// The lanes of a vector of each type, which the JIT's loop steps by.
extern const int lf_jit_lanes_f32 = lazyfuse::cpu_math::VectorOf<float>::lanes;
extern const int lf_jit_lanes_f64 = lazyfuse::cpu_math::VectorOf<double>::lanes;

}  // extern "C"
