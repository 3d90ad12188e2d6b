#pragma once

// How the fuzz targets report a broken invariant: one line on stderr that the tests and
// docs/fuzzing.md grep for ("chorus fuzz: invariant violated: ..."), then abort(), which
// libFuzzer (and the standalone driver) turn into a saved crashing input.

#include <cstdio>
#include <cstdlib>
#include <string>

namespace chorus::fuzz {

[[noreturn]] inline void violated(const std::string& what) {
  std::fprintf(stderr, "chorus fuzz: invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool condition, const std::string& what) {
  if (!condition) {
    violated(what);
  }
}

}  // namespace chorus::fuzz
