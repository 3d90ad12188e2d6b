#pragma once

// CallSite: where a chorus API was called from, for error messages and the unwaited-work report.

#include <string>

namespace chorus {

// A source location captured with compiler builtins. Every collective takes a trailing
// `CallSite site = CallSite::current()` default argument, so the location is the caller's line.
// (std::source_location cannot be used: clang 14 on our machines lacks it.)
//
// Trivially copyable; the strings are string literals with static storage.
class CallSite {
 public:
  constexpr CallSite() noexcept = default;
  constexpr CallSite(const char* file_name, int line, const char* function_name) noexcept
      : file_name_(file_name), line_(line), function_name_(function_name) {}

  // Evaluated in a default argument, the builtins name the call site of the outer function.
  static constexpr CallSite current(const char* file_name = __builtin_FILE(),
                                    int line = __builtin_LINE(),
                                    const char* function_name = __builtin_FUNCTION()) noexcept {
    return CallSite(file_name, line, function_name);
  }

  constexpr const char* file_name() const noexcept { return file_name_; }
  constexpr int line() const noexcept { return line_; }
  constexpr const char* function_name() const noexcept { return function_name_; }
  constexpr bool known() const noexcept { return line_ > 0; }

  // "file.cpp:12 (function)", or "<unknown>" for a default-constructed site.
  std::string to_string() const;

 private:
  const char* file_name_ = "";
  int line_ = 0;
  const char* function_name_ = "";
};

}  // namespace chorus
