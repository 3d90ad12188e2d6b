// The rank executors (Note [Rank executor]) on their own: both hand control back and forth the
// same way, run each body once, and report when bodies finished.

#include "executor.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace chorus::sim::detail {
namespace {

class Executor : public ::testing::TestWithParam<ExecutorKind> {
 protected:
  std::unique_ptr<RankExecutor> make() {
    return GetParam() == ExecutorKind::Fibers ? make_fiber_executor() : make_thread_executor();
  }
};

TEST_P(Executor, ResumeRunsUntilSuspendAndInterleavesAsTold) {
  std::unique_ptr<RankExecutor> executor = make();
  std::vector<std::string> log;
  executor->start(2, [&](int rank) {
    for (int step = 0; step < 3; ++step) {
      log.push_back(std::to_string(rank) + ":" + std::to_string(step));
      executor->suspend(rank);
    }
  });
  // Scheduler order: 1, 0, 0, 1, 1, 0, 0, 1 (each resume runs to the next suspend or the end).
  for (int rank : {1, 0, 0, 1, 1, 0}) {
    executor->resume(rank);
    EXPECT_FALSE(executor->finished(rank));
  }
  executor->resume(0);
  EXPECT_TRUE(executor->finished(0));
  executor->resume(1);
  EXPECT_TRUE(executor->finished(1));
  executor->stop();
  EXPECT_EQ(log, (std::vector<std::string>{"1:0", "0:0", "0:1", "1:1", "1:2", "0:2"}));
}

TEST_P(Executor, ManyRanksManySwitches) {
  std::unique_ptr<RankExecutor> executor = make();
  constexpr int kRanks = 64;
  constexpr int kSwitches = 20;
  std::vector<int> counts(kRanks, 0);
  executor->start(kRanks, [&](int rank) {
    for (int i = 0; i < kSwitches; ++i) {
      ++counts[static_cast<std::size_t>(rank)];
      executor->suspend(rank);
    }
  });
  for (int round = 0; round <= kSwitches; ++round) {
    for (int rank = kRanks - 1; rank >= 0; --rank) {
      executor->resume(rank);
    }
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_TRUE(executor->finished(rank));
    EXPECT_EQ(counts[static_cast<std::size_t>(rank)], kSwitches);
  }
  executor->stop();
}

TEST_P(Executor, DeepRecursionFitsOnARankStack) {
  std::unique_ptr<RankExecutor> executor = make();
  int depth_reached = 0;
  // ~256 KiB of frames in all: deeper than any sane rank function, within the 1 MiB stack.
  std::function<int(int)> recurse = [&](int depth) -> int {
    volatile char frame[256] = {};
    frame[depth % 256] = 1;
    return depth == 0 ? 0 : frame[depth % 256] + recurse(depth - 1);
  };
  executor->start(1, [&](int) { depth_reached = recurse(1000); });
  executor->resume(0);
  EXPECT_TRUE(executor->finished(0));
  EXPECT_EQ(depth_reached, 1000);
  executor->stop();
}

INSTANTIATE_TEST_SUITE_P(Kinds, Executor,
                         ::testing::Values(ExecutorKind::Fibers, ExecutorKind::Threads),
                         [](const ::testing::TestParamInfo<ExecutorKind>& kind) {
                           return kind.param == ExecutorKind::Fibers ? std::string("Fibers")
                                                                     : std::string("Threads");
                         });

#if defined(CHORUS_TSAN)
// Note [Fibers under TSan]: each rank runs in a TSan context of its own, so a race between a
// rank and a thread that is not one is reported under the rank's name, not as the scheduler's
// thread. (Tests built without TSan have no report to read.)
TEST(FibersUnderTsanDeathTest, ARaceWithARankIsReportedUnderTheRanksName) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::unique_ptr<RankExecutor> executor = make_fiber_executor();
        int shared = 0;
        // Rank 1 is neither the first lane made nor the last.
        executor->start(3, [&](int rank) {
          if (rank == 1) {
            std::thread other([&] { shared = 1; });
            shared = 2;  // unordered with the other thread's write: a data race
            other.join();
          }
        });
        for (int rank : {0, 1, 2}) {
          executor->resume(rank);
        }
        executor->stop();
        std::exit(0);  // TSan's exit code (66) replaces 0 after a report
      },
      ::testing::ExitedWithCode(66),
      // The planted race (the first report: the preset halts on it), with the rank's name.
      "data race.*executor_test\\.cpp.*Thread T[0-9]+ 'chorus rank 1'");
}
#endif

}  // namespace
}  // namespace chorus::sim::detail
