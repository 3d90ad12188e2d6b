// Async semantics on the simulator (DESIGN 2.4): results are pending until waited, views never
// wait, data access waits, waits are idempotent, chained collectives wait their inputs, the
// gather_dim rearrangement happens at completion, and the registry is exact throughout.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using testing::quiet_options;

TEST(AsyncSemantics, ResultIsPendingUntilWaitedAndViewsNeverWait) {
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    sim::run(quiet_options(3, seed), [] {
      Tensor sum = all_reduce(Tensor::arange(6, DType::Int32).view({2, 3}), "sum", world());
      EXPECT_TRUE(sum.is_pending());
      EXPECT_EQ(work_registry_size(), 1u);
      Tensor column = sum.select(1, 2);
      Tensor transposed = sum.transpose(0, 1);
      EXPECT_TRUE(column.is_pending()) << "views share the pending state";
      EXPECT_TRUE(sum.is_pending()) << "making views did not wait";
      EXPECT_EQ(work_registry_size(), 1u);
      EXPECT_EQ(column.to_vector<std::int32_t>(), (std::vector<std::int32_t>{6, 15}));
      EXPECT_FALSE(sum.is_pending());
      EXPECT_FALSE(transposed.is_pending());
      EXPECT_EQ(work_registry_size(), 0u);
      EXPECT_EQ(wait_tensor(sum).to_vector<std::int32_t>(),
                (std::vector<std::int32_t>{0, 3, 6, 9, 12, 15}));
    });
  }
}

TEST(AsyncSemantics, ChainedCollectivesWaitTheirPendingInputs) {
  sim::run(quiet_options(4, 3), [] {
    Tensor once = all_reduce(Tensor::ones({2}, DType::Int64), "sum", world());
    Tensor twice = all_reduce(once, "sum", world());  // reads `once`: waits for it first
    EXPECT_FALSE(once.is_pending());
    EXPECT_EQ(twice.to_vector<std::int64_t>(), (std::vector<std::int64_t>{16, 16}));
  });
}

TEST(AsyncSemantics, GatherAlongAnInnerDimDoesNotWaitEarly) {
  sim::run(quiet_options(2, 1), [] {
    const int r = rank();
    Tensor mine = Tensor::full({2, 2}, r + 1, DType::Int32);
    Tensor gathered = all_gather_tensor(mine, 1, world());
    EXPECT_TRUE(gathered.is_pending());
    EXPECT_EQ(gathered.sizes(), (Shape{2, 4}));
    EXPECT_EQ(gathered.to_vector<std::int32_t>(),
              (std::vector<std::int32_t>{1, 1, 2, 2, 1, 1, 2, 2}));
  });
}

TEST(AsyncSemantics, InputIsNeverModifiedAndMayBeReusedAfterIssue) {
  sim::run(quiet_options(3, 9), [] {
    Tensor input = Tensor::full({3}, rank() + 1, DType::Int32);
    Tensor sum = all_reduce(input, "sum", world());
    Tensor gathered = all_gather_tensor(input, 0, world());
    Tensor scattered = reduce_scatter_tensor(Tensor::full({3}, 1, DType::Int32), "sum", 0, world());
    wait_tensors({sum, gathered, scattered});
    EXPECT_EQ(input.to_vector<std::int32_t>(), std::vector<std::int32_t>(3, rank() + 1));
    EXPECT_EQ(sum.to_vector<std::int32_t>(), std::vector<std::int32_t>(3, 6));
    EXPECT_EQ(scattered.to_vector<std::int32_t>(), std::vector<std::int32_t>(1, 3));
  });
}

TEST(AsyncSemantics, WaitsInAnyOrderAndIdempotent) {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    sim::run(quiet_options(4, seed), [] {
      std::vector<Tensor> results;
      for (int i = 0; i < 4; ++i) {
        results.push_back(all_reduce(Tensor::full({1}, i, DType::Int32), "sum", world()));
      }
      EXPECT_EQ(work_registry_size(), 4u);
      // Waited in reverse order, each twice.
      for (int i = 3; i >= 0; --i) {
        wait_tensor(results[static_cast<std::size_t>(i)]);
        wait_tensor(results[static_cast<std::size_t>(i)]);
        EXPECT_EQ(work_registry_size(), static_cast<std::size_t>(i));
      }
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(results[static_cast<std::size_t>(i)].item<std::int32_t>(), 4 * i);
      }
    });
  }
}

TEST(AsyncSemantics, CoalescedOutputsShareOneWork) {
  sim::run(quiet_options(2, 0), [] {
    std::vector<Tensor> outputs =
        all_gather_into_tensor_coalesced({Tensor::ones({1}), Tensor::zeros({2})}, world());
    EXPECT_EQ(work_registry_size(), 1u);
    EXPECT_EQ(outputs[0].to_vector<float>(), std::vector<float>(2, 1.0f));
    EXPECT_FALSE(outputs[1].is_pending()) << "one wait retires the work for every output";
    EXPECT_EQ(work_registry_size(), 0u);
  });
}

TEST(AsyncSemantics, PooledOutputAtARecycledAddressIsANewStorage) {
  sim::run(quiet_options(2, 4), [] {
    const Tensor input = Tensor::ones({16}, DType::Int32);
    const void* first_address = nullptr;
    {
      Tensor first = all_reduce(input, "sum", world());
      first_address = first.unsafe_data_ptr();
      wait_tensor(first);
    }  // its block goes back to the rank's pool
    Tensor second = all_reduce(input, "max", world());
    // The pool hands the same block out again (that is its job), yet the registry sees only the
    // new, pending work under the new storage.
    EXPECT_EQ(second.unsafe_data_ptr(), first_address);
    EXPECT_TRUE(second.is_pending());
    EXPECT_EQ(work_registry_size(), 1u);
    EXPECT_EQ(second.to_vector<std::int32_t>(), std::vector<std::int32_t>(16, 1));
    EXPECT_EQ(work_registry_size(), 0u);
  });
}

TEST(AsyncSemantics, ARankMayWaitOnAndDropAnotherRanksPendingTensor) {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<Tensor> shared(2);
    std::vector<std::int32_t> seen(2);
    sim::SimReport report = sim::run(quiet_options(2, seed), [&] {
      const auto r = static_cast<std::size_t>(rank());
      shared[r] = all_reduce(Tensor::full({2}, rank() + 1, DType::Int32), "sum", {rank()});
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();  // both published
      // Read the other rank's pending result: this rank waits on a work it does not own.
      seen[r] = shared[1 - r].to_vector<std::int32_t>()[0];
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();  // both read
      if (rank() == 0) {
        // A pending result of rank 0 that only the shared vector holds...
        shared[0] = all_reduce(Tensor::ones({1}, DType::Int32), "sum", {0});
      }
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
      if (rank() == 1) {
        shared[0] = Tensor();  // ...dropped by rank 1: completed and reported on rank 0
      }
    });
    EXPECT_EQ(seen, (std::vector<std::int32_t>{2, 1}));
    EXPECT_TRUE(report.ok());
    ASSERT_EQ(report.unwaited.size(), 1u);
    EXPECT_EQ(report.unwaited[0].rank, 0);
    EXPECT_EQ(report.unwaited[0].op, "all_reduce");
    EXPECT_EQ(report.unwaited[0].seq, 1);
  }
}

// Note [Shared group labels]: every work of a communicator shares its slot's label. The report's
// lines name the group of each dropped work, for a label short enough to be stored inline in a
// std::string and for one that is not (8 ranks), and for a tagged group.
TEST(AsyncSemantics, DroppedWorksNameTheirGroupsLabelOnEveryRank) {
  sim::SimReport report = sim::run(quiet_options(8, 3), [] {
    (void)all_reduce(Tensor::ones({2}), "sum", world());
    (void)all_reduce(Tensor::ones({2}), "sum", world());
    (void)all_reduce(Tensor::ones({2}), "sum", {rank() / 2 * 2, rank() / 2 * 2 + 1}, "pair");
  });
  EXPECT_TRUE(report.ok()) << report.to_string();
  ASSERT_EQ(report.unwaited.size(), 24u);
  std::vector<int> lines_per_rank(8);
  for (const UnwaitedWork& line : report.unwaited) {
    ASSERT_GE(line.rank, 0);
    ASSERT_LT(line.rank, 8);
    ++lines_per_rank[static_cast<std::size_t>(line.rank)];
    if (line.seq == 0 && line.group.starts_with("'pair'")) {
      const int first = line.rank / 2 * 2;
      EXPECT_EQ(line.group,
                "'pair' [" + std::to_string(first) + ", " + std::to_string(first + 1) + "]");
    } else {
      EXPECT_EQ(line.group, "[0, 1, 2, 3, 4, 5, 6, 7]") << line.to_string();
    }
  }
  EXPECT_EQ(lines_per_rank, std::vector<int>(8, 3));
}

// Note [Borrowed group labels] (work_registry.cpp): a collective's work borrows its communicator
// slot's label, read when the work is claimed as unwaited. Results kept past the rank's end are
// claimed by its exit, with its slots still alive: each line names its own group, inline and
// tagged, run after run (the second run's rank states and slots are reused ones, and it names
// other groups).
TEST(AsyncSemantics, ResultsPendingAtTheRanksExitNameTheirGroupsRunAfterRun) {
  // The pair of `r`: {0, 1} and {2, 3} in the first run, {0, 2} and {1, 3} in the second.
  const auto pair_of = [](int run, int r) {
    return run == 0 ? std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}
                    : std::vector<int>{r % 2, r % 2 + 2};
  };
  for (int run = 0; run < 2; ++run) {
    std::vector<std::vector<Tensor>> kept(4);
    sim::SimReport report = sim::run(quiet_options(4, 5), [&kept, &pair_of, run] {
      std::vector<Tensor>& mine = kept[static_cast<std::size_t>(rank())];
      mine.push_back(all_reduce(Tensor::ones({2}), "sum", world()));
      mine.push_back(all_reduce(Tensor::ones({2}), "sum", pair_of(run, rank()), "pair"));
    });
    EXPECT_TRUE(report.ok()) << report.to_string();
    ASSERT_EQ(report.unwaited.size(), 8u);
    for (const UnwaitedWork& line : report.unwaited) {
      EXPECT_TRUE(line.at_rank_exit) << line.to_string();
      if (line.group.starts_with("'pair'")) {
        const std::vector<int> pair = pair_of(run, line.rank);
        EXPECT_EQ(line.group,
                  "'pair' [" + std::to_string(pair[0]) + ", " + std::to_string(pair[1]) + "]");
      } else {
        EXPECT_EQ(line.group, "[0, 1, 2, 3]") << line.to_string();
      }
    }
  }
}

// Two ranks reducing in place into views of one storage made outside the ranks (a row each),
// and each into a tensor the other rank made. Registering the caller's storage in place let
// works of two ranks sit on one storage: a CHECK aborted the process when the second rank
// registered while the first one's work was pending (the choices {0, 1, 0, 1}: both issue, then
// both register). Only a storage the rank made is reduced truly in place now; others are staged.
void reduce_in_place_into_shared_storages(const sim::SimOptions& options) {
  Tensor shared = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3, 4}).view({2, 2});
  std::vector<Tensor> handed(2);
  std::vector<std::vector<std::int32_t>> theirs_after(2);
  sim::SimReport report = sim::run(options, [&] {
    const auto me = static_cast<std::size_t>(rank());
    Tensor mine = shared.select(0, rank());
    all_reduce_inplace(mine, "sum", {rank()});
    (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
    handed[me] = all_reduce(Tensor::full({2}, rank() + 1, DType::Int32), "sum", {rank()});
    (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();  // both published
    Tensor theirs = handed[1 - me];
    all_reduce_inplace(theirs, "sum", world());
    theirs_after[me] = theirs.to_vector<std::int32_t>();
    (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
  });
  EXPECT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(shared.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(theirs_after[0], (std::vector<std::int32_t>{3, 3}));
  EXPECT_EQ(theirs_after[1], (std::vector<std::int32_t>{3, 3}));
}

TEST(AsyncSemantics, TwoRanksMayReduceInPlaceIntoViewsOfOneStorage) {
  sim::SimOptions both_register = quiet_options(2, 0);
  both_register.choices = std::vector<std::uint64_t>{0, 1, 0, 1};
  reduce_in_place_into_shared_storages(both_register);
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    reduce_in_place_into_shared_storages(quiet_options(2, seed));
  }
}

TEST(AsyncSemantics, AThreadThatIsNotARankMayWaitOnAPendingTensor) {
  for (sim::ExecutorKind executor : {sim::ExecutorKind::Fibers, sim::ExecutorKind::Threads}) {
    sim::SimOptions options = quiet_options(3, 2);
    options.executor = executor;
    sim::run(options, [] {
      Tensor sum = all_reduce(Tensor::full({4}, rank(), DType::Int64), "sum", world());
      std::vector<std::int64_t> seen;
      std::thread helper([view = sum.narrow(0, 1, 2), &seen] {
        seen = wait_tensor(view).to_vector<std::int64_t>();
      });
      // This rank keeps the simulation going (a chorus call), so the helper's wait can end;
      // joining before the collective completed would block the rank outside chorus.
      wait_tensor(sum);
      helper.join();
      EXPECT_EQ(seen, (std::vector<std::int64_t>{3, 3}));
    });
  }
}

}  // namespace
}  // namespace chorus
