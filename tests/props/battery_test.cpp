// The property battery and its runners: planted transport bugs make it fail with a shrunk,
// replayable counterexample (so a passing battery means something), both runners agree, and the
// replay tokens and property selection behave.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chorus/chorus.hpp>
#include <chorus/props/battery.hpp>
#include <chorus/props/runner.hpp>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "battery/cases.hpp"
#include "props/planted_transport.hpp"
#include "support/expect_error.hpp"
#include "support/forwarding_transport.hpp"
#include "support/narrowed_transport.hpp"

namespace chorus::props {
namespace {

using testing::plant;
using testing::PlantedBug;

PropertyResult check_one(const std::string& name, CheckOptions options) {
  const CheckReport report = check_on_simulator(select(battery(), name), options);
  EXPECT_EQ(report.results.size(), 1u);
  return report.results.at(0);
}

// `name`'s verdict on 3 simulated ranks with `bug` planted on rank `on_rank`.
PropertyResult check_with_bug(const std::string& name, PlantedBug bug, int on_rank) {
  CheckOptions options;
  options.ranks = 3;
  options.wrap_transport = plant(bug, on_rank);
  return check_one(name, options);
}

// A world of `world_size` simulated ranks for a lockstep check, quiet and seeded by the options
// alone.
sim::SimOptions lockstep_world(int world_size) {
  sim::SimOptions sim_options;
  sim_options.world_size = world_size;
  sim_options.print_failures = false;
  sim_options.seed_from_environment = false;
  return sim_options;
}

// check_in_lockstep of `properties` on every rank of `sim_options`' world, as a real transport's
// ranks run it: the simulated run's report and each rank's check report, by rank.
struct LockstepRun {
  sim::SimReport run;
  std::vector<CheckReport> reports;
};
LockstepRun run_lockstep(const std::vector<Property>& properties, const CheckOptions& options,
                         const sim::SimOptions& sim_options) {
  LockstepRun lockstep;
  lockstep.reports.resize(static_cast<std::size_t>(sim_options.world_size));
  lockstep.run = sim::simulate(sim_options, [&] {
    lockstep.reports[static_cast<std::size_t>(rank())] = check_in_lockstep(properties, options);
  });
  return lockstep;
}

TEST(Battery, PlantedLastBitOnOneRankFailsWithAShrunkReplayableCounterexample) {
  CheckOptions options;
  options.ranks = 4;
  options.wrap_transport = plant(PlantedBug::LastBitOnOneRank, 1);
  const PropertyResult result = check_one("reduce.all_reduce", options);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  // Only the planted rank's result is wrong, and the report says which element.
  EXPECT_NE(result.failure.find("rank 1: all_reduce result: element "), std::string::npos)
      << result.failure;
  EXPECT_EQ(result.failure.find("rank 0:"), std::string::npos) << result.failure;
  // Shrunk from a larger case to a small one: data seed 0, the all-0 schedule, and a result of
  // the fewest elements the bug touches — testing::kLargeResult transport elements: 4 of a real
  // dtype (the last is element 3) or 2 complex ones, which travel as 4 real values (element 1).
  // Greedy shrinking may stop at a world larger than 2: a smaller world regenerates the case. It
  // may also stop short of sum: once the result is 2 complex elements, only the (op, dtype)
  // pairs on a complex dtype still fail, and the index shrinks try (0 and halfway down) may
  // all be pairs on a real one.
  EXPECT_NE(result.counterexample.find(" ranks: group world [0, 1"), std::string::npos)
      << result.counterexample;
  EXPECT_TRUE(result.failure.find("element 3 (flat)") != std::string::npos ||
              result.failure.find("element 1 (flat)") != std::string::npos)
      << result.failure;
  EXPECT_NE(result.counterexample.find("data seed 0"), std::string::npos) << result.counterexample;
  EXPECT_NE(result.counterexample.find("schedule choices [] (then 0)"), std::string::npos)
      << result.counterexample;
  EXPECT_GT(result.shrink_steps, 0);
  EXPECT_NE(result.timeline.find("rank 1"), std::string::npos);
  EXPECT_EQ(result.replay_token.rfind("chorus-check:4:reduce.all_reduce:4:0:100:", 0), 0u)
      << result.replay_token;

  // The token replays the failure with the bug planted, and passes without it.
  sim::SimOptions with_bug;
  with_bug.wrap_transport = plant(PlantedBug::LastBitOnOneRank, 1);
  const Replay again = replay(battery(), result.replay_token, with_bug);
  EXPECT_EQ(again.result.verdict, Verdict::Failed);
  EXPECT_EQ(again.result.failure, result.failure);
  EXPECT_EQ(again.result.counterexample, result.counterexample);
  EXPECT_EQ(replay(battery(), result.replay_token).result.verdict, Verdict::Passed);

  // The summary says FAILED and the failure report carries the replay command.
  CheckReport report;
  report.results.push_back(result);
  EXPECT_FALSE(report.passed());
  EXPECT_NE(summary_table(report).find("FAILED"), std::string::npos);
  EXPECT_NE(failure_report(result).find("replay: chorus replay " + result.replay_token),
            std::string::npos);
}

TEST(Battery, PlantedEarlyCompletionIsCaughtByTheReductionAndWaitProperties) {
  CheckOptions options;
  options.ranks = 3;
  options.cases = 50;
  options.wrap_transport = plant(PlantedBug::CompletesBeforeData, 2);
  for (const std::string name : {"reduce.all_reduce", "async.wait_orders"}) {
    const PropertyResult result = check_one(name, options);
    ASSERT_EQ(result.verdict, Verdict::Failed) << name;
    EXPECT_NE(result.failure.find("  rank 2: "), std::string::npos) << result.failure;
    EXPECT_EQ(result.failure.find("rank 0:"), std::string::npos) << result.failure;
  }
}

class BatteryWorlds : public ::testing::TestWithParam<int> {};

TEST_P(BatteryWorlds, PassesWithoutAPlantedBug) {
  CheckOptions options;
  options.ranks = GetParam();
  options.cases = 10;
  options.seed = 17;
  const CheckReport report = check_on_simulator(battery(), options);
  EXPECT_TRUE(report.passed()) << summary_table(report);
  EXPECT_EQ(report.results.size(), battery().size());
  for (const PropertyResult& result : report.results) {
    if (result.name == "errors.mismatch" && options.ranks == 1) {
      EXPECT_EQ(result.verdict, Verdict::Skipped);  // needs two ranks to disagree
      continue;
    }
    EXPECT_EQ(result.verdict, Verdict::Passed) << result.name;
    EXPECT_EQ(result.cases, 10) << result.name;
  }
}

// World size 1 and non-powers of two, as every sweep.
INSTANTIATE_TEST_SUITE_P(Worlds, BatteryWorlds, ::testing::Values(1, 3, 5, 8));

TEST(Battery, LockstepCheckThatFailsMidwayStillReachesItsPeersCollectives) {
  // law.coalesced_equals_separate compares each output with a separate call and issues the next
  // separate call after a failed comparison: the failing rank must keep issuing them (Env
  // records the failure), or its peers would wait for it forever. The planted bug shows only in
  // some cases (a coalesced result of kLargeResult elements or more on rank 2, and one whose
  // separate calls differ): 100 cases reach one.
  CheckOptions options;
  options.cases = 100;
  const std::vector<Property> properties = select(battery(), "law.coalesced_equals_separate");
  sim::SimOptions sim_options = lockstep_world(3);
  sim_options.wrap_transport = plant(PlantedBug::LastBitOnOneRank, 2);
  const auto [run, reports] = run_lockstep(properties, options, sim_options);
  ASSERT_TRUE(run.ok()) << run.to_string();
  for (const CheckReport& report : reports) {
    ASSERT_EQ(report.results.size(), 1u);
    const PropertyResult& failed = report.results[0];
    EXPECT_EQ(failed.verdict, Verdict::Failed);
    EXPECT_NE(failed.failure.find("rank 2: coalesced output"), std::string::npos) << failed.failure;
    EXPECT_EQ(failed.failure.find("rank 0:"), std::string::npos) << failed.failure;
    EXPECT_EQ(failed.replay_token, reports[0].results[0].replay_token);
  }
  // A lockstep token replays the same case on the simulator.
  const PropertyResult& failed = reports[0].results[0];
  EXPECT_NE(failed.replay_token.find(":lockstep:"), std::string::npos) << failed.replay_token;
  sim::SimOptions with_bug;
  with_bug.wrap_transport = plant(PlantedBug::LastBitOnOneRank, 2);
  const Replay again = replay(properties, failed.replay_token, with_bug);
  EXPECT_EQ(again.result.verdict, Verdict::Failed);
  EXPECT_EQ(again.result.counterexample, failed.counterexample);
  EXPECT_EQ(replay(properties, failed.replay_token).result.verdict, Verdict::Passed);
  // The report says what a lockstep token replays (the all-0 schedule, not the run's own): it
  // used to print the token as if it replayed the run.
  const std::string report = failure_report(failed);
  EXPECT_NE(report.find("replay: chorus replay " + failed.replay_token +
                        "\n  (a lockstep token replays the case alone on the simulator with "
                        "choice 0 at every scheduling decision"),
            std::string::npos)
      << report;
  // A rerun reproduces it only where timing is replayed: the simulator, not MPI or NCCL.
  EXPECT_NE(report.find("reproduces it on the simulator, and on MPI or NCCL may reproduce it"),
            std::string::npos)
      << report;
  EXPECT_EQ(replay_note("chorus-check:4:law.gather_dim:3:5:100:7:generated:2:fixed:-:-"), "");
}

// failure_report never throws, whatever token a result holds: a token parse_token refuses (a
// format-3 token of one case, kept from an earlier build) gets no note. Since the note it
// called replay_note, which threw InvalidArgument on such a token.
TEST(Battery, FailureReportOfAMalformedTokenDoesNotThrow) {
  PropertyResult result;
  result.name = "reduce.all_reduce";
  result.verdict = Verdict::Failed;
  result.counterexample = "a case";
  result.failure = "rank 0: wrong\n";
  for (const std::string token :
       {"chorus-check:3:reduce.all_reduce:4:0:1:0:lockstep:2:fixed:-:-", "not a token"}) {
    result.replay_token = token;
    std::string report;
    EXPECT_NO_THROW(report = failure_report(result)) << token;
    EXPECT_NE(report.find("replay: chorus replay " + token + "\n"), std::string::npos) << report;
    EXPECT_EQ(report.find("a lockstep token"), std::string::npos) << report;
    EXPECT_EQ(replay_note(token), "") << token;
  }
}

// errors.invalid_argument's NotAMember kind: after the refused calls, the members of the group
// they named run a collective on it and check its result and that they numbered it alike (they
// used not to touch that group at all, so nothing showed whether the refusals had left it out of
// step). A bug planted on rank 0 under that group's communicators alone (tag
// "props.errors.other_group", errors.cpp's kOtherGroupTag) shows there and only there.
TEST(Battery, NotAMemberRefusalsLeaveTheOtherGroupInStep) {
  CheckOptions options;
  options.ranks = 4;
  options.cases = 100;
  const std::vector<Property> properties = select(battery(), "errors.invalid_argument");
  EXPECT_TRUE(check_on_simulator(properties, options).passed());
  options.wrap_transport =
      testing::plant_on_tag(PlantedBug::CompletesBeforeData, 0, "props.errors.other_group");
  const CheckReport report = check_on_simulator(properties, options);
  ASSERT_EQ(report.results.size(), 1u);
  const PropertyResult& failed = report.results[0];
  EXPECT_EQ(failed.verdict, Verdict::Failed);
  EXPECT_NE(failed.counterexample.find("caller not a member"), std::string::npos)
      << failed.counterexample;
  EXPECT_NE(failed.failure.find("rank 0: an all_reduce on the group the refused calls named"),
            std::string::npos)
      << failed.failure;
}

TEST(Battery, PropertyNamesThatTokensCannotCarryAreRefused) {
  Property bad = battery().front();
  bad.name = "user:layer";
  testing::expect_invalid_argument([&] { (void)check_on_simulator({bad}, CheckOptions{}); },
                                   {"property name 'user:layer'", "':' or whitespace"});
}

TEST(Battery, AGeneratorThatThrowsFailsThePropertyWithItsMessage) {
  const Property broken = make_property<int>(
      "user.broken_generator", "a generator that throws",
      [](World) {
        return rc::gen::map(rc::gen::just(0),
                            [](int) -> int { throw std::runtime_error("no case for you"); });
      },
      [](const int&, Env&) {});
  CheckOptions options;
  options.ranks = 2;
  const CheckReport report = check_on_simulator({broken}, options);
  ASSERT_EQ(report.results.size(), 1u);
  EXPECT_EQ(report.results[0].verdict, Verdict::Failed);
  EXPECT_NE(report.results[0].failure.find("the case generator failed: no case for you"),
            std::string::npos)
      << report.results[0].failure;
}

// A rank that fails before a collective its peers issue reaches the verdict exchange alone: the
// exchange fails (here CollectiveMismatch: the simulator sees the ranks wait on different groups;
// on MPI or NCCL a Timeout), and its error still carries the rank's own failure, which used to
// be lost.
TEST(Battery, LockstepVerdictErrorsCarryTheFailureThatCausedThem) {
  const Property one_sided = make_property<int>(
      "user.one_sided", "rank 0 fails before a collective the others issue",
      [](World) { return rc::gen::just(0); },
      [](const int&, Env&) {
        if (rank() == 0) {
          throw std::runtime_error("rank 0 gave up before its all_reduce");
        }
        (void)all_reduce(Tensor::ones({1}, DType::Int32), "sum", world()).to_vector<int>();
      });
  CheckOptions options;
  options.cases = 1;
  const sim::SimReport run = run_lockstep({one_sided}, options, lockstep_world(2)).run;
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.rank_errors[0].find("chorus::CollectiveMismatch: [rank 0] all_reduce #0 on group "
                                    "'chorus.check.verdicts'"),
            std::string::npos)
      << run.rank_errors[0];
  EXPECT_NE(run.rank_errors[0].find("; before this verdict exchange, this rank had failed the "
                                    "case: rank 0 gave up before its all_reduce"),
            std::string::npos)
      << run.rank_errors[0];
}

// Half the simulator runner's cases run on the full --ranks world whatever their index (the docs
// say so); the world size used to be drawn at the case's RapidCheck size, so the early cases
// (size i * 100 / cases) ran almost only on the smallest worlds.
TEST(Battery, HalfTheCasesRunOnTheFullWorldAtEveryCaseIndex) {
  auto worlds = std::make_shared<std::vector<int>>();
  const Property counted = make_property<int>(
      "user.world_sizes", "records each case's world size", [](World) { return rc::gen::just(0); },
      [worlds](const int&, Env& env) {
        if (env.rank() == 0) {
          worlds->push_back(world_size());
        }
      });
  CheckOptions options;
  options.ranks = 8;
  options.cases = 100;
  const CheckReport report = check_on_simulator({counted}, options);
  ASSERT_TRUE(report.passed()) << summary_table(report);
  ASSERT_EQ(worlds->size(), 100u);
  std::string sizes;
  for (const int size : *worlds) {
    sizes += std::to_string(size) + " ";
  }
  const auto full = [&](std::size_t first, std::size_t last) {
    return std::count(worlds->begin() + static_cast<std::ptrdiff_t>(first),
                      worlds->begin() + static_cast<std::ptrdiff_t>(last), 8);
  };
  // k in [0, 16): 8 ranks for k >= 7, i.e. 9 in 16 on average.
  EXPECT_GE(full(0, 100), 35) << sizes;
  EXPECT_GE(full(0, 25), 8) << sizes;
  // The other half still covers the smaller worlds, the smallest included.
  EXPECT_NE(std::find(worlds->begin(), worlds->end(), 1), worlds->end()) << sizes;
  EXPECT_GE(std::set<int>(worlds->begin(), worlds->end()).size(), 6u) << sizes;
}

// Counts the all_reduce and all_gather send buffers that start past their storage's start: an
// input at a nonzero storage offset, passed to the transport as it is.
class OffsetWatchComm final : public testing::ForwardingComm {
 public:
  OffsetWatchComm(std::shared_ptr<transport::Comm> inner, std::shared_ptr<std::atomic<int>> seen)
      : ForwardingComm(std::move(inner)), seen_(std::move(seen)) {}
  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override {
    watch(send);
    return ForwardingComm::all_reduce(send, recv, reduce_op, info);
  }
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override {
    watch(send);
    return ForwardingComm::all_gather(send, recv, info);
  }

 private:
  void watch(const transport::Buffer& send) {
    if (send.count > 0 && send.data != send.keep_alive.get()) {
      seen_->fetch_add(1);
    }
  }
  std::shared_ptr<std::atomic<int>> seen_;
};

class OffsetWatchTransport final : public testing::ForwardingTransport {
 public:
  OffsetWatchTransport(std::shared_ptr<transport::Transport> inner,
                       std::shared_ptr<std::atomic<int>> seen)
      : ForwardingTransport(std::move(inner)), seen_(std::move(seen)) {}
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override {
    return std::make_shared<OffsetWatchComm>(ForwardingTransport::create_comm(tag, ranks), seen_);
  }

 private:
  std::shared_ptr<std::atomic<int>> seen_;
};

// The reduction and gather cases feed collectives inputs at a nonzero storage offset and strided
// ones, not only fresh tensors (Note [Input forms]): a core that took every transport buffer at
// its storage's start instead of at the tensor's data passed the whole battery.
TEST(Battery, ReductionAndGatherInputsComeAtAStorageOffsetAndStrided) {
  // What reaches the transport: some sends start past their storage's start.
  auto seen = std::make_shared<std::atomic<int>>(0);
  CheckOptions options;
  options.ranks = 4;
  options.cases = 60;
  options.wrap_transport =
      [seen](std::shared_ptr<transport::Transport> inner) -> std::shared_ptr<transport::Transport> {
    return std::make_shared<OffsetWatchTransport>(std::move(inner), seen);
  };
  const CheckReport report =
      check_on_simulator(select(battery(), "reduce.all_reduce,law.gather_dim"), options);
  ASSERT_EQ(report.results.size(), 2u);
  EXPECT_TRUE(report.passed()) << summary_table(report);
  EXPECT_GT(seen->load(), 0) << "no all_reduce or all_gather input at a nonzero storage offset";

  // What the generators draw at the runner's case sizes (case i at i * 100 / cases): every form
  // (the last too, below the nominal size), deterministically from the seed.
  using families::InputForm;
  const auto forms_of = [](std::uint64_t seed) {
    std::vector<InputForm> forms;
    for (int i = 0; i < 60; ++i) {
      const rc::Random random(seed + static_cast<std::uint64_t>(i));
      const int size = i * 100 / 60;
      forms.push_back(families::gen_reduce_case(World{4}, false)(random, size).value().form);
      forms.push_back(families::gen_scatter_case(World{4})(random, size).value().form);
    }
    return forms;
  };
  const std::vector<InputForm> forms = forms_of(7);
  EXPECT_EQ(forms, forms_of(7));
  int offset = 0;
  int strided = 0;
  for (std::size_t i = 0; i < forms.size(); ++i) {
    const Tensor input = families::in_form(
        families::exact_input(i, 0, {3, 2}, DType::Int32, ReduceOp::Kind::Sum), forms[i]);
    offset += input.storage_offset() > 0 ? 1 : 0;
    strided += input.is_contiguous() ? 0 : 1;
    EXPECT_TRUE(input.bitwise_equal(
        families::exact_input(i, 0, {3, 2}, DType::Int32, ReduceOp::Kind::Sum)));
  }
  EXPECT_GT(offset, 0);
  EXPECT_GT(strided, 0);
  EXPECT_NE(std::count(forms.begin(), forms.end(), InputForm::Fresh), 0);
}

// errors.mismatch covers the layout digest (Note [Layout digest] in core): ranks that pass the
// same element count in another shape, or gather/scatter along another dim. Each kind is found
// when the transport is blind to that operation's layout, and shrinks to it; the kinds that
// change the element count, dtype, op or root pass without the digest (the mismatch used to
// stop there, so a layout-blind transport passed the battery).
struct LayoutBlindCase {
  transport::OpKind blind;
  const char* kind;  // the counterexample's mismatch kind
};

class BatteryLayoutBlind : public ::testing::TestWithParam<LayoutBlindCase> {};

TEST_P(BatteryLayoutBlind, MismatchFindsTheKindOnlyTheLayoutDigestCatches) {
  CheckOptions options;
  options.ranks = 3;
  options.wrap_transport = testing::layout_blind(GetParam().blind);
  const PropertyResult result = check_one("errors.mismatch", options);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_NE(result.counterexample.find(std::string("passes a different ") + GetParam().kind),
            std::string::npos)
      << result.counterexample;
  EXPECT_NE(result.failure.find("returned normally (expected CollectiveMismatch)"),
            std::string::npos)
      << result.failure;
}

void PrintTo(const LayoutBlindCase& c, std::ostream* out) {
  *out << "blind to " << transport::op_kind_name(c.blind) << ": " << c.kind;
}

std::string layout_blind_name(const ::testing::TestParamInfo<LayoutBlindCase>& info) {
  return std::string(transport::op_kind_name(info.param.blind));
}

INSTANTIATE_TEST_SUITE_P(
    Ops, BatteryLayoutBlind,
    ::testing::Values(LayoutBlindCase{transport::OpKind::AllReduce, "shape (same element count)"},
                      LayoutBlindCase{transport::OpKind::AllGather, "gather dim"},
                      LayoutBlindCase{transport::OpKind::ReduceScatter, "scatter dim"}),
    layout_blind_name);

// A schedule-independent property's PCT variants place their change points within the run (the
// first run's length), where they reorder something: with the simulator's default estimate of
// 256 decisions a case's short run seldom reached one. Seen in the report of the variant that
// decides a replay: an inexact float sum is 1 left to right (the first run) and under the ring
// order, which starts this sum at rank 1 after a rank 0 of 0, but 0 under the tree order,
// 1e20 + (-1e20 + 1), which only a PCT variant uses: that variant decides.
TEST(Battery, PctScheduleVariantsPlaceTheirChangePointsWithinTheRun) {
  Needs needs;
  needs.world_size_min = 4;
  needs.schedule_independent = true;
  const Property inexact = make_property<int>(
      "user.inexact_sum", "0 + 1e20 - 1e20 + 1 in float, whose value depends on the order",
      [](World) { return rc::gen::just(0); },
      [](const int&, Env& env) {
        constexpr float kValues[] = {0, 1e20F, -1e20F, 1};
        const Tensor x = Tensor::full({1}, kValues[rank()], DType::Float32);
        env.record(all_reduce(x, "sum", world()));
      },
      needs);
  int fired = 0;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    CheckOptions options;
    options.ranks = 4;
    options.seed = seed;
    options.cases = 1;
    const CheckReport report = check_on_simulator({inexact}, options);
    ASSERT_EQ(report.results.size(), 1u);
    const PropertyResult& result = report.results[0];
    ASSERT_EQ(result.verdict, Verdict::Failed);
    EXPECT_NE(result.failure.find("under strategy pct, reduction order tree"), std::string::npos)
        << result.failure;
    const Replay again = replay({inexact}, result.replay_token);
    ASSERT_EQ(again.result.verdict, Verdict::Failed);
    EXPECT_EQ(again.result.failure, result.failure);
    EXPECT_EQ(again.report.strategy, sim::Strategy::Pct);
    fired += again.report.mark_count("strategy.pct.change_point") > 0 ? 1 : 0;
  }
  EXPECT_EQ(fired, 8);
}

// A schedule-independent property whose check records nothing compares nothing across
// schedules: it fails, saying so, rather than pass vacuously. Recording in some cases, on some
// ranks, is enough: a case on one rank (the world sizes go down to 1) records nothing here.
TEST(Battery, AScheduleIndependentPropertyThatRecordsNothingFails) {
  Needs needs;
  needs.schedule_independent = true;
  const auto sum_property = [&needs](bool record_on_rank_1) {
    return make_property<int>(
        "user.unrecorded_sum", "an all_reduce whose result is recorded, or not",
        [](World) { return rc::gen::just(0); },
        [record_on_rank_1](const int&, Env& env) {
          const Tensor sum = all_reduce(Tensor::ones({2}), "sum", world());
          env.require_bitwise_equal(sum, Tensor::full({2}, world_size()), "sum");
          if (record_on_rank_1 && rank() == 1) {
            env.record(sum);
          }
        },
        needs);
  };
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    CheckOptions options;
    options.ranks = 2;
    options.cases = 6;
    options.seed = seed;
    const CheckReport unrecorded = check_on_simulator({sum_property(false)}, options);
    ASSERT_EQ(unrecorded.results.size(), 1u);
    EXPECT_EQ(unrecorded.results[0].verdict, Verdict::Failed);
    EXPECT_EQ(unrecorded.results[0].cases, 6);
    EXPECT_NE(unrecorded.results[0].failure.find(
                  "marked Needs::schedule_independent, but no case's check recorded a result on "
                  "any rank (Env::record)"),
              std::string::npos)
        << unrecorded.results[0].failure;
    const CheckReport recorded = check_on_simulator({sum_property(true)}, options);
    ASSERT_EQ(recorded.results.size(), 1u);
    EXPECT_EQ(recorded.results[0].verdict, Verdict::Passed) << recorded.results[0].failure;
  }
}

// The simulator runner's PCT cases place their change points within the run too (Note [PCT's
// estimate of a case's length]): with the default estimate of 256 decisions, a case's 20 to 40
// seldom reached one (13 of these 200 change points fired, both in no case; 196 now). A token
// without a simulator token regenerates the case's schedule, measure included, so its report is
// the check's run.
TEST(Battery, PctCasesPlaceTheirChangePointsWithinTheRun) {
  constexpr int kCases = 100;
  constexpr int kDepth = 3;
  int all_fired = 0;
  std::uint64_t fired = 0;
  for (int i = 0; i < kCases; ++i) {
    const std::string token = "chorus-check:4:reduce.all_reduce:8:0:" + std::to_string(kCases) +
                              ":" + std::to_string(i) + ":pct:" + std::to_string(kDepth) +
                              ":fixed:-:-";
    const Replay replayed = replay(battery(), token);
    ASSERT_EQ(replayed.result.verdict, Verdict::Passed) << token << "\n" << replayed.result.failure;
    ASSERT_EQ(replayed.report.strategy, sim::Strategy::Pct);
    const std::uint64_t points = replayed.report.mark_count("strategy.pct.change_point");
    fired += points;
    all_fired += points == kDepth - 1 ? 1 : 0;
    // Deterministic from the token: the same run again.
    if (i % 25 == 0) {
      const Replay again = replay(battery(), token);
      EXPECT_EQ(again.report.schedule_hash, replayed.report.schedule_hash) << token;
      EXPECT_EQ(again.report.steps, replayed.report.steps) << token;
    }
  }
  EXPECT_GE(all_fired, kCases * 9 / 10) << fired << " of " << kCases * (kDepth - 1) << " fired";
}

// The lockstep runner's one simulation holds every case of every property: PCT's estimate of its
// length grows with them (the default of 256 put both change points of the battery's 73,689
// decisions on 8 ranks in the first 256), and lies within the run's real length.
TEST(Battery, LockstepPctEstimatesTheWholeRunsLength) {
  const std::vector<Property> properties = battery();
  CheckOptions options;
  options.ranks = 4;
  options.seed = 3;
  options.cases = 10;
  options.strategy = sim::Strategy::Pct;
  options.pct_depth = 3;
  const RunOptions run_options = lockstep_run_options(properties, options, "sim");
  CheckOptions twice = options;
  twice.cases = 20;
  EXPECT_EQ(lockstep_run_options(properties, twice, "sim").pct_steps, 2 * run_options.pct_steps);
  CheckOptions wider = options;
  wider.ranks = 8;
  EXPECT_EQ(lockstep_run_options(properties, wider, "sim").pct_steps, 2 * run_options.pct_steps);
  // Properties the lockstep runner skips (simulator only) take no decisions.
  const RunOptions reductions = lockstep_run_options(select(battery(), "reduce.*"), options, "sim");
  EXPECT_GT(reductions.pct_steps, 1u);
  EXPECT_EQ(
      lockstep_run_options(select(battery(), "reduce.*,errors.mismatch"), options, "sim").pct_steps,
      reductions.pct_steps);

  sim::SimOptions sim_options = lockstep_world(run_options.ranks);
  sim_options.seed = run_options.seed;
  sim_options.strategy = run_options.strategy;
  sim_options.pct_depth = run_options.pct_depth;
  sim_options.pct_steps = run_options.pct_steps;
  const auto [run, reports] = run_lockstep(properties, options, sim_options);
  ASSERT_TRUE(run.ok()) << run.to_string();
  EXPECT_TRUE(reports[0].passed()) << summary_table(reports[0]);
  EXPECT_GT(run.steps, 256u);
  EXPECT_LE(run_options.pct_steps, run.steps);
  EXPECT_GE(run_options.pct_steps * 2, run.steps);
  EXPECT_EQ(run.mark_count("strategy.pct.change_point"), 2u);
}

TEST(Battery, LockstepRanksAgreeOnTheVerdictAndShrinkTogether) {
  CheckOptions options;
  options.cases = 100;
  sim::SimOptions sim_options = lockstep_world(4);
  sim_options.wrap_transport = plant(PlantedBug::LastBitOnOneRank, 1);
  const auto [run, reports] =
      run_lockstep(select(battery(), "reduce.all_reduce,errors.mismatch"), options, sim_options);
  ASSERT_TRUE(run.ok()) << run.to_string();
  for (const CheckReport& report : reports) {
    ASSERT_EQ(report.results.size(), 2u);
    const PropertyResult& failed = report.results[0];
    EXPECT_EQ(failed.verdict, Verdict::Failed);
    // Every rank learned rank 1's message, and they took the same shrinking path.
    EXPECT_NE(failed.failure.find("rank 1: all_reduce result"), std::string::npos)
        << failed.failure;
    EXPECT_EQ(failed.replay_token, reports[0].results[0].replay_token);
    EXPECT_EQ(failed.counterexample, reports[0].results[0].counterexample);
    EXPECT_NE(failed.counterexample.find("group world [0, 1, 2, 3], sum on "), std::string::npos)
        << failed.counterexample;
    EXPECT_EQ(report.results[1].verdict, Verdict::Skipped);
    EXPECT_EQ(report.results[1].skip_reason, "needs the simulator");
  }
}

// Note [Reductions a transport lacks]: on a transport without bitwise reductions (NCCL's gap,
// stood in for on the simulator), the battery's cases that draw one check the refusal instead,
// and the whole battery passes in lockstep; the refusals happen (counted by the transport).
TEST(Battery, LockstepOnATransportWithoutBitwiseReductionsPasses) {
  CheckOptions options;
  options.cases = 40;
  options.seed = 5;
  auto refusals = std::make_shared<std::atomic<int>>(0);
  sim::SimOptions sim_options = lockstep_world(3);
  sim_options.wrap_transport = testing::narrow(testing::refuse_bitwise, refusals);
  const auto [run, reports] = run_lockstep(battery(), options, sim_options);
  ASSERT_TRUE(run.ok()) << run.to_string();
  for (const CheckReport& report : reports) {
    EXPECT_TRUE(report.passed()) << summary_table(report);
    for (const PropertyResult& result : report.results) {
      EXPECT_NE(result.verdict, Verdict::Failed) << result.name << ": " << result.failure;
    }
  }
  EXPECT_GT(refusals->load(), 0) << "no case drew a bitwise reduction: the test proves nothing";
}

// The lockstep runner on the simulator runs the schedule its tokens record (it used to run
// RandomWalk, depth 2, Fixed whatever was asked). The reduction order shows in an inexact sum:
// 1e20 + 1 + -1e20 + 1 in float is 1 left to right, 0 as a tree ((1e20 + 1) + (-1e20 + 1)).
TEST(Battery, LockstepOnTheSimulatorRunsTheScheduleItsTokensRecord) {
  CheckOptions options;
  options.ranks = 4;
  options.seed = 9;
  const RunOptions plain = lockstep_run_options({}, options, "sim");
  EXPECT_EQ(plain.transport, "sim");
  EXPECT_EQ(plain.ranks, 4);
  EXPECT_EQ(plain.seed, 9u);
  EXPECT_EQ(plain.strategy, sim::Strategy::RandomWalk);  // no choice lists in lockstep
  options.strategy = sim::Strategy::Pct;
  options.pct_depth = 3;
  const RunOptions pct = lockstep_run_options({}, options, "sim");
  EXPECT_EQ(pct.strategy, sim::Strategy::Pct);
  EXPECT_EQ(pct.pct_depth, 3);

  const auto inexact_sum = [&](sim::ReductionOrder order) {
    options.reduction_order = order;
    std::atomic<float> sum{-1};
    const int status = run(lockstep_run_options({}, options, "sim"), [&] {
      constexpr float kValues[] = {1e20F, 1, -1e20F, 1};
      const Tensor x = Tensor::full({1}, kValues[rank()], DType::Float32);
      const float result = all_reduce(x, "sum", world()).item<float>();
      if (rank() == 0) {
        sum = result;
      }
    });
    EXPECT_EQ(status, 0);
    return sum.load();
  };
  EXPECT_EQ(inexact_sum(sim::ReductionOrder::Fixed), 1.0F);
  EXPECT_EQ(inexact_sum(sim::ReductionOrder::Tree), 0.0F);
}

TEST(Battery, SelectTakesCommaSeparatedGlobs) {
  const std::vector<Property> all = battery();
  EXPECT_EQ(select(all, "*").size(), all.size());
  const std::vector<Property> reductions = select(all, "reduce.*");
  ASSERT_EQ(reductions.size(), 4u);
  EXPECT_EQ(reductions[0].name, "reduce.all_reduce");
  const std::vector<Property> two = select(all, "*.mismatch,law.gather_?im");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].name, "law.gather_dim");
  EXPECT_EQ(two[1].name, "errors.mismatch");
  // A '*' left when the name is used up matches the empty rest.
  const std::vector<Property> trailing = select(all, "reduce.all_reduce*");
  ASSERT_EQ(trailing.size(), 1u);
  EXPECT_EQ(trailing[0].name, "reduce.all_reduce");
}

// Blanks around a pattern are trimmed, and a pattern that matches nothing is refused, naming it,
// even when the others match: 'reduce.all_reduce, async.*,law.typo' used to run one property.
TEST(Battery, SelectTrimsPatternsAndRefusesOneThatMatchesNothing) {
  const std::vector<Property> all = battery();
  const std::vector<Property> trimmed = select(all, " reduce.all_reduce ,\tlaw.gather_dim\t");
  ASSERT_EQ(trimmed.size(), 2u);
  EXPECT_EQ(trimmed[0].name, "reduce.all_reduce");
  EXPECT_EQ(trimmed[1].name, "law.gather_dim");
  EXPECT_EQ(select(all, "reduce.all_reduce, async.*").size(), 4u);
  testing::expect_invalid_argument(
      [&] { (void)select(all, "reduce.all_reduce, async.*,law.typo"); },
      {"no property matches 'law.typo'"});
  testing::expect_invalid_argument([&] { (void)select(all, "no.such"); },
                                   {"no property matches 'no.such'"});
  testing::expect_invalid_argument([&] { (void)select(all, "law.*,,nope"); },
                                   {"no property matches '', 'nope'"});
}

TEST(Battery, MalformedReplayTokensAreRefusedWithTheReason) {
  const std::vector<Property> all = battery();
  testing::expect_invalid_argument([&] { (void)replay(all, "chorus-chek:4:x"); },
                                   {"does not start with 'chorus-check:4:'"});
  // Format 1 generated other cases (world sizes, shapes, PCT's change points): refused, named.
  testing::expect_invalid_argument(
      [&] {
        (void)replay(all, "chorus-check:1:reduce.all_reduce:4:0:100:0:generated:2:fixed:-:-");
      },
      {"format 1, from an older chorus", "token of format 4"});
  // Format 2 drew other cases too (input forms, layouts, choices at the nominal size).
  testing::expect_invalid_argument(
      [&] {
        (void)replay(all, "chorus-check:2:reduce.all_reduce:4:0:100:0:generated:2:fixed:-:-");
      },
      {"format 2, from an older chorus", "token of format 4"});
  testing::expect_invalid_argument([&] { (void)replay(all, "chorus-check:4:reduce.all_reduce:4"); },
                                   {"too few fields"});
  // Named among the list given (a property program's own, which `chorus list` does not show).
  const std::vector<Property> two(all.begin(), all.begin() + 2);
  testing::expect_invalid_argument(
      [&] { (void)replay(two, "chorus-check:4:no.such:4:0:100:0:generated:2:fixed:-:-"); },
      {"no property named 'no.such' (the properties here: " + two[0].name + ", " + two[1].name +
       ")"});
  testing::expect_invalid_argument(
      [&] { (void)replay(all, "chorus-check:4:no.such:4:0:100:0:generated:2:fixed:-:-"); },
      {"(the properties here: " + all[0].name + ", " + all[1].name + ", " + all[2].name + ", " +
       all[3].name + " and " + std::to_string(all.size() - 4) + " more)"});
  // Four names are all shown: no "and 0 more".
  const std::vector<Property> four(all.begin(), all.begin() + 4);
  testing::expect_invalid_argument(
      [&] { (void)replay(four, "chorus-check:4:no.such:4:0:100:0:generated:2:fixed:-:-"); },
      {"(the properties here: " + all[0].name + ", " + all[1].name + ", " + all[2].name + ", " +
       all[3].name + ")"});
  testing::expect_invalid_argument(
      [&] {
        (void)replay(all, "chorus-check:4:reduce.all_reduce:four:0:100:0:generated:2:fixed:-:-");
      },
      {"ranks is not a number"});
  testing::expect_invalid_argument(
      [&] { (void)replay(all, "chorus-check:4:reduce.all_reduce:4:0:100:0:psychic:2:fixed:-:-"); },
      {"unknown schedule source 'psychic'"});
  testing::expect_invalid_argument(
      [&] {
        (void)replay(all, "chorus-check:4:reduce.all_reduce:4:0:100:0:generated:2:fixed:999:-");
      },
      {"shrink path"});
}

// chorus check skips a property below its world_size_min, and the lockstep runner skips the
// simulator-only ones, so neither prints a token for such a run: replay refuses one by the need
// it misses. It used to replay a one-rank errors.mismatch case and report it FAILED.
TEST(Battery, ReplayRefusesTokensOfRunsThatSkipTheProperty) {
  const std::vector<Property> all = battery();
  testing::expect_invalid_argument(
      [&] { (void)replay(all, "chorus-check:4:errors.mismatch:1:0:100:3:generated:2:fixed:-:-"); },
      {"malformed token", "errors.mismatch needs at least 2 ranks but the token has 1"});
  testing::expect_invalid_argument(
      [&] {
        (void)replay(all, "chorus-check:4:async.address_reuse:4:0:100:3:lockstep:2:fixed:-:-");
      },
      {"malformed token",
       "async.address_reuse needs the simulator but the token is from the lockstep runner"});
  // The same cases where chorus check runs them still replay (and pass: no bug is planted).
  EXPECT_EQ(
      replay(all, "chorus-check:4:errors.mismatch:2:0:100:3:generated:2:fixed:-:-").result.verdict,
      Verdict::Passed);
  EXPECT_EQ(replay(all, "chorus-check:4:async.address_reuse:4:0:100:3:generated:2:fixed:-:-")
                .result.verdict,
            Verdict::Passed);
}

// A run of one case generates it at the nominal size (RapidCheck's 100), not at size 0, which
// drew only the smallest shapes and groups; the sizes of longer runs still ramp up from 0. The
// size reaches the case through the generator, and its replay token (format 4) regenerates it.
TEST(Battery, ASingleCaseRunsAtTheNominalSize) {
  auto sizes = std::make_shared<std::vector<int>>();
  const Property sized = make_property<int>(
      "user.sized", "records the size its case was generated at",
      [](World) { return rc::gen::withSize([](int size) { return rc::gen::just(size); }); },
      [sizes](const int& size, Env& env) {
        if (env.rank() == 0) {
          sizes->push_back(size);
        }
        env.require(size < 0, "fail, for a token");
      });
  CheckOptions options;
  options.ranks = 1;
  options.cases = 1;
  options.shrink_runs_max = 0;
  const CheckReport one = check_on_simulator({sized}, options);
  ASSERT_EQ(one.results.size(), 1u);
  ASSERT_FALSE(sizes->empty());
  EXPECT_EQ(sizes->front(), 100);
  EXPECT_EQ(one.results[0].replay_token.rfind("chorus-check:4:user.sized:1:0:1:0:", 0), 0u)
      << one.results[0].replay_token;
  sizes->clear();
  (void)replay({sized}, one.results[0].replay_token);
  ASSERT_FALSE(sizes->empty());
  EXPECT_EQ(sizes->front(), 100);
  // Four cases: sizes 0, 25, 50, 75 (the first case fails at once here, so only its size shows).
  sizes->clear();
  options.cases = 4;
  (void)check_on_simulator({sized}, options);
  ASSERT_FALSE(sizes->empty());
  EXPECT_EQ(sizes->front(), 0);
}

// Format 3 generated a single case at size 0: its tokens of one case are refused rather than
// replayed as another case; its longer runs' tokens replay as they were generated.
TEST(Battery, Format3TokensOfOneCaseAreRefused) {
  const std::vector<Property> all = battery();
  testing::expect_invalid_argument(
      [&] { (void)replay(all, "chorus-check:3:reduce.all_reduce:4:0:1:0:generated:2:fixed:-:-"); },
      {"format 3 with cases 1", "token of format 4"});
  EXPECT_EQ(replay(all, "chorus-check:3:reduce.all_reduce:4:0:100:7:generated:2:fixed:-:-")
                .result.verdict,
            Verdict::Passed);
}

// The opposite of RunOptions' refusal of a property case's token in --replay.
TEST(Battery, ASimulatorReplayTokenIsRefusedSayingWhatRerunsIt) {
  testing::expect_invalid_argument(
      [] { (void)replay(battery(), "chorus-replay:3:f560e09ab83790fe:4:-:50:AAAA"); },
      {"malformed token 'chorus-replay:3:f560e09ab83790fe:4:-:50:AAAA': it is the simulator's "
       "replay token of a program's run, not a property case's (chorus-check:...): rerun that "
       "program with --replay=<token> or with CHORUS_SIM_REPLAY=<token> set"});
}

// Every numeric field is range-checked before anything is generated: a negative case index used
// to reach RapidCheck as a negative size (a crash), the others were taken silently.
TEST(Battery, ReplayTokenFieldsOutOfRangeAreRefusedNamingTheField) {
  const std::vector<Property> all = battery();
  const auto refused = [&](const std::string& fields, const std::string& fragment) {
    testing::expect_invalid_argument(
        [&] { (void)replay(all, "chorus-check:4:reduce.all_reduce:" + fields); },
        {"malformed token", fragment});
  };
  refused("8:0:100:-7:generated:2:fixed:-:-", "case -7 is out of range (expected 0 to 99");
  refused("8:0:100:100:generated:2:fixed:-:-", "case 100 is out of range (expected 0 to 99");
  refused("8:0:0:0:generated:2:fixed:-:-", "cases 0 is out of range (expected at least 1)");
  refused("0:0:100:0:generated:2:fixed:-:-", "ranks 0 is out of range (expected 1 to 1024)");
  refused("1025:0:100:0:generated:2:fixed:-:-", "ranks 1025 is out of range (expected 1 to 1024)");
  refused("8:0:100:0:generated:99:fixed:-:-", "pct depth 99 is out of range (expected 1, 2 or 3)");
  refused("8:0:100:0:generated:0:fixed:-:-", "pct depth 0 is out of range (expected 1, 2 or 3)");
  refused("8:0:100:0:generated:2:fixed:-1:-", "shrink path index -1 is out of range");
  refused("8:0:100:0:generated:2:fixed:0.-2:-", "shrink path index -2 is out of range");
  refused("8:-1:100:0:generated:2:fixed:-:-", "seed is not a number: '-1'");
  // The bounds themselves are accepted.
  EXPECT_EQ(replay(all, "chorus-check:4:reduce.all_reduce:1:0:1:0:pct:3:fixed:-:-").result.verdict,
            Verdict::Passed);
  EXPECT_EQ(
      replay(all, "chorus-check:4:reduce.all_reduce:2:0:100:99:pct:1:fixed:-:-").result.verdict,
      Verdict::Passed);
}

// A failure that was not shrunk has '-' for its shrink path in the token (the field is never
// empty), and its error is listed once, under its rank.
TEST(Battery, AnUnshrunkFailureHasADashForItsShrinkPathAndItsErrorOnce) {
  const Property failing = make_property<int>(
      "user.always_fails", "fails on every case", [](World) { return rc::gen::just(0); },
      [](const int&, Env& env) { env.require(false, "always"); });
  CheckOptions options;
  options.ranks = 1;
  options.cases = 1;
  options.shrink_runs_max = 0;
  const CheckReport report = check_on_simulator({failing}, options);
  ASSERT_EQ(report.results.size(), 1u);
  const PropertyResult& result = report.results[0];
  EXPECT_EQ(result.verdict, Verdict::Failed);
  EXPECT_EQ(result.shrink_steps, 0);
  EXPECT_EQ(
      result.replay_token.rfind("chorus-check:4:user.always_fails:1:0:1:0:generated:2:fixed:-:", 0),
      0u)
      << result.replay_token;
  EXPECT_EQ(result.failure, "  rank 0: always\n");
}

// In lockstep every rank learns each failing rank's first failure, with how many more it had
// (nothing said when it had none), under its rank once.
TEST(Battery, LockstepFailuresNameTheFirstAndCountTheRest) {
  const Property failing = make_property<int>(
      "user.fails_on_two_ranks", "rank 1 fails once, rank 2 three times",
      [](World) { return rc::gen::just(0); },
      [](const int&, Env& env) {
        if (env.rank() == 1) {
          env.require(false, "first");
        }
        if (env.rank() == 2) {
          env.require(false, "first");
          env.require(false, "second");
          env.require(false, "third");
        }
      });
  CheckOptions options;
  options.cases = 1;
  const auto [run, reports] = run_lockstep({failing}, options, lockstep_world(3));
  ASSERT_TRUE(run.ok()) << run.to_string();
  for (const CheckReport& report : reports) {
    ASSERT_EQ(report.results.size(), 1u);
    EXPECT_EQ(report.results[0].verdict, Verdict::Failed);
    EXPECT_EQ(report.results[0].failure, "  rank 1: first\n  rank 2: first (and 2 more)\n");
  }
}

TEST(Battery, CheckTakesUpTo1024Ranks) {
  CheckOptions options;
  options.ranks = 1024;
  EXPECT_TRUE(check_on_simulator({}, options).results.empty());  // no property: nothing runs
  options.ranks = 1025;
  testing::expect_invalid_argument([&] { (void)check_on_simulator({}, options); },
                                   {"chorus check: ranks must lie in [1, 1024], got 1025"});
}

TEST(Battery, CheckRefusesAPctDepthOutsideOneToThree) {
  CheckOptions options;
  options.cases = 1;
  options.pct_depth = 4;
  testing::expect_invalid_argument([&] { (void)check_one("reduce.all_reduce", options); },
                                   {"pct_depth must lie in [1, 3], got 4"});
}

TEST(Battery, ReplayWithoutASimulatorTokenRegeneratesTheSchedule) {
  const Replay replayed =
      replay(battery(), "chorus-check:4:law.gather_dim:3:5:100:7:generated:2:fixed:-:-");
  EXPECT_EQ(replayed.result.verdict, Verdict::Passed);
  // The world size is generated with the case (at most the token's 3 ranks).
  EXPECT_GE(replayed.report.world_size, 1);
  EXPECT_LE(replayed.report.world_size, 3);
  EXPECT_EQ(replayed.result.counterexample.rfind(
                std::to_string(replayed.report.world_size) + " ranks: ", 0),
            0u);
  EXPECT_FALSE(replayed.report.events.empty());  // replays record events for traces
}

// Whatever a lockstep rank throws, the verdict names it: an empty what(), an exception that is
// not a std::exception (a rank that swallowed it would pass) and a RapidCheck assertion each get
// a message of their own, and a message longer than the gathered bytes is cut, not lost.
TEST(Battery, LockstepFailuresOfEveryKindAreNamed) {
  // runner.cpp's kGatheredMessageBytes (1024), less the terminating zero.
  constexpr std::size_t kGatheredChars = 1023;
  const std::string rank_3_message = "rank 3: " + std::string(2000, 'x');
  const Property throwing = make_property<int>(
      "user.throws_every_kind", "each rank fails its own way",
      [](World) { return rc::gen::just(0); },
      [](const int&, Env& env) {
        switch (env.rank()) {
          case 0:
            throw std::runtime_error("");
          case 1:
            throw 42;
          case 2:
            RC_FAIL("planted");
          default:
            env.require(false, std::string(2000, 'x'));
        }
      });
  CheckOptions options;
  options.cases = 1;
  const auto [run, reports] = run_lockstep({throwing}, options, lockstep_world(4));
  ASSERT_TRUE(run.ok()) << run.to_string();
  for (const CheckReport& report : reports) {
    ASSERT_EQ(report.results.size(), 1u);
    const PropertyResult& result = report.results[0];
    EXPECT_EQ(result.verdict, Verdict::Failed);
    const std::string& failure = result.failure;
    EXPECT_EQ(failure.rfind("  rank 0: an exception with an empty message\n"
                            "  rank 1: an exception that is not a std::exception\n"
                            "  rank 2: a RapidCheck assertion (RC_ASSERT, RC_FAIL) failed: ",
                            0),
              0u)
        << failure;
    EXPECT_NE(failure.find("planted"), std::string::npos) << failure;
    const std::string rank_3_line = "\n  " + rank_3_message.substr(0, kGatheredChars) + "\n";
    ASSERT_GE(failure.size(), rank_3_line.size());
    EXPECT_EQ(failure.substr(failure.size() - rank_3_line.size()), rank_3_line);
  }
}

// The summary names why a property was skipped; a failure report says how far the failure shrank
// and carries its timeline under a heading.
TEST(Battery, ReportsNameSkipReasonsShrinkStepsAndTheTimeline) {
  CheckOptions options;
  options.ranks = 1;
  options.cases = 1;
  const CheckReport skipped = check_on_simulator(select(battery(), "errors.mismatch"), options);
  EXPECT_NE(summary_table(skipped).find("  skipped (needs at least 2 ranks)\n"), std::string::npos)
      << summary_table(skipped);
  PropertyResult result;
  result.name = "reduce.all_reduce";
  result.verdict = Verdict::Failed;
  result.shrink_steps = 3;
  result.counterexample = "a case";
  result.failure = "  rank 0: wrong\n";
  result.timeline = "rank 0 | all_reduce\n";
  result.replay_token = "chorus-check:4:reduce.all_reduce:4:0:100:7:generated:2:fixed:0.1.0:-";
  EXPECT_EQ(failure_report(result),
            "property reduce.all_reduce FAILED (shrunk in 3 steps)\n"
            "minimal counterexample:\n  a case\n"
            "errors:\n  rank 0: wrong\n"
            "timeline of the minimal failing run:\nrank 0 | all_reduce\n"
            "replay: chorus replay "
            "chorus-check:4:reduce.all_reduce:4:0:100:7:generated:2:fixed:0.1.0:-\n");
}

// A value whose shrinks are value - 1 down to 0: every shrink of an always-failing property is
// another failure, so only the shrink budget stops the shrinking.
rc::Gen<int> gen_countdown(int from) {
  return rc::Gen<int>([from](const rc::Random&, int) {
    return rc::shrinkable::shrinkRecur(
        from, [](int value) { return value > 0 ? rc::seq::just(value - 1) : rc::Seq<int>(); });
  });
}

// Shrinking runs at most shrink_runs_max inputs (CheckOptions): each counts, failing or not.
TEST(Battery, ShrinkingStopsAtTheShrinkRunsBudget) {
  const Property failing = make_property<int>(
      "user.countdown_fails", "fails on every value of a long shrink chain",
      [](World) { return gen_countdown(1000); },
      [](const int&, Env& env) { env.require(false, "always"); });
  CheckOptions options;
  options.ranks = 1;
  options.cases = 1;
  options.shrink_runs_max = 3;
  const CheckReport report = check_on_simulator({failing}, options);
  ASSERT_EQ(report.results.size(), 1u);
  EXPECT_EQ(report.results[0].verdict, Verdict::Failed);
  EXPECT_EQ(report.results[0].shrink_steps, 3);
  EXPECT_EQ(report.results[0].runs, 1u + 3u);  // the case, then 3 shrinks
}

// A shrink whose value the generator cannot produce is skipped but keeps its place in the shrink
// path: the token's index is the shrink's position, so its replay reaches the same case.
TEST(Battery, ASkippedShrinkKeepsItsIndexInTheReplayPath) {
  // 10's shrinks are 5 (whose value throws) and 3; 3 has none.
  const auto gen = [](World) {
    return rc::gen::map(rc::Gen<int>([](const rc::Random&, int) {
                          return rc::shrinkable::shrinkRecur(10, [](int value) {
                            return value == 10 ? rc::seq::just(5, 3) : rc::Seq<int>();
                          });
                        }),
                        [](int value) {
                          if (value == 5) {
                            throw std::runtime_error("no case for 5");
                          }
                          return value;
                        });
  };
  const Property failing =
      make_property<int>("user.skipped_shrink", "fails on every value", gen,
                         [](const int&, Env& env) { env.require(false, "always"); });
  CheckOptions options;
  options.cases = 1;
  const auto [run, reports] = run_lockstep({failing}, options, lockstep_world(1));
  ASSERT_TRUE(run.ok()) << run.to_string();
  const CheckReport& report = reports[0];
  ASSERT_EQ(report.results.size(), 1u);
  const PropertyResult& result = report.results[0];
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_EQ(result.counterexample, "3");
  EXPECT_EQ(result.shrink_steps, 1);
  EXPECT_EQ(result.replay_token, "chorus-check:4:user.skipped_shrink:1:0:1:0:lockstep:2:fixed:1:-");
  const Replay again = replay({failing}, result.replay_token);
  EXPECT_EQ(again.result.verdict, Verdict::Failed);
  EXPECT_EQ(again.result.counterexample, "3");
}

// schedule.independence checks its first all_reduce against the reference itself: a transport
// bug that gives every schedule the same wrong bytes passes the digest comparison.
TEST(Battery, ScheduleIndependenceCatchesAWrongResultEveryScheduleAgreesOn) {
  const PropertyResult result =
      check_with_bug("schedule.independence", PlantedBug::WrongLastContribution, 1);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_NE(result.failure.find(": all_reduce step "), std::string::npos) << result.failure;
}

// reduce leaves the members off the destination their zeros: a transport that writes there is
// caught by reduce.reduce, on the rank it wrote.
TEST(Battery, PlantedWriteOffTheDestinationIsCaughtByTheReduceProperty) {
  const PropertyResult result = check_with_bug("reduce.reduce", PlantedBug::ReduceWritesOffRoot, 1);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_NE(result.failure.find("rank 1: reduce result off the destination (zeros)"),
            std::string::npos)
      << result.failure;
  EXPECT_EQ(result.failure.find("rank 0:"), std::string::npos) << result.failure;
}

// The scatter-gather law compares with all_reduce: a wrong all_reduce on one rank breaks it there.
TEST(Battery, PlantedLastBitBreaksTheScatterGatherLaw) {
  const PropertyResult result =
      check_with_bug("law.reduce_scatter_then_all_gather", PlantedBug::LastBitOnOneRank, 1);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_NE(result.failure.find("rank 1: all_gather_tensor(reduce_scatter_tensor(x, op, d), d) vs "
                                "all_reduce"),
            std::string::npos)
      << result.failure;
  EXPECT_EQ(result.failure.find("rank 0:"), std::string::npos) << result.failure;
}

// A wait that returns before the data is caught by async.wait_orders' comparison of the waited
// result with the reference, on the planted rank.
TEST(Battery, PlantedEarlyCompletionFailsTheWaitedResultsComparison) {
  CheckOptions options;
  options.ranks = 3;
  options.cases = 50;
  options.wrap_transport = plant(PlantedBug::CompletesBeforeData, 2);
  const PropertyResult result = check_one("async.wait_orders", options);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_NE(result.failure.find("  rank 2: result waited by "), std::string::npos)
      << result.failure;
}

// reduce.all_reduce checks that its input is untouched after the collective: a write into it after
// the simulator's own checksum at completion is caught there, on the rank that wrote.
TEST(Battery, PlantedWriteIntoTheInputIsCaughtByTheAllReduceProperty) {
  const PropertyResult result =
      check_with_bug("reduce.all_reduce", PlantedBug::WritesInputOnCompletion, 1);
  ASSERT_EQ(result.verdict, Verdict::Failed);
  EXPECT_NE(result.failure.find("rank 1: all_reduce input after the collective"), std::string::npos)
      << result.failure;
  EXPECT_EQ(result.failure.find("rank 0:"), std::string::npos) << result.failure;
}

}  // namespace
}  // namespace chorus::props
