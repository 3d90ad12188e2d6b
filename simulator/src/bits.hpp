#pragma once

// Bit tricks for the scheduler's runnable-rank set (one bit per rank, 64 ranks per word).

#include <bit>
#include <cstddef>
#include <cstdint>

namespace chorus::sim::detail {

// The position of the k-th set bit of `word`, counted from the lowest (k = 0: the lowest set
// bit). Requires k < std::popcount(word).
//
// Branch-free up to one byte: the generic x86-64 build has no popcnt or pdep, and the
// scheduler calls this once per decision, so clearing k bits one by one (up to 63 steps with
// 64 ranks) would cost more than the rest of the choice. Instead: per-byte population counts
// (SWAR), their running sums in every byte by one multiplication, the byte that holds the k-th
// bit found by comparing all eight sums with k at once, then at most seven steps inside it.
// Below kKthSetBitDirectMax the bits are cleared one by one, without the search: the loop then
// runs as often as the search's last step would, and a few ranks (k < world size) skip the
// search's twenty-odd instructions.
inline constexpr std::size_t kKthSetBitDirectMax = 4;

// The position of the lowest set bit of `word`, which is not 0. std::countr_zero answers 64 for
// 0, which costs a test and a branch around tzcnt (bsf on older CPUs, undefined for 0) on generic
// x86-64, once a decision; the words here are never 0.
constexpr int lowest_set_bit(std::uint64_t word) noexcept { return __builtin_ctzll(word); }

constexpr int kth_set_bit(std::uint64_t word, std::size_t k) noexcept {
  if (k < kKthSetBitDirectMax) {
    for (; k > 0; --k) {
      word &= word - 1;  // drop the lowest set bit
    }
    return lowest_set_bit(word);  // k < popcount(word): a bit is left
  }
  constexpr std::uint64_t kOnes = 0x0101010101010101ull;
  constexpr std::uint64_t kHighs = 0x8080808080808080ull;
  std::uint64_t counts = word - ((word >> 1) & 0x5555555555555555ull);
  counts = (counts & 0x3333333333333333ull) + ((counts >> 2) & 0x3333333333333333ull);
  counts = (counts + (counts >> 4)) & 0x0f0f0f0f0f0f0f0full;
  // Byte i of `sums` is the number of set bits in bytes 0..i (at most 64: no carry between bytes).
  const std::uint64_t sums = counts * kOnes;
  // Byte i's high bit is set where sums_i <= k: (128 + k) - sums_i borrows from no other byte.
  const std::uint64_t at_most_k = ((k * kOnes) | kHighs) - sums;
  // The sums grow with i, so those bytes are the lowest ones; the k-th bit lies in the first
  // byte past them (one exists, since k < sums_7).
  const int byte = std::countr_zero(~at_most_k & kHighs) / 8;
  const std::uint64_t before = byte == 0 ? 0 : (sums >> (8 * (byte - 1))) & 0xff;
  std::uint64_t bits = (word >> (8 * byte)) & 0xff;
  for (std::uint64_t skip = k - before; skip > 0; --skip) {
    bits &= bits - 1;  // drop the lowest set bit
  }
  return 8 * byte + lowest_set_bit(bits);  // the k-th bit is in this byte
}

}  // namespace chorus::sim::detail
