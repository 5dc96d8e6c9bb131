// The C++ type behind each dtype, and conversions between storage and compute types, shared by
// the CPU kernels and the runtime's CPU library steps.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "lazyfuse/codegen/half.h"
#include "lazyfuse/ir/dtype.h"

namespace lazyfuse {

// Calls f.template operator()<T>() with T the storage type of `dtype`.
template <typename F>
decltype(auto) dispatch_storage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Bool:
      return f.template operator()<bool>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Float16:
      return f.template operator()<Half>();
    case DType::BFloat16:
      return f.template operator()<BFloat16>();
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      break;
  }
  return f.template operator()<double>();
}

// Storage dtypes, in dispatch_storage's order: bool, int32, int64, float16, bfloat16, float32,
// float64; for a storage type S, and for a dtype.
inline constexpr int kNumStorageSlots = 7;
template <typename S>
constexpr int storage_slot_of() {
  if constexpr (std::is_same_v<S, bool>) return 0;
  if constexpr (std::is_same_v<S, int32_t>) return 1;
  if constexpr (std::is_same_v<S, int64_t>) return 2;
  if constexpr (std::is_same_v<S, Half>) return 3;
  if constexpr (std::is_same_v<S, BFloat16>) return 4;
  if constexpr (std::is_same_v<S, float>) return 5;
  return 6;
}
inline int storage_slot(DType dtype) {
  return dispatch_storage(dtype, []<typename S>() { return storage_slot_of<S>(); });
}

// Compute dtypes (what values are in registers): bool, int32, int64, float32, float64.
inline constexpr int kNumComputeSlots = 5;
inline int compute_slot(DType compute) {
  switch (compute) {
    case DType::Bool:
      return 0;
    case DType::Int32:
      return 1;
    case DType::Int64:
      return 2;
    case DType::Float64:
      return 4;
    default:
      return 3;
  }
}

template <typename F>
decltype(auto) dispatch_compute(DType dtype, F&& f) {
  switch (compute_slot(compute_dtype(dtype))) {
    case 0:
      return f.template operator()<bool>();
    case 1:
      return f.template operator()<int32_t>();
    case 2:
      return f.template operator()<int64_t>();
    case 3:
      return f.template operator()<float>();
    default:
      break;
  }
  return f.template operator()<double>();
}

// The compute type of a storage type: half types compute in float.
template <typename S>
using ComputeOf =
    std::conditional_t<std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>, float, S>;

// A floating `value` as a constant of `dtype` holds it: rounded to float, float16 or bfloat16.
inline double held_as(DType dtype, double value) {
  switch (dtype) {
    case DType::Float16:
      return round_to_half(static_cast<float>(value));
    case DType::BFloat16:
      return round_to_bfloat16(static_cast<float>(value));
    case DType::Float32:
      return static_cast<float>(value);
    default:
      return value;
  }
}

// Random bits a uniform draw of `dtype` takes (codegen/philox.h).
inline int uniform_bits(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return 11;
    case DType::BFloat16:
      return 8;
    case DType::Float64:
      return 53;
    default:
      return 24;
  }
}

// A float to an integer type, truncating toward zero as a cast does, and defined everywhere:
// values past the type's range become its extremes (as the GPU's conversions saturate) and NaN
// becomes 0 (as JAX defines it; the GPU's own conversions disagree across widths, so its
// kernels test for NaN too: lf_float_to_int in codegen/cuda/cuda_prologue.cuh). A plain C++ cast of
// those is undefined, and x86 gives the minimum for all of them.
template <typename To, typename From>
inline To saturating_float_to_int(From x) {
  static_assert(std::is_floating_point_v<From> && std::is_integral_v<To>);
  // -2^31 and -2^63 are exact in every float type; their negations are the first values past
  // the maximum.
  constexpr From lowest = static_cast<From>(std::numeric_limits<To>::min());
  if (x != x) return 0;
  if (x <= lowest) return std::numeric_limits<To>::min();
  if (x >= -lowest) return std::numeric_limits<To>::max();
  return static_cast<To>(x);
}

// The value of an integer constant whose attribute is a float (IR text may say
// `const {value = 1e300} : i64[]`): the float converted as a cast to `dtype` converts it. Both
// code generators take it from here.
inline int64_t float_constant_as_integer(double value, DType dtype) {
  return dtype == DType::Int32 ? saturating_float_to_int<int32_t>(value)
                               : saturating_float_to_int<int64_t>(value);
}

// One value converted from one dtype's storage type to another's: what cast means, on the CPU.
template <typename To, typename From>
inline To convert_value(From x) {
  if constexpr (std::is_same_v<From, Half>) {
    return convert_value<To>(half_to_float(x));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert_value<To>(bfloat16_to_float(x));
  } else if constexpr (std::is_same_v<To, Half>) {
    return float_to_half(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return float_to_bfloat16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, bool>) {
    return x != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    return saturating_float_to_int<To>(x);
  } else {
    return static_cast<To>(x);
  }
}

}  // namespace lazyfuse
