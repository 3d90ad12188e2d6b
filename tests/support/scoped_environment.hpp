#pragma once

// Environment variables set for a test's scope, and put back as they were (set or not) however the
// test ends, an ASSERT leaving it early included: a variable left behind would change every later
// test of the process.

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::testing {

class ScopedEnvironment {
 public:
  // Each name set to its value (nullopt: unset) while this lives.
  // (An initializer list, not a vector: {{"NAME", "value"}} would also read as a vector's
  // iterator pair.)
  explicit ScopedEnvironment(
      std::initializer_list<std::pair<std::string, std::optional<std::string>>> variables) {
    for (const auto& [name, value] : variables) {
      const char* previous = std::getenv(name.c_str());
      previous_.emplace_back(
          name, previous == nullptr ? std::nullopt : std::optional<std::string>(previous));
      set(name, value);
    }
  }
  ~ScopedEnvironment() {
    // Last first: a name listed twice gets back what it had before the first.
    for (auto entry = previous_.rbegin(); entry != previous_.rend(); ++entry) {
      set(entry->first, entry->second);
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

  // Sets (or with nullopt unsets) one of the scope's variables; restored with the others.
  void set(const std::string& name, const std::optional<std::string>& value) const {
    EXPECT_EQ(value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str()), 0)
        << name;
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> previous_;
};

}  // namespace chorus::testing
