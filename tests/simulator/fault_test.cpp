// Injected faults and the liveness phase (Note [Fault injection], Note [Virtual time skip],
// Note [Liveness phase] in simulator/src/world.hpp): each fault kind fires (its mark), every
// rank ends with the error its role calls for, never a hang; random faults come from the
// decision stream and replay; a program that cannot finish once faults stop is reported.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "support/expect_error.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using sim::Fault;
using sim::SimOptions;
using sim::SimReport;
using testing::CaughtError;
using testing::contains;
using testing::rank_slot;
using testing::world_label;

// The report of a run and, per rank and per operation the error each call raised (code empty:
// it succeeded) and the results it returned.
struct FaultRun {
  SimReport report;
  std::vector<std::vector<CaughtError>> errors;    // [rank][operation]
  std::vector<std::vector<std::int32_t>> results;  // [rank]: each operation's element 0
};

// Each rank runs `operations` all_reduces of [rank + 1, rank + 1] over the world, one after the
// other, catching the error of each and going on (so every later call is exercised too).
FaultRun run_all_reduces(const SimOptions& options, int operations) {
  const auto size = static_cast<std::size_t>(options.world_size);
  FaultRun outcome;
  outcome.errors.assign(size, std::vector<CaughtError>(static_cast<std::size_t>(operations)));
  outcome.results.assign(size, {});
  outcome.report = sim::simulate(options, [&] {
    for (int i = 0; i < operations; ++i) {
      try {
        const std::vector<std::int32_t> sum =
            all_reduce(Tensor::full({2}, rank() + 1, DType::Int32), "sum", world())
                .to_vector<std::int32_t>();
        EXPECT_EQ(sum[0], sum[1]);
        outcome.results[rank_slot()].push_back(sum[0]);
      } catch (const Error& error) {
        outcome.errors[rank_slot()][static_cast<std::size_t>(i)] = testing::caught_error(error);
      }
    }
  });
  return outcome;
}

std::int32_t triangle(int world_size) { return world_size * (world_size + 1) / 2; }

// `caught` is `code`, raised on `rank` by all_reduce #`seq` of the world, its detail holding
// `fragment`.
void expect_caught(const CaughtError& caught, ErrorCode code, int rank, std::int64_t seq,
                   int world_size, const std::string& fragment) {
  ASSERT_TRUE(caught.code.has_value()) << "rank " << rank << " #" << seq << ": no error";
  EXPECT_EQ(*caught.code, code) << caught.what;
  EXPECT_EQ(caught.context.rank, rank) << caught.what;
  EXPECT_EQ(caught.context.op, "all_reduce") << caught.what;
  EXPECT_EQ(caught.context.seq, seq) << caught.what;
  EXPECT_EQ(caught.context.group, world_label(world_size)) << caught.what;
  EXPECT_TRUE(contains(caught.detail, fragment)) << caught.what << "\nlacks: " << fragment;
}

SimOptions options_for(int world_size, std::uint64_t seed, std::vector<Fault> faults) {
  SimOptions options = testing::quiet_options(world_size, seed);
  options.faults = std::move(faults);
  return options;
}

constexpr std::uint64_t kSeeds = 6;

class SimFault : public ::testing::TestWithParam<int> {};

TEST_P(SimFault, CrashKillsTheRankAndGivesEveryPeerRankFailure) {
  const int size = GetParam();
  const int victim = size - 1;
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const FaultRun outcome = run_all_reduces(options_for(size, seed, {Fault::crash(victim, 1)}), 3);
    const std::string crashed = "rank " + std::to_string(victim) +
                                " crashed (injected fault: crash at rank " +
                                std::to_string(victim) +
                                "'s operation 1, starting all_reduce #1 "
                                "on group " +
                                world_label(size) + ")";
    EXPECT_EQ(outcome.report.mark_count("fault.crash"), 1u);
    ASSERT_EQ(outcome.report.faults_fired, std::vector<Fault>{Fault::crash(victim, 1)});
    for (int r = 0; r < size; ++r) {
      const auto& errors = outcome.errors[static_cast<std::size_t>(r)];
      EXPECT_FALSE(errors[0].code.has_value()) << "operation 0 precedes the crash";
      EXPECT_EQ(outcome.results[static_cast<std::size_t>(r)],
                std::vector<std::int32_t>{triangle(size)});
      // The dead rank raises at the call, now and ever after; its peers, where they wait. A
      // call that raises at the transport took no sequence number (Note [Transport contract]):
      // the dead rank's next call is #1 again.
      expect_caught(errors[1], ErrorCode::RankFailure, r, 1, size, crashed);
      expect_caught(errors[2], ErrorCode::RankFailure, r, r == victim ? 1 : 2, size, crashed);
    }
  }
}

// Rank 0's operation 1 got an injected TransportError: on every member operation #0 succeeded,
// #1 failed with the transport error and #2 was aborted.
void expect_transport_error_at_op_1(const FaultRun& outcome, int size) {
  EXPECT_EQ(outcome.report.mark_count("fault.transport_error"), 1u);
  EXPECT_TRUE(outcome.report.ok()) << "every rank caught its errors";
  for (int r = 0; r < size; ++r) {
    const auto& errors = outcome.errors[static_cast<std::size_t>(r)];
    EXPECT_FALSE(errors[0].code.has_value());
    expect_caught(errors[1], ErrorCode::TransportError, r, 1, size,
                  "the transport reported a failure (injected fault: transport_error at rank "
                  "0's operation 1); the communicator is aborted");
    expect_caught(errors[2], ErrorCode::Aborted, r, 2, size,
                  "the communicator was aborted: operation #1 failed with a transport error");
  }
}

TEST_P(SimFault, TransportErrorFailsTheOperationOnEveryMemberThenAborts) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const FaultRun outcome =
        run_all_reduces(options_for(size, seed, {Fault::transport_error(0, 1)}), 3);
    expect_transport_error_at_op_1(outcome, size);
  }
}

// A TransportError listed before a Delay of the same operation fires first, then the Delay stalls
// its rank while the peers start that operation too (their starts find no fault). The error still
// marks the stalled rank's slot once it arrives: start keeps its fault to itself until its own
// faults are done (SimWorld::fire_start_faults).
TEST_P(SimFault, ATransportErrorFiredBeforeADelayStillFailsItsOperation) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const FaultRun outcome = run_all_reduces(
        options_for(size, seed, {Fault::transport_error(0, 1), Fault::delay(0, 1, 40)}), 3);
    expect_transport_error_at_op_1(outcome, size);
  }
}

TEST_P(SimFault, HangTimesOutEveryMemberInVirtualTime) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    // The default timeout (ten minutes) passes in virtual time: nothing else can run, so the
    // clock jumps to the first deadline.
    const FaultRun outcome =
        run_all_reduces(options_for(size, seed, {Fault::hang(size - 1, 0)}), 2);
    EXPECT_EQ(outcome.report.mark_count("fault.hang"), 1u);
    EXPECT_GE(outcome.report.mark_count("fault.time_skip"), 1u);
    EXPECT_GE(outcome.report.virtual_time, std::chrono::minutes(10));
    for (int r = 0; r < size; ++r) {
      const auto& errors = outcome.errors[static_cast<std::size_t>(r)];
      expect_caught(errors[0], ErrorCode::Timeout, r, 0, size,
                    "before the collective completed: it hung (injected fault: hang at rank " +
                        std::to_string(size - 1) +
                        "'s operation 0); the communicator is aborted, as a watchdog would");
      expect_caught(errors[1], ErrorCode::Aborted, r, 1, size,
                    "the communicator was aborted: operation #0 timed out");
    }
  }
}

// Every rank issues two all_reduces over the world and waits on the second, then on the first:
// what each wait raised, per rank.
struct TwoWaits {
  SimReport report;
  std::vector<CaughtError> first;
  std::vector<CaughtError> second;
};

TwoWaits wait_second_then_first(const SimOptions& options) {
  TwoWaits run;
  run.first.resize(static_cast<std::size_t>(options.world_size));
  run.second.resize(static_cast<std::size_t>(options.world_size));
  run.report = sim::simulate(options, [&] {
    Tensor first = all_reduce(Tensor::ones({1}), "sum", world());
    try {
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
    } catch (const Error& error) {
      run.second[rank_slot()] = testing::caught_error(error);
    }
    try {
      (void)first.item<float>();
    } catch (const Error& error) {
      run.first[rank_slot()] = testing::caught_error(error);
    }
  });
  return run;
}

TEST_P(SimFault, ATimeoutBehindAHangFailsTheHungOperationTooAndNamesIt) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    // Operation #0 hangs and nobody waits on it; the waits on #1 time out behind it. The
    // watchdog that aborts the communicator fails #0 as well, at the same deadline (not a second
    // timeout later), and the error of #1 says what held it up.
    const TwoWaits run = wait_second_then_first(options_for(size, seed, {Fault::hang(0, 0)}));
    const SimReport& report = run.report;
    const std::vector<CaughtError>& later = run.second;
    const std::vector<CaughtError>& hung = run.first;
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(report.mark_count("fault.hang"), 1u);
    EXPECT_GE(report.virtual_time, std::chrono::minutes(10));
    EXPECT_LT(report.virtual_time, std::chrono::minutes(11)) << "one timeout, not two";
    for (int r = 0; r < size; ++r) {
      const auto slot = static_cast<std::size_t>(r);
      expect_caught(later[slot], ErrorCode::Timeout, r, 1, size,
                    "before the collective completed, behind all_reduce #0, which hung "
                    "(injected fault: hang at rank 0's operation 0); the communicator is "
                    "aborted, as a watchdog would");
      expect_caught(hung[slot], ErrorCode::Timeout, r, 0, size,
                    "'s wait on all_reduce #1 passed its deadline");
      expect_caught(hung[slot], ErrorCode::Timeout, r, 0, size,
                    "before this collective completed: it hung (injected fault: hang at rank 0's "
                    "operation 0); the communicator is aborted, as a watchdog would");
    }
  }
}

// A waited operation that hung itself gives its own hang as the reason, not the hang of the one
// before it: the wait on #1 names only #1's hang, and #0 fails with its own.
TEST_P(SimFault, ATimeoutOfAHungOperationBehindAnotherHangNamesOnlyItsOwn) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const TwoWaits run =
        wait_second_then_first(options_for(size, seed, {Fault::hang(0, 0), Fault::hang(0, 1)}));
    const SimReport& report = run.report;
    const std::vector<CaughtError>& later = run.second;
    const std::vector<CaughtError>& hung = run.first;
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(report.mark_count("fault.hang"), 2u);
    for (int r = 0; r < size; ++r) {
      const auto slot = static_cast<std::size_t>(r);
      expect_caught(later[slot], ErrorCode::Timeout, r, 1, size,
                    " s) before the collective completed: it hung (injected fault: hang at rank "
                    "0's operation 1); the communicator is aborted, as a watchdog would");
      EXPECT_FALSE(contains(later[slot].detail, "behind")) << later[slot].what;
      expect_caught(hung[slot], ErrorCode::Timeout, r, 0, size,
                    "before this collective completed: it hung (injected fault: hang at rank 0's "
                    "operation 0); the communicator is aborted, as a watchdog would");
    }
  }
}

TEST_P(SimFault, HangWithoutADeadlineIsADeadlockNamingTheHang) {
  const int size = GetParam();
  SimOptions options = options_for(size, 0, {Fault::hang(0, 0)});
  options.timeout = std::chrono::nanoseconds::max();  // waits never time out
  const FaultRun outcome = run_all_reduces(options, 1);
  EXPECT_EQ(outcome.report.mark_count("fault.hang"), 1u);
  EXPECT_EQ(outcome.report.mark_count("fault.time_skip"), 0u);
  for (int r = 0; r < size; ++r) {
    expect_caught(outcome.errors[static_cast<std::size_t>(r)][0], ErrorCode::Deadlock, r, 0, size,
                  "it hung (injected fault: hang at rank 0's operation 0)");
  }
}

TEST_P(SimFault, ShortDelayOnlySlowsTheRank) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const FaultRun outcome =
        run_all_reduces(options_for(size, seed, {Fault::delay(1, 1, 1000)}), 3);
    EXPECT_EQ(outcome.report.mark_count("fault.delay"), 1u);
    EXPECT_GE(outcome.report.mark_count("fault.time_skip"), 1u) << "the others wait for rank 1";
    EXPECT_GE(outcome.report.virtual_time, std::chrono::microseconds(1000));
    EXPECT_TRUE(outcome.report.ok());
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(outcome.results[static_cast<std::size_t>(r)],
                std::vector<std::int32_t>(3, triangle(size)));
    }
  }
}

TEST_P(SimFault, DelayPastTheTimeoutGivesEveryRankTimeout) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    SimOptions options = options_for(size, seed, {Fault::delay(1, 0, 1000)});
    options.timeout = std::chrono::microseconds(50);
    const FaultRun outcome = run_all_reduces(options, 2);
    EXPECT_EQ(outcome.report.mark_count("fault.delay"), 1u);
    for (int r = 0; r < size; ++r) {
      const auto& errors = outcome.errors[static_cast<std::size_t>(r)];
      expect_caught(errors[0], ErrorCode::Timeout, r, 0, size,
                    "when rank(s) 1 had not joined it yet");
      expect_caught(errors[1], ErrorCode::Aborted, r, 1, size, "operation #0 timed out");
    }
  }
}

TEST_P(SimFault, CertainRandomCrashFiresAtTheFirstOperationAndReplaysAsAnExplicitFault) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    SimOptions options = options_for(size, seed, {});
    options.random_faults.crash_ppm = 1'000'000;  // the first operation started crashes
    const FaultRun outcome = run_all_reduces(options, 2);
    EXPECT_EQ(outcome.report.mark_count("fault.random"), 1u);
    EXPECT_EQ(outcome.report.mark_count("fault.crash"), 1u);
    ASSERT_EQ(outcome.report.faults_fired.size(), 1u);
    const Fault fired = outcome.report.faults_fired[0];
    EXPECT_EQ(fired.kind, Fault::Kind::Crash);
    EXPECT_EQ(fired.at_op, 0u);
    for (int r = 0; r < size; ++r) {
      expect_caught(outcome.errors[static_cast<std::size_t>(r)][0], ErrorCode::RankFailure, r, 0,
                    size, "rank " + std::to_string(fired.rank) + " crashed");
    }
    // The fired fault, given explicitly, does the same to every rank.
    const FaultRun pinned = run_all_reduces(options_for(size, seed, {fired}), 2);
    EXPECT_EQ(pinned.report.mark_count("fault.random"), 0u);
    EXPECT_EQ(pinned.report.faults_fired, outcome.report.faults_fired);
    EXPECT_EQ(pinned.report.rank_errors, outcome.report.rank_errors);
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(pinned.errors[static_cast<std::size_t>(r)][i].what,
                  outcome.errors[static_cast<std::size_t>(r)][i].what);
      }
    }
  }
}

// Certainty holds for every choice, 0 included (an all-0 list: a shrunk one, or past a list's
// end), and a total of a million reaches every kind's last part per million.
TEST_P(SimFault, CertainRandomFaultsFireUnderAnAllZeroList) {
  const int size = GetParam();
  SimOptions options = options_for(size, 0, {});
  options.random_faults.crash_ppm = 1'000'000;
  options.choices = std::vector<std::uint64_t>{};
  const FaultRun outcome = run_all_reduces(options, 2);
  EXPECT_EQ(outcome.report.mark_count("fault.crash"), 1u);

  SimOptions last_part = options_for(size, 0, {});
  last_part.random_faults.crash_ppm = 999'999;
  last_part.random_faults.delay_ppm = 1;
  last_part.choices = std::vector<std::uint64_t>{};  // choice 0: the last offset
  EXPECT_EQ(run_all_reduces(last_part, 2).report.mark_count("fault.delay"), 1u);
}

TEST_P(SimFault, LivenessViolationReportsTheStuckRanks) {
  // After a transport error every rank retries forever: each retry is Aborted at once, so the
  // program can never finish once the fault stopped.
  const int size = GetParam();
  SimOptions options = options_for(size, 3, {Fault::transport_error(0, 0)});
  options.liveness_steps = 200;
  std::vector<CaughtError> final_errors(static_cast<std::size_t>(size));
  std::vector<int> retries(static_cast<std::size_t>(size), 0);
  const SimReport report = sim::simulate(options, [&] {
    try {
      while (true) {
        try {
          (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
          return;
        } catch (const TransportError&) {
        } catch (const Aborted&) {
        }
        retries[rank_slot()] += 1;
      }
    } catch (const Error& error) {
      final_errors[rank_slot()] = testing::caught_error(error);
    }
  });
  EXPECT_EQ(report.mark_count("fault.transport_error"), 1u);
  EXPECT_EQ(report.mark_count("liveness.phase"), 1u);
  EXPECT_EQ(report.mark_count("liveness.violation"), 1u);
  EXPECT_EQ(report.stuck_ranks, testing::first_ranks(size));
  EXPECT_TRUE(
      contains(report.to_string(), "  injected fault: transport_error at rank 0's operation 0\n"))
      << report.to_string();
  EXPECT_TRUE(contains(report.to_string(), "  liveness violated by rank(s) 0 1"))
      << report.to_string();
  std::string stuck = "0";
  for (int r = 1; r < size; ++r) {
    stuck += ", " + std::to_string(r);
  }
  for (int r = 0; r < size; ++r) {
    const CaughtError& caught = final_errors[static_cast<std::size_t>(r)];
    ASSERT_TRUE(caught.code.has_value()) << "rank " << r;
    EXPECT_EQ(*caught.code, ErrorCode::Deadlock) << caught.what;
    EXPECT_EQ(caught.context.rank, r);
    EXPECT_EQ(caught.context.op, "all_reduce");
    EXPECT_EQ(caught.context.group, world_label(size));
    EXPECT_TRUE(contains(caught.detail, "liveness violated: rank(s) " + stuck +
                                            " did not finish within "
                                            "SimOptions::liveness_steps = 200 scheduling "
                                            "decisions once no fault could fire"))
        << caught.what;
    EXPECT_GT(retries[static_cast<std::size_t>(r)], 1);
  }
}

TEST_P(SimFault, LivenessHoldsWhenRanksGiveUpAfterAFault) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    SimOptions options = options_for(size, seed, {Fault::transport_error(0, 0)});
    options.liveness_steps = 200;
    const SimReport report = sim::simulate(options, [&] {
      for (int attempt = 0; attempt < 3; ++attempt) {
        try {
          (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
          return;
        } catch (const TransportError&) {
        } catch (const Aborted&) {
        }
      }
    });
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(report.mark_count("liveness.phase"), 1u);
    EXPECT_EQ(report.mark_count("liveness.violation"), 0u);
    EXPECT_TRUE(report.stuck_ranks.empty());
  }
}

TEST_P(SimFault, LivenessStartsOnlyOnceADelayedRankWoke) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    // Rank 0 is slow (400 steps) at its first operation; meanwhile its peers work alone for more
    // decisions than the liveness budget. A slow rank is not a stuck one.
    SimOptions options = options_for(size, seed, {Fault::delay(0, 0, 400)});
    options.liveness_steps = 30;
    std::vector<std::int32_t> sums(static_cast<std::size_t>(size));
    const SimReport report = sim::simulate(options, [&] {
      if (rank() != 0) {
        for (int i = 0; i < 20; ++i) {
          (void)all_reduce(Tensor::ones({1}), "sum", {rank()}).item<float>();
        }
      }
      sums[rank_slot()] =
          all_reduce(Tensor::full({1}, 1, DType::Int32), "sum", world()).item<std::int32_t>();
    });
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(report.mark_count("fault.delay"), 1u);
    EXPECT_EQ(report.mark_count("liveness.phase"), 1u);
    EXPECT_EQ(report.mark_count("liveness.violation"), 0u);
    EXPECT_EQ(sums, std::vector<std::int32_t>(static_cast<std::size_t>(size), size));
  }
}

TEST_P(SimFault, LivenessStartsOnlyOnceAHungOperationTimedOut) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    // Rank 0's first world all_reduce hangs until the waits on it time out (400 us); meanwhile
    // its peers work alone for more decisions than the liveness budget. Ranks held up by a hang
    // that has not timed out yet are not stuck: every rank ends with the hang's Timeout.
    SimOptions options = options_for(size, seed, {Fault::hang(0, 0)});
    options.timeout = std::chrono::microseconds(400);
    options.liveness_steps = 30;
    std::vector<CaughtError> errors(static_cast<std::size_t>(size));
    const SimReport report = sim::simulate(options, [&] {
      if (rank() != 0) {
        for (int i = 0; i < 20; ++i) {
          (void)all_reduce(Tensor::ones({1}), "sum", {rank()}).item<float>();
        }
      }
      try {
        (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
      } catch (const Error& error) {
        errors[rank_slot()] = testing::caught_error(error);
      }
    });
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(report.mark_count("fault.hang"), 1u);
    EXPECT_EQ(report.mark_count("liveness.phase"), 1u);
    EXPECT_EQ(report.mark_count("liveness.violation"), 0u);
    EXPECT_TRUE(report.stuck_ranks.empty());
    for (int r = 0; r < size; ++r) {
      expect_caught(errors[static_cast<std::size_t>(r)], ErrorCode::Timeout, r, 0, size,
                    "it hung (injected fault: hang at rank 0's operation 0)");
    }
  }
}

TEST_P(SimFault, ACrashAtTheSameOperationPreemptsItsHangAndReportsOnlyWhatHappened) {
  const int size = GetParam();
  SimOptions options = options_for(size, 0, {Fault::hang(1, 0), Fault::crash(1, 0)});
  const SimReport report = sim::simulate(options, [] {
    try {
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
    } catch (const RankFailure&) {
    }
  });
  EXPECT_EQ(report.faults_fired, std::vector<Fault>{Fault::crash(1, 0)});
  EXPECT_EQ(report.mark_count("fault.crash"), 1u);
  EXPECT_EQ(report.mark_count("fault.hang"), 0u);
}

TEST_P(SimFault, AHangAtTheSameOperationPreemptsItsTransportErrorAndReportsOnlyWhatHappened) {
  const int size = GetParam();
  for (const auto& faults : {std::vector<Fault>{Fault::hang(1, 0), Fault::transport_error(1, 0)},
                             std::vector<Fault>{Fault::transport_error(1, 0), Fault::hang(1, 0)}}) {
    // The operation never completes, so no transport error is raised where it would have.
    const FaultRun outcome = run_all_reduces(options_for(size, 0, faults), 1);
    EXPECT_EQ(outcome.report.faults_fired, std::vector<Fault>{Fault::hang(1, 0)});
    EXPECT_EQ(outcome.report.mark_count("fault.hang"), 1u);
    EXPECT_EQ(outcome.report.mark_count("fault.transport_error"), 0u);
    for (int r = 0; r < size; ++r) {
      expect_caught(outcome.errors[static_cast<std::size_t>(r)][0], ErrorCode::Timeout, r, 0, size,
                    "it hung (injected fault: hang at rank 1's operation 0)");
    }
  }
}

// Between the members of one collective the same precedence holds, whichever arrives first: a
// rank's Hang replaces another rank's TransportError (withdrawn from the marks and the report),
// so the operation hangs on every seed. (They used to each mark the slot, the last arrival's
// winning, and both were reported as fired.)
TEST_P(SimFault, AHangOfOneMemberPreemptsAnotherMembersTransportErrorInEitherArrivalOrder) {
  const int size = GetParam();
  int hang_arrived_first = 0;
  int error_arrived_first = 0;
  for (std::uint64_t seed = 0; seed < 3 * kSeeds; ++seed) {
    SimOptions options = options_for(size, seed, {Fault::hang(0, 0), Fault::transport_error(1, 0)});
    options.record_events = true;
    const FaultRun outcome = run_all_reduces(options, 1);
    EXPECT_EQ(outcome.report.faults_fired, std::vector<Fault>{Fault::hang(0, 0)}) << seed;
    EXPECT_EQ(outcome.report.mark_count("fault.hang"), 1u) << seed;
    EXPECT_EQ(outcome.report.mark_count("fault.transport_error"), 0u) << seed;
    for (int r = 0; r < size; ++r) {
      expect_caught(outcome.errors[static_cast<std::size_t>(r)][0], ErrorCode::Timeout, r, 0, size,
                    "it hung (injected fault: hang at rank 0's operation 0)");
    }
    for (const sim::SimEvent& event : outcome.report.events) {
      if (event.kind == sim::SimEvent::Kind::Arrive && (event.rank == 0 || event.rank == 1)) {
        (event.rank == 0 ? hang_arrived_first : error_arrived_first) += 1;
        break;
      }
    }
  }
  // Both orders were exercised.
  EXPECT_GT(hang_arrived_first, 0);
  EXPECT_GT(error_arrived_first, 0);
}

// Of two members' faults of one kind on one collective the first to arrive acts and is reported;
// the other is not.
TEST_P(SimFault, OfTwoMembersTransportErrorsOnOneCollectiveOnlyTheFirstIsReported) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    SimOptions options =
        options_for(size, seed, {Fault::transport_error(0, 0), Fault::transport_error(1, 0)});
    const FaultRun outcome = run_all_reduces(options, 1);
    ASSERT_EQ(outcome.report.faults_fired.size(), 1u) << seed;
    const Fault fired = outcome.report.faults_fired[0];
    EXPECT_EQ(outcome.report.mark_count("fault.transport_error"), 1u) << seed;
    for (int r = 0; r < size; ++r) {
      expect_caught(outcome.errors[static_cast<std::size_t>(r)][0], ErrorCode::TransportError, r, 0,
                    size, "injected fault: " + fired.to_string());
    }
  }
}

// A fault that lands on an operation failing at once never acts, so it is not reported: after a
// transport error aborts the world's communicator, rank 1's second all_reduce is Aborted on
// arrival, and the hang planned for it does not happen.
TEST_P(SimFault, AFaultOnAnOperationThatFailsAtOnceIsNotReported) {
  const int size = GetParam();
  const FaultRun outcome =
      run_all_reduces(options_for(size, 0, {Fault::transport_error(0, 0), Fault::hang(1, 1)}), 2);
  EXPECT_EQ(outcome.report.faults_fired, std::vector<Fault>{Fault::transport_error(0, 0)});
  EXPECT_EQ(outcome.report.mark_count("fault.hang"), 0u);
  for (int r = 0; r < size; ++r) {
    expect_caught(outcome.errors[static_cast<std::size_t>(r)][1], ErrorCode::Aborted, r, 1, size,
                  "the communicator was aborted");
  }
}

// A fault whose operation fails for another reason first never acts and is withdrawn, whichever
// member arrives first: rank 1's crash fails the all_reduce rank 0's transport error was planned
// for, and a mismatching member fails the one rank 0's hang was planned for. (A fault marked on
// the operation before the other member came used to stay reported.)
TEST(SimFaultPrecedence, AFaultWhoseOperationFailsForAnotherReasonIsWithdrawn) {
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const FaultRun crashed = run_all_reduces(
        options_for(2, seed, {Fault::crash(1, 0), Fault::transport_error(0, 0)}), 1);
    EXPECT_EQ(crashed.report.faults_fired, std::vector<Fault>{Fault::crash(1, 0)}) << seed;
    EXPECT_EQ(crashed.report.mark_count("fault.transport_error"), 0u) << seed;
    expect_caught(crashed.errors[0][0], ErrorCode::RankFailure, 0, 0, 2, "rank 1 crashed");

    std::vector<std::optional<ErrorCode>> codes(2);
    const SimReport mismatched = sim::simulate(options_for(2, seed, {Fault::hang(0, 0)}), [&] {
      try {
        (void)wait_tensor(all_reduce(Tensor::ones({rank() + 1}), "sum", world()));
      } catch (const Error& error) {
        codes[rank_slot()] = error.code();
      }
    });
    EXPECT_EQ(mismatched.faults_fired, std::vector<Fault>{}) << seed;
    EXPECT_EQ(mismatched.mark_count("fault.hang"), 0u) << seed;
    EXPECT_EQ(codes, (std::vector<std::optional<ErrorCode>>(2, ErrorCode::CollectiveMismatch)))
        << seed;
  }
}

// The random window covers the operations started while decisions 0 .. until_step - 1 run: with
// until_step = 1, the first operation (started in decision 0) still draws (it used to count
// decision 0 as decision 1, so until_step = 1 drew nothing), and only it, even with room for more
// faults (docs/simulator-faults.md: "with 1, only the first decision's"). The rank crashed in
// decision 0 ends there; the others start their operation later.
TEST_P(SimFault, RandomFaultsUntilStepOneCoverTheFirstDecisionOnly) {
  const int size = GetParam();
  for (const std::uint64_t max_faults : {std::uint64_t{1}, static_cast<std::uint64_t>(size)}) {
    for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
      SimOptions options = options_for(size, seed, {});
      options.random_faults.crash_ppm = 1'000'000;
      options.random_faults.until_step = 1;
      options.random_faults.max_faults = max_faults;
      const FaultRun outcome = run_all_reduces(options, 1);
      EXPECT_EQ(outcome.report.mark_count("fault.crash"), 1u) << seed << " " << max_faults;
      EXPECT_EQ(outcome.report.mark_count("fault.random"), 1u) << seed << " " << max_faults;
      ASSERT_EQ(outcome.report.faults_fired.size(), 1u) << seed << " " << max_faults;
      EXPECT_EQ(outcome.report.faults_fired[0],
                Fault::crash(outcome.report.schedule.front().rank, 0))
          << seed << " " << max_faults;
    }
  }
}

// No random fault is drawn at an operation where an explicit one fires (docs/simulator-faults.md,
// "Random faults"): with a certain random crash, every rank's only operation has its explicit
// delay, so nothing else fires and every rank gets the sum.
TEST_P(SimFault, AnExplicitFaultLeavesNoRoomForARandomOneAtItsOperation) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    std::vector<Fault> delays;
    for (int r = 0; r < size; ++r) {
      delays.push_back(Fault::delay(r, 0, 1));
    }
    SimOptions options = options_for(size, seed, delays);
    options.random_faults.crash_ppm = 1'000'000;
    const FaultRun outcome = run_all_reduces(options, 1);
    EXPECT_EQ(outcome.report.mark_count("fault.delay"), static_cast<std::uint64_t>(size)) << seed;
    EXPECT_EQ(outcome.report.mark_count("fault.crash"), 0u) << seed;
    EXPECT_EQ(outcome.report.mark_count("fault.random"), 0u) << seed;
    EXPECT_EQ(outcome.report.faults_fired.size(), static_cast<std::size_t>(size)) << seed;
    EXPECT_TRUE(outcome.report.ok()) << outcome.report.to_string();
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(outcome.results[static_cast<std::size_t>(r)],
                std::vector<std::int32_t>{triangle(size)})
          << seed;
    }
  }
}

// liveness_steps = N allows N decisions once the phase began (without faults: at decision 0), and
// no more: a run of exactly N decisions ends well, and with N - 1 its ranks are reported stuck.
TEST_P(SimFault, LivenessStepsAllowExactlyThatManyDecisions) {
  const int size = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    const FaultRun plain = run_all_reduces(options_for(size, seed, {}), 2);
    ASSERT_TRUE(plain.report.ok()) << plain.report.to_string();
    SimOptions exact = options_for(size, seed, {});
    exact.liveness_steps = plain.report.steps;
    const FaultRun enough = run_all_reduces(exact, 2);
    EXPECT_TRUE(enough.report.ok()) << enough.report.to_string();
    EXPECT_EQ(enough.report.mark_count("liveness.phase"), 1u) << seed;
    EXPECT_EQ(enough.report.mark_count("liveness.violation"), 0u) << seed;
    SimOptions short_by_one = options_for(size, seed, {});
    short_by_one.liveness_steps = plain.report.steps - 1;
    const FaultRun over = run_all_reduces(short_by_one, 2);
    EXPECT_EQ(over.report.mark_count("liveness.violation"), 1u) << seed;
    EXPECT_FALSE(over.report.stuck_ranks.empty()) << seed;
  }
}

// The violation names the decision its phase began at: without faults, decision 0 (not the
// decision that found it).
TEST(SimFaultLiveness, AViolationNamesTheDecisionItsPhaseBeganAt) {
  SimOptions options = options_for(2, 0, {});
  options.liveness_steps = 10;
  std::vector<CaughtError> errors(2);
  // Far more collectives than 10 decisions allow: the liveness check ends the loop, or the test
  // fails below instead of hanging.
  constexpr int kCollectivesMax = 1000;
  const SimReport report = sim::simulate(options, [&] {
    try {
      for (int i = 0; i < kCollectivesMax; ++i) {
        (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
      }
    } catch (const Error& error) {
      errors[rank_slot()] = testing::caught_error(error);
    }
  });
  EXPECT_EQ(report.mark_count("liveness.violation"), 1u);
  for (const CaughtError& caught : errors) {
    ASSERT_TRUE(caught.code.has_value());
    EXPECT_EQ(*caught.code, ErrorCode::Deadlock) << caught.what;
    EXPECT_TRUE(contains(caught.detail,
                         "liveness violated: rank(s) 0, 1 did not finish within "
                         "SimOptions::liveness_steps = 10 scheduling decisions once no fault "
                         "could fire (from decision 0)"))
        << caught.what;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SimFault, ::testing::Values(2, 4), testing::world_name);

TEST(SimFaultCrash, RanksOutsideTheDeadRanksGroupsGoOn) {
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    std::vector<std::vector<std::int32_t>> results(4);
    std::vector<std::vector<CaughtError>> errors(4);
    SimOptions options = options_for(4, seed, {Fault::crash(3, 0)});
    options.liveness_steps = 100;
    const SimReport report = sim::simulate(options, [&] {
      const std::vector<int> pair = rank() < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
      for (int i = 0; i < 2; ++i) {
        try {
          results[rank_slot()].push_back(
              all_reduce(Tensor::full({1}, rank() + 1, DType::Int32), "sum", pair)
                  .item<std::int32_t>());
        } catch (const Error& error) {
          errors[rank_slot()].push_back(testing::caught_error(error));
        }
      }
    });
    EXPECT_EQ(report.mark_count("fault.crash"), 1u);
    EXPECT_EQ(report.mark_count("liveness.violation"), 0u);
    EXPECT_EQ(results[0], (std::vector<std::int32_t>{3, 3}));
    EXPECT_EQ(results[1], (std::vector<std::int32_t>{3, 3}));
    EXPECT_TRUE(errors[0].empty());
    EXPECT_TRUE(errors[1].empty());
    for (std::size_t r : {2u, 3u}) {
      EXPECT_TRUE(results[r].empty());
      ASSERT_EQ(errors[r].size(), 2u);
      for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(errors[r][i].code, ErrorCode::RankFailure) << errors[r][i].what;
        // The dead rank's calls raise at the transport and take no number: both are #0
        // (Note [Transport contract]); its peer's wait the operations #0 and #1.
        EXPECT_EQ(errors[r][i].context.seq, r == 3 ? 0 : static_cast<std::int64_t>(i));
        EXPECT_EQ(errors[r][i].context.group, "[2, 3]");
        EXPECT_TRUE(contains(errors[r][i].detail, "rank 3 crashed")) << errors[r][i].what;
      }
    }
  }
}

TEST(SimFaultRandom, EveryRunEndsWithFaultErrorsOnlyAndEveryKindFires) {
  // A quarter of a chance of each kind at every operation, one fault per run: over the seeds
  // every kind fires, and every rank of every run ends with no error or a fault's error.
  const std::set<ErrorCode> fault_codes = {ErrorCode::RankFailure, ErrorCode::TransportError,
                                           ErrorCode::Timeout, ErrorCode::Aborted};
  std::map<std::string, std::uint64_t> kinds;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    SimOptions options = testing::quiet_options(3, seed);
    options.random_faults.crash_ppm = 50'000;
    options.random_faults.transport_error_ppm = 50'000;
    options.random_faults.hang_ppm = 50'000;
    options.random_faults.delay_ppm = 50'000;
    options.random_faults.delay_steps_max = 20;
    const FaultRun outcome = run_all_reduces(options, 4);
    EXPECT_LE(outcome.report.faults_fired.size(), 1u);
    for (const char* kind : {"fault.crash", "fault.transport_error", "fault.hang", "fault.delay"}) {
      kinds[kind] += outcome.report.mark_count(kind);
    }
    for (const auto& errors : outcome.errors) {
      for (const CaughtError& caught : errors) {
        if (caught.code) {
          EXPECT_TRUE(fault_codes.count(*caught.code) != 0)
              << "seed " << seed << ": " << caught.what;
        }
      }
    }
  }
  for (const auto& [kind, count] : kinds) {
    EXPECT_GE(count, 1u) << kind << " never fired";
  }
  EXPECT_EQ(kinds.size(), 4u);
}

TEST(SimFaultRandom, ReplayingTheChoicesReproducesTheFaults) {
  SimOptions options = testing::quiet_options(3, 11);
  options.random_faults.transport_error_ppm = 200'000;
  options.random_faults.delay_ppm = 200'000;
  options.random_faults.max_faults = 3;
  const FaultRun original = run_all_reduces(options, 4);
  ASSERT_FALSE(original.report.faults_fired.empty()) << "seed 11 draws some fault";
  SimOptions replay = options;
  replay.choices = original.report.choices;
  const FaultRun replayed = run_all_reduces(replay, 4);
  EXPECT_EQ(replayed.report.faults_fired, original.report.faults_fired);
  EXPECT_EQ(replayed.report.schedule_hash, original.report.schedule_hash);
  EXPECT_EQ(replayed.results, original.results);
}

TEST(SimFaultRandom, ChoiceZeroIsNoFault) {
  // A shrunk choice list is all zeros past its end: it draws no fault.
  SimOptions options = testing::quiet_options(2, 0);
  options.random_faults.transport_error_ppm = 999'999;
  options.choices = std::vector<std::uint64_t>{};
  const FaultRun outcome = run_all_reduces(options, 2);
  EXPECT_TRUE(outcome.report.faults_fired.empty());
  EXPECT_EQ(outcome.report.mark_count("fault.random"), 0u);
  EXPECT_EQ(outcome.results, (std::vector<std::vector<std::int32_t>>{{3, 3}, {3, 3}}));
}

TEST(SimFaultRandom, DisabledRandomFaultsDrawNoChoice) {
  const FaultRun plain = run_all_reduces(testing::quiet_options(3, 5), 3);
  SimOptions options = testing::quiet_options(3, 5);
  options.random_faults.max_faults = 0;  // not enabled although a kind has a probability
  options.random_faults.crash_ppm = 1'000'000;
  const FaultRun disabled = run_all_reduces(options, 3);
  EXPECT_EQ(disabled.report.choices, plain.report.choices);
  EXPECT_TRUE(disabled.report.faults_fired.empty());
}

TEST(SimFaultPlan, TheDocumentedUsageRuns) {
  // docs/simulator-faults.md, "Usage".
  SimOptions options = testing::quiet_options(4);
  options.faults = {Fault::crash(3, 0), Fault::delay(0, 0, 500)};
  options.random_faults.transport_error_ppm = 10'000;
  options.random_faults.until_step = 1'000;
  options.liveness_steps = 10'000;
  const SimReport report = sim::simulate(options, [] {
    try {
      auto sum = all_reduce(Tensor::ones({4}), "sum", world());
      (void)sum.to_vector<float>();
    } catch (const RankFailure&) {
    } catch (const TransportError&) {
    }
  });
  EXPECT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(report.mark_count("fault.crash"), 1u);
  EXPECT_EQ(report.mark_count("fault.delay"), 1u);
  EXPECT_EQ(report.mark_count("liveness.violation"), 0u);
  EXPECT_GE(report.virtual_time, std::chrono::microseconds(500));
}

TEST(SimFaultPlan, InvalidPlansAreRejected) {
  const auto run_with = [](SimOptions options) {
    return [options] { (void)sim::simulate(options, [] {}); };
  };
  SimOptions outside = testing::quiet_options(2);
  outside.faults = {Fault::crash(2, 0)};
  testing::expect_invalid_argument(run_with(outside),
                                   {"fault 'crash at rank 2's operation 0' names rank 2, outside "
                                    "the world of 2 ranks"});
  SimOptions no_delay = testing::quiet_options(2);
  no_delay.faults = {Fault::delay(0, 0, 0)};
  testing::expect_invalid_argument(run_with(no_delay), {"delays by 0 steps"});
  SimOptions long_delay = testing::quiet_options(2);
  long_delay.faults = {Fault::delay(0, 0, sim::kDelayStepsMax + 1)};
  testing::expect_invalid_argument(run_with(long_delay), {"delays by more than kDelayStepsMax"});
  SimOptions long_random = testing::quiet_options(2);
  long_random.random_faults.delay_ppm = 1;
  long_random.random_faults.delay_steps_max = sim::kDelayStepsMax + 1;
  testing::expect_invalid_argument(run_with(long_random), {"is above kDelayStepsMax"});
  SimOptions too_likely = testing::quiet_options(2);
  too_likely.random_faults.crash_ppm = 600'000;
  too_likely.random_faults.hang_ppm = 600'000;
  testing::expect_invalid_argument(run_with(too_likely),
                                   {"random fault probabilities add up to 1200000 ppm"});
}

}  // namespace
}  // namespace chorus
