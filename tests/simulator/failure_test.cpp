// Hangs and disagreements become errors (Note [Simulator failures]): mismatches, deadlocks, dead
// peers, peers that leave without joining, virtual-time timeouts, livelock, and the seed +
// replay line of a failing run.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chorus/chorus.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/expect_error.hpp"
#include "support/scoped_environment.hpp"
#include "world.hpp"

namespace chorus {
namespace {

using sim::SimOptions;
using sim::SimReport;

SimOptions quiet(int world_size, std::uint64_t seed = 0) {
  SimOptions options;
  options.world_size = world_size;
  options.seed = seed;
  options.print_failures = false;
  options.seed_from_environment = false;
  return options;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Per-rank outcome of the collective each rank ran: the error caught, if any.
struct Outcome {
  std::optional<ErrorCode> code;
  std::string what;
  ErrorContext context;
};

template <class Body>
std::vector<Outcome> run_catching(int world_size, Body body, std::uint64_t seed = 0) {
  std::vector<Outcome> outcomes(static_cast<std::size_t>(world_size));
  sim::run(quiet(world_size, seed), [&] {
    Outcome& outcome = outcomes[static_cast<std::size_t>(rank())];
    try {
      body();
    } catch (const Error& e) {
      outcome.code = e.code();
      outcome.what = e.what();
      outcome.context = e.context();
    }
  });
  return outcomes;
}

// A mismatch where rank 1 deviates from rank 0 (and every other rank follows rank 0).
struct MismatchCase {
  const char* name;
  std::function<Tensor(int rank)> issue;
  const char* rank0_signature;
  const char* rank1_signature;
};

class SimMismatch : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(SimMismatch, EveryRankGetsCollectiveMismatchNamingBothSides) {
  const MismatchCase& c = GetParam();
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<Outcome> outcomes = run_catching(
        3, [&] { (void)c.issue(rank()).to_vector<std::uint8_t>(); }, seed);
    for (std::size_t r = 0; r < outcomes.size(); ++r) {
      ASSERT_TRUE(outcomes[r].code.has_value()) << c.name << " rank " << r;
      EXPECT_EQ(*outcomes[r].code, ErrorCode::CollectiveMismatch) << outcomes[r].what;
      EXPECT_EQ(outcomes[r].context.rank, static_cast<int>(r));
      EXPECT_EQ(outcomes[r].context.seq, 0);
      EXPECT_EQ(outcomes[r].context.group, "[0, 1, 2]");
      EXPECT_TRUE(contains(outcomes[r].what, c.rank1_signature)) << outcomes[r].what;
      EXPECT_TRUE(contains(outcomes[r].what, c.rank0_signature)) << outcomes[r].what;
      EXPECT_TRUE(contains(outcomes[r].what, "failure_test.cpp:")) << "call sites";
    }
  }
}

Tensor bytes(std::int64_t n, DType dtype = DType::UInt8) { return Tensor::ones({n}, dtype); }

INSTANTIATE_TEST_SUITE_P(
    Kinds, SimMismatch,
    ::testing::Values(
        MismatchCase{
            "dtype",
            [](int r) {
              return all_reduce(bytes(4, r == 1 ? DType::Int8 : DType::UInt8), "sum", world())
                  .to(DType::UInt8);
            },
            "all_reduce(UInt8, send=4, recv=4, sum)", "all_reduce(Int8, send=4, recv=4, sum)"},
        MismatchCase{
            "shape", [](int r) { return all_reduce(bytes(r == 1 ? 5 : 4), "sum", world()); },
            "all_reduce(UInt8, send=4, recv=4, sum)", "all_reduce(UInt8, send=5, recv=5, sum)"},
        MismatchCase{"reduce op",
                     [](int r) { return all_reduce(bytes(4), r == 1 ? "max" : "sum", world()); },
                     "all_reduce(UInt8, send=4, recv=4, sum)",
                     "all_reduce(UInt8, send=4, recv=4, max)"},
        MismatchCase{"op",
                     [](int r) {
                       return r == 1 ? all_gather_tensor(bytes(4), 0, world())
                                     : all_reduce(bytes(12), "sum", world());
                     },
                     "all_reduce(UInt8, send=12, recv=12, sum)",
                     "all_gather(UInt8, send=4, recv=12)"}),
    [](const ::testing::TestParamInfo<MismatchCase>& param_info) {
      std::string name = param_info.param.name;
      for (char& c : name) {
        c = c == ' ' ? '_' : c;
      }
      return name;
    });

TEST(SimFailure, AfterAMismatchTheCommunicatorIsAborted) {
  std::vector<Outcome> outcomes = run_catching(2, [] {
    try {
      (void)all_reduce(bytes(rank() == 0 ? 1 : 2), "sum", world()).to_vector<std::uint8_t>();
    } catch (const CollectiveMismatch&) {
    }
    (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
  });
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::Aborted) << outcome.what;
    EXPECT_EQ(outcome.context.seq, 1);
    EXPECT_TRUE(contains(outcome.what, "collective mismatch")) << outcome.what;
  }
}

// As AModifiedInputNamesTheWritersWorldRank: a mismatch in the group {1, 2} names both sides by
// their world ranks (1 and 2), not their ranks in the group (0 and 1), whichever arrived first.
TEST(SimFailure, AMismatchNamesBothSidesByTheirWorldRanks) {
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<Outcome> outcomes = run_catching(
        3,
        [] {
          if (rank() == 0) {
            return;
          }
          const ProcessGroup pair = new_group({1, 2}, "pair");
          if (rank() == 1) {
            (void)all_reduce(bytes(4), "sum", pair).to_vector<std::uint8_t>();
          } else {
            (void)all_gather_tensor(bytes(2), 0, pair).to_vector<std::uint8_t>();
          }
        },
        seed);
    EXPECT_FALSE(outcomes[0].code.has_value()) << outcomes[0].what;
    for (std::size_t r = 1; r < outcomes.size(); ++r) {
      const Outcome& outcome = outcomes[r];
      ASSERT_TRUE(outcome.code.has_value()) << "rank " << r;
      EXPECT_EQ(*outcome.code, ErrorCode::CollectiveMismatch) << outcome.what;
      EXPECT_TRUE(contains(outcome.what, "rank 1 issued all_reduce(UInt8, send=4, recv=4, sum)"))
          << outcome.what;
      EXPECT_TRUE(contains(outcome.what, "rank 2 issued all_gather_tensor all_gather(UInt8"))
          << outcome.what;
    }
  }
}

// The first member's call site comes from its arrival (its work's, SimGroup::Arrival::site), the
// later one's from its own call: whichever order the seed picks, each is named where it was issued.
TEST(SimFailure, AMismatchNamesWhereEachSideIssuedIt) {
  std::set<bool> rank_0_named_first;  // both orders must be seen
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<Outcome> outcomes = run_catching(
        2,
        [] {
          if (rank() == 0) {
            (void)all_reduce(bytes(4), "sum", world(), "", CallSite("first.cpp", 3, "f"))
                .to_vector<std::uint8_t>();
          } else {
            (void)all_reduce(bytes(2), "sum", world(), "", CallSite("second.cpp", 5, "g"))
                .to_vector<std::uint8_t>();
          }
        },
        seed);
    for (const Outcome& outcome : outcomes) {
      ASSERT_TRUE(outcome.code.has_value());
      EXPECT_EQ(*outcome.code, ErrorCode::CollectiveMismatch) << outcome.what;
      EXPECT_TRUE(contains(outcome.what, " at first.cpp:3 (f)")) << outcome.what;
      EXPECT_TRUE(contains(outcome.what, " at second.cpp:5 (g)")) << outcome.what;
    }
    const std::string& what = outcomes[0].what;
    ASSERT_TRUE(contains(what, "rank 0 issued") && contains(what, "rank 1 issued")) << what;
    rank_0_named_first.insert(what.find("rank 0 issued") < what.find("rank 1 issued"));
  }
  EXPECT_EQ(rank_0_named_first.size(), 2u) << "the seeds cover only one order of arrival";
}

TEST(SimFailure, RanksThatDisagreeOnTheGroupGetCollectiveMismatchNamingBoth) {
  // Rank 0 joins {0, 1}; rank 1 joins {0, 1, 2}; rank 2 joins {1, 2}: each waits for a peer
  // that is waiting in another group holding them both.
  std::vector<Outcome> outcomes = run_catching(3, [] {
    const std::vector<std::vector<int>> groups = {{0, 1}, {0, 1, 2}, {1, 2}};
    (void)all_reduce(bytes(2), "sum", groups[static_cast<std::size_t>(rank())])
        .to_vector<std::uint8_t>();
  });
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    ASSERT_TRUE(outcomes[r].code.has_value());
    EXPECT_EQ(*outcomes[r].code, ErrorCode::CollectiveMismatch) << outcomes[r].what;
    EXPECT_TRUE(contains(outcomes[r].what, "disagree on the group")) << outcomes[r].what;
    EXPECT_TRUE(contains(outcomes[r].what, "failure_test.cpp:")) << "call sites";
  }
  EXPECT_TRUE(contains(outcomes[0].what, "rank 0 waits in all_reduce #0 on group [0, 1]"));
  EXPECT_TRUE(contains(outcomes[0].what, "rank 1 waits in all_reduce #0 on group [0, 1, 2]"));
  EXPECT_TRUE(contains(outcomes[2].what, "rank 2 waits in all_reduce #0 on group [1, 2]"));
}

TEST(SimFailure, RanksThatDisagreeOnTheTagGetCollectiveMismatch) {
  std::vector<Outcome> outcomes = run_catching(2, [] {
    const ProcessGroup group = new_group({0, 1}, rank() == 0 ? "alpha" : "beta");
    (void)all_reduce(bytes(2), "sum", group).to_vector<std::uint8_t>();
  });
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::CollectiveMismatch) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "'alpha' [0, 1]")) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "'beta' [0, 1]")) << outcome.what;
  }
}

TEST(SimFailure, CyclicWaitsAcrossGroupsAreADeadlockWithEveryRanksPendingOp) {
  // Each rank waits on its first group before joining its second: a cycle 0 -> 1 -> 2 -> 0 in
  // which no group holds both ends of a wait, so nobody disagrees: a plain deadlock.
  std::vector<Outcome> outcomes = run_catching(3, [] {
    const int r = rank();
    std::vector<int> first = {r, (r + 1) % 3};
    std::vector<int> second = {(r + 2) % 3, r};
    std::sort(first.begin(), first.end());
    std::sort(second.begin(), second.end());
    (void)all_reduce(bytes(1), "sum", first).to_vector<std::uint8_t>();
    (void)all_reduce(bytes(1), "sum", second).to_vector<std::uint8_t>();
  });
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::Deadlock) << outcome.what;
    const std::string& what = outcome.what;
    EXPECT_TRUE(contains(what, "no rank can make progress"));
    EXPECT_TRUE(contains(what, "rank 0: waiting in all_reduce #0 on group [0, 1]")) << what;
    EXPECT_TRUE(contains(what, "rank 1: waiting in all_reduce #0 on group [1, 2]")) << what;
    EXPECT_TRUE(contains(what, "rank 2: waiting in all_reduce #0 on group [0, 2]")) << what;
    EXPECT_TRUE(contains(what, "not yet joined by rank(s) 1")) << what;
    EXPECT_TRUE(contains(what, "failure_test.cpp:")) << what;
  }
}

// A cycle as above beside two ranks that already ended: the deadlock's rank table says how each
// ended, in rank order (the last lines of the detail).
TEST(SimFailure, TheDeadlocksRankTableSaysHowEachEndedRankEnded) {
  std::vector<Outcome> outcomes(5);
  std::string rethrown;
  try {
    sim::run(quiet(5), [&] {
      const int r = rank();
      if (r == 3) {
        return;
      }
      if (r == 4) {
        throw std::runtime_error("rank 4's own bug");
      }
      // 0 waits for 1, 1 for 2, 2 for 0.
      std::vector<int> first = {r, (r + 1) % 3};
      std::sort(first.begin(), first.end());
      try {
        (void)all_reduce(bytes(1), "sum", first).to_vector<std::uint8_t>();
      } catch (const Error& e) {
        outcomes[static_cast<std::size_t>(r)] = Outcome{e.code(), e.what(), e.context()};
      }
    });
  } catch (const std::exception& e) {
    rethrown = e.what();
  }
  EXPECT_EQ(rethrown, "rank 4's own bug") << "sim::run rethrows rank 4's error";
  for (std::size_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(outcomes[r].code.has_value()) << "rank " << r;
    EXPECT_EQ(*outcomes[r].code, ErrorCode::Deadlock) << outcomes[r].what;
    EXPECT_TRUE(outcomes[r].what.ends_with(
        "\n  rank 3: finished\n  rank 4: ended with an error: rank 4's own bug"))
        << outcomes[r].what;
  }
}

// A rank waiting on a result another rank issued (a tensor they share) is listed as waiting in
// that rank's operation: here ranks 1 and 2 wait on rank 0's all_reduce, which neither joins.
TEST(SimFailure, TheDeadlocksRankTableNamesTheIssuerOfAnotherRanksOperation) {
  Tensor shared;
  std::vector<Outcome> outcomes = run_catching(3, [&shared] {
    const ProcessGroup signal = new_group({0, 1, 2}, "signal");
    if (rank() == 0) {
      shared = all_reduce(bytes(1), "sum", world());
    }
    // Rank 0 issued its all_reduce before this one completes.
    (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
    (void)shared.to_vector<std::uint8_t>();
  });
  shared = Tensor();
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    ASSERT_TRUE(outcomes[r].code.has_value()) << "rank " << r;
    EXPECT_EQ(*outcomes[r].code, ErrorCode::Deadlock) << outcomes[r].what;
    const std::string& what = outcomes[r].what;
    EXPECT_TRUE(contains(what, "\n  rank 0: waiting in all_reduce #0 on group [0, 1, 2]")) << what;
    EXPECT_TRUE(contains(what, "\n  rank 1: waiting in rank 0's all_reduce #0 on group [0, 1, 2]"))
        << what;
    EXPECT_TRUE(contains(what, "\n  rank 2: waiting in rank 0's all_reduce #0 on group [0, 1, 2]"))
        << what;
    EXPECT_TRUE(contains(what, "; not yet joined by rank(s) 1, 2")) << what;
  }
}

// A rank waiting on a result another rank issued raises the failure as its own error: [rank R]
// is the rank that raised it (docs/errors.md, "Reading a message"), the waiter, while op, seq and
// group stay the collective's and the detail names its issuer. Until 2026-12-06 the waiter raised
// the issuer's own error, which named the issuer as the rank that raised it.
TEST(SimFailure, AWaitOnAnotherRanksFailedResultNamesTheWaiterAsTheRankThatRaisedIt) {
  Tensor shared;
  std::vector<Outcome> outcomes = run_catching(3, [&shared] {
    const ProcessGroup signal = new_group({0, 1, 2}, "signal");
    if (rank() == 0) {
      shared = all_reduce(bytes(1), "sum", {0, 2});
    }
    // Rank 0 issued its all_reduce before this one completes.
    (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
    if (rank() != 2) {
      (void)shared.to_vector<std::uint8_t>();  // rank 2 returns without joining
    }
  });
  shared = Tensor();
  for (int r : {0, 1}) {
    const Outcome& outcome = outcomes[static_cast<std::size_t>(r)];
    ASSERT_TRUE(outcome.code.has_value()) << "rank " << r;
    EXPECT_EQ(*outcome.code, ErrorCode::Deadlock) << outcome.what;
    EXPECT_EQ(outcome.context.rank, r) << outcome.what;
    EXPECT_EQ(outcome.context.op, "all_reduce") << outcome.what;
    EXPECT_EQ(outcome.context.seq, 0) << outcome.what;
    EXPECT_EQ(outcome.context.group, "[0, 2]") << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "returned from its rank function without joining"))
        << outcome.what;
  }
  EXPECT_TRUE(outcomes[0].what.starts_with(
      "chorus::Deadlock: [rank 0] all_reduce #0 on group [0, 2]: rank 2 returned"))
      << outcomes[0].what;
  EXPECT_TRUE(outcomes[1].what.starts_with(
      "chorus::Deadlock: [rank 1] all_reduce #0 on group [0, 2]: rank 0 issued this collective "
      "and rank 1 waited on its result: rank 2 returned"))
      << outcomes[1].what;
  EXPECT_FALSE(outcomes[2].code.has_value()) << outcomes[2].what;
}

TEST(SimFailure, APeerThatReturnsWithoutJoiningIsReportedNotAwaitedForever) {
  std::vector<Outcome> outcomes = run_catching(3, [] {
    if (rank() == 0) {
      (void)all_reduce(bytes(2), "sum", world()).to_vector<std::uint8_t>();
    }
  });
  ASSERT_TRUE(outcomes[0].code.has_value());
  EXPECT_EQ(*outcomes[0].code, ErrorCode::Deadlock);
  EXPECT_TRUE(contains(outcomes[0].what, "returned from its rank function without joining"))
      << outcomes[0].what;
  EXPECT_FALSE(outcomes[1].code.has_value());
  EXPECT_FALSE(outcomes[2].code.has_value());
}

// The classic skipped collective: rank 1 skips the first of two all_reduces on "dp", so its
// one call pairs with the others' #0 and it returns; the others' #1 names where rank 1 stopped.
TEST(SimFailure, AMemberThatReturnedWithoutJoiningIsNamedWithItsLastOperationOnTheGroup) {
  std::vector<Outcome> outcomes = run_catching(3, [] {
    const ProcessGroup dp = new_group({0, 1, 2}, "dp");
    if (rank() == 1) {
      (void)all_reduce(bytes(1), "sum", dp, "", CallSite("train.cpp", 7, "step"))
          .to_vector<std::uint8_t>();
      return;
    }
    (void)all_reduce(bytes(1), "sum", dp).to_vector<std::uint8_t>();
    (void)all_reduce(bytes(1), "sum", dp).to_vector<std::uint8_t>();
  });
  for (int r : {0, 2}) {
    const Outcome& outcome = outcomes[static_cast<std::size_t>(r)];
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::Deadlock);
    EXPECT_EQ(outcome.context.seq, 1);
    EXPECT_TRUE(contains(outcome.what,
                         "rank 1 returned from its rank function without joining this collective "
                         "(its last operation on this group was #0, issued at train.cpp:7 "
                         "(step); on NCCL this would hang)"))
        << outcome.what;
  }
}

TEST(SimFailure, ADeadPeerGivesItsWaitingPeersRankFailure) {
  std::vector<Outcome> outcomes(3);
  EXPECT_THROW(
      sim::run(
          quiet(3),
          [&] {
            if (rank() == 1) {
              throw std::runtime_error("rank 1's own bug");
            }
            try {
              (void)all_reduce(bytes(2), "sum", world()).to_vector<std::uint8_t>();
            } catch (const Error& e) {
              outcomes[static_cast<std::size_t>(rank())] = Outcome{e.code(), e.what(), e.context()};
            }
          }),
      std::runtime_error)
      << "sim::run rethrows the first rank error";
  for (int r : {0, 2}) {
    const Outcome& outcome = outcomes[static_cast<std::size_t>(r)];
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::RankFailure) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "rank 1 failed before joining this collective"));
    EXPECT_TRUE(contains(outcome.what, "rank 1's own bug"));
    EXPECT_EQ(outcome.context.rank, r);
    EXPECT_EQ(outcome.context.op, "all_reduce");
  }
}

TEST(SimFailure, RankFailureEvenWhenNoRankCanRun) {
  // Rank 0 blocks first; then rank 1 dies: rank 0 gets RankFailure, never Deadlock.
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<Outcome> outcomes(2);
    SimReport report = sim::simulate(quiet(2, seed), [&] {
      if (rank() == 1) {
        (void)all_reduce(bytes(1), "sum", {1}).to_vector<std::uint8_t>();
        throw InvalidArgument(ErrorContext{1, "user", -1, ""}, "dies");
      }
      try {
        (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
      } catch (const Error& e) {
        outcomes[0] = Outcome{e.code(), e.what(), e.context()};
      }
    });
    EXPECT_FALSE(report.ok());
    ASSERT_TRUE(outcomes[0].code.has_value());
    EXPECT_EQ(*outcomes[0].code, ErrorCode::RankFailure) << outcomes[0].what;
  }
}

TEST(SimFailure, RunReturnsNormallyWhenRanksCatchTheirErrors) {
  SimReport report = sim::run(quiet(2), [] {
    try {
      (void)all_reduce(bytes(rank() + 1), "sum", world()).to_vector<std::uint8_t>();
    } catch (const CollectiveMismatch&) {
    }
  });
  EXPECT_TRUE(report.ok());
}

TEST(SimFailure, TimeoutFailsTheCollectiveOnEveryRankAndAbortsTheCommunicator) {
  SimOptions options = quiet(2);
  options.timeout = std::chrono::microseconds(50);  // 50 scheduling steps of virtual time
  std::vector<Outcome> first(2);
  std::vector<Outcome> second(2);
  sim::run(options, [&] {
    const auto r = static_cast<std::size_t>(rank());
    try {
      if (rank() == 1) {
        // Busy on its own for far longer than rank 0's deadline, then joins.
        for (int i = 0; i < 200; ++i) {
          (void)all_reduce(bytes(1), "sum", {1}).to_vector<std::uint8_t>();
        }
      }
      (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
    } catch (const Error& e) {
      first[r] = Outcome{e.code(), e.what(), e.context()};
    }
    try {
      (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
    } catch (const Error& e) {
      second[r] = Outcome{e.code(), e.what(), e.context()};
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(first[r].code.has_value()) << "rank " << r;
    EXPECT_EQ(*first[r].code, ErrorCode::Timeout) << first[r].what;
    EXPECT_TRUE(contains(first[r].what, "deadline")) << first[r].what;
    EXPECT_TRUE(contains(first[r].what, "communicator is aborted")) << first[r].what;
    ASSERT_TRUE(second[r].code.has_value());
    EXPECT_EQ(*second[r].code, ErrorCode::Aborted) << second[r].what;
    EXPECT_TRUE(contains(second[r].what, "timed out")) << second[r].what;
  }
  EXPECT_TRUE(contains(first[1].what, "rank 0's wait passed its deadline")) << first[1].what;
  EXPECT_TRUE(contains(first[1].what, "when rank(s) 1 had not joined it yet")) << first[1].what;
}

TEST(SimFailure, LivelockHitsTheStepBudget) {
  SimOptions options = quiet(2);
  options.max_steps = 500;
  SimReport report = sim::simulate(options, [] {
    if (rank() == 0) {
      while (true) {  // never ends, but calls chorus: the budget stops it
        (void)all_reduce(bytes(1), "sum", {0}).to_vector<std::uint8_t>();
      }
    }
  });
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(contains(report.rank_errors[0], "step budget")) << report.rank_errors[0];
}

// The budget is SimOptions::max_steps decisions exactly: the livelock is declared when the
// (max_steps + 1)-th would be taken, and the error counts max_steps of them.
TEST(SimFailure, TheStepBudgetRunsOutAfterExactlyMaxStepsDecisions) {
  SimOptions options = quiet(1);
  options.max_steps = 40;
  SimReport report = sim::simulate(options, [] {
    while (true) {  // never ends, but calls chorus: the budget stops it
      (void)all_reduce(bytes(1), "sum", {0}).to_vector<std::uint8_t>();
    }
  });
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(contains(report.rank_errors[0],
                       "the simulation took 40 scheduling decisions without ending (livelock?); "
                       "step budget SimOptions::max_steps exhausted"))
      << report.rank_errors[0];
}

// A rank that catches every error and retries would never end once the budget ran out (its
// operations fail at once, but each is a scheduling decision): steps_after_budget decisions
// later its next operation unwinds it, past its handler, and it fails with Deadlock.
TEST(SimFailure, ARankThatRetriesForeverAfterTheStepBudgetIsStopped) {
  SimOptions options = quiet(2);
  options.max_steps = 500;
  options.steps_after_budget = 300;
  std::vector<std::uint64_t> caught(2, 0);
  SimReport report = sim::simulate(options, [&caught] {
    while (true) {
      try {
        (void)all_reduce(bytes(1), "sum", {0, 1}).to_vector<std::uint8_t>();
      } catch (const chorus::Error&) {
        ++caught[static_cast<std::size_t>(rank())];
      }
    }
  });
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.marks["livelock.rank_stopped"], 2u);
  EXPECT_GE(report.steps, options.max_steps + options.steps_after_budget);
  for (int r = 0; r < 2; ++r) {
    const std::string& error = report.rank_errors[static_cast<std::size_t>(r)];
    EXPECT_TRUE(contains(error, "chorus::Deadlock: [rank " + std::to_string(r) + "] all_reduce #"))
        << error;
    EXPECT_TRUE(contains(error,
                         "scheduling decisions after the step budget "
                         "(SimOptions::max_steps = 500) ran out, catching the errors "
                         "they raised, so the simulator stopped it"))
        << error;
    EXPECT_GT(caught[static_cast<std::size_t>(r)], 0u);  // it did retry
  }
}

// steps_after_budget counts exactly: the ranks are stopped at the first operation started once
// max_steps + steps_after_budget decisions were taken, and the error says how far past the
// budget that was.
TEST(SimFailure, ARankIsStoppedExactlyStepsAfterBudgetDecisionsPastTheBudget) {
  SimOptions options = quiet(1);
  options.max_steps = 100;
  options.steps_after_budget = 50;
  SimReport report = sim::simulate(options, [] {
    while (true) {
      try {
        (void)all_reduce(bytes(1), "sum", {0}).to_vector<std::uint8_t>();
      } catch (const chorus::Error&) {
      }
    }
  });
  EXPECT_EQ(report.marks["livelock.rank_stopped"], 1u);
  // The stop is set once decision 150 is due; the rank's operation in decision 151 unwinds it.
  EXPECT_TRUE(contains(report.rank_errors[0],
                       "rank 0 still issued operations 51 scheduling decisions after the step "
                       "budget (SimOptions::max_steps = 100) ran out"))
      << report.rank_errors[0];
}

TEST(SimFailure, ATimeoutThatIsNotPositiveIsRefused) {
  for (const std::chrono::nanoseconds timeout :
       {std::chrono::nanoseconds(0), std::chrono::nanoseconds(-5)}) {
    SimOptions options = quiet(2);
    options.timeout = timeout;
    testing::expect_invalid_argument([&] { (void)sim::simulate(options, [] {}); },
                                     {"SimOptions::timeout is " + std::to_string(timeout.count()) +
                                      " ns: a wait's timeout must be positive"});
  }
}

// PCT's bug depth runs at both ends of its range (ErrorsDocRunning.SimOptionsOutOfRange refuses
// the values just outside it).
TEST(SimFailure, APctDepthOfOneOrTheMaximumRuns) {
  for (const int depth : {1, sim::kPctDepthMax}) {
    SimOptions options = quiet(1);
    options.strategy = sim::Strategy::Pct;
    options.pct_depth = depth;
    EXPECT_TRUE(sim::simulate(options, [] {}).ok()) << depth;
  }
}

// The fault plan's bounds are inclusive: a delay of exactly kDelayStepsMax steps is allowed (at an
// operation the program never reaches, so it never fires), and random faults without delays need
// no delay_steps_max.
TEST(SimFailure, FaultPlanLimitsAreInclusiveAndDelayStepsOnlyMatterForDelays) {
  SimOptions options = quiet(1);
  options.faults = {sim::Fault::delay(0, 5, sim::kDelayStepsMax)};
  EXPECT_TRUE(sim::simulate(options, [] {}).ok());
  options.faults.clear();
  options.random_faults.crash_ppm = 1;
  options.random_faults.delay_ppm = 0;
  options.random_faults.delay_steps_max = 0;
  EXPECT_TRUE(sim::simulate(options, [] {}).ok());
  options.random_faults.delay_ppm = 1;
  const testing::CaughtError caught =
      testing::expect_error<InvalidArgument>([&] { (void)sim::simulate(options, [] {}); }, {});
  EXPECT_EQ(caught.detail, "random delays need RandomFaults::delay_steps_max >= 1");
}

// print_failures prints the report of a failing run only.
TEST(SimFailure, ASuccessfulRunPrintsNothingEvenWithPrintFailures) {
  SimOptions options = quiet(1);
  options.print_failures = true;
  ::testing::internal::CaptureStderr();
  const SimReport report = sim::simulate(options, [] {});
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(printed, "");
}

// A timeout close to the end of the clock: the hang's timeout skips virtual time to its deadline,
// and the delay after it would end past the clock's end. Virtual time saturates instead of
// wrapping (signed overflow, which the asan-ubsan preset reports), and the run still ends.
TEST(SimFailure, VirtualTimeNearTheEndOfTheClockDoesNotWrap) {
  SimOptions options = quiet(2);
  options.timeout = std::chrono::nanoseconds::max() - std::chrono::seconds(1);
  options.faults = {sim::Fault::hang(1, 0), sim::Fault::delay(0, 1, std::uint64_t{1} << 30)};
  std::vector<std::string> first(2);
  SimReport report = sim::simulate(options, [&first] {
    try {
      (void)all_reduce(bytes(1), "sum", {0, 1}).to_vector<std::uint8_t>();
    } catch (const chorus::Error& error) {
      first[static_cast<std::size_t>(rank())] = error.what();
    }
    if (rank() == 0) {
      (void)all_reduce(bytes(1), "sum", {0}).to_vector<std::uint8_t>();  // delayed
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(first[static_cast<std::size_t>(r)], "chorus::Timeout"))
        << first[static_cast<std::size_t>(r)];
  }
  EXPECT_EQ(report.marks["fault.time_skip"], 2u) << report.to_string();
}

TEST(SimFailure, AFailingRunPrintsTheSeedAndAReplayCommand) {
  const testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
  const auto fail_on_rank_0 = [] {
    if (rank() == 0) {
      throw std::runtime_error("boom");
    }
  };
  SimOptions options = quiet(2, 77);
  options.print_failures = true;
  options.seed_from_environment = true;
  ::testing::internal::CaptureStderr();
  SimReport report = sim::simulate(options, fail_on_rank_0);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(contains(printed, "seed 77")) << printed;
  EXPECT_TRUE(contains(printed, "replay: CHORUS_SIM_SEED=77 ")) << printed;
  EXPECT_TRUE(contains(printed, "rank 0 failed: boom")) << printed;
  EXPECT_EQ(report.rank_errors[0], "boom");
  EXPECT_TRUE(report.rank_errors[1].empty());
  // A run that does not read the environment says what to set instead of a command that would
  // not reach it.
  options.seed_from_environment = false;
  ::testing::internal::CaptureStderr();
  report = sim::simulate(options, fail_on_rank_0);
  const std::string unread = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(unread,
                       "replay: (set SimOptions::seed = 77: this run does not read "
                       "CHORUS_SIM_SEED, SimOptions::seed_from_environment is false)\n"))
      << unread;
  EXPECT_FALSE(contains(unread, "CHORUS_SIM_SEED=")) << unread;
}

// What `command_line_probe <args>` prints: its command line as a replay command repeats it.
std::string probe_command_line(const std::vector<std::string>& args) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return "";
  }
  std::vector<char*> argv{const_cast<char*>(CHORUS_COMMAND_LINE_PROBE)};
  for (const std::string& arg : args) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(out[1], STDOUT_FILENO);  // dup2 clears close-on-exec on the copy
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const int fork_error = errno;
  ::close(out[1]);
  if (child < 0) {
    ::close(out[0]);
    ADD_FAILURE() << "fork: " << std::strerror(fork_error);
    return "";
  }
  std::string printed;
  char chunk[256];
  for (;;) {
    const ssize_t n = ::read(out[0], chunk, sizeof chunk);
    if (n > 0) {
      printed.append(chunk, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(out[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  return printed;
}

// Each argument of the replay command reads back as itself in a POSIX shell: an empty one as '',
// one with a space or a shell character in single quotes, a single quote as '\''.
TEST(SimFailure, TheReplayCommandQuotesEachArgumentForTheShell) {
  const std::string printed = probe_command_line({"", "plain", "a b", "it's", "$HOME", "-x=1"});
  // After the program's path (itself quoted if the build directory needs it).
  EXPECT_TRUE(printed.starts_with(" ") &&
              printed.ends_with(" '' plain 'a b' 'it'\\''s' '$HOME' -x=1"))
      << printed;
}

// chorus::run's command lines without the flag that the replay command's variable overrides.
TEST(SimFailure, TheReplayCommandRerunsTheCommandLineItIsGiven) {
  const testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
  SimOptions options = quiet(2, 7);
  options.seed_from_environment = true;
  options.command_without_seed = {"prog", "a b", "--replay=r"};
  options.command_without_replay = {"prog", "--seed=s"};
  const auto program = [] { (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>(); };
  const SimReport seeded = sim::simulate(options, program);
  EXPECT_EQ(seeded.replay_command, "CHORUS_SIM_SEED=7 prog 'a b' --replay=r");
  ASSERT_FALSE(seeded.replay_token.empty());
  options.replay = seeded.replay_token;
  const SimReport followed = sim::simulate(options, program);
  EXPECT_EQ(followed.replay_command, "CHORUS_SIM_REPLAY=" + seeded.replay_token + " prog --seed=s");
}

TEST(SimFailure, ReplayingTheSeedReproducesTheFailureExactly) {
  // A bug that shows only in some interleavings: rank 1 reads a shared flag that rank 0 sets
  // after its first collective; whether rank 1 sees it depends on the schedule.
  const auto program = [](bool& flag) {
    return [&flag] {
      if (rank() == 0) {
        (void)all_reduce(bytes(1), "sum", {0}).to_vector<std::uint8_t>();
        flag = true;
      } else {
        (void)all_reduce(bytes(1), "sum", {1}).to_vector<std::uint8_t>();
        if (flag) {
          throw std::runtime_error("saw the flag");
        }
      }
    };
  };
  std::optional<SimReport> failing;
  for (std::uint64_t seed = 0; seed < 64 && !failing; ++seed) {
    bool flag = false;
    SimReport report = sim::simulate(quiet(2, seed), program(flag));
    if (!report.ok()) {
      failing = report;
    }
  }
  ASSERT_TRUE(failing.has_value()) << "some schedule must expose the race";
  // Replay as the printed command does: through the environment, whatever the options say.
  SimOptions options = quiet(2, failing->seed + 1);
  options.seed_from_environment = true;
  const testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::to_string(failing->seed)}});
  bool flag = false;
  SimReport replayed = sim::simulate(options, program(flag));
  EXPECT_EQ(replayed.seed, failing->seed);
  EXPECT_EQ(replayed.schedule_hash, failing->schedule_hash);
  EXPECT_EQ(replayed.schedule, failing->schedule);
  EXPECT_EQ(replayed.rank_errors, failing->rank_errors);
  // The failing run did not read the environment: its report says what to set instead.
  EXPECT_EQ(failing->replay_command.find(
                "(set SimOptions::seed = " + std::to_string(failing->seed) + ": "),
            0u)
      << failing->replay_command;
}

// A run driven by a choice list that made more choices than it keeps has no token, and its
// seed would replay another run: the report offers no command rather than a wrong one.
TEST(SimFailure, AListDrivenRunTooLongForAReplayTokenOffersNoReplayCommand) {
  SimOptions options = quiet(2, 5);
  options.choices = std::vector<std::uint64_t>{1, 0, 1};
  options.choices_record_max = 2;
  const SimReport report = sim::simulate(options, [] {
    for (int i = 0; i < 3; ++i) {
      (void)all_reduce(bytes(rank() + 1), "sum", world()).to_vector<std::uint8_t>();
    }
  });
  EXPECT_TRUE(report.replay_token.empty());
  EXPECT_EQ(report.replay_command.find("CHORUS_SIM_SEED"), std::string::npos)
      << report.replay_command;
  EXPECT_NE(report.replay_command.find("choices_record_max"), std::string::npos)
      << report.replay_command;
}

TEST(SimFailure, ADroppedWorkThatFailsIsRaisedAtTheRanksNextCall) {
  std::vector<Outcome> outcomes = run_catching(2, [] {
    // Rank 0 drops a mismatched collective; completing it fails in the destructor, which
    // records the error and raises it at rank 0's next chorus call.
    { Tensor dropped = all_reduce(bytes(rank() + 1), "sum", world()); }
    (void)all_reduce(bytes(1), "sum", {rank()}).to_vector<std::uint8_t>();
  });
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::CollectiveMismatch) << outcome.what;
    EXPECT_EQ(outcome.context.seq, 0);
    EXPECT_EQ(outcome.context.op, "all_reduce");
    EXPECT_TRUE(contains(outcome.what, "the result of all_reduce #0 (issued at ")) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "was dropped un-waited, and completing it failed"))
        << outcome.what;
  }
}

TEST(SimFailure, WritingAnInputBeforeCompletionFailsTheCollectiveEverywhere) {
  std::vector<Outcome> outcomes = run_catching(2, [] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 0) {
      Tensor sum = all_reduce(input, "sum", world());
      input.copy_(Tensor::full({4}, 100, DType::Int32));  // a race on NCCL
      // Rank 1 joins the world collective only after this signal: it cannot have completed.
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)sum.to_vector<std::int32_t>();
    } else {
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)all_reduce(input, "sum", world()).to_vector<std::int32_t>();
    }
  });
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << outcome.what;
    EXPECT_EQ(outcome.context.op, "all_reduce");
    EXPECT_EQ(outcome.context.seq, 0);
    EXPECT_TRUE(contains(outcome.what, "rank 0 modified input 0 of all_reduce")) << outcome.what;
    EXPECT_FALSE(contains(outcome.what, "likely through")) << outcome.what;  // its own code
  }
}

// Note [Likely writers]: an in-place collective on another communicator that completed while the
// collective was pending, and wrote over its input, is named as the likely writer (the in-place
// forms wait only for collectives that write their tensor). Until 2026-12-07 only the victim was
// named. A write by the rank's own code (above) names none.
// Rank 0's input of a collective on {0, 1} is overwritten, while pending, by its in-place
// all_reduce on group 'writer' (every rank but 1); rank 1 joins only after a signal from rank 0.
std::vector<Outcome> input_overwritten_in_place(int ranks) {
  return run_catching(ranks, [ranks] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    std::vector<int> all_but_1;
    for (int r = 0; r < ranks; ++r) {
      if (r != 1) {
        all_but_1.push_back(r);
      }
    }
    const ProcessGroup writer = new_group(all_but_1, "writer");
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 0) {
      Tensor sum = all_reduce(input, "sum", {0, 1});
      (void)all_reduce_inplace(input, "sum", writer).to_vector<std::int32_t>();  // writes input
      // Rank 1 joins the collective on {0, 1} only after this signal: it cannot have completed.
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)sum.to_vector<std::int32_t>();
    } else if (rank() == 1) {
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)all_reduce(input, "sum", {0, 1}).to_vector<std::int32_t>();
    } else {
      (void)all_reduce_inplace(input, "sum", writer).to_vector<std::int32_t>();
    }
  });
}

TEST(SimFailure, AnInputOverwrittenByAnInPlaceCollectiveNamesItAsTheLikelyWriter) {
  const std::vector<Outcome> outcomes = input_overwritten_in_place(3);
  EXPECT_FALSE(outcomes[2].code.has_value()) << outcomes[2].what;
  for (std::size_t r = 0; r < 2; ++r) {
    const Outcome& outcome = outcomes[r];
    ASSERT_TRUE(outcome.code.has_value()) << "rank " << r;
    EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << outcome.what;
    EXPECT_EQ(outcome.context.op, "all_reduce");
    EXPECT_EQ(outcome.context.seq, 0);
    EXPECT_EQ(outcome.context.group, "[0, 1]");
    EXPECT_TRUE(contains(outcome.what, "rank 0 modified input 0 of all_reduce (issued at "))
        << outcome.what;
    EXPECT_TRUE(contains(outcome.what,
                         "), likely through rank 0's all_reduce_inplace #0 on group 'writer' "
                         "[0, 2] (issued at "))
        << outcome.what;
    EXPECT_TRUE(contains(outcome.what,
                         "), which completed while it was pending and wrote its output there "
                         "before the collective completed: "))
        << outcome.what;
  }
}

// The same in a world of 20 ranks: the in-place collective writes 19 outputs at once, among which
// a ring of 16 shared by the world lost the writer's; each rank keeps its own.
TEST(SimFailure, TheLikelyWriterIsNamedAfterACollectiveOfManyRanks) {
  const std::vector<Outcome> outcomes = input_overwritten_in_place(20);
  for (std::size_t r = 0; r < 2; ++r) {
    const Outcome& outcome = outcomes[r];
    ASSERT_TRUE(outcome.code.has_value()) << "rank " << r;
    EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << outcome.what;
    EXPECT_TRUE(contains(outcome.what,
                         "), likely through rank 0's all_reduce_inplace #0 on group "
                         "'writer' [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
                         "15, 16, 17, 18, 19] (issued at "))
        << outcome.what;
  }
}

// Note [Likely writers]: each rank's ring keeps the outputs of its last 16 recorded writes, and
// only the written entries are read (its room is left unset as a rank's slot is made). The writer,
// followed by `later` in-place collectives of rank 0 on another tensor and the signal's output, all
// while the victim is pending: named while it is among the last 16, not once the later ones
// (`later` + 1) pushed it out.
std::vector<Outcome> input_overwritten_then_others(int later) {
  return run_catching(3, [later] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    const ProcessGroup writer = new_group({0, 2}, "writer");
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    Tensor other = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 0 || rank() == 2) {
      Tensor sum;
      if (rank() == 0) {
        sum = all_reduce(input, "sum", {0, 1});
      }
      (void)all_reduce_inplace(input, "sum", writer).to_vector<std::int32_t>();  // writes input
      for (int i = 0; i < later; ++i) {
        (void)all_reduce_inplace(other, "sum", writer).to_vector<std::int32_t>();
      }
      if (rank() == 0) {
        (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
        (void)sum.to_vector<std::int32_t>();
      }
    } else {
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)all_reduce(input, "sum", {0, 1}).to_vector<std::int32_t>();
    }
  });
}

TEST(SimFailure, TheLikelyWriterIsNamedWhileAmongItsRanksLast16Writes) {
  for (const int later : {0, 5, 14, 15, 21}) {
    const std::vector<Outcome> outcomes = input_overwritten_then_others(later);
    const Outcome& outcome = outcomes[0];
    ASSERT_TRUE(outcome.code.has_value()) << later;
    EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << outcome.what;
    EXPECT_EQ(contains(outcome.what,
                       "), likely through rank 0's all_reduce_inplace #0 on group "
                       "'writer' [0, 2] (issued at "),
              later < 15)
        << later << ": " << outcome.what;
    EXPECT_EQ(contains(outcome.what, "likely through"), later < 15)
        << later << ": " << outcome.what;
  }
}

// Two writers of one collective: the report names both, in group-rank order, in one text (the
// check's loop builds the text out of line, SimWorld::append_modified_input).
TEST(SimFailure, EveryModifiedInputOfACollectiveIsNamedInOneText) {
  std::vector<Outcome> outcomes = run_catching(3, [] {
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 2) {
      // Joins the world collective only after both writers signalled: it cannot have completed.
      const ProcessGroup signal0 = new_group({0, 2}, "signal0");
      const ProcessGroup signal1 = new_group({1, 2}, "signal1");
      (void)all_reduce(bytes(1), "sum", signal0).to_vector<std::uint8_t>();
      (void)all_reduce(bytes(1), "sum", signal1).to_vector<std::uint8_t>();
      (void)all_reduce(input, "sum", world()).to_vector<std::int32_t>();
      return;
    }
    const ProcessGroup signal =
        rank() == 0 ? new_group({0, 2}, "signal0") : new_group({1, 2}, "signal1");
    Tensor sum = all_reduce(input, "sum", world());
    input.copy_(Tensor::full({4}, 100, DType::Int32));  // a race on NCCL
    (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
    (void)sum.to_vector<std::int32_t>();
  });
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << outcome.what;
    const std::size_t first =
        outcome.what.find("rank 0 modified input 0 of all_reduce (issued at ");
    const std::size_t second =
        outcome.what.find("; rank 1 modified input 0 of all_reduce (issued at ");
    ASSERT_NE(first, std::string::npos) << outcome.what;
    ASSERT_NE(second, std::string::npos) << outcome.what;
    EXPECT_LT(first, second) << outcome.what;
    EXPECT_FALSE(contains(outcome.what, "rank 2 modified")) << outcome.what;
    EXPECT_EQ(outcome.what.find("before the collective completed"),
              outcome.what.rfind("before the collective completed"))
        << outcome.what;
  }
}

// The report names the writer by its world rank, not its rank in the group: world rank 1 is rank 0
// of the group {1, 2}.
TEST(SimFailure, AModifiedInputNamesTheWritersWorldRank) {
  std::vector<Outcome> outcomes = run_catching(3, [] {
    if (rank() == 0) {
      return;
    }
    const ProcessGroup pair = new_group({1, 2}, "pair");
    const ProcessGroup signal = new_group({1, 2}, "signal");
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 1) {
      Tensor sum = all_reduce(input, "sum", pair);
      input.copy_(Tensor::full({4}, 100, DType::Int32));  // a race on NCCL
      // Rank 2 joins the pair's collective only after this signal: it cannot have completed.
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)sum.to_vector<std::int32_t>();
    } else {
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)all_reduce(input, "sum", pair).to_vector<std::int32_t>();
    }
  });
  EXPECT_FALSE(outcomes[0].code.has_value()) << outcomes[0].what;
  for (std::size_t r = 1; r < outcomes.size(); ++r) {
    const Outcome& outcome = outcomes[r];
    ASSERT_TRUE(outcome.code.has_value()) << "rank " << r;
    EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "rank 1 modified input 0 of all_reduce")) << outcome.what;
    EXPECT_FALSE(contains(outcome.what, "rank 0 modified")) << outcome.what;
  }
}

// SimOptions::check_buffers = false (Note [Buffer checks], for `chorus bench`): the same race
// goes unnoticed, and a pending output is not poisoned (it keeps what the allocator gave it).
TEST(SimFailure, WithoutBufferChecksAModifiedInputAndAnEarlyReadGoUnnoticed) {
  SimOptions options = quiet(2);
  options.check_buffers = false;
  std::vector<std::int32_t> sums(2);
  std::int32_t early = 0;
  const SimReport report = sim::run(options, [&] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    const ProcessGroup late = new_group({0, 1}, "late");
    const auto me = static_cast<std::size_t>(rank());
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 0) {
      {
        // Its block goes back to the rank's pool, and the next output of that size gets it.
        const Tensor freed = Tensor::full({4}, -7, DType::Int32);
      }
      // Rank 1 joins both collectives only after the signal: neither can have completed.
      const Tensor early_result = all_reduce(input, "sum", world());
      std::memcpy(&early, early_result.unsafe_data_ptr(), sizeof early);
      Tensor sum = all_reduce(input, "sum", late);
      input.copy_(Tensor::full({4}, 100, DType::Int32));  // a race on NCCL
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      sums[me] = sum.to_vector<std::int32_t>().back();
      EXPECT_EQ(early_result.to_vector<std::int32_t>().back(), 101);
    } else {
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      EXPECT_EQ(all_reduce(input, "sum", world()).to_vector<std::int32_t>().back(), 101);
      sums[me] = all_reduce(input, "sum", late).to_vector<std::int32_t>().back();
    }
  });
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(early, -7);  // not poisoned: the value it had
  // Both collectives completed after rank 0 wrote 100 into their input, and read it.
  EXPECT_EQ(sums, (std::vector<std::int32_t>{101, 101}));
}

// Rank 0 issues an all_reduce (one input) or an all_reduce_coalesced (several) of Int32 inputs of
// `counts` elements, input i filled with i + 1, and flips a bit of the last byte of input
// `written` (none when it is counts.size()) before rank 1 joins; then both wait. What each caught.
std::vector<Outcome> write_pending_input(const std::vector<std::int64_t>& counts,
                                         std::size_t written) {
  return run_catching(2, [&] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      inputs.push_back(Tensor::full({counts[i]}, static_cast<double>(i + 1), DType::Int32));
    }
    const auto issue = [&] {
      return inputs.size() == 1 ? std::vector<Tensor>{all_reduce(inputs[0], "sum", world())}
                                : all_reduce_coalesced(inputs, ReduceOp::Kind::Sum, world());
    };
    std::vector<Tensor> results;
    if (rank() == 0) {
      results = issue();
      if (written < inputs.size()) {
        // The input's last byte (a race on NCCL): a comparison that stops short misses it.
        auto* last = reinterpret_cast<unsigned char*>(inputs[written].data_ptr<std::int32_t>() +
                                                      counts[written]) -
                     1;
        *last ^= 0x40;
      }
      // Rank 1 issues only after this signal: the collective cannot have completed.
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
    } else {
      (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
      results = issue();
    }
    for (std::size_t i = 0; i < results.size(); ++i) {
      // Counted rather than compared with a vector of the expected sums: GCC 12 at -O3 takes
      // that temporary's deallocation for a free of a non-heap pointer (-Wfree-nonheap-object).
      const std::vector<std::int32_t> sums = results[i].to_vector<std::int32_t>();
      const std::int32_t expected = 2 * static_cast<std::int32_t>(i + 1);
      EXPECT_EQ(std::count(sums.begin(), sums.end(), expected),
                static_cast<std::ptrdiff_t>(sums.size()))
          << "result " << i << " holds a sum other than " << expected;
    }
  });
}

// Note [Input snapshots]: an input of up to kInputSnapshotBytesMax bytes is compared with a copy,
// a larger one by checksum. A write into the last byte is reported on both sides of the
// threshold, alone and in a batch mixing both (a small input after a large one: the copies must
// line up), and an untouched batch whose inputs differ from each other is not reported.
TEST(SimFailure, AModifiedInputIsReportedOnBothSidesOfTheSnapshotThreshold) {
  constexpr auto kAtThreshold =
      static_cast<std::int64_t>(sim::detail::kInputSnapshotBytesMax / sizeof(std::int32_t));
  struct Case {
    std::vector<std::int64_t> counts;
    std::size_t written;
  };
  const std::vector<Case> cases = {
      {{1}, 0},
      {{kAtThreshold}, 0},
      {{kAtThreshold + 1}, 0},
      {{16, kAtThreshold + 1, 3}, 0},
      {{16, kAtThreshold + 1, 3}, 1},
      {{16, kAtThreshold + 1, 3}, 2},
      {{16, kAtThreshold, 3}, 2},
  };
  for (const Case& c : cases) {
    const std::string name = std::to_string(c.counts.size()) + " inputs, the first of " +
                             std::to_string(c.counts.front()) + " elements, input " +
                             std::to_string(c.written);
    std::vector<Outcome> outcomes = write_pending_input(c.counts, c.written);
    for (const Outcome& outcome : outcomes) {
      ASSERT_TRUE(outcome.code.has_value()) << name;
      EXPECT_EQ(*outcome.code, ErrorCode::InputModified) << name << ": " << outcome.what;
      const std::string reported = "rank 0 modified input " + std::to_string(c.written) + " of ";
      EXPECT_TRUE(contains(outcome.what, reported)) << name << ": " << outcome.what;
      EXPECT_EQ(outcome.what.find("modified input"), outcome.what.rfind("modified input"))
          << name << ": only one input was written: " << outcome.what;
    }
    // Untouched, the same collective completes.
    for (const Outcome& outcome : write_pending_input(c.counts, c.counts.size())) {
      EXPECT_FALSE(outcome.code.has_value()) << name << ": " << outcome.what;
    }
  }
}

// guide/semantics.md, "In-place forms": an in-place collective writing a tensor that an earlier,
// unwaited collective still reads races with that read only on another group (its own stream on
// NCCL); a group's operations complete in issue order, so on the same group it never does.
TEST(SimFailure, AnInPlaceWriteRacesWithAnUnwaitedReadOnlyOnAnotherGroup) {
  const auto input_modified = [](bool same_group, std::uint64_t seed) {
    bool modified = false;
    (void)sim::simulate(quiet(2, seed), [&] {
      const ProcessGroup other = new_group({0, 1}, "other");
      Tensor x = Tensor::full({4}, static_cast<float>(rank() + 1));
      const Tensor y = all_gather_tensor(x, 0, world());
      all_reduce_inplace(x, "sum", same_group ? ProcessGroup(world()) : other);
      try {
        wait_tensor(y);
      } catch (const InputModified&) {
        if (rank() == 0) {
          modified = true;
        }
      }
    });
    return modified;
  };
  int same = 0;
  int another = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    same += input_modified(true, seed) ? 1 : 0;
    another += input_modified(false, seed) ? 1 : 0;
  }
  EXPECT_EQ(same, 0);
  EXPECT_GT(another, 0);  // 50 of the 200 (guide/semantics.md quotes it)
}

TEST(SimFailure, AnInputModifiedCollectiveDoesNotStallTheCommunicator) {
  // Rank 1 issues `first` only after the signal, which rank 0 joins only after writing into
  // first's input: the write lands while `first` is certainly pending, on every schedule.
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<std::int32_t> after(2);
    std::vector<int> modified(2, 0);
    run_catching(
        2,
        [&] {
          const int me = rank();
          const ProcessGroup signal = new_group({0, 1}, "signal");
          Tensor input = Tensor::full({1}, 1, DType::Int32);
          Tensor first;
          if (me == 0) {
            first = all_reduce(input, "sum", world());
            input.copy_(Tensor::full({1}, 5, DType::Int32));
            (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
          } else {
            (void)all_reduce(bytes(1), "sum", signal).to_vector<std::uint8_t>();
            first = all_reduce(input, "sum", world());
          }
          try {
            (void)first.to_vector<std::int32_t>();
          } catch (const InputModified&) {
            modified[static_cast<std::size_t>(me)] = 1;
          }
          after[static_cast<std::size_t>(me)] =
              all_reduce(Tensor::full({1}, 2, DType::Int32), "sum", world()).item<std::int32_t>();
        },
        seed);
    EXPECT_EQ(modified[0], 1) << "seed " << seed << ": rank 0's write was not reported";
    EXPECT_EQ(after, (std::vector<std::int32_t>{4, 4})) << "seed " << seed;
  }
}

// A drop deferred while unwinding (Note [Work lifecycle]) stays deferred through a collective
// called while the exception is still in flight (from a destructor): completing it there would
// wait for rank 1, which waits in that very collective first, a deadlock.
TEST(SimFailure, ACollectiveCalledWhileUnwindingLeavesTheDeferredDropForLater) {
  struct JoinsSideWhileUnwinding {
    ProcessGroup side;
    std::vector<std::uint8_t>& sums;
    ~JoinsSideWhileUnwinding() {
      try {
        sums[0] = all_reduce(bytes(1), "sum", side).to_vector<std::uint8_t>()[0];
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
      }
    }
  };
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<std::uint8_t> side_sums(2);
    const SimReport report = sim::simulate(quiet(2, seed), [&] {
      const ProcessGroup side = new_group({0, 1}, "side");
      if (rank() == 0) {
        try {
          const JoinsSideWhileUnwinding joins{side, side_sums};  // destroyed after `pending`
          Tensor pending = all_reduce(bytes(1), "sum", world());
          throw std::runtime_error("unwinding");
        } catch (const std::runtime_error&) {
        }
      } else {
        side_sums[1] = all_reduce(bytes(1), "sum", side).to_vector<std::uint8_t>()[0];
        (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
      }
    });
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(side_sums, (std::vector<std::uint8_t>{2, 2})) << "seed " << seed;
  }
}

TEST(SimFailure, ARankThatUnwindsWithAPendingResultGivesPeersRankFailureNotDeadlock) {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<Outcome> outcomes(2);
    SimReport report = sim::simulate(quiet(2, seed), [&] {
      const ProcessGroup side = new_group({0, 1}, "side");
      if (rank() == 0) {
        Tensor pending = all_reduce(bytes(1), "sum", world());  // rank 1 joins it later
        throw std::runtime_error("rank 0 gives up with a result pending");
      }
      try {
        // Rank 0 never joins this one.
        (void)all_reduce(bytes(1), "sum", side).to_vector<std::uint8_t>();
      } catch (const Error& e) {
        outcomes[1] = Outcome{e.code(), e.what(), e.context()};
      }
      (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
    });
    ASSERT_TRUE(outcomes[1].code.has_value());
    EXPECT_EQ(*outcomes[1].code, ErrorCode::RankFailure) << outcomes[1].what;
    EXPECT_TRUE(contains(outcomes[1].what, "rank 0 gives up")) << outcomes[1].what;
    EXPECT_EQ(report.rank_errors[0], "rank 0 gives up with a result pending");
    EXPECT_TRUE(report.rank_errors[1].empty()) << report.rank_errors[1];
    ASSERT_EQ(report.unwaited.size(), 1u);
    EXPECT_EQ(report.unwaited[0].rank, 0);
    EXPECT_FALSE(report.unwaited[0].at_rank_exit);
  }
}

TEST(SimFailure, PremulSumFactorsMustMatchBitForBit) {
  std::vector<Outcome> same = run_catching(2, [] {
    (void)all_reduce(Tensor::ones({1}), ReduceOp::premul_sum(std::nan("")), world()).item<float>();
  });
  for (const Outcome& outcome : same) {
    EXPECT_FALSE(outcome.code.has_value()) << "NaN factors agree: " << outcome.what;
  }
  std::vector<Outcome> different = run_catching(2, [] {
    (void)all_reduce(Tensor::ones({1}), ReduceOp::premul_sum(rank() == 0 ? 0.5 : 2.0), world())
        .item<float>();
  });
  for (const Outcome& outcome : different) {
    ASSERT_TRUE(outcome.code.has_value());
    EXPECT_EQ(*outcome.code, ErrorCode::CollectiveMismatch) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "premul_sum(0.5)")) << outcome.what;
    EXPECT_TRUE(contains(outcome.what, "premul_sum(2)")) << outcome.what;
  }
}

TEST(SimFailure, TheFirstErrorIsTheOneRaisedFirstEvenWhileItsRankStillSettlesItsResults) {
  // Rank 0 throws with a result pending, so its end waits for that result; rank 1 learns of the
  // throw (its side collective fails) and only then throws its own error.
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    SimReport report = sim::simulate(quiet(2, seed), [&] {
      const ProcessGroup side = new_group({0, 1}, "side");
      if (rank() == 0) {
        Tensor pending = all_reduce(bytes(1), "sum", world());  // rank 1 never joins it
        throw std::runtime_error("rank 0 first");
      }
      try {
        (void)all_reduce(bytes(1), "sum", side).to_vector<std::uint8_t>();
      } catch (const RankFailure&) {
      }
      throw std::logic_error("rank 1 later");
    });
    ASSERT_NE(report.first_error, nullptr);
    try {
      std::rethrow_exception(report.first_error);
    } catch (const std::exception& error) {
      EXPECT_STREQ(error.what(), "rank 0 first") << "seed " << seed;
    }
  }
}

TEST(SimFailure, APeerThatReturnsIsReportedAsReturnedEvenWhenItsEndRaisesADroppedFailure) {
  // Rank 0 drops a collective that fails (a mismatch), so its end raises that failure, and
  // returns without joining world #0; whenever rank 1 arrives there, rank 0 had returned.
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    std::optional<Outcome> outcome;
    SimReport report = sim::simulate(quiet(2, seed), [&] {
      const ProcessGroup side = new_group({0, 1}, "side");
      if (rank() == 0) {
        Tensor dropped = all_reduce(bytes(1), "sum", side);
        return;
      }
      try {
        (void)all_reduce(bytes(2), "sum", side).to_vector<std::uint8_t>();
      } catch (const CollectiveMismatch&) {
      }
      try {
        (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
      } catch (const Error& e) {
        outcome = Outcome{e.code(), e.what(), e.context()};
      }
    });
    EXPECT_TRUE(contains(report.rank_errors[0], "was dropped un-waited, and completing it failed"))
        << report.rank_errors[0];
    ASSERT_TRUE(outcome.has_value() && outcome->code.has_value()) << "seed " << seed;
    EXPECT_EQ(*outcome->code, ErrorCode::Deadlock) << "seed " << seed << ": " << outcome->what;
    EXPECT_TRUE(contains(outcome->what, "rank 0 returned from its rank function without joining"))
        << outcome->what;
  }
}

// ---- Note [Interrupt report]

// A Ctrl-C while a rank runs its own code (here the rank raises SIGINT itself, as the terminal
// would while it loops) names that rank and the run's replay command, and the process then ends
// by SIGINT.
TEST(SimInterruptDeathTest, ACtrlCWhileARankRunsItsOwnCodeNamesItAndTheReplay) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto interrupted_run = [] {
    const testing::ScopedEnvironment environment({{"CHORUS_SIM_SEED", std::nullopt}});
    SimOptions options = quiet(2, 4);
    options.report_on_interrupt = true;
    options.seed_from_environment = true;
    options.command_without_seed = {"prog", "--stuck"};
    sim::run(options, [] {
      (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
      if (rank() == 1) {
        ::raise(SIGINT);
      }
    });
  };
  EXPECT_EXIT(interrupted_run(), ::testing::KilledBySignal(SIGINT),
              "chorus sim: interrupted at virtual time [0-9]+ us while rank 1 was running its own "
              "code \\(the simulator runs one rank at a time and switches only at chorus calls.*\n"
              "  replay: CHORUS_SIM_SEED=4 prog --stuck\n");
}

// Runs on two threads: the one that ended is out of the report, the one stuck in its rank's own
// code is in it, whichever thread the signal (sent to the process) lands on.
TEST(SimInterruptDeathTest, ARunThatEndsLeavesTheRunStillInProgressReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto two_runs = [] {
    std::atomic<bool> stuck{false};
    std::atomic<bool> never{false};
    std::thread first([&] {
      SimOptions options = quiet(2, 7);
      options.report_on_interrupt = true;
      sim::run(options, [&] {
        if (rank() == 1) {
          stuck = true;
          while (!never.load()) {  // its own code, forever
          }
        }
      });
    });
    while (!stuck.load()) {
    }
    SimOptions options = quiet(2, 8);
    options.report_on_interrupt = true;
    sim::run(options, [] { (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>(); });
    ::kill(::getpid(), SIGINT);
    first.join();  // never: the signal ends the process
  };
  EXPECT_EXIT(two_runs(), ::testing::KilledBySignal(SIGINT),
              "chorus sim: interrupted at virtual time [0-9]+ us while rank 1 was running its own "
              "code [^\n]*\n  replay: \\(set SimOptions::seed = 7: [^\n]*\n");
}

// The handler is the run's only while it lasts, and never replaces a SIGINT the caller ignores.
TEST(SimInterrupt, TheRunInstallsItsHandlerOnlyWhileItLastsAndNotOverAnIgnoredSigint) {
  for (const auto found : {SIG_DFL, SIG_IGN}) {
    struct sigaction action {};
    action.sa_handler = found;
    sigemptyset(&action.sa_mask);
    struct sigaction before {};
    ASSERT_EQ(::sigaction(SIGINT, &action, &before), 0);
    SimOptions options = quiet(2);
    options.report_on_interrupt = true;
    std::vector<bool> replaced(2);
    sim::run(options, [&] {
      struct sigaction now {};
      ::sigaction(SIGINT, nullptr, &now);
      replaced[static_cast<std::size_t>(rank())] = now.sa_handler != found;
      (void)all_reduce(bytes(1), "sum", world()).to_vector<std::uint8_t>();
    });
    struct sigaction after {};
    ::sigaction(SIGINT, nullptr, &after);
    EXPECT_EQ(after.sa_handler, found) << "put back";
    EXPECT_EQ(replaced, std::vector<bool>(2, found == SIG_DFL));
    ::sigaction(SIGINT, &before, nullptr);
  }
}

}  // namespace
}  // namespace chorus
