// The portable half conversions (integer arithmetic, for compilers without _Float16) against
// the compiler's own _Float16 conversions, which the library uses wherever they exist: bit for
// bit, except that a NaN need only be a NaN of the same sign (which payload bits survive a
// conversion differs between the compiler's runtime and the F16C instructions too).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>

#include "lazyfuse/codegen/half.h"

namespace lazyfuse {
namespace {

bool is_half_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// Equal bits, or NaNs of the same sign.
::testing::AssertionResult same_half(uint16_t got, uint16_t expected) {
  if (got == expected ||
      (is_half_nan(got) && is_half_nan(expected) && (got & 0x8000u) == (expected & 0x8000u)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << std::hex << "got 0x" << got << ", expected 0x" << expected;
}

#if defined(__FLT16_MANT_DIG__)
TEST(Half, PortableConversionsMatchTheCompilers) {
  // Every half, NaNs and subnormals included, to float and back.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float expected = static_cast<float>(std::bit_cast<_Float16>(bits));
    ASSERT_EQ(std::bit_cast<uint32_t>(half_bits_to_float(bits)), std::bit_cast<uint32_t>(expected))
        << std::hex << h;
    ASSERT_TRUE(same_half(float_to_half_bits(expected),
                          std::bit_cast<uint16_t>(static_cast<_Float16>(expected))))
        << std::hex << h;
  }
  // Floats around every rounding boundary: each half, the midpoints between neighbours (ties
  // go to even) and a few floats either side of them, both signs; then NaN payloads and a
  // sweep of float bit patterns.
  auto check = [](uint32_t u) {
    const float f = std::bit_cast<float>(u);
    ASSERT_TRUE(same_half(float_to_half_bits(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))))
        << std::hex << u;
  };
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float low = half_bits_to_float(static_cast<uint16_t>(h));
    const float high = half_bits_to_float(static_cast<uint16_t>(h + 1));
    const uint32_t mid = std::bit_cast<uint32_t>((low + high) / 2);  // exact in float
    for (uint32_t base : {std::bit_cast<uint32_t>(low), mid})
      for (uint32_t delta = 0; delta < 3; ++delta)
        for (uint32_t sign : {0u, 0x80000000u}) {
          check((base + delta) | sign);
          if (base >= delta) check((base - delta) | sign);
        }
  }
  for (uint32_t payload : {1u, 0x1fffu, 0x2000u, 0x3fffffu, 0x400000u, 0x7fffffu})
    for (uint32_t sign : {0u, 0x80000000u}) check(sign | 0x7f800000u | payload);
  for (uint64_t u = 0; u <= 0xffffffffu; u += 0x10001u) check(static_cast<uint32_t>(u));
}
#endif

}  // namespace
}  // namespace lazyfuse
