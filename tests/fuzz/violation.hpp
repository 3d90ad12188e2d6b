#pragma once

// How the fuzz targets report a broken invariant: one line on stderr that the tests and
// docs/fuzzing.md grep for ("chorus fuzz: invariant violated: ..."), then abort(), which
// libFuzzer (and the standalone driver) turn into a saved crashing input.

#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// What the parser targets (trace_json_fuzz, store_protocol_fuzz) require of every input when
// CHORUS_FUZZ_EXPECT is set: `parsed` (accepted) or `refused`. A parser that refused everything
// would pass every fuzz run, so CTest runs each target on its seeds with the outcome each seed
// was written for (<target>.seeds_parsed, <target>.seeds_refused).
enum class Expectation { Any, Parsed, Refused };

inline Expectation expectation() {
  const char* value = std::getenv("CHORUS_FUZZ_EXPECT");
  if (value == nullptr || *value == '\0') {
    return Expectation::Any;
  }
  if (std::strcmp(value, "parsed") == 0) {
    return Expectation::Parsed;
  }
  if (std::strcmp(value, "refused") == 0) {
    return Expectation::Refused;
  }
  violated(std::string("CHORUS_FUZZ_EXPECT is '") + value + "', not parsed or refused");
}

// Checks the outcome of parsing one input against CHORUS_FUZZ_EXPECT; `what` names the parser
// and, for a refusal, its message.
inline void check_outcome(bool parsed, const std::string& what) {
  const Expectation expected = expectation();
  if (expected == Expectation::Parsed && !parsed) {
    violated(what + " refused an input expected to parse");
  }
  if (expected == Expectation::Refused && parsed) {
    violated(what + " accepted an input expected to be refused");
  }
}

}  // namespace chorus::fuzz
