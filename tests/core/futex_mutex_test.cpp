// The mutex of the work registry, the host pool and the MPI transport (Note [Futex mutex],
// chorus/transport/futex_mutex.hpp).

#include "chorus/transport/futex_mutex.hpp"

#include <gtest/gtest.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace chorus::transport {
namespace {

// A thread reaches the futex call microseconds after it starts; these bound only a broken run,
// so that it fails instead of hanging until ctest's timeout.
constexpr std::chrono::seconds kSleepDeadline{30};
constexpr unsigned kJoinAlarmSeconds = 30;  // SIGALRM ends the process: an unlock woke nobody

std::string syscall_file(pid_t tid) {
  return "/proc/self/task/" + std::to_string(tid) + "/syscall";
}

// Whether this kernel shows a thread's system call (/proc/<pid>/task/<tid>/syscall, absent in
// some sandboxes): the contended tests need it to see that the waiter sleeps.
bool can_see_system_calls() { return std::ifstream(syscall_file(gettid())).is_open(); }

// Whether thread `tid` of this process is blocked in the futex system call (its syscall line
// starts with the call's number).
bool asleep_in_futex(pid_t tid) {
  std::ifstream file(syscall_file(tid));
  long number = -1;
  return static_cast<bool>(file >> number) && number == SYS_futex;
}

// A thread that takes `mutex` (which the test holds), notes that it got it, and gives it back.
class Waiter {
 public:
  explicit Waiter(FutexMutex& mutex)
      : mutex_(mutex), thread_([this] {
          tid_.store(gettid());
          mutex_.lock();
          acquired_.store(true);
          mutex_.unlock();
        }) {}
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  ~Waiter() {
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  // Yields until the waiter found the mutex taken, marked it contended and sleeps in the kernel,
  // so that an unlock is tested against a sleeper and not against a thread still on its way to
  // the futex call. False if it took the mutex instead (the mutex let a second holder in) or did
  // not get to sleep by kSleepDeadline.
  bool wait_until_asleep() const {
    const auto deadline = std::chrono::steady_clock::now() + kSleepDeadline;
    while (!mutex_.marked_contended() || !asleep_in_futex(tid_.load())) {
      if (acquired() || std::chrono::steady_clock::now() > deadline) {
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }
  bool acquired() const { return acquired_.load(); }
  // Once the test unlocked: the waiter must have been woken. A lost wake-up ends the process
  // (SIGALRM after kJoinAlarmSeconds).
  void join() {
    alarm(kJoinAlarmSeconds);
    thread_.join();
    alarm(0);
  }

 private:
  FutexMutex& mutex_;
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> acquired_{false};
  std::thread thread_;  // last: it starts once the members it uses exist
};

TEST(FutexMutex, TryLockFailsWhileHeldAndSucceedsOnceFree) {
  FutexMutex mutex;
  ASSERT_TRUE(mutex.try_lock());
  EXPECT_FALSE(mutex.try_lock());
  mutex.unlock();
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

// Four threads add to a plain counter under the mutex: a lock that let two in at once would lose
// increments (and ThreadSanitizer would report the race).
TEST(FutexMutex, ExcludesEveryOtherThread) {
  constexpr int kThreads = 4;
  constexpr std::int64_t kIncrements = 50'000;
  FutexMutex mutex;
  std::int64_t counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (std::int64_t i = 0; i < kIncrements; ++i) {
        const std::lock_guard<FutexMutex> lock(mutex);
        counter = counter + 1;
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(counter, kThreads * kIncrements);
}

// The contended path: the holder unlocks only once the second thread sleeps on the mutex; the
// unlock must wake it.
TEST(FutexMutex, AnUnlockWakesTheThreadThatFoundItTaken) {
  if (!can_see_system_calls()) {
    GTEST_SKIP() << "this kernel shows no /proc/self/task/<tid>/syscall";
  }
  FutexMutex mutex;
  mutex.lock();
  Waiter waiter(mutex);
  EXPECT_TRUE(waiter.wait_until_asleep()) << "the waiter took a held mutex, or never slept";
  EXPECT_FALSE(waiter.acquired());
  mutex.unlock();
  waiter.join();
  EXPECT_TRUE(waiter.acquired());
  EXPECT_FALSE(mutex.marked_contended()) << "the waiter's unlock left it marked";
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

// Note [Single-threaded processes]: a mutex locked with a plain store while the process had one
// thread, and a thread created while it is held. In a fresh process (the death test's child runs
// this test alone), so the first lock takes the single-threaded path; each way of going wrong
// exits with its own code: the new thread must find the mutex taken and go to sleep, and the
// unlock, which now sees two threads, must wake it (a plain store there would leave it asleep:
// the test's timeout).
TEST(FutexMutexDeathTest, AThreadMadeWhileItIsHeldWaitsAndIsWoken) {
#if defined(CHORUS_FUTEX_MUTEX_TSAN)
  GTEST_SKIP() << "under ThreadSanitizer the mutex has no single-threaded path";
#endif
  if (!can_see_system_calls()) {
    GTEST_SKIP() << "this kernel shows no /proc/self/task/<tid>/syscall";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto lock_then_make_a_thread = [] {
    if (__libc_single_threaded == 0) {
      _exit(3);  // not the path under test
    }
    FutexMutex mutex;
    mutex.lock();
    Waiter waiter(mutex);
    if (!waiter.wait_until_asleep()) {
      _exit(4);  // the second thread took a mutex that was held, or never slept
    }
    mutex.unlock();
    waiter.join();
    if (!waiter.acquired()) {
      _exit(5);
    }
    if (mutex.marked_contended() || !mutex.try_lock()) {
      _exit(6);  // the waiter's unlock left it marked or held
    }
    mutex.unlock();
    _exit(0);
  };
  EXPECT_EXIT(lock_then_make_a_thread(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace chorus::transport
