// The lf_* functions that op expressions in ir/ops.def call, for the CPU: on scalars of every
// compute dtype, and, where the translation unit is compiled for AVX2, on 8 floats or 4
// doubles at once, or for AVX-512, on 16 floats or 8 doubles, through SLEEF (accuracy 1.0 ULP,
// the u10 variants). Everything here lies in a namespace of the instruction set the including
// file is compiled for: the same inline function compiled for two of them must not be merged
// into one by the linker, or code for AVX-512 could run on a CPU without it.
//
// Note [NaN in comparisons]: maximum, minimum, clamp and relu propagate NaN as PyTorch does;
// the scalar and vector forms agree on it.
//
// Note [Lane-independent math]: a vector function must give each lane the result it would give
// that element alone, or a value would depend on its neighbours, and so on how a kernel's
// elements fall into vectors (a fused reduction's rows, a tail's padding): fused and unfused
// results would differ. SLEEF's sin and cos choose their argument reduction for all lanes at
// once (the fast one only when every lane is small), which breaks this, so they are left out:
// sin and cos run per element. `lazyfuse fuzz` found it; exp, log, tanh, pow and sqrt hold.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#ifdef __AVX2__
#include <immintrin.h>
#include <sleef.h>
#endif

#if defined(__AVX512F__)
#define LF_CPU_MATH_ISA avx512
#elif defined(__AVX2__)
#define LF_CPU_MATH_ISA avx2
#else
#define LF_CPU_MATH_ISA baseline
#endif

namespace lazyfuse::cpu_math {
inline namespace LF_CPU_MATH_ISA {

template <typename T>
concept Floating = std::floating_point<T>;
template <typename T>
concept Arithmetic = std::is_arithmetic_v<T>;
template <typename T>
concept Integer = std::integral<T> && !std::same_as<T, bool>;

template <Floating T>
inline T lf_abs(T a) {
  return std::fabs(a);
}
template <Integer T>
inline T lf_abs(T a) {
  return a < 0 ? static_cast<T>(-a) : a;
}
template <Floating T>
inline T lf_exp(T a) {
  return std::exp(a);
}
template <Floating T>
inline T lf_log(T a) {
  return std::log(a);
}
template <Floating T>
inline T lf_log1p(T a) {
  return std::log1p(a);
}
template <Floating T>
inline T lf_expm1(T a) {
  return std::expm1(a);
}
template <Floating T>
inline T lf_erf(T a) {
  return std::erf(a);
}
template <Floating T>
inline T lf_sqrt(T a) {
  return std::sqrt(a);
}
template <Floating T>
inline T lf_rsqrt(T a) {
  return T(1) / std::sqrt(a);
}
template <Floating T>
inline T lf_sin(T a) {
  return std::sin(a);
}
template <Floating T>
inline T lf_cos(T a) {
  return std::cos(a);
}
template <Floating T>
inline T lf_tanh(T a) {
  return std::tanh(a);
}
template <Floating T>
inline T lf_sigmoid(T a) {
  return T(1) / (T(1) + std::exp(-a));
}
template <Floating T>
inline T lf_pow(T a, T b) {
  return std::pow(a, b);
}
template <Integer T>
inline T lf_pow(T base, T exponent) {
  if (exponent < 0) return base == 1 ? 1 : base == -1 ? (exponent % 2 ? -1 : 1) : 0;
  T result = 1;
  while (exponent) {
    if (exponent & 1) result = static_cast<T>(result * base);
    base = static_cast<T>(base * base);
    exponent >>= 1;
  }
  return result;
}
template <Arithmetic T>
inline T lf_max(T a, T b) {
  if constexpr (Floating<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}
template <Arithmetic T>
inline T lf_min(T a, T b) {
  if constexpr (Floating<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}
template <Arithmetic T>
inline T lf_relu(T a) {
  return a < T(0) ? T(0) : a;
}
template <Arithmetic T>
inline T lf_select(T condition, T a, T b) {
  return condition != T(0) ? a : b;
}

#ifdef __AVX2__
// Eight floats; only what the op expressions need.
struct Vf8 {
  __m256 v;
};
inline Vf8 operator+(Vf8 a, Vf8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vf8 operator-(Vf8 a, Vf8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vf8 operator*(Vf8 a, Vf8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vf8 operator/(Vf8 a, Vf8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vf8 operator-(Vf8 a) { return {_mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f))}; }
inline Vf8 lf_abs(Vf8 a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
inline Vf8 lf_log(Vf8 a) { return {Sleef_logf8_u10avx2(a.v)}; }
inline Vf8 lf_sqrt(Vf8 a) { return {_mm256_sqrt_ps(a.v)}; }
inline Vf8 lf_rsqrt(Vf8 a) { return {_mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(a.v))}; }
inline Vf8 lf_pow(Vf8 a, Vf8 b) { return {Sleef_powf8_u10avx2(a.v, b.v)}; }
inline Vf8 lf_fma(Vf8 a, Vf8 b, Vf8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline __m256 is_nan(__m256 a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
inline Vf8 lf_max(Vf8 a, Vf8 b) {
  return {_mm256_blendv_ps(_mm256_max_ps(a.v, b.v), a.v, is_nan(a.v))};
}
inline Vf8 lf_min(Vf8 a, Vf8 b) {
  return {_mm256_blendv_ps(_mm256_min_ps(a.v, b.v), a.v, is_nan(a.v))};
}
inline Vf8 lf_relu(Vf8 a) {
  __m256 zero = _mm256_setzero_ps();
  return {_mm256_blendv_ps(a.v, zero, _mm256_cmp_ps(a.v, zero, _CMP_LT_OQ))};
}

// Four doubles.
struct Vd4 {
  __m256d v;
};
inline Vd4 operator+(Vd4 a, Vd4 b) { return {_mm256_add_pd(a.v, b.v)}; }
inline Vd4 operator-(Vd4 a, Vd4 b) { return {_mm256_sub_pd(a.v, b.v)}; }
inline Vd4 operator*(Vd4 a, Vd4 b) { return {_mm256_mul_pd(a.v, b.v)}; }
inline Vd4 operator/(Vd4 a, Vd4 b) { return {_mm256_div_pd(a.v, b.v)}; }
inline Vd4 operator-(Vd4 a) { return {_mm256_xor_pd(a.v, _mm256_set1_pd(-0.0))}; }
inline Vd4 lf_abs(Vd4 a) { return {_mm256_andnot_pd(_mm256_set1_pd(-0.0), a.v)}; }
inline Vd4 lf_exp(Vd4 a) { return {Sleef_expd4_u10avx2(a.v)}; }
inline Vd4 lf_log(Vd4 a) { return {Sleef_logd4_u10avx2(a.v)}; }
inline Vd4 lf_sqrt(Vd4 a) { return {_mm256_sqrt_pd(a.v)}; }
inline Vd4 lf_rsqrt(Vd4 a) { return {_mm256_div_pd(_mm256_set1_pd(1.0), _mm256_sqrt_pd(a.v))}; }
inline Vd4 lf_tanh(Vd4 a) { return {Sleef_tanhd4_u10avx2(a.v)}; }
inline Vd4 lf_pow(Vd4 a, Vd4 b) { return {Sleef_powd4_u10avx2(a.v, b.v)}; }
inline Vd4 lf_fma(Vd4 a, Vd4 b, Vd4 c) { return {_mm256_fmadd_pd(a.v, b.v, c.v)}; }

#ifdef __AVX512F__
// Sixteen floats (AVX512F and AVX512DQ).
struct Vf16 {
  __m512 v;
};
inline Vf16 operator+(Vf16 a, Vf16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vf16 operator-(Vf16 a, Vf16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vf16 operator*(Vf16 a, Vf16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vf16 operator/(Vf16 a, Vf16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vf16 operator-(Vf16 a) { return {_mm512_xor_ps(a.v, _mm512_set1_ps(-0.0f))}; }
inline Vf16 lf_abs(Vf16 a) { return {_mm512_andnot_ps(_mm512_set1_ps(-0.0f), a.v)}; }
inline Vf16 lf_log(Vf16 a) { return {Sleef_logf16_u10avx512f(a.v)}; }
inline Vf16 lf_sqrt(Vf16 a) { return {_mm512_sqrt_ps(a.v)}; }
inline Vf16 lf_rsqrt(Vf16 a) { return {_mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(a.v))}; }
inline Vf16 lf_pow(Vf16 a, Vf16 b) { return {Sleef_powf16_u10avx512f(a.v, b.v)}; }
inline Vf16 lf_fma(Vf16 a, Vf16 b, Vf16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
// As the AVX2 forms: max_ps gives its second operand where either is NaN; a NaN first one is
// then put back.
inline Vf16 lf_max(Vf16 a, Vf16 b) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), _mm512_max_ps(a.v, b.v),
                               a.v)};
}
inline Vf16 lf_min(Vf16 a, Vf16 b) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), _mm512_min_ps(a.v, b.v),
                               a.v)};
}
inline Vf16 lf_relu(Vf16 a) {
  __m512 zero = _mm512_setzero_ps();
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, zero, _CMP_LT_OQ), a.v, zero)};
}

// Eight doubles.
struct Vd8 {
  __m512d v;
};
inline Vd8 operator+(Vd8 a, Vd8 b) { return {_mm512_add_pd(a.v, b.v)}; }
inline Vd8 operator-(Vd8 a, Vd8 b) { return {_mm512_sub_pd(a.v, b.v)}; }
inline Vd8 operator*(Vd8 a, Vd8 b) { return {_mm512_mul_pd(a.v, b.v)}; }
inline Vd8 operator/(Vd8 a, Vd8 b) { return {_mm512_div_pd(a.v, b.v)}; }
inline Vd8 operator-(Vd8 a) { return {_mm512_xor_pd(a.v, _mm512_set1_pd(-0.0))}; }
inline Vd8 lf_abs(Vd8 a) { return {_mm512_andnot_pd(_mm512_set1_pd(-0.0), a.v)}; }
inline Vd8 lf_exp(Vd8 a) { return {Sleef_expd8_u10avx512f(a.v)}; }
inline Vd8 lf_log(Vd8 a) { return {Sleef_logd8_u10avx512f(a.v)}; }
inline Vd8 lf_sqrt(Vd8 a) { return {_mm512_sqrt_pd(a.v)}; }
inline Vd8 lf_rsqrt(Vd8 a) { return {_mm512_div_pd(_mm512_set1_pd(1.0), _mm512_sqrt_pd(a.v))}; }
inline Vd8 lf_tanh(Vd8 a) { return {Sleef_tanhd8_u10avx512f(a.v)}; }
inline Vd8 lf_pow(Vd8 a, Vd8 b) { return {Sleef_powd8_u10avx512f(a.v, b.v)}; }
inline Vd8 lf_fma(Vd8 a, Vd8 b, Vd8 c) { return {_mm512_fmadd_pd(a.v, b.v, c.v)}; }
#endif  // __AVX512F__

// Note [Float exp and tanh]: float32 exp and tanh on vectors are our own, not SLEEF's. SLEEF's
// 1-ULP tanh keeps double-float intermediates, which makes it slow (docs/benchmarks.md, "CPU exp
// and tanh"); its 3.5-ULP one and Highway's are 2.86 ULP off at worst, past what the CPU's
// vector math promises. SLEEF's exp is a call that a fused loop cannot inline. These take 1.0
// ULP and under, every float32 input checked against libm's double result
// (tests/cpu_math_test.cc, LAZYFUSE_EXHAUSTIVE=1), and inline into the interpreter's kernels and
// the JIT's loops alike; every lane is computed alone (Note [Lane-independent math]).
//
// exp(x) = 2^floor(k/16) * 2^((k mod 16)/16) * exp(r), k = round(16 x / ln 2), r = x - k ln2/16
// in [-ln2/32, ln2/32] with ln 2 split in two (Cody and Waite: k/16 * kLn2Hi is exact), the
// middle factor from a 16-entry table as a rounded float plus what the rounding left out, and
// exp(r) = 1 + r + r^2 Q(r) with Q a degree-1 fit of least relative error. Inputs are clamped
// to [-104, 89] first, where the result is already 0 or infinity; the clamp keeps NaN. Max
// error 0.762 ULP (SLEEF's: 0.988). Against a degree-5 polynomial on [-ln2/2, ln2/2] (0.987
// ULP), two arithmetic instructions fewer and two table lookups (permutes) more.
//
// tanh(x) = sign(x) tanh(|x|). Below 1, |x| + |x|^3 P(x^2), P a degree-6 fit; the correction is
// at most a quarter of the result, so its rounding errors shrink by that much. From 1 on,
// 1 - 2 / (1 + exp(2|x|)), |x| clamped to 9.5 (past 9.02 tanh rounds to 1): 2 / (1 + exp(2|x|))
// is at most 0.24, so exp's error reaches the result a quarter as large; that exp takes the
// rounded table alone. The exp form alone is past 1 ULP below 1 (1.01 on [0.9, 1), 1.9 near
// 0.5), so both forms are computed for every lane and the lane's own is kept. Max error
// 0.986 ULP (SLEEF's: 1.0).
//
// The tables measured faster than polynomials of degree 5 (exp) and 4 (inside tanh) on
// [-ln2/2, ln2/2] in chain16, `(z + 2).exp() * y`, GELU and log-softmax (docs/benchmarks.md,
// "The CPU backend, table-driven exp and tanh, in a window of faster memory: 2026-12-06 06:06
// UTC, the 2-core Intel machine").
//
// The coefficients come from scripts/fit-cpu-math.py. The primitives differ by instruction set:
// AVX-512 scales by 2^n with scalef and takes 1 / d from a 14-bit estimate and one Newton step
// (relative error about 2^-28, before rounding); AVX2 divides, scales by 2^n in two exact
// halves so a subnormal result rounds once, and looks the table up in two 8-entry halves.

// The constants below have internal linkage and the functions are always inlined, so that an
// instruction set's kernel file defines nothing another could share, even at -O0
// (tests/isa_symbols.sh).
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kInvLn2 = 1.44269504088896341f;
// exp(r) = 1 + r + r^2 Q(r) on [-ln2/32, ln2/32], Q of degree 1, highest power first; the
// rest of exp comes from tables of 2^(j/16).
constexpr float kExpQ[] = {0.16666844775585646f, 0.5000161910767519f};
// 2^(j/16) for j = 0..15, each rounded to float; what that rounding left out; and twice the
// rounded value (exact).
// clang-format off
alignas(64) constexpr float kExp2Sixteenths[16] = {
    1.0f, 1.0442737824274138f, 1.0905077326652577f, 1.1387886347566916f,
    1.189207115002721f, 1.241857812073484f, 1.2968395546510096f, 1.3542555469368927f,
    1.4142135623730951f, 1.4768261459394993f, 1.5422108254079407f, 1.6104903319492543f,
    1.681792830507429f, 1.7562521603732995f, 1.8340080864093424f, 1.9152065613971474f};
alignas(64) constexpr float kExp2SixteenthsLow[16] = {
    0.0f, 4.83347016e-08f, -1.30775399e-08f, 5.38622231e-08f,
    3.79763527e-08f, 4.4968381e-08f, -4.01899953e-08f, -1.01233493e-08f,
    2.4203235e-08f, -4.50089885e-08f, 8.07090483e-09f, 9.83621717e-09f,
    -2.47553267e-08f, -9.23577037e-09f, -1.1239278e-08f, 9.84532811e-09f};
alignas(64) constexpr float kTwiceExp2Sixteenths[16] = {
    2 * kExp2Sixteenths[0], 2 * kExp2Sixteenths[1], 2 * kExp2Sixteenths[2],
    2 * kExp2Sixteenths[3], 2 * kExp2Sixteenths[4], 2 * kExp2Sixteenths[5],
    2 * kExp2Sixteenths[6], 2 * kExp2Sixteenths[7], 2 * kExp2Sixteenths[8],
    2 * kExp2Sixteenths[9], 2 * kExp2Sixteenths[10], 2 * kExp2Sixteenths[11],
    2 * kExp2Sixteenths[12], 2 * kExp2Sixteenths[13], 2 * kExp2Sixteenths[14],
    2 * kExp2Sixteenths[15]};
// clang-format on
// P(s) of tanh below 1, highest power first.
constexpr float kTanhP[] = {-3.5845236004922523e-4f, 2.301366236277299e-3f,  -7.94610934219894e-3f,
                            2.1486660111106597e-2f,  -5.387980384307768e-2f, 0.13332344596726212f,
                            -0.3333329543363718f};

template <typename V>
V splat(float x);
template <>
inline Vf8 splat<Vf8>(float x) {
  return {_mm256_set1_ps(x)};
}
// c - a * b, rounded once.
inline Vf8 fnma(Vf8 a, Vf8 b, Vf8 c) { return {_mm256_fnmadd_ps(a.v, b.v, c.v)}; }
// a * 2^floor(n) for a in [0.5, 2] and n in [-151, 129).
inline Vf8 times_power_of_two(Vf8 a, Vf8 n) {
  __m256i whole = _mm256_cvtps_epi32(_mm256_floor_ps(n.v));
  __m256i half = _mm256_srai_epi32(whole, 1);
  __m256i rest = _mm256_sub_epi32(whole, half);
  __m256i bias = _mm256_set1_epi32(127);
  __m256 first = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  __m256 second = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return {_mm256_mul_ps(_mm256_mul_ps(a.v, first), second)};
}
inline Vf8 reciprocal(Vf8 d) { return {_mm256_div_ps(_mm256_set1_ps(1.0f), d.v)}; }
// The lanes of `a` below `bound` from `if_below`, the others (NaN among them) from `otherwise`.
inline Vf8 select_below(Vf8 a, Vf8 bound, Vf8 if_below, Vf8 otherwise) {
  return {_mm256_blendv_ps(otherwise.v, if_below.v, _mm256_cmp_ps(a.v, bound.v, _CMP_LT_OQ))};
}
// min and max keeping a NaN `a` (minps gives its second operand where either is NaN).
inline Vf8 min_keeping_nan(Vf8 bound, Vf8 a) { return {_mm256_min_ps(bound.v, a.v)}; }
inline Vf8 max_keeping_nan(Vf8 bound, Vf8 a) { return {_mm256_max_ps(bound.v, a.v)}; }
inline Vf8 with_sign_of(Vf8 magnitude, Vf8 sign) {
  __m256 sign_bit = _mm256_set1_ps(-0.0f);
  return {_mm256_or_ps(magnitude.v, _mm256_and_ps(sign.v, sign_bit))};
}
// table[i mod 16] for each lane's i, the low bits of `index`'s bit pattern.
inline Vf8 lookup16(const float (&table)[16], Vf8 index) {
  __m256i i = _mm256_castps_si256(index.v);
  __m256 low = _mm256_permutevar8x32_ps(_mm256_load_ps(table), i);
  __m256 high = _mm256_permutevar8x32_ps(_mm256_load_ps(table + 8), i);
  return {_mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)))};
}

#ifdef __AVX512F__
template <>
inline Vf16 splat<Vf16>(float x) {
  return {_mm512_set1_ps(x)};
}
inline Vf16 fnma(Vf16 a, Vf16 b, Vf16 c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline Vf16 times_power_of_two(Vf16 a, Vf16 n) { return {_mm512_scalef_ps(a.v, n.v)}; }
inline Vf16 reciprocal(Vf16 d) {
  __m512 estimate = _mm512_rcp14_ps(d.v);
  __m512 residual = _mm512_fnmadd_ps(d.v, estimate, _mm512_set1_ps(1.0f));
  return {_mm512_fmadd_ps(estimate, residual, estimate)};
}
inline Vf16 select_below(Vf16 a, Vf16 bound, Vf16 if_below, Vf16 otherwise) {
  return {
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, bound.v, _CMP_LT_OQ), otherwise.v, if_below.v)};
}
inline Vf16 min_keeping_nan(Vf16 bound, Vf16 a) { return {_mm512_min_ps(bound.v, a.v)}; }
inline Vf16 max_keeping_nan(Vf16 bound, Vf16 a) { return {_mm512_max_ps(bound.v, a.v)}; }
inline Vf16 with_sign_of(Vf16 magnitude, Vf16 sign) {
  __m512 sign_bit = _mm512_set1_ps(-0.0f);
  return {_mm512_or_ps(magnitude.v, _mm512_and_ps(sign.v, sign_bit))};
}
inline Vf16 lookup16(const float (&table)[16], Vf16 index) {
  return {_mm512_permutexvar_ps(_mm512_castps_si512(index.v), _mm512_load_ps(table))};
}
#endif  // __AVX512F__

template <typename V, size_t degree>
[[gnu::always_inline]] inline V horner(V x, const float (&coefficients)[degree]) {
  V result = splat<V>(coefficients[0]);
  for (size_t k = 1; k < degree; ++k) result = lf_fma(result, x, splat<V>(coefficients[k]));
  return result;
}
// x = (k/16) ln2 / m + h for k = round(16 m x / ln 2), m = 1 (exp) or 2 (exp(2x), where
// r = 2h): k/16, exactly; h, exactly but for kLn2Lo's part (Cody and Waite); and `shifted`,
// whose low bits hold k for the table. k is rounded by adding 1.5 * 2^23, which leaves no
// fraction bits (an add, where a rounding instruction costs more on AVX-512).
template <typename V>
struct Sixteenths {
  V shifted, k16, h;
};
template <int m, typename V>
[[gnu::always_inline]] inline Sixteenths<V> reduce_by_sixteenths(V x) {
  V shifted = lf_fma(x, splat<V>(16 * m * kInvLn2), splat<V>(0x1.8p23f));
  V k16 = lf_fma(shifted, splat<V>(1.0f / 16), splat<V>(-0x1.8p23f / 16));
  V h = fnma(k16, splat<V>(kLn2Hi / m), x);
  return {shifted, k16, fnma(k16, splat<V>(kLn2Lo / m), h)};
}
// exp(x) = 2^floor(k/16) * 2^((k mod 16)/16) * exp(r), the middle factor from the tables as a
// rounded float and what the rounding left out.
template <typename V>
[[gnu::always_inline]] inline V exp_float(V x) {
  x = max_keeping_nan(splat<V>(-104.0f), min_keeping_nan(splat<V>(89.0f), x));
  auto [shifted, k16, r] = reduce_by_sixteenths<1>(x);
  V exp_r_minus_one = lf_fma(r * r, lf_fma(splat<V>(kExpQ[0]), r, splat<V>(kExpQ[1])), r);
  V high = lookup16(kExp2Sixteenths, shifted);
  V scaled = high + lf_fma(high, exp_r_minus_one, lookup16(kExp2SixteenthsLow, shifted));
  return times_power_of_two(scaled, k16);
}
// exp(2c) for c in [0, 9.5] or NaN, its doubling folded into the reduction: with h = r/2,
// (exp(r) - 1) / 2 = h + h^2 (4 q0 h + 2 q1) for Q(r) = q0 r + q1, and exp(2c) =
// 2^(k/16) (1 + 2 that). Its error reaches tanh a quarter as large, so the rounded table
// alone is close enough.
template <typename V>
[[gnu::always_inline]] inline V exp_of_twice(V c) {
  auto [shifted, k16, h] = reduce_by_sixteenths<2>(c);
  V half_exp_r_minus_one =
      lf_fma(h * h, lf_fma(splat<V>(4 * kExpQ[0]), h, splat<V>(2 * kExpQ[1])), h);
  V scaled = lf_fma(lookup16(kTwiceExp2Sixteenths, shifted), half_exp_r_minus_one,
                    lookup16(kExp2Sixteenths, shifted));
  return times_power_of_two(scaled, k16);
}
template <typename V>
[[gnu::always_inline]] inline V tanh_float(V x) {
  V a = lf_abs(x);
  V s = a * a;
  V below_one = lf_fma(a * s, horner(s, kTanhP), a);
  V e = exp_of_twice(min_keeping_nan(splat<V>(9.5f), a));
  V from_one = fnma(reciprocal(e + splat<V>(1.0f)), splat<V>(2.0f), splat<V>(1.0f));
  return with_sign_of(select_below(a, splat<V>(1.0f), below_one, from_one), x);
}

[[gnu::always_inline]] inline Vf8 lf_exp(Vf8 a) { return exp_float(a); }
[[gnu::always_inline]] inline Vf8 lf_tanh(Vf8 a) { return tanh_float(a); }
[[gnu::always_inline]] inline Vf8 lf_sigmoid(Vf8 a) {
  Vf8 one = splat<Vf8>(1.0f);
  return one / (one + lf_exp(-a));
}
#ifdef __AVX512F__
[[gnu::always_inline]] inline Vf16 lf_exp(Vf16 a) { return exp_float(a); }
[[gnu::always_inline]] inline Vf16 lf_tanh(Vf16 a) { return tanh_float(a); }
[[gnu::always_inline]] inline Vf16 lf_sigmoid(Vf16 a) {
  Vf16 one = splat<Vf16>(1.0f);
  return one / (one + lf_exp(-a));
}
#endif  // __AVX512F__

// The widest vector of T the translation unit is compiled for.
template <typename T>
struct VectorOf;
#ifdef __AVX512F__
template <>
struct VectorOf<float> {
  using type = Vf16;
  static constexpr int lanes = 16;
  static Vf16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static void store(float* p, Vf16 x) { _mm512_storeu_ps(p, x.v); }
  static void stream(float* p, Vf16 x) { _mm512_stream_ps(p, x.v); }
};
template <>
struct VectorOf<double> {
  using type = Vd8;
  static constexpr int lanes = 8;
  static Vd8 load(const double* p) { return {_mm512_loadu_pd(p)}; }
  static void store(double* p, Vd8 x) { _mm512_storeu_pd(p, x.v); }
  static void stream(double* p, Vd8 x) { _mm512_stream_pd(p, x.v); }
};
#else
template <>
struct VectorOf<float> {
  using type = Vf8;
  static constexpr int lanes = 8;
  static Vf8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static void store(float* p, Vf8 x) { _mm256_storeu_ps(p, x.v); }
  static void stream(float* p, Vf8 x) { _mm256_stream_ps(p, x.v); }
};
template <>
struct VectorOf<double> {
  using type = Vd4;
  static constexpr int lanes = 4;
  static Vd4 load(const double* p) { return {_mm256_loadu_pd(p)}; }
  static void store(double* p, Vd4 x) { _mm256_storeu_pd(p, x.v); }
  static void stream(double* p, Vd4 x) { _mm256_stream_pd(p, x.v); }
};
#endif  // __AVX512F__
#endif  // __AVX2__

}  // namespace LF_CPU_MATH_ISA
}  // namespace lazyfuse::cpu_math
