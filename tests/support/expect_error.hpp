#pragma once

// Assertions on chorus errors shared by the test suites.

#include <gtest/gtest.h>

#include <chorus/error.hpp>
#include <exception>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::testing {

// Whether `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `statement`, expecting InvalidArgument whose message contains every one of `fragments`.
inline void expect_invalid_argument(const std::function<void()>& statement,
                                    std::initializer_list<std::string> fragments,
                                    int line = __builtin_LINE()) {
  try {
    statement();
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "line " << line << ": message \"" << message << "\" lacks \"" << fragment << "\"";
    }
    return;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "line " << line << ": expected InvalidArgument, got " << error.what();
    return;
  }
  ADD_FAILURE() << "line " << line << ": expected InvalidArgument, nothing was thrown";
}

// A chorus::Error as caught: everything a test may check after the catch block. `code` is empty
// when nothing was caught.
struct CaughtError {
  std::optional<ErrorCode> code;
  std::string what;
  std::string detail;
  ErrorContext context;
};

// The caught copy of `error`.
inline CaughtError caught_error(const Error& error) {
  return CaughtError{error.code(), error.what(), error.detail(), error.context()};
}

// The code every error of type E carries.
template <class E>
ErrorCode error_code_of() {
  return E(ErrorContext{}, "").code();
}

// Runs `statement`, expecting an error of type E (and E's code) whose detail and what() contain
// every one of `fragments`; returns what was caught (an empty CaughtError after a failure).
template <class E>
CaughtError expect_error(const std::function<void()>& statement,
                         const std::vector<std::string>& fragments, int line = __builtin_LINE()) {
  const std::string_view expected = error_code_name(error_code_of<E>());
  const std::string first = fragments.empty() ? "" : fragments.front();
  try {
    statement();
  } catch (const E& error) {
    const CaughtError caught = caught_error(error);
    EXPECT_EQ(error.code(), error_code_of<E>()) << "line " << line;
    for (const std::string& fragment : fragments) {
      EXPECT_TRUE(contains(caught.detail, fragment))
          << "line " << line << ": detail \"" << caught.detail << "\" lacks \"" << fragment << "\"";
      EXPECT_TRUE(contains(caught.what, fragment))
          << "line " << line << ": what() \"" << caught.what << "\" lacks \"" << fragment << "\"";
    }
    return caught;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "line " << line << ": expected " << expected << " ('" << first << "'), got "
                  << error.what();
    return CaughtError{};
  }
  ADD_FAILURE() << "line " << line << ": expected " << expected << " ('" << first
                << "'), nothing was thrown";
  return CaughtError{};
}

}  // namespace chorus::testing
