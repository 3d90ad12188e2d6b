#pragma once

// FNV-1a, 64-bit: the digests ranks compute alike without communicating (communicator ids,
// MPI's collective-check digest).

#include <cstdint>

namespace chorus::transport {

class Fnv1a {
 public:
  void byte(unsigned char value) noexcept {
    hash_ ^= value;
    hash_ *= 1099511628211ULL;
  }
  // `value`'s `bytes` low bytes, lowest first (the same on every rank whatever its endianness).
  void integer(std::uint64_t value, int bytes = 8) noexcept {
    for (int i = 0; i < bytes; ++i) {
      byte(static_cast<unsigned char>((value >> (8 * i)) & 0xFFU));
    }
  }
  std::uint64_t value() const noexcept { return hash_; }

 private:
  std::uint64_t hash_ = 14695981039346656037ULL;
};

}  // namespace chorus::transport
