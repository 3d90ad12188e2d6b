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
  const auto* bytes = static_cast<const unsigned char*>(data);
  // Each lane step, (h ^ word) * odd then h ^= h >> 29, is a bijection of h: a changed word
  // changes its lane's state for good.
  std::uint64_t lanes[4] = {0xcbf29ce484222325ull ^ size, 0x9e3779b97f4a7c15ull,
                            0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull};
  std::size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (std::size_t lane = 0; lane < 4; ++lane) {
      std::uint64_t word;
      std::memcpy(&word, bytes + i + lane * 8, 8);
      lanes[lane] = (lanes[lane] ^ word) * kPrime;
      lanes[lane] ^= lanes[lane] >> 29;
    }
  }
  for (; i + 8 <= size; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    lanes[0] = (lanes[0] ^ word) * kPrime;
    lanes[0] ^= lanes[0] >> 29;
  }
  for (; i < size; ++i) {
    lanes[1] = (lanes[1] ^ bytes[i]) * kPrime;
  }
  std::uint64_t hash = hash_combine(lanes[0], lanes[1]);
  hash = hash_combine(hash, lanes[2]);
  return hash_combine(hash, lanes[3]);
}

}  // namespace chorus::sim::detail
