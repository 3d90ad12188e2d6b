// The mutex of the work registry, the host pool and the MPI transport (Note [Futex mutex],
// chorus/transport/futex_mutex.hpp).

#include "chorus/transport/futex_mutex.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace chorus::transport {
namespace {

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

// The contended path: the holder unlocks only once the second thread has marked the mutex
// contended, so that thread is asleep in lock() or about to be; the unlock must wake it.
TEST(FutexMutex, AnUnlockWakesTheThreadThatFoundItTaken) {
  FutexMutex mutex;
  mutex.lock();
  std::atomic<bool> acquired{false};
  std::thread waiter([&] {
    mutex.lock();
    acquired.store(true);
    mutex.unlock();
  });
  while (!mutex.marked_contended()) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(acquired.load());
  mutex.unlock();
  waiter.join();  // hangs (the test's timeout) if the unlock woke nobody
  EXPECT_TRUE(acquired.load());
  EXPECT_FALSE(mutex.marked_contended()) << "the waiter's unlock left it marked";
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

}  // namespace
}  // namespace chorus::transport
