#pragma once

// The simulator's random number generator: xoshiro256** seeded through splitmix64. Fixed
// algorithms, so a seed means the same stream on every platform and compiler.

#include <cstddef>
#include <cstdint>

namespace chorus::sim::detail {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept;

  std::uint64_t next() noexcept;
  // Uniform in [0, bound); bound > 0. Multiply-shift: deterministic, bias below 2^-32 for the
  // small bounds the scheduler uses.
  std::uint64_t below(std::uint64_t bound) noexcept;

 private:
  std::uint64_t state_[4];
};

// A 64-bit digest of `size` bytes (not cryptographic: detects accidental change).
std::uint64_t hash_bytes(const void* data, std::size_t size) noexcept;

// Mixes `value` into `hash` (for the schedule digest).
std::uint64_t hash_combine(std::uint64_t hash, std::uint64_t value) noexcept;

}  // namespace chorus::sim::detail
