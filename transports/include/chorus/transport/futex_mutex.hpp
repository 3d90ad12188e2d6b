#pragma once

// Note [Futex mutex]
// The work registry and the host pool take their mutex six times per collective on the calling
// rank (reserve, add_reserved, wait_storage, the retire after the wait; the output's allocation
// and its release), and almost never find it taken: other threads take it only to drop a tensor
// or to give memory back. std::mutex goes through pthread_mutex_lock and pthread_mutex_unlock in
// libc, about 50 instructions a pair around the two atomic instructions that do the work (a
// callgrind of bench_registry put the pair at 7% of a collective's instructions). FutexMutex is
// the three-state mutex of Drepper's "Futexes Are Tricky" (mutex 2), inline: an uncontended lock
// is one compare-exchange, an uncontended unlock one exchange. A thread that finds it taken marks
// it contended and sleeps in the kernel on the futex at once, as glibc's mutex does (not through
// std::atomic::wait, which in libstdc++ 12 spins and calls sched_yield first: the yields Note
// [Wait backoff] keeps out of the MPI transport's waits); an unlock that finds it contended wakes
// one sleeper. The MPI transport's locks use it too (the MPI lock is taken to post each operation
// and at every poll of a wait, Note [MPI locking]); a transport header, so core and transports
// share it. Linux only, as chorus is.
//
// ThreadSanitizer sees the acquire and release through the atomics, and is told that this is a
// mutex (the __tsan_mutex_* annotations), so it still reports a double lock, an unlock of a mutex
// not held and lock-order inversions, as it did for std::mutex.

// Note [Single-threaded processes]
// The compare-exchange and the exchange are locked instructions, ~20 cycles each whatever the
// thread count: in the simulator's fiber runs (one thread, every rank a fiber) the registry's and
// the pool's twelve of them per rank and collective were a tenth of a collective's time. While
// glibc says the process has one thread (`__libc_single_threaded`, glibc 2.32; libstdc++'s
// shared_ptr counts read it the same way), nobody else can hold, take or wait for the mutex, so
// lock() and unlock() store the state word with plain stores. Both still read the flag at every
// call, so each half decides on its own: a thread created while the mutex is held (creation
// orders the plain store before the new thread's first read) finds it locked and waits as usual,
// and the unlock, which then sees more than one thread, takes the exchange and wakes it. A lock
// that finds the word taken while single-threaded (a self-deadlock, on fibers too) takes the
// usual path. Not under ThreadSanitizer, whose runtime has threads of its own. This assumes,
// as libstdc++ does, that every thread is made through the process's glibc (pthread_create, or
// std::thread on it): a raw clone() would leave the flag set.

#include <linux/futex.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#if defined(__SANITIZE_THREAD__)
#define CHORUS_FUTEX_MUTEX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CHORUS_FUTEX_MUTEX_TSAN 1
#endif
#endif
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace chorus::transport {

class FutexMutex {
 public:
  FutexMutex() noexcept {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_create(this, 0);
#endif
  }
  ~FutexMutex() {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_destroy(this, 0);
#endif
  }
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;

  void lock() noexcept {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_pre_lock(this, 0);
#endif
    if (single_threaded() && state_.load(std::memory_order_relaxed) == kUnlocked) {
      state_.store(kLocked, std::memory_order_relaxed);  // Note [Single-threaded processes]
    } else {
      int expected = kUnlocked;
      if (!state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                          std::memory_order_relaxed)) {
        lock_contended();
      }
    }
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_post_lock(this, 0, 0);
#endif
  }

  bool try_lock() noexcept {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
#endif
    int expected = kUnlocked;
    const bool locked = state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                                       std::memory_order_relaxed);
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_post_lock(
        this, locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed,
        0);
#endif
    return locked;
  }

  void unlock() noexcept {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_pre_unlock(this, 0);
#endif
    if (single_threaded()) {
      state_.store(kUnlocked, std::memory_order_release);  // nobody else to wake
    } else if (state_.exchange(kUnlocked, std::memory_order_release) == kContended) {
      futex(FUTEX_WAKE_PRIVATE, 1);
    }
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    __tsan_mutex_post_unlock(this, 0);
#endif
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

  // Whether this process has one thread (Note [Single-threaded processes]).
  static bool single_threaded() noexcept {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
    return false;
#else
    return __libc_single_threaded != 0;
#endif
  }

  // Marks the mutex contended and sleeps until an unlock leaves it free. Whoever takes it this
  // way leaves it marked contended, so its unlock wakes the next sleeper (at worst one wake-up
  // finds nobody). FUTEX_WAIT returns at once when the word is no longer kContended, and may
  // return spuriously: either way the loop tries again.
  void lock_contended() noexcept {
    while (state_.exchange(kContended, std::memory_order_acquire) != kUnlocked) {
      futex(FUTEX_WAIT_PRIVATE, kContended);
    }
  }

  // The futex call on state_ (an std::atomic<int> is an int in memory on Linux).
  void futex(int operation, int value) noexcept {
    static_assert(sizeof(std::atomic<int>) == sizeof(int));
    (void)syscall(SYS_futex, reinterpret_cast<int*>(&state_), operation, value, nullptr, nullptr,
                  0);
  }

  std::atomic<int> state_{kUnlocked};
};

}  // namespace chorus::transport
