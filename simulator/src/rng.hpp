#pragma once

// The simulator's random number generator: xoshiro256** seeded through splitmix64. Fixed
// algorithms, so a seed means the same stream on every platform and compiler.
//
// The per-decision functions (next, below, hash_combine) are defined here, inline: the scheduler
// calls them several times per decision, and a call into another translation unit cost more
// than the arithmetic.

#include <cstddef>
#include <cstdint>

#include "chorus/check.hpp"

namespace chorus::sim::detail {

// One step of splitmix64: advances `state` and returns the next output.
constexpr std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept;

  [[gnu::always_inline]] std::uint64_t next() noexcept {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, bound); bound > 0. Multiply-shift: deterministic, bias below 2^-32 for the
  // small bounds the scheduler uses. The check names no values (as DecisionStream::choose's).
  // Inline, always: GCC made it a call in the scheduler's loop once the loop had less in it.
  [[gnu::always_inline]] std::uint64_t below(std::uint64_t bound) noexcept {
    CHORUS_CHECK(bound > 0);
    __extension__ using Uint128 = unsigned __int128;
    const Uint128 product = static_cast<Uint128>(next()) * bound;
    return static_cast<std::uint64_t>(product >> 64);
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
    return (x << k) | (x >> (64 - k));
  }

  std::uint64_t state_[4];
};

// A 64-bit digest of `size` bytes (not cryptographic: detects accidental change).
std::uint64_t hash_bytes(const void* data, std::size_t size) noexcept;

// A 64-bit checksum of `size` bytes for detecting that a buffer changed (InputModified): eight
// independent lanes over 64-byte blocks, so it runs several times faster than hash_bytes on
// large buffers. Not interchangeable with hash_bytes (different values).
std::uint64_t checksum_bytes(const void* data, std::size_t size) noexcept;

// Mixes `value` into `hash` (for the schedule digest). constexpr: the codes of running a small
// world's ranks are made at compile time (SimWorld::start_ranks).
constexpr std::uint64_t hash_combine(std::uint64_t hash, std::uint64_t value) noexcept {
  std::uint64_t state = hash ^ (value + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2));
  return splitmix64(state);
}

}  // namespace chorus::sim::detail
