#pragma once

// Note [Shared group labels]
// A group's label ("[0, 1, 2, 3]", "'tp' [0, 1]"), for reports and error messages, is made once
// per communicator (core: per communicator slot, RankState::comm_slot; the MPI transport: per
// MpiComm) and every work issued on it takes a copy. A label of up to 15 characters is copied as
// a std::string, inline in it (no allocation, no atomic count); a longer one (groups of 6 ranks
// or more: "[0, 1, 2, 3, 4, 5]") is shared, a pointer copy, where a std::string copy allocated
// per operation. Shared rather than borrowed: a work is reference-counted (core's PendingWork:
// the registry, stream waits, a failure being reported; a transport's Work: core's PendingWork)
// and nothing ties its life to its communicator's, so it must not point into it. Short labels
// are not shared because a shared pointer's copy and release are two atomic read-modify-writes
// in a multi-threaded process (Note [Atomic counts per operation], core/src/detail/
// work_registry.hpp), dearer than copying 15 bytes. Until 2026-12-05 the MPI transport shared
// every label: two locked instructions per operation.

#include <array>
#include <charconv>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace chorus::transport {

// Appends "[1, 2, 3]": the integers by std::to_chars, not a std::to_string and a concatenation
// each (every communicator's label is made so at its first collective). Core's rank lists and
// shapes in messages (detail::bracketed) are written by it too. The text is written into a local
// chunk and appended a chunk at a time: a std::string append per bracket, separator and value
// cost ~290 instructions for "[0, 1, 2, 3]", ~1% of a simulated schedule of 4 ranks.
template <class T>
void append_bracketed(std::string& out, std::span<const T> values) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 8);
  // Room for a separator, a 64-bit integer (at most 20 characters: 19 digits and a sign, or 20
  // digits) and the closing ']'.
  constexpr std::size_t kValueMax = 2 + 20 + 1;
  std::array<char, 64> chunk{};
  std::size_t used = 0;
  chunk[used++] = '[';
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (chunk.size() - used < kValueMax) {
      out.append(chunk.data(), used);
      used = 0;
    }
    if (i > 0) {
      chunk[used++] = ',';
      chunk[used++] = ' ';
    }
    // Most ranks are one digit, which std::to_chars would count first (negative ones wrap above 9).
    if (static_cast<std::make_unsigned_t<T>>(values[i]) <= 9) {
      chunk[used++] = static_cast<char>('0' + values[i]);
      continue;
    }
    const std::to_chars_result end =
        std::to_chars(chunk.data() + used, chunk.data() + chunk.size(), values[i]);
    used = static_cast<std::size_t>(end.ptr - chunk.data());
  }
  chunk[used++] = ']';  // kValueMax kept room for it
  out.append(chunk.data(), used);
}

// "[0, 1, 2]", or "'tp' [0, 1]" for a tagged group: how every layer (core, the simulator, MPI,
// NCCL) names a group in its reports and errors.
inline std::string group_label(std::string_view tag, std::span<const int> ranks) {
  std::string out;  // no reserve: a short label stays in the string's own 15 bytes
  if (!tag.empty()) {
    out.append("'").append(tag).append("' ");
  }
  append_bracketed(out, ranks);
  return out;
}

// A group's label, copied inline when short and shared when long (Note [Shared group labels]).
// Immutable once made; copies may be used from any thread.
class GroupLabel {
 public:
  GroupLabel() = default;
  GroupLabel(std::string text) {  // NOLINT(google-explicit-constructor): tests pass literals
    if (text.size() <= kInlineCharacters) {
      inline_ = std::move(text);
    } else {
      shared_ = std::make_shared<const std::string>(std::move(text));
    }
  }
  GroupLabel(const char* text)  // NOLINT(google-explicit-constructor)
      : GroupLabel(std::string(text)) {}

  const std::string& str() const noexcept { return shared_ != nullptr ? *shared_ : inline_; }
  bool empty() const noexcept { return str().empty(); }

 private:
  // What libstdc++'s std::string holds without allocating.
  static constexpr std::size_t kInlineCharacters = 15;
  std::string inline_;
  std::shared_ptr<const std::string> shared_;
};

}  // namespace chorus::transport
