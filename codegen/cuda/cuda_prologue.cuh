// The fixed prologue of every generated CUDA kernel: integer types, the storage types of half
// and bfloat16 with their conversions, and the lf_* functions that the expressions of
// ir/ops.def call. Kernels are compiled by NVRTC with no include path, so nothing is included.
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

// Half types are stored as 16 bits and computed in float. The conversions round to nearest
// even, as the CPU's (codegen/half.h) do; a NaN stays a NaN, though not always of the same
// sign or payload.
struct lf_f16 {
  unsigned short bits;
};
struct lf_bf16 {
  unsigned short bits;
};
__device__ __forceinline__ float lf_load(lf_f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float lf_load(lf_bf16 x) {
  return __uint_as_float(static_cast<unsigned int>(x.bits) << 16);
}
template <typename T>
__device__ __forceinline__ T lf_load(T x) {
  return x;
}
// A cast from a float to an integer type: NaN is 0, and past the type's range the conversion
// saturates (as on the CPU: saturating_float_to_int in codegen/dtype_dispatch.h). The hardware
// gives NaN as 0 from float to int32 but as the minimum from double or to int64.
template <typename I, typename F>
__device__ __forceinline__ I lf_float_to_int(F x) {
  return x != x ? (I)0 : (I)x;
}
template <typename S, typename T>
struct lf_store_impl {
  __device__ static S run(T x) { return static_cast<S>(x); }
};
template <typename T>
struct lf_store_impl<lf_f16, T> {
  __device__ static lf_f16 run(T x) {
    lf_f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(static_cast<float>(x)));
    return h;
  }
};
template <typename T>
struct lf_store_impl<lf_bf16, T> {
  __device__ static lf_bf16 run(T x) {
    lf_bf16 b;
#if __CUDA_ARCH__ >= 800
    // One instruction instead of eight: every op rounds its bfloat16 result, so this decides
    // the speed of bfloat16 chains. As with float16, a NaN comes out as the canonical NaN.
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(static_cast<float>(x)));
#else
    unsigned int u = __float_as_uint(static_cast<float>(x));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      b.bits = static_cast<unsigned short>((u >> 16) | 0x40);
    } else {
      b.bits = static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
#endif
    return b;
  }
};
template <typename S, typename T>
__device__ __forceinline__ S lf_store(T x) {
  return lf_store_impl<S, T>::run(x);
}
__device__ __forceinline__ float lf_round_f16(float x) { return lf_load(lf_store<lf_f16>(x)); }
__device__ __forceinline__ float lf_round_bf16(float x) { return lf_load(lf_store<lf_bf16>(x)); }

// W elements moved by one vector load or store (two, for 32 bytes).
template <typename T, int W>
struct alignas(W * sizeof(T)) lf_vec {
  T v[W];
};
template <typename T>
using lf_vec4 = lf_vec<T, 4>;

__device__ __forceinline__ float lf_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double lf_abs(double a) { return fabs(a); }
// abs of the minimum is the minimum, as on the CPU (wrapping negation).
__device__ __forceinline__ int32_t lf_abs(int32_t a) {
  return a < 0 ? (int32_t)(0u - (uint32_t)a) : a;
}
__device__ __forceinline__ int64_t lf_abs(int64_t a) {
  return a < 0 ? (int64_t)(0ull - (uint64_t)a) : a;
}
#ifdef LF_FAST_MATH
// Opt-in hardware approximations (LAZYFUSE_FAST_MATH=1): ex2.approx, lg2.approx, sin.approx,
// cos.approx and tanh.approx through the __*f intrinsics; see docs/design.md for their bounds.
__device__ __forceinline__ float lf_exp(float a) { return __expf(a); }
__device__ __forceinline__ float lf_log(float a) { return __logf(a); }
__device__ __forceinline__ float lf_sin(float a) { return __sinf(a); }
__device__ __forceinline__ float lf_cos(float a) { return __cosf(a); }
__device__ __forceinline__ float lf_tanh(float a) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
#else
__device__ __forceinline__ float lf_exp(float a) { return expf(a); }
__device__ __forceinline__ float lf_log(float a) { return logf(a); }
__device__ __forceinline__ float lf_sin(float a) { return sinf(a); }
__device__ __forceinline__ float lf_cos(float a) { return cosf(a); }
__device__ __forceinline__ float lf_tanh(float a) { return tanhf(a); }
#endif
__device__ __forceinline__ double lf_exp(double a) { return exp(a); }
__device__ __forceinline__ double lf_log(double a) { return log(a); }
__device__ __forceinline__ double lf_sin(double a) { return sin(a); }
__device__ __forceinline__ double lf_cos(double a) { return cos(a); }
__device__ __forceinline__ double lf_tanh(double a) { return tanh(a); }
__device__ __forceinline__ float lf_log1p(float a) { return log1pf(a); }
__device__ __forceinline__ double lf_log1p(double a) { return log1p(a); }
__device__ __forceinline__ float lf_expm1(float a) { return expm1f(a); }
__device__ __forceinline__ double lf_expm1(double a) { return expm1(a); }
__device__ __forceinline__ float lf_erf(float a) { return erff(a); }
__device__ __forceinline__ double lf_erf(double a) { return erf(a); }
__device__ __forceinline__ float lf_sqrt(float a) { return sqrtf(a); }
__device__ __forceinline__ double lf_sqrt(double a) { return sqrt(a); }
__device__ __forceinline__ float lf_rsqrt(float a) { return 1.0f / sqrtf(a); }
__device__ __forceinline__ double lf_rsqrt(double a) { return 1.0 / sqrt(a); }
// float32 sigmoid from e = exp(-|x|), in (0, 1]: the denominator 1 + e lies in (1, 2], where
// the hardware reciprocal (rcp.approx, 1 ulp) needs no special cases and one Newton step
// brings it within rounding; x < 0 takes e / (1 + e). Against 1 / (1 + expf(-x)) with a
// correctly rounded reciprocal it gives up 0.5 ulp (3.7 against 3.1 ulp at most) for 18% more
// speed in sigmoid chains, which are bound by their instructions (bench/sigmoid_forms.py).
// Where sigmoid is subnormal (x below about -87) both give 0: expf flushes there.
__device__ __forceinline__ float lf_sigmoid(float a) {
  const float e = lf_exp(-fabsf(a));
  const float d = 1.0f + e;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = fmaf(r, fmaf(-d, r, 1.0f), r);
  return a >= 0.0f ? r : r * e;
}
// __drcp_rn is correctly rounded: the bits of 1 / x, in fewer instructions.
__device__ __forceinline__ double lf_sigmoid(double a) { return __drcp_rn(1.0 + exp(-a)); }
__device__ __forceinline__ float lf_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double lf_pow(double a, double b) { return pow(a, b); }
// Products wrap (Note [Integer wrap-around] in codegen/cuda/cuda_codegen.cc): U is T's unsigned
// twin.
template <typename T, typename U>
__device__ __forceinline__ T lf_ipow(T base_in, T exponent) {
  if (exponent < 0) return base_in == 1 ? 1 : base_in == -1 ? ((exponent % 2) ? -1 : 1) : 0;
  U result = 1, base = (U)base_in;
  while (exponent) {
    if (exponent & 1) result = result * base;
    base = base * base;
    exponent >>= 1;
  }
  return (T)result;
}
__device__ __forceinline__ int32_t lf_pow(int32_t a, int32_t b) {
  return lf_ipow<int32_t, uint32_t>(a, b);
}
__device__ __forceinline__ int64_t lf_pow(int64_t a, int64_t b) {
  return lf_ipow<int64_t, uint64_t>(a, b);
}
// NaN propagates through maximum, minimum, clamp and relu, as in PyTorch and on the CPU.
// NaN-propagating (the NaN operand itself, the first one where both are), and otherwise the
// first operand only where it is strictly greater (the second where they compare equal, as with
// +0 and -0). Written as selects rather than early returns, which NVRTC compiled to a branch
// and its reconvergence for every element of a softmax's row maximum.
template <typename T>
__device__ __forceinline__ T lf_max(T a, T b) {
  const T larger = a > b ? a : b;
  const T unless_b_nan = b != b ? b : larger;
  return a != a ? a : unless_b_nan;
}
template <typename T>
__device__ __forceinline__ T lf_min(T a, T b) {
  const T smaller = a < b ? a : b;
  const T unless_b_nan = b != b ? b : smaller;
  return a != a ? a : unless_b_nan;
}
template <typename T>
__device__ __forceinline__ T lf_relu(T a) {
  return a < T(0) ? T(0) : a;
}
template <typename T>
__device__ __forceinline__ T lf_select(T condition, T a, T b) {
  return condition != T(0) ? a : b;
}
