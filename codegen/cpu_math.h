// The lf_* functions that op expressions in ir/ops.def call, for the CPU: on scalars of every
// compute dtype, and, where the translation unit is compiled for AVX2, on 8 floats or 4
// doubles at once through SLEEF (accuracy 1.0 ULP, the u10 variants).
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

namespace lazyfuse::cpu_math {

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
inline Vd4 lf_tanh(Vd4 a) { return {Sleef_tanhd4_u10avx2(a.v)}; }
inline Vd4 lf_pow(Vd4 a, Vd4 b) { return {Sleef_powd4_u10avx2(a.v, b.v)}; }

template <typename T>
struct VectorOf;
template <>
struct VectorOf<float> {
  using type = Vf8;
  static constexpr int lanes = 8;
  static Vf8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vf8 splat(float x) { return {_mm256_set1_ps(x)}; }
  static void store(float* p, Vf8 x) { _mm256_storeu_ps(p, x.v); }
};
template <>
struct VectorOf<double> {
  using type = Vd4;
  static constexpr int lanes = 4;
  static Vd4 load(const double* p) { return {_mm256_loadu_pd(p)}; }
  static Vd4 splat(double x) { return {_mm256_set1_pd(x)}; }
  static void store(double* p, Vd4 x) { _mm256_storeu_pd(p, x.v); }
};
#endif  // __AVX2__

}  // namespace lazyfuse::cpu_math
