#include "rng.hpp"

#include <cstring>

namespace chorus::sim::detail {

Rng::Rng(std::uint64_t seed) noexcept {
  std::uint64_t state = seed;
  for (std::uint64_t& word : state_) {
    word = splitmix64(state);
  }
}

std::uint64_t hash_bytes(const void* data, std::size_t size) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint64_t hash = 0xcbf29ce484222325ull ^ size;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    hash = (hash ^ word) * 0x100000001b3ull;
    hash ^= hash >> 29;
  }
  for (; i < size; ++i) {
    hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  std::uint64_t state = hash;
  return splitmix64(state);
}

std::uint64_t checksum_bytes(const void* data, std::size_t size) noexcept {
  constexpr std::uint64_t kPrime = 0x100000001b3ull;
  constexpr std::size_t kLanes = 8;
  const auto* bytes = static_cast<const unsigned char*>(data);
  // Each lane step, (h ^ word) * odd then h ^= h >> 29, is a bijection of h: a changed word
  // changes its lane's state for good. Eight independent lanes over 64-byte blocks keep the
  // multiplier busy instead of waiting on one lane's dependent chain.
  std::uint64_t lanes[kLanes] = {0xcbf29ce484222325ull ^ size, 0x9e3779b97f4a7c15ull,
                                 0xbf58476d1ce4e5b9ull,        0x94d049bb133111ebull,
                                 0xd6e8feb86659fd93ull,        0xa0761d6478bd642full,
                                 0xe7037ed1a0b428dbull,        0x8ebc6af09c88c6e3ull};
  const auto step = [&lanes](std::size_t lane, std::uint64_t word) {
    lanes[lane] = (lanes[lane] ^ word) * kPrime;
    lanes[lane] ^= lanes[lane] >> 29;
  };
  std::size_t i = 0;
  for (; i + 8 * kLanes <= size; i += 8 * kLanes) {
#pragma GCC unroll 8
    for (std::size_t lane = 0; lane < kLanes; ++lane) {
      std::uint64_t word;
      std::memcpy(&word, bytes + i + lane * 8, 8);
      step(lane, word);
    }
  }
  for (; i + 8 <= size; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    step(0, word);  // fewer than kLanes words are left
  }
  for (; i < size; ++i) {
    lanes[kLanes - 1] = (lanes[kLanes - 1] ^ bytes[i]) * kPrime;
  }
  std::uint64_t hash = lanes[0];
#pragma GCC unroll 8
  for (std::size_t lane = 1; lane < kLanes; ++lane) {
    hash = hash_combine(hash, lanes[lane]);
  }
  return hash;
}

}  // namespace chorus::sim::detail
