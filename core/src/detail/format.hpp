#pragma once

// Small text helpers for error messages and reports.

#include <string>
#include <vector>

namespace chorus::detail {

// "[1, 2, 3]".
template <class T>
std::string bracketed(const std::vector<T>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    out += std::to_string(values[i]);
  }
  out += "]";
  return out;
}

}  // namespace chorus::detail
