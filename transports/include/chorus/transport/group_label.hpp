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

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

namespace chorus::transport {

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
