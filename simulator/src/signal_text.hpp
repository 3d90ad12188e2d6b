#pragma once

// Text for the simulator's signal handlers (Note [Guard pages], Note [Interrupt report]): they
// may take no lock and allocate nothing, so they build a message in a buffer of their own with
// these, and write it with write(2).

#include <cstddef>
#include <cstdint>

namespace chorus::sim::detail {

// Appends `text` to out[0, capacity) at *length, leaving room for a NUL (async-signal-safe).
inline void append_text(char* out, std::size_t capacity, std::size_t* length, const char* text) {
  while (*text != '\0' && *length + 1 < capacity) {
    out[(*length)++] = *text++;
  }
}

// Appends `value` in decimal (async-signal-safe).
inline void append_number(char* out, std::size_t capacity, std::size_t* length,
                          std::int64_t value) {
  char digits[24];
  std::size_t count = 0;
  const bool negative = value < 0;
  auto magnitude =
      negative ? static_cast<std::uint64_t>(-(value + 1)) + 1 : static_cast<std::uint64_t>(value);
  do {
    digits[count++] = static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0);
  if (negative) {
    append_text(out, capacity, length, "-");
  }
  while (count > 0 && *length + 1 < capacity) {
    out[(*length)++] = digits[--count];
  }
}

// The length of a NUL-terminated text (strlen is not async-signal-safe).
inline std::size_t text_length(const char* text) {
  std::size_t length = 0;
  while (text[length] != '\0') {
    ++length;
  }
  return length;
}

}  // namespace chorus::sim::detail
