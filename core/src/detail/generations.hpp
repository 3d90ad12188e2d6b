#pragma once

// Note [Generations in batches]
// Storages and works carry generations that are never reused (Note [Registry links]), so an
// object at a recycled address is never taken for an old one. One process-wide counter bumped
// per object would cost a locked read-modify-write per object in a process that ever had a
// second thread (Note [Atomic counts per operation]): two per collective, one for its work and
// one for its output. Instead each thread takes a batch of kGenerationBatch numbers from the
// process-wide counter at once and hands them out one by one. Generations stay unique and
// non-zero; they are no longer ordered across threads, which nothing needs: links compare them
// for equality only.

#include <atomic>
#include <cstdint>

namespace chorus::detail {

inline constexpr std::uint64_t kGenerationBatch = 1024;

// The next generation of the counter `Kind` (a tag type: storages and works count apart).
template <class Kind>
std::uint64_t next_generation() noexcept {
  static std::atomic<std::uint64_t> next_batch{1};
  thread_local std::uint64_t next = 0;
  thread_local std::uint64_t end = 0;
  if (next == end) [[unlikely]] {
    next = next_batch.fetch_add(kGenerationBatch, std::memory_order_relaxed);
    end = next + kGenerationBatch;
  }
  return next++;
}

}  // namespace chorus::detail
