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

// The conversions in integer arithmetic, for compilers without _Float16 (clang before 15 on
// x86, which builds the fuzzers); Half.PortableConversionsMatchTheCompilers holds them to the
// compiler's own for every half and for floats around every rounding boundary.
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f)  // infinity, or NaN made quiet with its payload kept
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa ? 0x400000u | mantissa << 13 : 0));
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
}
inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u)  // NaN: quiet, the payload's top bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (magnitude >= 0x38800000u) {  // a normal half: rebias, round to nearest even at bit 13
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded - 0x38000000u) >> 13);
  }
  if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: zero
  // A subnormal half, mantissa x 2^-24: the float's significand shifted into place, rounded to
  // nearest even (a carry into the exponent gives the smallest normal, as it should).
  const uint32_t exponent = magnitude >> 23, significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14 (2^-15) to 24 (2^-25)
  uint32_t mantissa = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (mantissa & 1u))) ++mantissa;
  return static_cast<uint16_t>(sign | mantissa);
}

#if defined(__FLT16_MANT_DIG__)
inline float half_to_float(Half h) { return static_cast<float>(std::bit_cast<_Float16>(h.bits)); }
inline Half float_to_half(float f) { return {std::bit_cast<uint16_t>(static_cast<_Float16>(f))}; }
#else
inline float half_to_float(Half h) { return half_bits_to_float(h.bits); }
inline Half float_to_half(float f) { return {float_to_half_bits(f)}; }
#endif

inline float bfloat16_to_float(BFloat16 b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16);
}
// Without a branch, so that a loop of them is vector instructions (the CPU JIT's stores).
inline BFloat16 float_to_bfloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // to nearest, ties to even
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return {static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

// The value a float takes when stored as the half type and read back.
inline float round_to_half(float f) { return half_to_float(float_to_half(f)); }
inline float round_to_bfloat16(float f) { return bfloat16_to_float(float_to_bfloat16(f)); }

}  // namespace lazyfuse
