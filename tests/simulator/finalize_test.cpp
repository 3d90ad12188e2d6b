// When a dropped result is finalized, as a choice of the decision stream
// (SimOptions::choose_finalization, Note [Finalization choice] in simulator/src/world.hpp;
// Note [Work lifecycle], step 3, in core/src/detail/work_registry.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "detail/rank_state.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using sim::SimEvent;
using sim::SimOptions;
using sim::SimReport;

constexpr int kWorldSize = 3;

SimOptions choosing(std::uint64_t seed) {
  SimOptions options = testing::quiet_options(kWorldSize, seed);
  options.choose_finalization = true;
  return options;
}

// Works registered on the calling rank, without settling deferred drops (work_registry_size
// would finalize them): 1 right after a drop that was deferred, 0 after one finalized at once.
std::size_t registered_works() { return RankContext::current()->state().registry()->size(); }

Tensor rank_tensor() { return Tensor::from_vector(std::vector<std::int32_t>{rank(), rank() + 1}); }

// What a rank of drop_then_reduce saw.
struct Observed {
  std::size_t registered_after_drop = 0;
  std::vector<std::int32_t> result;
};

// The line of the dropped all_reduce below, for the report check.
constexpr int kDroppedLine = __LINE__ + 5;
// Drops all_reduce #0 un-waited, then waits all_reduce #1 (whose call settles a deferred drop).
auto drop_then_reduce(std::vector<Observed>& observed) {
  return [&observed] {
    Observed& mine = observed[testing::rank_slot()];
    { Tensor dropped = all_reduce(rank_tensor(), "sum", world()); }
    mine.registered_after_drop = registered_works();
    mine.result = wait_tensor(all_reduce(rank_tensor(), "sum", world())).to_vector<std::int32_t>();
  };
}

// Checks what every rank of a run of drop_then_reduce saw and reported, and the marks of the
// finalization choices (none when not `chosen`); returns how many of the ranks' drops were
// deferred.
std::uint64_t expect_drop_then_reduce_right(const SimReport& report,
                                            const std::vector<Observed>& observed,
                                            bool chosen = true) {
  EXPECT_TRUE(report.ok());
  const std::vector<std::int32_t> sums = {0 + 1 + 2, 1 + 2 + 3};
  std::uint64_t deferred = 0;
  for (const Observed& seen : observed) {
    EXPECT_EQ(seen.result, sums);
    EXPECT_LE(seen.registered_after_drop, 1u);
    deferred += seen.registered_after_drop;
  }
  EXPECT_EQ(report.mark_count("finalize.deferred"), deferred);
  EXPECT_EQ(report.mark_count("finalize.now") + deferred, chosen ? std::uint64_t{kWorldSize} : 0u);
  EXPECT_EQ(report.mark_count("timeline.finalize"), std::uint64_t{kWorldSize});
  // Each dropped op is reported once, as dropped, with its call site.
  EXPECT_EQ(report.unwaited.size(), std::size_t{kWorldSize});
  for (std::size_t r = 0; r < report.unwaited.size(); ++r) {
    const UnwaitedWork& line = report.unwaited[r];
    EXPECT_EQ(line.rank, static_cast<int>(r));
    EXPECT_EQ(line.op, "all_reduce");
    EXPECT_EQ(line.seq, 0);
    EXPECT_EQ(line.location.line(), kDroppedLine);
    EXPECT_TRUE(testing::contains(line.location.file_name(), "finalize_test.cpp"));
    EXPECT_FALSE(line.at_rank_exit);
    EXPECT_TRUE(line.error.empty()) << line.error;
  }
  return deferred;
}

// A result one rank kept in a tensor another rank holds last (a shared variable): its owner
// exits with it unwaited and finishes it there; the other rank's later drop of the last
// reference must leave it to that claim (it once claimed it again and ended the process).
TEST(Finalization, ATensorAnotherRankDropsLastAfterItsOwnerExited) {
  for (std::uint64_t seed : {0u, 1u, 2u, 3u, 4u, 5u}) {
    Tensor shared;
    const SimReport report = sim::run(testing::quiet_options(2, seed), [&shared] {
      Tensor mine = all_reduce(Tensor::ones({4}), "sum", world());
      shared = mine;  // the other rank's assignment may drop this rank's result
    });
    EXPECT_TRUE(report.ok()) << "seed " << seed;
    // Both results were left unwaited: each is reported once.
    EXPECT_EQ(report.unwaited.size(), 2u) << "seed " << seed;
    ASSERT_TRUE(shared.defined());
    EXPECT_EQ(shared.to_vector<float>(), std::vector<float>(4, 2.0f)) << "seed " << seed;
  }
}

TEST(Finalization, IsNoChoiceByDefault) {
  for (std::uint64_t seed : {0u, 1u, 2u, 3u}) {
    std::vector<Observed> observed(kWorldSize);
    const SimReport report =
        sim::run(testing::quiet_options(kWorldSize, seed), drop_then_reduce(observed));
    EXPECT_EQ(expect_drop_then_reduce_right(report, observed, /*chosen=*/false), 0u)
        << "seed " << seed;
    // A random walk draws one choice per scheduling decision and nothing else here.
    EXPECT_EQ(report.choices.size(), report.steps) << "seed " << seed;
  }
}

TEST(Finalization, EachDropDrawsOneChoice) {
  std::vector<Observed> observed(kWorldSize);
  const SimReport report = sim::run(choosing(5), drop_then_reduce(observed));
  expect_drop_then_reduce_right(report, observed);
  EXPECT_EQ(report.choices.size(), report.steps + kWorldSize);
}

TEST(Finalization, BothBranchesFireOverSeedsAndResultsStayRight) {
  std::uint64_t now = 0;
  std::uint64_t deferred = 0;
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    std::vector<Observed> observed(kWorldSize);
    const SimReport report = sim::run(choosing(seed), drop_then_reduce(observed));
    deferred += expect_drop_then_reduce_right(report, observed);
    now += report.mark_count("finalize.now");
  }
  EXPECT_GT(now, 0u);
  EXPECT_GT(deferred, 0u);
  EXPECT_EQ(now + deferred, 16u * kWorldSize);
}

// All choices 0 finalize every drop at once; a list that differs from it in one choice of a drop
// defers exactly that drop (choice 1), on the rank that dropped.
TEST(Finalization, ChoiceOneDefersExactlyItsDrop) {
  SimOptions options = choosing(0);
  options.choices = std::vector<std::uint64_t>{};
  std::vector<Observed> observed(kWorldSize);
  const SimReport all_now = sim::run(options, drop_then_reduce(observed));
  EXPECT_EQ(expect_drop_then_reduce_right(all_now, observed), 0u);
  EXPECT_EQ(all_now.mark_count("finalize.now"), std::uint64_t{kWorldSize});
  std::vector<int> deferring_ranks;
  for (std::size_t at = 0; at < all_now.choices.size(); ++at) {
    std::vector<std::uint64_t> choices(at, 0);
    choices.push_back(1);
    options.choices = choices;
    observed.assign(kWorldSize, Observed{});
    const SimReport flipped = sim::run(options, drop_then_reduce(observed));
    if (expect_drop_then_reduce_right(flipped, observed) == 1) {
      for (int r = 0; r < kWorldSize; ++r) {
        if (observed[static_cast<std::size_t>(r)].registered_after_drop == 1) {
          deferring_ranks.push_back(r);
        }
      }
    }
  }
  std::sort(deferring_ranks.begin(), deferring_ranks.end());
  EXPECT_EQ(deferring_ranks, (std::vector<int>{0, 1, 2})) << "one drop choice per rank";
}

// (kind, step, rank, seq, detail) of every drop and finalization, in order.
std::vector<std::tuple<SimEvent::Kind, std::uint64_t, int, std::int64_t, std::string>>
finalization_points(const SimReport& report) {
  std::vector<std::tuple<SimEvent::Kind, std::uint64_t, int, std::int64_t, std::string>> points;
  for (const SimEvent& event : report.events) {
    if (event.kind == SimEvent::Kind::Drop || event.kind == SimEvent::Kind::Finalize) {
      points.emplace_back(event.kind, event.step, event.rank, event.seq, event.detail);
    }
  }
  return points;
}

TEST(Finalization, ReplayedChoicesGiveTheSameFinalizationPoints) {
  bool replayed_a_deferral = false;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    SimOptions options = choosing(seed);
    options.record_events = true;
    std::vector<Observed> observed(kWorldSize);
    const SimReport original = sim::run(options, drop_then_reduce(observed));
    expect_drop_then_reduce_right(original, observed);
    options.seed = seed + 1000;  // the choices alone decide the replay
    options.choices = original.choices;
    observed.assign(kWorldSize, Observed{});
    const SimReport replay = sim::run(options, drop_then_reduce(observed));
    expect_drop_then_reduce_right(replay, observed);
    EXPECT_EQ(replay.choices, original.choices) << "seed " << seed;
    EXPECT_EQ(replay.marks, original.marks) << "seed " << seed;
    EXPECT_EQ(finalization_points(replay), finalization_points(original)) << "seed " << seed;
    EXPECT_EQ(finalization_points(original).size(), 2u * kWorldSize);
    replayed_a_deferral = replayed_a_deferral || original.mark_count("finalize.deferred") > 0;
  }
  EXPECT_TRUE(replayed_a_deferral);
}

// Op #0 mismatches (the last rank issues all_gather where the others issue all_reduce) and every
// rank drops its result un-waited. Completing it fails, at the drop or where it was deferred to;
// either way the rank's next call raises the failure.
struct MismatchOutcome {
  std::size_t registered_after_drop = 0;
  testing::CaughtError at_next_call;
};
auto drop_a_mismatch(std::vector<MismatchOutcome>& outcomes, bool call_again) {
  return [&outcomes, call_again] {
    MismatchOutcome& mine = outcomes[testing::rank_slot()];
    {
      Tensor dropped = rank() == world_size() - 1 ? all_gather_tensor(rank_tensor(), 0, world())
                                                  : all_reduce(rank_tensor(), "sum", world());
    }
    mine.registered_after_drop = registered_works();
    if (call_again) {
      mine.at_next_call = testing::expect_error<CollectiveMismatch>(
          [] { all_reduce(rank_tensor(), "sum", world()); }, {"dropped un-waited", "#0"});
    }
  };
}

TEST(Finalization, DeferredFailureIsRaisedAtTheRanksNextCollective) {
  std::uint64_t deferred = 0;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    std::vector<MismatchOutcome> outcomes(kWorldSize);
    const SimReport report = sim::run(choosing(seed), drop_a_mismatch(outcomes, true));
    EXPECT_TRUE(report.ok()) << "every rank caught its error";
    for (const MismatchOutcome& outcome : outcomes) {
      deferred += outcome.registered_after_drop;
      EXPECT_TRUE(testing::contains(outcome.at_next_call.what, "finalize_test.cpp:"))
          << "the dropped op's call site: " << outcome.at_next_call.what;
    }
    ASSERT_EQ(report.unwaited.size(), std::size_t{kWorldSize});
    for (const UnwaitedWork& line : report.unwaited) {
      EXPECT_EQ(line.seq, 0);
      EXPECT_FALSE(line.at_rank_exit);
      EXPECT_TRUE(testing::contains(line.error, "CollectiveMismatch")) << line.error;
    }
  }
  EXPECT_GT(deferred, 0u) << "no seed deferred a failing finalization";
}

TEST(Finalization, DeferredFailureWithNoLaterCallIsTheRanksErrorAtExit) {
  std::uint64_t deferred = 0;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    std::vector<MismatchOutcome> outcomes(kWorldSize);
    const SimReport report = sim::simulate(choosing(seed), drop_a_mismatch(outcomes, false));
    ASSERT_EQ(report.rank_errors.size(), std::size_t{kWorldSize});
    for (int r = 0; r < kWorldSize; ++r) {
      deferred += outcomes[static_cast<std::size_t>(r)].registered_after_drop;
      const std::string& error = report.rank_errors[static_cast<std::size_t>(r)];
      EXPECT_TRUE(testing::contains(error, "dropped un-waited")) << "rank " << r << ": " << error;
      EXPECT_TRUE(testing::contains(error, "CollectiveMismatch")) << "rank " << r << ": " << error;
    }
  }
  EXPECT_GT(deferred, 0u);
}

}  // namespace
}  // namespace chorus
