// The rank executors (Note [Rank executor]) on their own: both hand control back and forth the
// same way, run each body once, and report when bodies finished.

#include "executor.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "support/address_space.hpp"
#include "support/sim_helpers.hpp"

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

// A refused context, in every build (RefuseContextsAfter; the system's own refusals are below,
// outside the sanitizers): the start throws the kind's error, the contexts made end without
// running their body, and the executor starts again.
template <class Start>
void expect_refused(ExecutorKind kind, Start start) {
  if (kind == ExecutorKind::Fibers) {
    EXPECT_THROW(start(), std::bad_alloc);  // a fiber's stack
  } else {
    EXPECT_THROW(start(), std::system_error);  // a thread
  }
}

TEST_P(Executor, ARefusedContextEndsTheMadeOnesWithoutTheirBodies) {
  std::unique_ptr<RankExecutor> executor = make();
  int bodies_run = 0;
  for (const int made : {0, 2}) {  // the first context refused; two made and ended
    SCOPED_TRACE(made);
    {
      const RefuseContextsAfter refuse(made);
      expect_refused(GetParam(), [&] { executor->start(4, [&](int) { ++bodies_run; }); });
    }
    EXPECT_EQ(bodies_run, 0);
  }
  executor->start(2, [&](int) { ++bodies_run; });
  executor->resume(1);
  executor->resume(0);
  executor->stop();
  EXPECT_EQ(bodies_run, 2);
}

TEST_P(Executor, TheSeamRefusesOnlyTheContextsAfterTheMadeOnes) {
  std::unique_ptr<RankExecutor> executor = make();
  int bodies_run = 0;
  const RefuseContextsAfter refuse(2);
  executor->start(2, [&](int) { ++bodies_run; });
  executor->resume(0);
  executor->resume(1);
  executor->stop();
  EXPECT_EQ(bodies_run, 2);
  expect_refused(GetParam(), [&] { executor->start(1, [&](int) { ++bodies_run; }); });
  EXPECT_EQ(bodies_run, 2);
}

TEST_P(Executor, ARunWhoseRanksAreRefusedThrowsAndTheNextRunSucceeds) {
  SimOptions options = chorus::testing::quiet_options(4);
  options.executor = GetParam();
  int ranks_run = 0;
  {
    const RefuseContextsAfter refuse(3);
    expect_refused(GetParam(), [&] { sim::run(options, [&] { ++ranks_run; }); });
  }
  EXPECT_EQ(ranks_run, 0);
  sim::run(options, [&] { ++ranks_run; });
  EXPECT_EQ(ranks_run, 4);
}

std::string kind_name(const ::testing::TestParamInfo<ExecutorKind>& kind) {
  return kind.param == ExecutorKind::Fibers ? "Fibers" : "Threads";
}

INSTANTIATE_TEST_SUITE_P(Kinds, Executor,
                         ::testing::Values(ExecutorKind::Fibers, ExecutorKind::Threads), kind_name);

#if !defined(CHORUS_ASAN) && !defined(CHORUS_TSAN)
// A world whose ranks cannot all get a context (a stack, a thread) fails with the error, never
// crashes. The address space is limited (RLIMIT_AS) in a child process: the sanitizers' shadow
// memory would not fit such a limit, hence not in their builds.
using ExecutorDeathTest = Executor;

// chorus::testing::limit_address_space, ending the child (code 3) when it cannot.
rlimit limit_address_space_or_exit(std::size_t extra_bytes) {
  const std::optional<rlimit> before = chorus::testing::limit_address_space(extra_bytes);
  if (!before) {
    std::_Exit(3);
  }
  return *before;
}

void restore_address_space(const rlimit& before) {
  if (setrlimit(RLIMIT_AS, &before) != 0) {
    std::_Exit(3);
  }
}

// Room for a few of 256 contexts: three of the larger of a fiber's stack (1 MiB) and a new
// thread's (glibc's default, from RLIMIT_STACK: 8 MiB with the usual `ulimit -s`), and 8 MiB
// for the rest.
std::size_t room_for_a_few_stacks() {
  std::size_t thread_stack = 0;
  pthread_attr_t defaults;
  if (pthread_getattr_default_np(&defaults) == 0) {
    pthread_attr_getstacksize(&defaults, &thread_stack);
    pthread_attr_destroy(&defaults);
  }
  const std::size_t stack = std::max(thread_stack, std::size_t{1} << 20);
  return 3 * stack + (std::size_t{8} << 20);
}

// Exit codes of the children below, but 0.
constexpr int kNotRefused = 1;    // the start that should not fit did not fail
constexpr int kWrongOutcome = 2;  // bodies ran, or the run after did not
constexpr int kWrongError = 4;    // failed with another error than the kind's
constexpr int kNoRoomAtAll = 5;   // not even one context fits under the limit

// What a kind fails with when the system refuses a context: a fiber's stack is mmap'ed (Boost
// throws std::bad_alloc), a thread is refused by pthread_create (std::system_error).
template <class Start>
int refusal_code(ExecutorKind kind, Start start) {
  try {
    start();
  } catch (const std::bad_alloc&) {
    return kind == ExecutorKind::Fibers ? 0 : kWrongError;
  } catch (const std::system_error&) {
    return kind == ExecutorKind::Threads ? 0 : kWrongError;
  }
  return kNotRefused;
}

TEST_P(ExecutorDeathTest, AStartThatCannotMakeEveryContextRunsNoBodyAndMayStartAgain) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::unique_ptr<RankExecutor> executor = make();
        int bodies_run = 0;
        const rlimit before = limit_address_space_or_exit(room_for_a_few_stacks());
        // One context fits (and a fiber's stack or a thread's is kept for the next): the start
        // below makes some before it fails, so ending them is what is checked.
        if (refusal_code(GetParam(), [&] {
              executor->start(1, [&](int) { ++bodies_run; });
              executor->resume(0);
              executor->stop();
            }) != kNotRefused) {
          std::_Exit(kNoRoomAtAll);
        }
        const int code =
            refusal_code(GetParam(), [&] { executor->start(256, [&](int) { ++bodies_run; }); });
        restore_address_space(before);
        if (code != 0) {
          std::_Exit(code);
        }
        // Empty again: a new start runs its bodies.
        executor->start(2, [&](int) { ++bodies_run; });
        executor->resume(1);
        executor->resume(0);
        executor->stop();
        std::_Exit(bodies_run == 3 ? 0 : kWrongOutcome);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_P(ExecutorDeathTest, ARunThatCannotStartItsRanksThrowsAndTheNextRunSucceeds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        SimOptions options = chorus::testing::quiet_options(256);
        options.executor = GetParam();
        int ranks_run = 0;
        const rlimit before = limit_address_space_or_exit(room_for_a_few_stacks());
        const int code = refusal_code(GetParam(), [&] { sim::run(options, [&] { ++ranks_run; }); });
        restore_address_space(before);
        if (code != 0) {
          std::_Exit(code);
        }
        if (ranks_run != 0) {
          std::_Exit(kWrongOutcome);
        }
        options.world_size = 2;
        sim::run(options, [&] { ++ranks_run; });
        std::_Exit(ranks_run == 2 ? 0 : kWrongOutcome);
      },
      ::testing::ExitedWithCode(0), "");
}

INSTANTIATE_TEST_SUITE_P(Kinds, ExecutorDeathTest,
                         ::testing::Values(ExecutorKind::Fibers, ExecutorKind::Threads), kind_name);
#endif

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
