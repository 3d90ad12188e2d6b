#include "chorus/half.hpp"

#include <bit>
#include <cstdint>

// Reference conversions between float and the two 16-bit formats. They are written for clarity
// (one branch per class of value); kernels.cpp carries branch-free copies for its vectorized
// loops, and tests/core/kernels_test.cpp proves the two agree bit for bit.

namespace chorus {
namespace {

constexpr std::uint32_t kFloatSignMask = 0x8000'0000u;
constexpr std::uint32_t kFloatAbsMask = 0x7FFF'FFFFu;
constexpr std::uint32_t kFloatInfBits = 0x7F80'0000u;
constexpr std::uint32_t kFloatQuietBit = 0x0040'0000u;
constexpr int kFloatMantissaBits = 23;
constexpr int kFloatExponentBias = 127;

constexpr std::uint16_t kHalfSignMask = 0x8000u;
constexpr std::uint16_t kHalfInfBits = 0x7C00u;
constexpr std::uint16_t kHalfQuietBit = 0x0200u;
constexpr std::uint16_t kHalfMantissaMask = 0x03FFu;
constexpr int kHalfMantissaBits = 10;
constexpr int kHalfExponentBias = 15;
constexpr std::uint32_t kHalfExponentMax = 0x1Fu;

// Bits of a float dropped when narrowing its mantissa to half's.
constexpr int kHalfDroppedBits = kFloatMantissaBits - kHalfMantissaBits;
static_assert(kHalfDroppedBits == 13);
// Rebias between the two exponent fields (127 - 15).
constexpr std::uint32_t kHalfRebias = kFloatExponentBias - kHalfExponentBias;
// |x| >= 2^-14 (the smallest normal half) has a normal half encoding.
constexpr std::uint32_t kHalfMinNormalAsFloat = (kFloatExponentBias - 14u) << kFloatMantissaBits;
// |x| >= 65520 (half way between the largest finite half, 65504, and 65536) rounds to infinity:
// the tie goes to the even neighbour, which is 2^16, i.e. infinity.
constexpr std::uint32_t kHalfOverflowAsFloat = 0x477F'F000u;
// The smallest half subnormal is 2^-24; anything below 2^-25 (float exponent field 102) rounds to
// zero, and the shift below would exceed the 24-bit significand.
constexpr std::uint32_t kHalfSubnormalExponentMin = kFloatExponentBias - 25u;

// bfloat16 keeps the upper half of a float.
constexpr int kBFloat16DroppedBits = 16;
constexpr std::uint16_t kBFloat16QuietBit = 0x0040u;

// Rounds `value >> shift` to nearest, ties to even. 1 <= shift <= 31.
constexpr std::uint32_t shift_right_rne(std::uint32_t value, int shift) noexcept {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t remainder = value & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  const bool round_up = remainder > halfway || (remainder == halfway && (kept & 1u) != 0);
  return kept + (round_up ? 1u : 0u);
}

static_assert(shift_right_rne(0b1010, 2) == 0b10);   // 2.5 -> 2 (tie, even)
static_assert(shift_right_rne(0b1110, 2) == 0b100);  // 3.5 -> 4 (tie, even)
static_assert(shift_right_rne(0b1011, 2) == 0b11);   // 2.75 -> 3

}  // namespace

float half_bits_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & kHalfSignMask) << 16;
  const std::uint32_t exponent = (static_cast<std::uint32_t>(bits) >> kHalfMantissaBits) & 0x1Fu;
  const std::uint32_t mantissa = bits & kHalfMantissaMask;

  if (exponent == kHalfExponentMax) {
    // Infinity keeps its sign; a NaN keeps sign and payload and comes out quiet, as F16C does.
    const std::uint32_t quiet = mantissa != 0 ? kFloatQuietBit : 0u;
    return std::bit_cast<float>(sign | kFloatInfBits | (mantissa << kHalfDroppedBits) | quiet);
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float (10 significant bits, normal range).
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + kHalfRebias) << kFloatMantissaBits) |
                              (mantissa << kHalfDroppedBits));
}

std::uint16_t float_to_half_bits(float value) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits & kFloatSignMask) >> 16);
  const std::uint32_t magnitude = bits & kFloatAbsMask;

  if (magnitude > kFloatInfBits) {
    // NaN: keep the sign and the top of the payload, and force the quiet bit (which also keeps a
    // payload that lived only in the dropped bits from turning into infinity).
    const auto payload =
        static_cast<std::uint16_t>((magnitude >> kHalfDroppedBits) & kHalfMantissaMask);
    return static_cast<std::uint16_t>(sign | kHalfInfBits | kHalfQuietBit | payload);
  }
  if (magnitude >= kHalfOverflowAsFloat) {
    return static_cast<std::uint16_t>(sign | kHalfInfBits);  // Overflow and infinity.
  }
  if (magnitude >= kHalfMinNormalAsFloat) {
    // Normal: rebias the exponent and round the mantissa. A carry out of the mantissa correctly
    // bumps the exponent (and cannot reach infinity: that range was handled above).
    const std::uint32_t rebiased = magnitude - (kHalfRebias << kFloatMantissaBits);
    return static_cast<std::uint16_t>(sign | shift_right_rne(rebiased, kHalfDroppedBits));
  }
  const std::uint32_t exponent = magnitude >> kFloatMantissaBits;
  if (exponent < kHalfSubnormalExponentMin) {
    return sign;  // Below half the smallest subnormal (float subnormals included): signed zero.
  }
  // Subnormal half: the result counts units of 2^-24. The float is significand * 2^(exponent -
  // 150) with the implicit bit restored, so shift by 150 - 24 - exponent = 126 - exponent, which
  // lies in [14, 24] here. Rounding up from 0x3FF gives 0x400, the smallest normal: correct.
  const std::uint32_t significand = (magnitude & 0x007F'FFFFu) | 0x0080'0000u;
  const int shift = static_cast<int>(126u - exponent);
  return static_cast<std::uint16_t>(sign | shift_right_rne(significand, shift));
}

float bfloat16_bits_to_float(std::uint16_t bits) noexcept {
  // Exact for every pattern, NaN payloads included.
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << kBFloat16DroppedBits);
}

std::uint16_t float_to_bfloat16_bits(float value) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & kFloatAbsMask) > kFloatInfBits) {
    // NaN: keep sign and the top of the payload, force quiet (so it cannot become infinity).
    return static_cast<std::uint16_t>((bits >> kBFloat16DroppedBits) | kBFloat16QuietBit);
  }
  // Rounding the whole pattern as an integer is correct for every non-NaN value: a carry out of
  // the mantissa bumps the exponent, and past the largest finite value it lands on infinity.
  // No overflow of the uint32: the largest input is 0xFF80'0000.
  return static_cast<std::uint16_t>(shift_right_rne(bits, kBFloat16DroppedBits));
}

}  // namespace chorus
