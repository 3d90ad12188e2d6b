#include "chorus/check.hpp"

#include <cstdio>
#include <cstdlib>

namespace chorus::detail {

void check_failed(const char* condition, const char* file, int line, const std::string& values) {
  std::fprintf(stderr, "chorus: CHECK failed at %s:%d: %s %s\n", file, line, condition,
               values.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace chorus::detail
