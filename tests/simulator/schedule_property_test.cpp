// RapidCheck drives the decision stream (chorus/sim/rapidcheck.hpp): generated choice lists find
// a planted ordering bug, RapidCheck's shrinking reduces it to its hand-minimal schedule with a
// replay token that reproduces it, and a correct program holds under 100 generated schedules
// (and reduction orders). ctest fixes RapidCheck's seed with RC_PARAMS (tests/CMakeLists.txt);
// check_schedules takes its seed as an argument.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <chorus/sim/rapidcheck.hpp>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/planted_bugs.hpp"
#include "support/scoped_environment.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using sim::SimOptions;
using sim::SimReport;

constexpr std::uint64_t kRapidCheckSeed = 20261201;

// Three ranks; integer all_reduce and reduce_scatter (exact in any order), each rank checking
// its own results. Its reductions take their order from the decision stream too.
SimOptions correct_program_options() {
  SimOptions options = testing::quiet_options(3);
  options.reduction_order = sim::ReductionOrder::Adversarial;
  return options;
}

void correct_program() {
  const std::int64_t r = rank();
  const Tensor summed =
      all_reduce(Tensor::full({3}, static_cast<double>(r + 1), DType::Int64), "sum", world());
  const Tensor scattered =
      reduce_scatter_tensor(Tensor::arange(3, DType::Int64), "max", 0, world());
  if (summed.to_vector<std::int64_t>() != std::vector<std::int64_t>{6, 6, 6} ||
      scattered.item<std::int64_t>() != r) {
    throw std::runtime_error("wrong reduction result");
  }
}

TEST(ScheduleProperties, RapidCheckFindsAPlantedOrderBugAndShrinksItToItsMinimalSchedule) {
  testing::FirstTickBug bug;
  const SimOptions options = testing::quiet_options(2);
  const sim::ScheduleCheck check =
      sim::check_schedules(options, bug.program(), 100, kRapidCheckSeed);
  ASSERT_FALSE(check.passed);
  // Hand-minimal: {1} (rank 1 runs first). Allowed: one step more.
  EXPECT_LE(check.choices.size(), 2u) << check.message;
  EXPECT_EQ(check.choices, (std::vector<std::uint64_t>{1})) << check.message;
  EXPECT_NE(check.message.find("rank 1: planted bug: rank 1 ticked first"), std::string::npos)
      << check.message;
  // quiet_options do not read the environment, so the message gives the token for
  // SimOptions::replay rather than a CHORUS_SIM_REPLAY command that would not replay.
  EXPECT_NE(check.message.find("replay token (SimOptions::replay): " + check.replay_token),
            std::string::npos)
      << check.message;
  EXPECT_EQ(check.message.find("CHORUS_SIM_REPLAY="), std::string::npos) << check.message;
  EXPECT_NE(check.message.find("rank 1 failed: planted bug"), std::string::npos)  // the timeline
      << check.message;
  // Its token replays the failure.
  SimOptions replay = testing::quiet_options(2);
  replay.replay = check.replay_token;
  const SimReport replayed = sim::simulate(replay, bug.program());
  EXPECT_FALSE(replayed.ok());
  EXPECT_EQ(replayed.rank_errors[1], "planted bug: rank 1 ticked first");
}

TEST(ScheduleProperties, RapidCheckShrinksAFailingReductionOrderToTheChoicesItNeeds) {
  // The program assumes the rank-order sum of {1, 1e8, -1e8, 1}, which is 1; pairwise it is 0.
  SimOptions options = testing::quiet_options(4);
  options.reduction_order = sim::ReductionOrder::Adversarial;
  const auto assumes_rank_order = [] {
    const float values[] = {1.0f, 1e8f, -1e8f, 1.0f};
    const float sum =
        all_reduce(Tensor::full({1}, values[testing::rank_slot()]), "sum", world()).item<float>();
    if (sum != 1.0f) {
      throw std::runtime_error("the sum was not the rank-order sum");
    }
  };
  const sim::ScheduleCheck check =
      sim::check_schedules(options, assumes_rank_order, 100, kRapidCheckSeed);
  ASSERT_FALSE(check.passed);
  // Shrunk as far as RapidCheck's shrinks go: no trailing 0 (removing it changes nothing), and
  // every nonzero choice is needed: with it 0 the program passes. The list holds the schedule
  // up to the completion, then the order choices (n - 1 picks, n - 1 splits).
  ASSERT_FALSE(check.choices.empty());
  EXPECT_NE(check.choices.back(), 0u) << check.message;
  for (std::size_t i = 0; i < check.choices.size(); ++i) {
    if (check.choices[i] != 0) {
      SimOptions zeroed = options;
      zeroed.choices = check.choices;
      (*zeroed.choices)[i] = 0;
      EXPECT_TRUE(sim::simulate(zeroed, assumes_rank_order).ok()) << "choice " << i;
    }
  }
  SimOptions replay = testing::quiet_options(4);
  replay.reduction_order = sim::ReductionOrder::Adversarial;
  replay.replay = check.replay_token;
  const SimReport replayed = sim::simulate(replay, assumes_rank_order);
  EXPECT_FALSE(replayed.ok());
  EXPECT_EQ(replayed.mark_count("reduction.adversarial"), 1u);
}

TEST(ScheduleProperties, TheReplayCommandOfAFailureReplaysItInsteadOfTheGeneratedLists) {
  // The message's replay line sets CHORUS_SIM_REPLAY; with it set, the schedule check follows
  // the token (it used to ignore the environment and draw fresh lists, so the printed command
  // did not replay anything).
  testing::FirstTickBug bug;
  SimOptions options = testing::quiet_options(2);
  const sim::ScheduleCheck found =
      sim::check_schedules(options, bug.program(), 100, kRapidCheckSeed);
  ASSERT_FALSE(found.passed);
  ASSERT_FALSE(found.replay_token.empty());
  testing::FirstTickBug fresh;
  ASSERT_TRUE(sim::check_schedules(options, fresh.program(), 1, kRapidCheckSeed).passed)
      << "the first generated list misses the bug";

  options.seed_from_environment = true;  // as sim::run's default
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_REPLAY", found.replay_token}});
  testing::FirstTickBug replayed_bug;
  const sim::ScheduleCheck replayed =
      sim::check_schedules(options, replayed_bug.program(), 1, kRapidCheckSeed);
  EXPECT_FALSE(replayed.passed);
  EXPECT_EQ(replayed.replay_token, found.replay_token);
  EXPECT_TRUE(replayed.choices.empty()) << "the run followed the token, not a generated list";
  EXPECT_NE(replayed.message.find("replay: CHORUS_SIM_REPLAY=" + found.replay_token),
            std::string::npos)
      << replayed.message;
  EXPECT_NE(replayed.message.find("rank 1: planted bug: rank 1 ticked first"), std::string::npos)
      << replayed.message;
}

TEST(ScheduleProperties, TheReplayCommandOfAFailureRerunsTheCommandLineItIsGiven) {
  // The replay line reruns the command line the options give (SimOptions::command_without_replay),
  // as sim::run's replay command does, not this process's.
  testing::FirstTickBug bug;
  SimOptions options = testing::quiet_options(2);
  options.seed_from_environment = true;
  options.command_without_replay = {"prog", "--steps=3"};
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_REPLAY", std::nullopt}});
  const sim::ScheduleCheck check =
      sim::check_schedules(options, bug.program(), 100, kRapidCheckSeed);
  ASSERT_FALSE(check.passed);
  ASSERT_FALSE(check.replay_token.empty());
  EXPECT_NE(
      check.message.find("replay: CHORUS_SIM_REPLAY=" + check.replay_token + " prog --steps=3\n"),
      std::string::npos)
      << check.message;
}

TEST(ScheduleProperties, GeneratedIndicesReachEveryOptionOfEightRunnableRanksAndACollective) {
  // Eight runnable ranks and one ready collective are nine options, the collective last: an
  // index of 8 or more must be generated, or a completion while every rank still runs is never
  // tried (the old bound was 7).
  const rc::Gen<std::vector<std::uint64_t>> gen = sim::gen_choices();
  std::uint64_t largest = 0;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    for (const std::uint64_t choice : gen(rc::Random(seed), 100).value()) {
      largest = std::max(largest, choice);
    }
  }
  EXPECT_GE(largest, 8u);
  EXPECT_LE(largest, sim::kGeneratedChoiceIndexMax);
}

// Random faults are one choice among a million, firing on indices 1 to the kinds' total ppm:
// generated lists reach them (their indices used to stay below 2048, where the fault range
// began at 10^6 - total, so check_schedules tested without faults), and every kind in turn.
TEST(ScheduleProperties, CheckSchedulesWithRandomFaultsInjectsThem) {
  SimOptions options = testing::quiet_options(2);
  options.random_faults.crash_ppm = 500'000;
  const auto eight_all_reduces = [] {
    for (int i = 0; i < 8; ++i) {
      (void)all_reduce(Tensor::ones({4}), "sum", world()).to_vector<float>();
    }
  };
  const sim::ScheduleCheck check =
      sim::check_schedules(options, eight_all_reduces, 100, kRapidCheckSeed);
  ASSERT_FALSE(check.passed);
  SimOptions replay = testing::quiet_options(2);
  replay.random_faults = options.random_faults;
  replay.replay = check.replay_token;
  const SimReport replayed = sim::simulate(replay, eight_all_reduces);
  EXPECT_FALSE(replayed.ok());
  EXPECT_EQ(replayed.mark_count("fault.random"), 1u);
  EXPECT_EQ(replayed.mark_count("fault.crash"), 1u);

  // The second kind's range starts half a million up: lists generated for faults reach it.
  SimOptions both = testing::quiet_options(2);
  both.random_faults.crash_ppm = 500'000;
  both.random_faults.transport_error_ppm = 500'000;
  const rc::Gen<std::vector<std::uint64_t>> gen =
      sim::gen_choices(sim::kGeneratedChoiceLengthMax, sim::kGeneratedFaultChoiceIndexMax);
  std::uint64_t crashes = 0;
  std::uint64_t transport_errors = 0;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    both.choices = gen(rc::Random(seed), 100).value();
    const SimReport report = sim::simulate(both, eight_all_reduces);
    crashes += report.mark_count("fault.crash");
    transport_errors += report.mark_count("fault.transport_error");
  }
  EXPECT_GT(crashes, 0u);
  EXPECT_GT(transport_errors, 0u);
}

TEST(ScheduleProperties, CheckSchedulesPassesACorrectProgram) {
  const sim::ScheduleCheck check =
      sim::check_schedules(correct_program_options(), correct_program, 100, kRapidCheckSeed);
  EXPECT_TRUE(check.passed) << check.message;
  EXPECT_EQ(check.schedules_passed, 100);
  EXPECT_TRUE(check.choices.empty());
}

RC_GTEST_PROP(ScheduleProperties, GeneratedChoicesAreSmallIndicesWithinTheLength, ()) {
  const std::vector<std::uint64_t> choices = *sim::gen_choices(5, 2);
  RC_ASSERT(choices.size() <= 5u);
  for (const std::uint64_t choice : choices) {
    RC_ASSERT(choice <= 2u);
  }
}

// The property helper inside a RapidCheck property: 100 schedules by default.
RC_GTEST_PROP(ScheduleProperties, ACorrectProgramHoldsUnderGeneratedSchedulesAndOrders, ()) {
  const SimReport report =
      sim::check_schedule(correct_program_options(), *sim::gen_choices(), correct_program);
  RC_ASSERT(report.mark_count("reduction.adversarial") == 2u);
}

}  // namespace
}  // namespace chorus
