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
inline Vf8 lf_exp(Vf8 a) { return {Sleef_expf8_u10avx2(a.v)}; }
inline Vf8 lf_log(Vf8 a) { return {Sleef_logf8_u10avx2(a.v)}; }
inline Vf8 lf_sqrt(Vf8 a) { return {_mm256_sqrt_ps(a.v)}; }
inline Vf8 lf_rsqrt(Vf8 a) { return {_mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(a.v))}; }
inline Vf8 lf_tanh(Vf8 a) { return {Sleef_tanhf8_u10avx2(a.v)}; }
inline Vf8 lf_pow(Vf8 a, Vf8 b) { return {Sleef_powf8_u10avx2(a.v, b.v)}; }
inline Vf8 lf_fma(Vf8 a, Vf8 b, Vf8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf8 lf_sigmoid(Vf8 a) {
  __m256 one = _mm256_set1_ps(1.0f);
  return {_mm256_div_ps(one, _mm256_add_ps(one, Sleef_expf8_u10avx2((-a).v)))};
}
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
inline Vf16 lf_exp(Vf16 a) { return {Sleef_expf16_u10avx512f(a.v)}; }
inline Vf16 lf_log(Vf16 a) { return {Sleef_logf16_u10avx512f(a.v)}; }
inline Vf16 lf_sqrt(Vf16 a) { return {_mm512_sqrt_ps(a.v)}; }
inline Vf16 lf_rsqrt(Vf16 a) { return {_mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(a.v))}; }
inline Vf16 lf_tanh(Vf16 a) { return {Sleef_tanhf16_u10avx512f(a.v)}; }
inline Vf16 lf_pow(Vf16 a, Vf16 b) { return {Sleef_powf16_u10avx512f(a.v, b.v)}; }
inline Vf16 lf_fma(Vf16 a, Vf16 b, Vf16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf16 lf_sigmoid(Vf16 a) {
  __m512 one = _mm512_set1_ps(1.0f);
  return {_mm512_div_ps(one, _mm512_add_ps(one, Sleef_expf16_u10avx512f((-a).v)))};
}
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
