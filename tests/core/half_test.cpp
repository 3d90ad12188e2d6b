#include "chorus/half.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace chorus {
namespace {

// Independent decodings, built from std::ldexp rather than bit surgery.
float half_value_reference(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  const float sign = (bits & 0x8000) != 0 ? -1.0f : 1.0f;
  if (exponent == 0) {
    return sign * std::ldexp(static_cast<float>(mantissa), -24);
  }
  return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

bool is_half_nan(std::uint16_t bits) { return (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0; }
bool is_bfloat16_nan(std::uint16_t bits) {
  return (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0;
}

float float_from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }

constexpr std::uint16_t kHalfMaxFinite = 0x7BFF;  // 65504
constexpr std::uint16_t kHalfInf = 0x7C00;
constexpr std::uint16_t kBFloat16MaxFinite = 0x7F7F;
constexpr std::uint16_t kBFloat16Inf = 0x7F80;

TEST(Half, DecodesEveryPatternExactly) {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float value = half_bits_to_float(bits);
    if (is_half_nan(bits)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << pattern;
      EXPECT_EQ(std::signbit(value), (bits & 0x8000) != 0) << std::hex << pattern;
    } else if ((bits & 0x7FFF) == kHalfInf) {
      ASSERT_TRUE(std::isinf(value)) << std::hex << pattern;
      EXPECT_EQ(std::signbit(value), (bits & 0x8000) != 0) << std::hex << pattern;
    } else {
      // Bitwise, so -0 must decode to -0.
      ASSERT_EQ(bits_of(value), bits_of(half_value_reference(bits))) << std::hex << pattern;
    }
  }
}

TEST(Half, RoundTripsEveryPattern) {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const std::uint16_t back = float_to_half_bits(half_bits_to_float(bits));
    if (is_half_nan(bits)) {
      // NaNs stay NaN with their sign and payload, and come back quiet.
      ASSERT_TRUE(is_half_nan(back)) << std::hex << pattern;
      EXPECT_EQ(back, bits | 0x0200) << std::hex << pattern;
    } else {
      ASSERT_EQ(back, bits) << std::hex << pattern;
    }
  }
}

// Every pair of neighbouring finite halves, both signs: the midpoint is exactly representable in
// float, goes to the even neighbour, and one float ulp either side goes to the nearer neighbour.
// This covers subnormal steps, the subnormal/normal boundary, every binade, and 65504 -> inf.
TEST(Half, RoundsTiesToEvenAtEveryBoundary) {
  for (std::uint16_t low = 0; low < kHalfMaxFinite + 1; ++low) {
    const auto high = static_cast<std::uint16_t>(low + 1);
    for (const std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      const float low_value = half_bits_to_float(static_cast<std::uint16_t>(low | sign));
      const float high_value = half_bits_to_float(static_cast<std::uint16_t>(high | sign));
      const float midpoint =
          high == kHalfInf ? (sign != 0 ? -65520.0f : 65520.0f) : (low_value + high_value) / 2.0f;
      const auto even = static_cast<std::uint16_t>(((low & 1) == 0 ? low : high) | sign);
      ASSERT_EQ(float_to_half_bits(midpoint), even) << std::hex << low << " sign " << sign;
      const float toward_low = std::nextafter(midpoint, low_value);
      const float toward_high = std::nextafter(midpoint, 2.0f * midpoint);
      ASSERT_EQ(float_to_half_bits(toward_low), low | sign) << std::hex << low;
      ASSERT_EQ(float_to_half_bits(toward_high), high | sign) << std::hex << low;
    }
  }
}

TEST(Half, RoundsTiesToEven) {
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f), 0x3C00);      // Tie, 1 is even.
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * 0x1p-11f), 0x3C02);  // Tie, 1 + 2^-9 is even.
  EXPECT_EQ(float_to_half_bits(2049.0f), 0x6800);              // 2048 | 2050: 2048 is even.
  EXPECT_EQ(float_to_half_bits(2051.0f), 0x6802);              // 2050 | 2052: 2052 is even.
  EXPECT_EQ(float_to_half_bits(-2049.0f), 0xE800);
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // Just above the tie.
}

TEST(Half, ConvertsSubnormals) {
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x0400), 0x1p-14f);  // Smallest normal.
  EXPECT_EQ(half_bits_to_float(0x8001), -0x1p-24f);
  EXPECT_EQ(float_to_half_bits(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000);  // Tie between 0 and 2^-24: 0 is even.
  EXPECT_EQ(float_to_half_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half_bits(3 * 0x1p-25f), 0x0002);        // Tie between 1 and 2 units: 2.
  EXPECT_EQ(float_to_half_bits(1023.5f * 0x1p-24f), 0x0400);  // Rounds up into the normals.
  EXPECT_EQ(float_to_half_bits(-0x1p-24f), 0x8001);
  // Float subnormals and tiny normals underflow to a zero of the same sign.
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half_bits(-1e-40f), 0x8000);
  EXPECT_EQ(float_to_half_bits(0x1p-26f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
}

TEST(Half, OverflowsToInfinity) {
  EXPECT_EQ(float_to_half_bits(65504.0f), kHalfMaxFinite);
  EXPECT_EQ(half_bits_to_float(kHalfMaxFinite), 65504.0f);
  EXPECT_EQ(float_to_half_bits(std::nextafter(65520.0f, 0.0f)), kHalfMaxFinite);
  EXPECT_EQ(float_to_half_bits(65520.0f), kHalfInf);  // Tie with 65536: rounds to "even" inf.
  EXPECT_EQ(float_to_half_bits(65536.0f), kHalfInf);
  EXPECT_EQ(float_to_half_bits(1e10f), kHalfInf);
  EXPECT_EQ(float_to_half_bits(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::max()), kHalfInf);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), kHalfInf);
  EXPECT_EQ(float_to_half_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
}

TEST(Half, KeepsNaNQuietWithSign) {
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(float_to_half_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  // A signalling NaN whose payload lives only in the bits half drops must not become infinity.
  EXPECT_EQ(float_to_half_bits(float_from_bits(0x7F80'0001u)), 0x7E00);
  EXPECT_EQ(float_to_half_bits(float_from_bits(0xFF80'0001u)), 0xFE00);
  EXPECT_EQ(float_to_half_bits(float_from_bits(0x7FA0'0000u)), 0x7F00);  // Payload kept.
  EXPECT_EQ(bits_of(half_bits_to_float(0x7E00)), 0x7FC0'0000u);
  EXPECT_EQ(bits_of(half_bits_to_float(0x7C01)), 0x7FC0'2000u);  // Signalling comes out quiet.
}

TEST(Half, StructConvertsThroughTheFunctions) {
  EXPECT_EQ(Half(1.0f).bits, 0x3C00);
  EXPECT_EQ(Half(-2.0f).bits, 0xC000);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x3555)), half_bits_to_float(0x3555));
  EXPECT_EQ(Half::from_bits(0x1234), Half::from_bits(0x1234));
  EXPECT_FALSE(Half::from_bits(0x0000) == Half::from_bits(0x8000));  // Bitwise, not IEEE.
}

TEST(BFloat16, DecodesEveryPatternAsTheUpperHalfOfAFloat) {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    ASSERT_EQ(bits_of(bfloat16_bits_to_float(bits)), pattern << 16) << std::hex << pattern;
  }
}

TEST(BFloat16, RoundTripsEveryPattern) {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const std::uint16_t back = float_to_bfloat16_bits(bfloat16_bits_to_float(bits));
    if (is_bfloat16_nan(bits)) {
      ASSERT_TRUE(is_bfloat16_nan(back)) << std::hex << pattern;
      EXPECT_EQ(back, bits | 0x0040) << std::hex << pattern;  // Quiet, sign and payload kept.
    } else {
      ASSERT_EQ(back, bits) << std::hex << pattern;
    }
  }
}

// As for half: every neighbouring pair of finite bfloat16 values, both signs.
TEST(BFloat16, RoundsTiesToEvenAtEveryBoundary) {
  for (std::uint16_t low = 0; low < kBFloat16MaxFinite + 1; ++low) {
    const auto high = static_cast<std::uint16_t>(low + 1);
    for (const std::uint32_t sign : {0u, 0x8000'0000u}) {
      const std::uint32_t midpoint_bits = (static_cast<std::uint32_t>(low) << 16) | 0x8000u;
      const auto sign16 = static_cast<std::uint16_t>(sign >> 16);
      const auto even = static_cast<std::uint16_t>(((low & 1) == 0 ? low : high) | sign16);
      ASSERT_EQ(float_to_bfloat16_bits(float_from_bits(midpoint_bits | sign)), even)
          << std::hex << low;
      ASSERT_EQ(float_to_bfloat16_bits(float_from_bits((midpoint_bits - 1) | sign)), low | sign16)
          << std::hex << low;
      ASSERT_EQ(float_to_bfloat16_bits(float_from_bits((midpoint_bits + 1) | sign)), high | sign16)
          << std::hex << low;
    }
  }
}

TEST(BFloat16, RoundsTiesToEven) {
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 0x1p-8f), 0x3F80);      // Tie, 1 is even.
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 3 * 0x1p-8f), 0x3F82);  // Tie, rounds up to even.
  EXPECT_EQ(float_to_bfloat16_bits(257.0f), 0x4380);              // 256 | 258: 256 is even.
  EXPECT_EQ(float_to_bfloat16_bits(259.0f), 0x4382);              // 258 | 260: 260 is even.
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
}

TEST(BFloat16, ConvertsSubnormals) {
  EXPECT_EQ(bfloat16_bits_to_float(0x0001), 0x1p-133f);
  EXPECT_EQ(float_to_bfloat16_bits(0x1p-133f), 0x0001);
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x0000'8000u)), 0x0000);  // Tie: 0 is even.
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x0001'8000u)), 0x0002);  // Tie: 2 is even.
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x007F'FFFFu)), 0x0080);  // Up to normal.
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bfloat16_bits(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

TEST(BFloat16, OverflowsToInfinity) {
  EXPECT_EQ(bits_of(bfloat16_bits_to_float(kBFloat16MaxFinite)), 0x7F7F'0000u);
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x7F7F'7FFFu)), kBFloat16MaxFinite);
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x7F7F'8000u)), kBFloat16Inf);  // Tie.
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::max()), kBFloat16Inf);
  EXPECT_EQ(float_to_bfloat16_bits(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::infinity()), kBFloat16Inf);
}

TEST(BFloat16, KeepsNaNQuietWithSign) {
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(float_to_bfloat16_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFFC0);
  // Payload only in the dropped bits, and the all-ones payload that rounding would carry out of.
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x7F80'0001u)), 0x7FC0);
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x7FFF'FFFFu)), 0x7FFF);
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0xFFFF'FFFFu)), 0xFFFF);
}

TEST(BFloat16, StructConvertsThroughTheFunctions) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(static_cast<float>(BFloat16::from_bits(0xC040)), -3.0f);
}

}  // namespace
}  // namespace chorus
