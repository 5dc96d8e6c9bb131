// float16 and bfloat16 storage types and their conversions to and from float, rounding to
// nearest even, as every backend stores them.
#pragma once

#include <bit>
#include <cstdint>

namespace lazyfuse {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float half_to_float(Half h) { return static_cast<float>(std::bit_cast<_Float16>(h.bits)); }
inline Half float_to_half(float f) { return {std::bit_cast<uint16_t>(static_cast<_Float16>(f))}; }

inline float bfloat16_to_float(BFloat16 b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16);
}
inline BFloat16 float_to_bfloat16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return {static_cast<uint16_t>(u >> 16)};
}

// The value a float takes when stored as the half type and read back.
inline float round_to_half(float f) { return half_to_float(float_to_half(f)); }
inline float round_to_bfloat16(float f) { return bfloat16_to_float(float_to_bfloat16(f)); }

}  // namespace lazyfuse
