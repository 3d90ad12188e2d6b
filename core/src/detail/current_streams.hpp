#pragma once

// A rank's current stream per CUDA device index (Note [Current stream]).

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

#include "chorus/check.hpp"

namespace chorus::detail {

// Shared by the rank's state and its pending works: a stream wait reads the stream current when
// it runs, which may be on another thread than the rank's, or after the rank ended.
class CurrentStreams {
 public:
  // Device indexes from 0 to kMaxDevices - 1 (chorus::set_current_stream refuses others).
  static constexpr int kMaxDevices = 1024;

  // Null (the legacy default stream) for a device never set.
  void* get(int device_index) const {
    const std::lock_guard lock(mutex_);
    const auto index = static_cast<std::size_t>(device_index);
    return device_index >= 0 && index < streams_.size() ? streams_[index] : nullptr;
  }
  void set(int device_index, void* stream) {
    CHORUS_CHECK(device_index >= 0 && device_index < kMaxDevices);
    const std::lock_guard lock(mutex_);
    const auto index = static_cast<std::size_t>(device_index);
    if (index >= streams_.size()) {
      streams_.resize(index + 1, nullptr);
    }
    streams_[index] = stream;
    ever_set_.store(true, std::memory_order_relaxed);
  }
  // Every device back on the legacy default stream (the rank's function returned: the streams
  // it set may be gone). Every rank of every simulated run resets its streams as it ends, and
  // almost none ever set one: a set that never happened leaves nothing to clear, so that rank
  // takes no lock (a lock and an unlock, ~55 instructions a rank). The flag guards no data: a
  // set() it does not see yet is one that comes after this reset, as if it took the lock later.
  void reset() {
    if (!ever_set_.load(std::memory_order_relaxed)) {
      return;
    }
    const std::lock_guard lock(mutex_);
    streams_.clear();
  }
  // Back to the state of a fresh one (no stream, never set), for a rank state that is reused
  // (Note [Reused rank states]). Only for an object nothing else holds any more. Its last other
  // holder (a work, perhaps on another thread) let go by a count decrement that the rank's
  // use_count() == 1 reads relaxed, which orders nothing, and an acquire fence after it is
  // refused by GCC's ThreadSanitizer (-Wtsan, an error with -Werror). So the clear goes through
  // reset(), under the lock that holder's last get() took: ordered after it. A rank that never
  // set a stream has nothing to clear (no write) and takes no lock.
  void reset_unshared() noexcept {
    reset();
    ever_set_.store(false, std::memory_order_relaxed);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<void*> streams_;         // by device index
  std::atomic<bool> ever_set_{false};  // set() ran once: streams_ may hold a stream
};

}  // namespace chorus::detail
