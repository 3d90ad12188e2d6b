// kth_set_bit (simulator/src/bits.hpp), the scheduler's pick of the k-th runnable rank.

#include "bits.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "rng.hpp"

namespace chorus::sim::detail {
namespace {

// The positions of the set bits of `word`, lowest first: the definition kth_set_bit must meet.
std::vector<int> set_bits(std::uint64_t word) {
  std::vector<int> out;
  for (int i = 0; i < 64; ++i) {
    if (((word >> i) & 1u) != 0) {
      out.push_back(i);
    }
  }
  return out;
}

void expect_every_k(std::uint64_t word) {
  const std::vector<int> bits = set_bits(word);
  for (std::size_t k = 0; k < bits.size(); ++k) {
    ASSERT_EQ(kth_set_bit(word, k), bits[k])
        << "word " << std::hex << word << std::dec << " k " << k;
  }
}

TEST(KthSetBit, CraftedWords) {
  static_assert(kth_set_bit(1, 0) == 0);
  static_assert(kth_set_bit(std::uint64_t{1} << 63, 0) == 63);
  static_assert(kth_set_bit(~std::uint64_t{0}, 63) == 63);
  static_assert(kth_set_bit(0b1011'0000, 2) == 7);
  // Crossing byte borders: the k-th bit is the first of a byte, the last of a byte, alone in
  // the top byte after empty bytes, and in a byte after full ones.
  EXPECT_EQ(kth_set_bit(0x0000'0000'0000'01ffull, 8), 8);
  EXPECT_EQ(kth_set_bit(0x0000'0000'0000'80ffull, 8), 15);
  EXPECT_EQ(kth_set_bit(0x8000'0000'0000'0001ull, 1), 63);
  EXPECT_EQ(kth_set_bit(0x0100'ffff'ffff'ffffull, 48), 56);
  const std::uint64_t words[] = {1,
                                 ~std::uint64_t{0},
                                 0x5555'5555'5555'5555ull,
                                 0xaaaa'aaaa'aaaa'aaaaull,
                                 0x8000'0000'0000'0000ull,
                                 0xff00'0000'0000'00ffull,
                                 0x0000'00ff'ff00'0000ull,
                                 0x0101'0101'0101'0101ull,
                                 0x8080'8080'8080'8080ull,
                                 0x0f0f'0f0f'f0f0'f0f0ull};
  for (const std::uint64_t word : words) {
    expect_every_k(word);
  }
}

TEST(KthSetBit, EverySingleBitAndEveryPairOfBits) {
  for (int i = 0; i < 64; ++i) {
    const std::uint64_t one = std::uint64_t{1} << i;
    ASSERT_EQ(kth_set_bit(one, 0), i);
    for (int j = i + 1; j < 64; ++j) {
      const std::uint64_t two = one | (std::uint64_t{1} << j);
      ASSERT_EQ(kth_set_bit(two, 0), i);
      ASSERT_EQ(kth_set_bit(two, 1), j);
    }
  }
}

TEST(KthSetBit, SeededRandomWordsOfEveryDensity) {
  Rng rng(20261202);
  for (int round = 0; round < 4000; ++round) {
    // AND-ing or OR-ing draws together gives sparse and dense words as well as half-full ones.
    std::uint64_t word = rng.next();
    for (int extra = 0; extra < round % 4; ++extra) {
      word = (round % 8 < 4) ? (word & rng.next()) : (word | rng.next());
    }
    if (word == 0) {
      continue;
    }
    expect_every_k(word);
  }
}

}  // namespace
}  // namespace chorus::sim::detail
