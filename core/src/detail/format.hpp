#pragma once

// Small text helpers for error messages and reports.

#include <span>
#include <string>
#include <vector>

#include "chorus/transport/group_label.hpp"

namespace chorus::detail {

// "[1, 2, 3]" (transport::append_bracketed).
template <class T>
std::string bracketed(const std::vector<T>& values) {
  std::string out;  // no reserve: a short list stays in the string's own 15 bytes
  transport::append_bracketed(out, std::span<const T>(values));
  return out;
}

}  // namespace chorus::detail
