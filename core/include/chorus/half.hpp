#pragma once

// 16-bit floating-point storage types. Values are stored as raw bits; arithmetic converts to
// float. Conversions from float round to nearest, ties to even, as IEEE 754 and NCCL do.

#include <cstdint>

namespace chorus {

// IEEE 754 binary16 bits -> float (exact) and float -> binary16 (round to nearest even;
// overflow goes to infinity, NaN stays a quiet NaN with the sign kept).
float half_bits_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_half_bits(float value) noexcept;

// bfloat16 (the upper 16 bits of a float32) -> float (exact) and float -> bfloat16
// (round to nearest even; NaN stays a quiet NaN).
float bfloat16_bits_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_bfloat16_bits(float value) noexcept;

struct Half {
  std::uint16_t bits = 0;

  constexpr Half() noexcept = default;
  explicit Half(float value) noexcept : bits(float_to_half_bits(value)) {}
  static constexpr Half from_bits(std::uint16_t raw) noexcept {
    Half h;
    h.bits = raw;
    return h;
  }
  explicit operator float() const noexcept { return half_bits_to_float(bits); }
  friend constexpr bool operator==(Half a, Half b) noexcept { return a.bits == b.bits; }
};

struct BFloat16 {
  std::uint16_t bits = 0;

  constexpr BFloat16() noexcept = default;
  explicit BFloat16(float value) noexcept : bits(float_to_bfloat16_bits(value)) {}
  static constexpr BFloat16 from_bits(std::uint16_t raw) noexcept {
    BFloat16 b;
    b.bits = raw;
    return b;
  }
  explicit operator float() const noexcept { return bfloat16_bits_to_float(bits); }
  friend constexpr bool operator==(BFloat16 a, BFloat16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace chorus
