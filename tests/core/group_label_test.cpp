// transport::append_bracketed and group_label against an oracle of their own (std::to_string
// joined by ", "): the tests elsewhere compare labels with ExpandedGroup::to_string, which is
// written by append_bracketed itself, so they cannot see it go wrong. Covers every integer width,
// negatives (which the one-digit fast path must not take), the extremes (20 characters), and
// lists long enough to flush the 64-byte chunk several times.

#include "chorus/transport/group_label.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace chorus::transport {
namespace {

template <class T>
std::string oracle(const std::vector<T>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += (i > 0 ? ", " : "");
    out += std::to_string(values[i]);  // promotes char types to int: digits, not characters
  }
  return out + "]";
}

template <class T>
void expect_bracketed(const std::vector<T>& values) {
  std::string out = "prefix ";  // appended to, not overwritten
  append_bracketed(out, std::span<const T>(values));
  EXPECT_EQ(out, "prefix " + oracle(values));
}

template <class T>
void expect_every_shape() {
  using Limits = std::numeric_limits<T>;
  expect_bracketed<T>({});
  expect_bracketed<T>({0});
  expect_bracketed<T>({9});
  expect_bracketed<T>({10});
  expect_bracketed<T>({Limits::max()});
  expect_bracketed<T>({Limits::min()});
  if constexpr (Limits::is_signed) {
    expect_bracketed<T>({-1, -9, -10, 0, 1});
  }
  // Long lists of the widest values: the chunk fills and flushes many times, at every offset.
  for (std::size_t n = 1; n <= 40; ++n) {
    std::vector<T> values;
    for (std::size_t i = 0; i < n; ++i) {
      values.push_back(i % 3 == 0 ? Limits::min() : i % 3 == 1 ? Limits::max() : T(i % 10));
    }
    expect_bracketed(values);
  }
  // The widest value at every offset in the chunk: p two-digit and q one-digit values before a
  // run of extremes shift where each extreme (and the closing bracket) lands.
  for (int p = 0; p < 8; ++p) {
    for (int q = 0; q < 8; ++q) {
      std::vector<T> values(static_cast<std::size_t>(p), T(10));
      values.insert(values.end(), static_cast<std::size_t>(q), T(5));
      for (int i = 0; i < 6; ++i) {
        values.push_back(Limits::is_signed ? Limits::min() : Limits::max());
        expect_bracketed(values);
      }
    }
  }
}

TEST(AppendBracketed, MatchesToStringForEveryIntegerType) {
  expect_every_shape<signed char>();
  expect_every_shape<unsigned char>();
  expect_every_shape<short>();
  expect_every_shape<unsigned short>();
  expect_every_shape<int>();
  expect_every_shape<unsigned>();
  expect_every_shape<long>();
  expect_every_shape<unsigned long>();
  expect_every_shape<long long>();
  expect_every_shape<unsigned long long>();
}

TEST(AppendBracketed, AGroupOfAHundredRanksIsLabelledInFull) {
  std::vector<int> ranks;
  for (int r = 0; r < 100; ++r) {
    ranks.push_back(r);
  }
  EXPECT_EQ(group_label("", ranks), oracle(ranks));
  EXPECT_EQ(group_label("tp", ranks), "'tp' " + oracle(ranks));
}

}  // namespace
}  // namespace chorus::transport
