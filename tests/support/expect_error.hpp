#pragma once

// Assertions on chorus errors shared by the test suites.

#include <gtest/gtest.h>

#include <chorus/error.hpp>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>

namespace chorus::testing {

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

}  // namespace chorus::testing
