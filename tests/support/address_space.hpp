#pragma once

// An address-space limit for a death test's child that must see mmap and malloc refused.

#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <fstream>
#include <optional>

namespace chorus::testing {

// Limits this process's address space (RLIMIT_AS, the soft limit) to what it maps now plus
// `extra_bytes`. Returns the limit before, for setrlimit to restore; nullopt when the mapping's
// size or the limit could not be read or set.
inline std::optional<rlimit> limit_address_space(std::size_t extra_bytes) {
  rlimit before{};
  if (::getrlimit(RLIMIT_AS, &before) != 0) {
    return std::nullopt;
  }
  std::size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  if (pages == 0) {
    return std::nullopt;
  }
  rlimit limited = before;
  limited.rlim_cur =
      static_cast<rlim_t>(pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) + extra_bytes);
  if (::setrlimit(RLIMIT_AS, &limited) != 0) {
    return std::nullopt;
  }
  return before;
}

}  // namespace chorus::testing
