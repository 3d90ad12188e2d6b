#pragma once

// Note [Futex mutex]
// The work registry and the host pool take their mutex six times per collective on the calling
// rank (reserve, add_reserved, wait_storage, the retire after the wait; the output's allocation
// and its release), and almost never find it taken: other threads take it only to drop a tensor
// or to give memory back. std::mutex goes through pthread_mutex_lock and pthread_mutex_unlock in
// libc, about 50 instructions a pair around the two atomic instructions that do the work (a
// callgrind of bench_registry put the pair at 7% of a collective's instructions). FutexMutex is
// the three-state mutex of Drepper's "Futexes Are Tricky" (mutex 2) on C++20's atomic wait and
// notify, inline: an uncontended lock is one compare-exchange, an uncontended unlock one
// exchange. A thread that finds it taken marks it contended and sleeps in the kernel (futex),
// never spins, so a holder that is descheduled costs its waiters no CPU; an unlock that finds it
// contended wakes one of them. ThreadSanitizer sees its acquire and release through the atomics.
// The MPI transport's locks use it too (the MPI lock is taken to post each operation and at every
// poll of a wait, Note [MPI locking]); a transport header, so core and transports share it.

#include <atomic>

namespace chorus::transport {

class FutexMutex {
 public:
  FutexMutex() = default;
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;

  void lock() noexcept {
    int expected = kUnlocked;
    if (!state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      lock_contended();
    }
  }

  bool try_lock() noexcept {
    int expected = kUnlocked;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  void unlock() noexcept {
    if (state_.exchange(kUnlocked, std::memory_order_release) == kContended) {
      state_.notify_one();
    }
  }

  // Whether a thread that found it taken marked it contended (and may be asleep in lock()); for
  // tests, which hold it until a second thread is known to wait.
  bool marked_contended() const noexcept {
    return state_.load(std::memory_order_relaxed) == kContended;
  }

 private:
  static constexpr int kUnlocked = 0;
  static constexpr int kLocked = 1;     // held, nobody waits
  static constexpr int kContended = 2;  // held, and someone may be waiting

  // Marks the mutex contended and sleeps until an unlock leaves it free. Whoever takes it this
  // way leaves it marked contended, so its unlock wakes the next waiter (at worst one wake-up
  // finds nobody).
  void lock_contended() noexcept {
    while (state_.exchange(kContended, std::memory_order_acquire) != kUnlocked) {
      state_.wait(kContended, std::memory_order_relaxed);
    }
  }

  std::atomic<int> state_{kUnlocked};
};

}  // namespace chorus::transport
