// The simulator's allocator (Note [Simulator allocator]): LIFO reuse provokes ABA in code keyed
// by address while chorus's own registry (keyed by storage identity, its links stamped with
// generations) stays right; quarantine delays reuse for exactly K frees and catches writes after
// free; random reuse replays from its seed; guard pages make a raw read of a pending output fault
// with rank, op and step (Note [Guard pages]).

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chorus/chorus.hpp>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "decision_stream.hpp"
#include "guard_pages.hpp"
#include "sim_allocator.hpp"
#include "support/fake_transport.hpp"
#include "support/scoped_environment.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using sim::AllocatorPolicy;
using sim::Fault;
using sim::SimOptions;
using sim::SimReport;
using testing::quiet_options;

SimOptions with_allocator(int world_size, AllocatorPolicy policy, std::uint64_t seed = 0) {
  SimOptions options = quiet_options(world_size, seed);
  options.allocator = policy;
  return options;
}

std::size_t index_of_rank() { return static_cast<std::size_t>(rank()); }

// Sum over ranks r of (r + 1) * factor.
float rank_sum(int world_size, float factor) {
  return factor * static_cast<float>(world_size * (world_size + 1) / 2);
}

TEST(SimAllocator, LifoReuseHandsBackTheFreedAddress) {
  for (int world_size : testing::kWorldSizes) {
    std::vector<const void*> freed(static_cast<std::size_t>(world_size));
    std::vector<const void*> smaller(freed.size());
    std::vector<const void*> while_taken(freed.size());
    const SimReport report = sim::run(with_allocator(world_size, AllocatorPolicy::LifoReuse), [&] {
      Tensor a = Tensor::empty({16});
      freed[index_of_rank()] = a.unsafe_data_ptr();
      a = Tensor();
      const Tensor b = Tensor::empty({3});  // a smaller request takes the larger block
      smaller[index_of_rank()] = b.unsafe_data_ptr();
      const Tensor c = Tensor::empty({16});  // while b holds it, a new one
      while_taken[index_of_rank()] = c.unsafe_data_ptr();
    });
    for (std::size_t r = 0; r < freed.size(); ++r) {
      EXPECT_EQ(smaller[r], freed[r]) << "world " << world_size << " rank " << r;
      EXPECT_NE(while_taken[r], freed[r]) << "world " << world_size << " rank " << r;
    }
    EXPECT_GE(report.mark_count("alloc.lifo_reuse"), static_cast<std::uint64_t>(world_size));
  }
}

// A reducer that remembers by address which buffers it already all-reduced (a bug: addresses are
// reused). Returns the value of a second, smaller tensor after "reducing" it once.
float reduce_with_address_cache(std::set<const void*>& reduced) {
  const auto reduce_once = [&](const Tensor& tensor) {
    if (!reduced.insert(tensor.unsafe_data_ptr()).second) {
      return tensor;  // "already reduced"
    }
    return wait_tensor(all_reduce(tensor, ReduceOp::Kind::Sum, world()));
  };
  const auto value = static_cast<float>(rank() + 1);
  {
    const Tensor bucket = Tensor::full({64}, value);  // 256 bytes
    const Tensor reduced_bucket = reduce_once(bucket);
    EXPECT_EQ(reduced_bucket.to_vector<float>()[0], rank_sum(world_size(), 1));
  }                                                    // freed: first the result, then the bucket
  const Tensor small = Tensor::full({4}, 10 * value);  // 16 bytes: another pool size class
  return reduce_once(small).to_vector<float>()[0];
}

TEST(SimAllocator, AddressKeyedCacheMeetsAbaUnderLifoReuse) {
  constexpr int kWorldSize = 3;
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    for (AllocatorPolicy policy : {AllocatorPolicy::Pooled, AllocatorPolicy::LifoReuse}) {
      std::vector<std::set<const void*>> caches(kWorldSize);
      std::vector<float> results(kWorldSize);
      const SimReport report = sim::run(with_allocator(kWorldSize, policy, seed), [&] {
        results[index_of_rank()] = reduce_with_address_cache(caches[index_of_rank()]);
      });
      for (std::size_t r = 0; r < results.size(); ++r) {
        if (policy == AllocatorPolicy::Pooled) {
          // The pool buckets by exact size: the small tensor gets a new address, the bug hides.
          EXPECT_EQ(results[r], rank_sum(kWorldSize, 10)) << "seed " << seed << " rank " << r;
          EXPECT_EQ(report.mark_count("alloc.lifo_reuse"), 0u);
        } else {
          // Its own freed bucket comes back to each rank whatever the schedule: the cache says
          // "already reduced" and the small tensor is returned unreduced.
          EXPECT_EQ(results[r], 10 * static_cast<float>(r + 1)) << "seed " << seed;
          EXPECT_GE(report.mark_count("alloc.lifo_reuse"), 1u);
        }
      }
    }
  }
}

TEST(SimAllocator, RegistryStaysRightWhenADroppedPendingOutputsAddressIsReused) {
  for (int world_size : testing::kWorldSizes) {
    std::vector<int> same_address(static_cast<std::size_t>(world_size), 0);
    std::vector<std::vector<float>> kept(same_address.size());
    std::vector<std::vector<float>> reused(same_address.size());
    const SimReport report = sim::run(with_allocator(world_size, AllocatorPolicy::LifoReuse), [&] {
      const auto value = static_cast<float>(rank() + 1);
      const Tensor input = Tensor::full({8}, value);
      const Tensor second_input = Tensor::full({8}, 10 * value);
      const Tensor pending = all_reduce(input, ReduceOp::Kind::Sum, world());
      Tensor dropped = all_reduce(input, ReduceOp::Kind::Max, world());
      const void* address = dropped.unsafe_data_ptr();
      dropped = Tensor();  // dropped while pending: completed, then its block freed
      const Tensor again = all_reduce(second_input, ReduceOp::Kind::Sum, world());
      same_address[index_of_rank()] = again.unsafe_data_ptr() == address ? 1 : 0;
      reused[index_of_rank()] = again.to_vector<float>();
      kept[index_of_rank()] = pending.to_vector<float>();
    });
    for (std::size_t r = 0; r < same_address.size(); ++r) {
      EXPECT_EQ(same_address[r], 1) << "world " << world_size << " rank " << r;
      EXPECT_EQ(kept[r], std::vector<float>(8, rank_sum(world_size, 1)));
      EXPECT_EQ(reused[r], std::vector<float>(8, rank_sum(world_size, 10)));
    }
    EXPECT_EQ(report.unwaited.size(), static_cast<std::size_t>(world_size));  // the dropped one
    EXPECT_GE(report.mark_count("alloc.lifo_reuse"), static_cast<std::uint64_t>(world_size));
  }
}

TEST(SimAllocator, QuarantineDelaysReuseForExactlyKFrees) {
  constexpr std::size_t kQuarantine = 2;
  for (int world_size : {1, 3}) {
    SimOptions options = with_allocator(world_size, AllocatorPolicy::Quarantine);
    options.quarantine_frees = kQuarantine;
    std::vector<std::vector<int>> reused(static_cast<std::size_t>(world_size));
    std::vector<int> pattern(reused.size(), 0);
    const SimReport report = sim::run(options, [&] {
      Tensor first = Tensor::empty({16});
      const auto* address = static_cast<const unsigned char*>(first.unsafe_data_ptr());
      first = Tensor();  // free 1: quarantined
      // The block stays with the allocator, filled with the pattern.
      pattern[index_of_rank()] = address[0] == 0xDD && address[63] == 0xDD ? 1 : 0;
      std::vector<int>& mine = reused[index_of_rank()];
      for (std::size_t later_frees = 0; later_frees <= kQuarantine; ++later_frees) {
        Tensor next = Tensor::empty({16});
        mine.push_back(next.unsafe_data_ptr() == address ? 1 : 0);
        next = Tensor();
      }
    });
    for (std::size_t r = 0; r < reused.size(); ++r) {
      EXPECT_EQ(pattern[r], 1);
      // After 0 and 1 later frees it is still quarantined; after 2 it is reused.
      EXPECT_EQ(reused[r], (std::vector<int>{0, 0, 1})) << "world " << world_size << " rank " << r;
    }
    EXPECT_EQ(report.mark_count("alloc.quarantine"), 4u * static_cast<std::uint64_t>(world_size));
    EXPECT_EQ(report.mark_count("alloc.quarantine.reuse"), static_cast<std::uint64_t>(world_size));
    EXPECT_EQ(report.mark_count("alloc.quarantine.overwritten"), 0u);
  }
}

TEST(SimAllocator, QuarantineCatchesAWriteAfterFree) {
  SimOptions options = with_allocator(2, AllocatorPolicy::Quarantine);
  options.quarantine_frees = 1;
  const SimReport report = sim::run(options, [] {
    Tensor tensor = Tensor::zeros({4});
    auto* dangling = static_cast<float*>(tensor.unsafe_data_ptr());
    tensor = Tensor();
    if (rank() == 1) {
      dangling[2] = 1.0f;  // the bug: a write through a pointer kept past the free
    }
    Tensor other = Tensor::zeros({4});
    other = Tensor();  // the second free ends the first block's quarantine: it is checked
  });
  EXPECT_EQ(report.mark_count("alloc.quarantine.overwritten"), 1u);
}

TEST(SimAllocator, QuarantineChecksTheBlocksStillQuarantinedWhenTheRanksEnd) {
  SimOptions options = with_allocator(2, AllocatorPolicy::Quarantine);
  options.quarantine_frees = 4;
  const SimReport report = sim::run(options, [] {
    Tensor tensor = Tensor::zeros({4});
    auto* dangling = static_cast<float*>(tensor.unsafe_data_ptr());
    tensor = Tensor();
    if (rank() == 1) {
      dangling[2] = 1.0f;  // a write after free, and no later free pushes the block out
    }
  });
  EXPECT_EQ(report.mark_count("alloc.quarantine"), 2u);
  EXPECT_EQ(report.mark_count("alloc.quarantine.overwritten"), 1u);
}

// For each allocation after a batch was freed: which freed block it got (its index), or -1.
std::vector<int> random_reuse_pattern() {
  std::vector<const void*> freed;
  {
    std::vector<Tensor> batch;
    for (std::int64_t i = 0; i < 6; ++i) {
      batch.push_back(Tensor::empty({16}));
      freed.push_back(batch.back().unsafe_data_ptr());
    }
  }
  std::vector<int> pattern;
  std::vector<Tensor> kept;
  for (std::int64_t i = 0; i < 6; ++i) {
    kept.push_back(Tensor::empty({4}));
    const auto it = std::find(freed.begin(), freed.end(), kept.back().unsafe_data_ptr());
    pattern.push_back(it == freed.end() ? -1 : static_cast<int>(it - freed.begin()));
  }
  return pattern;
}

TEST(SimAllocator, RandomReuseIsDeterministicPerSeedAndReplays) {
  constexpr int kWorldSize = 2;
  const auto patterns_of = [&](const SimOptions& options, SimReport* report) {
    std::vector<std::vector<int>> patterns(kWorldSize);
    *report = sim::run(options, [&] { patterns[index_of_rank()] = random_reuse_pattern(); });
    return patterns;
  };
  std::set<std::vector<std::vector<int>>> distinct;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    const SimOptions options = with_allocator(kWorldSize, AllocatorPolicy::Random, seed);
    SimReport first;
    SimReport again;
    SimReport replayed;
    const auto patterns = patterns_of(options, &first);
    EXPECT_EQ(patterns_of(options, &again), patterns) << "seed " << seed;
    SimOptions replay = options;
    replay.choices = first.choices;
    EXPECT_EQ(patterns_of(replay, &replayed), patterns) << "seed " << seed;
    EXPECT_EQ(replayed.choices, first.choices);
    // Every allocation of the second batch reuses one of the six freed blocks (all fit).
    for (const std::vector<int>& pattern : patterns) {
      EXPECT_EQ(std::set<int>(pattern.begin(), pattern.end()).size(), 6u) << "seed " << seed;
    }
    // Each rank draws for its first five allocations (two or more blocks fit).
    EXPECT_EQ(first.mark_count("alloc.random"), 5u * kWorldSize);
    distinct.insert(patterns);
  }
  EXPECT_GE(distinct.size(), 2u);  // the seed decides the addresses
}

TEST(SimAllocator, OnlyRandomDrawsChoices) {
  const auto body = [] {
    const Tensor tensor = Tensor::ones({4});
    EXPECT_EQ(wait_tensor(all_reduce(tensor, ReduceOp::Kind::Sum, world())).to_vector<float>(),
              std::vector<float>(4, static_cast<float>(world_size())));
  };
  const SimReport pooled = sim::run(quiet_options(3, 7), body);
  for (AllocatorPolicy policy : {AllocatorPolicy::LifoReuse, AllocatorPolicy::Quarantine}) {
    const SimReport other = sim::run(with_allocator(3, policy, 7), body);
    EXPECT_EQ(other.choices, pooled.choices);  // same run, choice for choice
  }
  EXPECT_EQ(pooled.mark_count("alloc.lifo_reuse"), 0u);
  EXPECT_EQ(pooled.mark_count("alloc.quarantine"), 0u);
}

TEST(SimAllocator, ProtectRefusesMemoryItDoesNotOwn) {
  sim::detail::DecisionStream stream(sim::detail::prng_source(1), sim::Strategy::RandomWalk, 2, 0,
                                     1, false);
  auto allocator = std::make_shared<sim::detail::SimAllocator>(
      sim::detail::SimAllocator::Config{AllocatorPolicy::Pooled, 0, true, 1, false}, stream);
  std::vector<float> caller_memory(16);
  const std::uint64_t step = 0;
  EXPECT_FALSE(allocator->protect(caller_memory.data(), 64, &stream, "x", &step));
  allocator->unprotect(&stream);  // nothing to undo
  allocator->detach();
}

TEST(SimAllocator, ProtectRefusesASecondWorkOnAGuardedBlock) {
  sim::detail::DecisionStream stream(sim::detail::prng_source(1), sim::Strategy::RandomWalk, 2, 0,
                                     1, false);
  auto allocator = std::make_shared<sim::detail::SimAllocator>(
      sim::detail::SimAllocator::Config{AllocatorPolicy::LifoReuse, 0, true, 1, false}, stream);
  RankContext context(std::make_shared<testing::FakeTransport>());
  ScopedRankBinding binding(&context);
  {
    std::shared_ptr<void> block = allocator->allocate(256);
    const char* data = static_cast<const char*>(block.get());
    const int first_work = 0;
    const int second_work = 0;
    const std::uint64_t step = 0;
    EXPECT_TRUE(allocator->protect(data, 64, &first_work, "first", &step));
    EXPECT_TRUE(allocator->protect(data + 64, 64, &first_work, "first", &step)) << "same work";
    EXPECT_FALSE(allocator->protect(data + 128, 64, &second_work, "second", &step));
    EXPECT_EQ(allocator->marks()["guard.shared"], 1u);
    allocator->unprotect(&first_work);
    EXPECT_TRUE(allocator->protect(data + 128, 64, &second_work, "second", &step));
    allocator->unprotect(&second_work);
  }
  allocator->detach();
}

// ---- Guard pages (Note [Guard pages]).

#if defined(CHORUS_ASAN) || defined(CHORUS_TSAN)

TEST(SimGuardPages, RefusedUnderSanitizers) {
  SimOptions options = quiet_options(2);
  options.guard_pending_outputs = true;
  testing::expect_invalid_argument([&] { sim::run(options, [] {}); },
                                   {"guard_pending_outputs", "sanitizer"});
}

#else

TEST(SimGuardPages, ACorrectProgramRunsWithItsPendingOutputsProtected) {
  for (AllocatorPolicy policy : {AllocatorPolicy::Pooled, AllocatorPolicy::LifoReuse}) {
    for (int world_size : testing::kWorldSizes) {
      SimOptions options = with_allocator(world_size, policy);
      options.guard_pending_outputs = true;
      std::vector<std::vector<float>> results(static_cast<std::size_t>(world_size));
      const SimReport report = sim::run(options, [&] {
        const auto value = static_cast<float>(rank() + 1);
        const Tensor sum = all_reduce(Tensor::full({1000}, value), ReduceOp::Kind::Sum, world());
        const Tensor gathered = all_gather_tensor(Tensor::full({2}, value), 0, world());
        // Each is read only after its wait.
        results[index_of_rank()] = sum.to_vector<float>();
        EXPECT_EQ(gathered.to_vector<float>()[2 * static_cast<std::size_t>(world_size) - 1],
                  static_cast<float>(world_size));
      });
      for (const std::vector<float>& result : results) {
        EXPECT_EQ(result, std::vector<float>(1000, rank_sum(world_size, 1)));
      }
      EXPECT_EQ(report.mark_count("guard.protect"), 2u * static_cast<std::uint64_t>(world_size));
      EXPECT_EQ(report.mark_count("guard.unowned"), 0u);
    }
  }
}

// A Delay stalls a rank inside its start, and the other rank's start runs meanwhile: the stalled
// rank guards only its own outputs when it resumes (until 2026-12-04 it guarded the other's too,
// left in the world's scratch list, so a completed result could be protected again under the
// wrong work). One output per rank, so two protections, whichever rank starts first.
TEST(SimGuardPages, ARankStalledByADelayGuardsOnlyItsOwnOutputs) {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    SimOptions options = quiet_options(2, seed);
    options.guard_pending_outputs = true;
    options.faults = {Fault::delay(0, 0, 20)};
    std::vector<std::vector<float>> results(2);
    const SimReport report = sim::run(options, [&] {
      const Tensor sum = all_reduce(Tensor::full({1000}, static_cast<float>(rank() + 1)),
                                    ReduceOp::Kind::Sum, world());
      results[index_of_rank()] = sum.to_vector<float>();
    });
    EXPECT_EQ(results, std::vector<std::vector<float>>(2, std::vector<float>(1000, 3.0f)))
        << "seed " << seed;
    EXPECT_EQ(report.mark_count("fault.delay"), 1u) << "seed " << seed;
    EXPECT_EQ(report.mark_count("guard.protect"), 2u) << "seed " << seed;
    EXPECT_EQ(report.mark_count("guard.shared"), 0u) << "seed " << seed;
  }
}

// Every collective's outputs can be guarded while several are pending at once: neither core nor
// the simulator touches a pending output before its completion.
TEST(SimGuardPages, EveryCollectiveKeepsItsResultsUnderGuard) {
  for (int world_size : testing::kWorldSizes) {
    SimOptions options = quiet_options(world_size, static_cast<std::uint64_t>(world_size));
    options.guard_pending_outputs = true;
    const auto size = static_cast<std::size_t>(world_size);
    const float sum = rank_sum(world_size, 1);
    const SimReport report = sim::run(options, [&] {
      const auto value = static_cast<float>(rank() + 1);
      const std::int64_t n = world_size;
      Tensor in_place = Tensor::full({3}, value);
      std::vector<int> rotate(size);
      for (std::size_t m = 0; m < size; ++m) {
        rotate[m] = static_cast<int>((m + 1) % size);
      }
      const Tensor reduced = all_reduce(Tensor::full({3}, value), ReduceOp::Kind::Sum, world());
      const Tensor gathered = all_gather_tensor(Tensor::full({2}, value), 0, world());
      const Tensor gathered_dim1 = all_gather_tensor(Tensor::full({2, 1}, value), 1, world());
      const Tensor scattered =
          reduce_scatter_tensor(Tensor::full({2 * n}, value), ReduceOp::Kind::Sum, 0, world());
      const std::vector<Tensor> coalesced = all_reduce_coalesced(
          {Tensor::full({3}, value), Tensor::full({5}, value)}, ReduceOp::Kind::Sum, world());
      const Tensor exchanged =
          all_to_all_single(Tensor::full({n}, value), std::nullopt, std::nullopt, world());
      const Tensor broadcasted = broadcast(Tensor::full({2}, value), 0, world());
      const Tensor reduced_to_0 = reduce(Tensor::full({2}, value), ReduceOp::Kind::Sum, 0, world());
      const Tensor permuted = permute_tensor(Tensor::full({2}, value), rotate, world());
      all_reduce_inplace(in_place, ReduceOp::Kind::Sum, world());

      EXPECT_EQ(reduced.to_vector<float>(), std::vector<float>(3, sum));
      std::vector<float> expected_gather;
      std::vector<float> expected_exchange;
      for (std::size_t r = 0; r < size; ++r) {
        expected_gather.insert(expected_gather.end(), 2, static_cast<float>(r + 1));
        expected_exchange.push_back(static_cast<float>(r + 1));
      }
      EXPECT_EQ(gathered.to_vector<float>(), expected_gather);
      std::vector<float> expected_rows;  // [[1, ..., W], [1, ..., W]]
      for (int row = 0; row < 2; ++row) {
        expected_rows.insert(expected_rows.end(), expected_exchange.begin(),
                             expected_exchange.end());
      }
      EXPECT_EQ(gathered_dim1.to_vector<float>(), expected_rows);
      EXPECT_EQ(scattered.to_vector<float>(), std::vector<float>(2, sum));
      EXPECT_EQ(coalesced[0].to_vector<float>(), std::vector<float>(3, sum));
      EXPECT_EQ(coalesced[1].to_vector<float>(), std::vector<float>(5, sum));
      EXPECT_EQ(exchanged.to_vector<float>(), expected_exchange);
      EXPECT_EQ(broadcasted.to_vector<float>(), std::vector<float>(2, 1.0f));
      EXPECT_EQ(reduced_to_0.to_vector<float>(), std::vector<float>(2, rank() == 0 ? sum : 0.0f));
      const auto sender = static_cast<float>((index_of_rank() + size - 1) % size + 1);
      EXPECT_EQ(permuted.to_vector<float>(), std::vector<float>(2, sender));
      EXPECT_EQ(in_place.to_vector<float>(), std::vector<float>(3, sum));
    });
    // Each rank's nine outputs (the coalesced pair counts two; the in-place one reads its input,
    // so it is not guarded), and the reduce's on its root: every output was guarded.
    EXPECT_EQ(report.mark_count("guard.protect"), 9u * size + 1u);
  }
}

// A failed operation's outputs are unprotected when it fails: reading them raw after the failed
// wait sees the poison, not a fault.
TEST(SimGuardPages, AFailedOperationReleasesItsGuard) {
  SimOptions options = quiet_options(2);
  options.guard_pending_outputs = true;
  std::vector<std::uint32_t> poison_bits(2);
  std::vector<int> mismatches(2);
  const SimReport report = sim::run(options, [&] {
    const Tensor input = Tensor::ones({4});
    const Tensor output = rank() == 0 ? all_reduce(input, ReduceOp::Kind::Sum, world())
                                      : all_reduce(input, ReduceOp::Kind::Max, world());
    try {
      wait_tensor(output);
    } catch (const CollectiveMismatch&) {
      mismatches[index_of_rank()] = 1;
    }
    std::memcpy(&poison_bits[index_of_rank()], output.unsafe_data_ptr(), sizeof(std::uint32_t));
  });
  EXPECT_EQ(mismatches, (std::vector<int>{1, 1}));
  float poison = 0;
  std::memcpy(&poison, &poison_bits[0], sizeof poison);
  EXPECT_TRUE(std::isnan(poison));
  EXPECT_EQ(poison_bits[1], poison_bits[0]);
  EXPECT_GE(report.mark_count("guard.protect"), 1u);
}

// Two ranks, their pending outputs guarded, always choice 0 (ranks before completions): rank
// `toucher` reads (or writes) its all_reduce's output before waiting for it.
void touch_a_pending_output(int toucher, bool write) {
  SimOptions options = quiet_options(2);
  options.guard_pending_outputs = true;
  options.choices = std::vector<std::uint64_t>{};
  sim::run(options, [&] {
    const Tensor output = all_reduce(Tensor::ones({4}), ReduceOp::Kind::Sum, world());
    if (rank() == toucher && write) {
      *static_cast<volatile float*>(output.unsafe_data_ptr()) = 2.0f;
    } else if (rank() == toucher) {
      volatile float first = *static_cast<const float*>(output.unsafe_data_ptr());
      (void)first;
    }
    wait_tensor(output);
  });
}

TEST(SimGuardPagesDeathTest, RawReadOfAPendingOutputFaultsWithRankOpAndStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(touch_a_pending_output(1, false),
               "chorus sim: rank 1 read the pending output of all_reduce #0 on group \\[0, 1\\] "
               "\\(issued by rank 1 at .*allocator_test.cpp:[0-9]+.*\\) at step [0-9]+ without "
               "waiting");
}

// The fault aborts the process, so the run's report never comes: the fault's own message ends
// with the run's replay line (Note [Guard pages]). Seeded runs: on one rank the all_reduce is
// pending while the rank runs on, or not, by the seed; the first seed that faults is named.
TEST(SimGuardPagesDeathTest, AFaultEndsWithTheRunsReplayLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto read_pending_outputs = [] {
    const testing::ScopedEnvironment environment(
        {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
    SimOptions options = quiet_options(1);
    options.guard_pending_outputs = true;
    options.seed_from_environment = true;
    options.command_without_seed = {"prog", "--guard-pages"};
    for (options.seed = 0; options.seed < 64; ++options.seed) {
      sim::run(options, [] {
        const Tensor output = all_reduce(Tensor::ones({4}), ReduceOp::Kind::Sum, world());
        volatile float first = *static_cast<const float*>(output.unsafe_data_ptr());
        (void)first;
      });
    }
  };
  EXPECT_DEATH(read_pending_outputs(),
               "chorus sim: rank 0 read the pending output of all_reduce #0 on group \\[0\\] .* "
               "without waiting \\(guard pages: SimOptions::guard_pending_outputs\\)\n"
               "  replay: CHORUS_SIM_SEED=[0-9]+ prog --guard-pages\n");
}

TEST(SimGuardPagesDeathTest, ARawReadFromAThreadOfNoRankSaysSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto read_from_another_thread = [] {
    SimOptions options = quiet_options(2);
    options.guard_pending_outputs = true;
    options.choices = std::vector<std::uint64_t>{};
    sim::run(options, [] {
      const Tensor output = all_reduce(Tensor::ones({4}), ReduceOp::Kind::Sum, world());
      if (rank() == 1) {
        std::thread reader([&output] {
          volatile float first = *static_cast<const float*>(output.unsafe_data_ptr());
          (void)first;
        });
        reader.join();
      }
      wait_tensor(output);
    });
  };
  EXPECT_DEATH(read_from_another_thread(),
               "chorus sim: a thread of no rank read the pending output of all_reduce #0 on "
               "group \\[0, 1\\] \\(issued by rank 1 at .*\\) at step [0-9]+ without waiting");
}

TEST(SimGuardPagesDeathTest, UnrelatedFaultsKeepTheirDefaultAction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto fault_elsewhere = [] {
    SimOptions options = quiet_options(1);
    options.guard_pending_outputs = true;
    sim::run(options, [] {
      const Tensor output = all_reduce(Tensor::ones({4}), ReduceOp::Kind::Sum, world());
      volatile int* null_pointer = nullptr;
      *null_pointer = 1;
    });
  };
  EXPECT_EXIT(fault_elsewhere(), ::testing::KilledBySignal(SIGSEGV), "");
}

// The reported rank is the faulting one, rank 0 included (choice 0 runs rank 0 first, so its
// all_reduce is pending until rank 1 issues its own).
TEST(SimGuardPagesDeathTest, RawReadByRank0NamesRank0) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(touch_a_pending_output(0, false),
               "chorus sim: rank 0 read the pending output of all_reduce #0 on group \\[0, 1\\] "
               "\\(issued by rank 0 at .*\\) at step [0-9]+ without waiting");
}

#if defined(__x86_64__)
// A write is told from a read by the page fault's error code (x86-64 only).
TEST(SimGuardPagesDeathTest, RawWriteOfAPendingOutputSaysWroteTo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(touch_a_pending_output(1, true),
               "chorus sim: rank 1 wrote to the pending output of all_reduce #0 on group "
               "\\[0, 1\\] \\(issued by rank 1 at .*\\) at step [0-9]+ without waiting");
}
#endif

// A SIGSEGV sent by raise() or kill() (no fault to re-execute) still kills the process when it
// is not a guarded page's: the handler raises it again under the default action.
TEST(SimGuardPagesDeathTest, ASegvSentByRaiseStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto raise_segv = [] {
    SimOptions options = quiet_options(1);
    options.guard_pending_outputs = true;
    sim::run(options, [] { std::raise(SIGSEGV); });
  };
  EXPECT_EXIT(raise_segv(), ::testing::KilledBySignal(SIGSEGV), "");
}

// ---- The table of guarded ranges itself (guard_pages.hpp), on pages of the test's own.

// Two PROT_NONE pages, unmapped on destruction (never reached in a death test's child).
struct TwoProtectedPages {
  std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  char* memory =
      static_cast<char*>(mmap(nullptr, 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ~TwoProtectedPages() { munmap(memory, 2 * page); }
};

// A range is [begin, begin + nbytes): the first byte past one range belongs to the next, and the
// step reported is the one its pointer holds at the fault.
TEST(SimGuardPagesDeathTest, TheFirstByteAfterARangeIsTheNextRangesWithItsStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto read_second_page = [] {
    sim::detail::install_guard_handler();
    TwoProtectedPages pages;
    ASSERT_NE(pages.memory, MAP_FAILED);
    const std::uint64_t first_step = 41;
    std::uint64_t second_step = 0;
    ASSERT_GE(
        sim::detail::add_guarded_range(pages.memory, pages.page, "the first page", &first_step), 0);
    ASSERT_GE(sim::detail::add_guarded_range(pages.memory + pages.page, pages.page,
                                             "the second page", &second_step),
              0);
    second_step = 42;
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the handler reads it
    volatile char byte = *static_cast<volatile char*>(pages.memory + pages.page);
    (void)byte;
  };
  EXPECT_DEATH(read_second_page(),
               "chorus sim: a thread of no rank read the second page at step 42 without waiting");
}

// Guards both pages (step 7), removes the second range by the index add_guarded_range returned,
// and reads page `page` (0 or 1).
void read_after_removing_the_second_range(std::size_t page) {
  sim::detail::install_guard_handler();
  TwoProtectedPages pages;
  ASSERT_NE(pages.memory, MAP_FAILED);
  const std::uint64_t step = 7;
  ASSERT_GE(sim::detail::add_guarded_range(pages.memory, pages.page, "the first page", &step), 0);
  const int second = sim::detail::add_guarded_range(pages.memory + pages.page, pages.page,
                                                    "the second page", &step);
  ASSERT_GE(second, 0);
  sim::detail::remove_guarded_range(second);
  volatile char byte = *static_cast<volatile char*>(pages.memory + page * pages.page);
  (void)byte;
}

// Removing a range removes that range only: the other is still reported...
TEST(SimGuardPagesDeathTest, RemovingARangeKeepsTheOthers) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(read_after_removing_the_second_range(0),
               "chorus sim: a thread of no rank read the first page at step 7 without waiting");
}

// ... and the removed one is no longer the handler's: a fault there keeps its default action.
TEST(SimGuardPagesDeathTest, AFaultInARemovedRangeKeepsItsDefaultAction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(read_after_removing_the_second_range(1), ::testing::KilledBySignal(SIGSEGV), "");
}

#endif

// The quarantine check reads every byte of the block, the last one included.
TEST(SimAllocator, QuarantineCatchesAWriteToTheLastByteOfABlock) {
  SimOptions options = with_allocator(1, AllocatorPolicy::Quarantine);
  options.quarantine_frees = 1;
  const SimReport report = sim::run(options, [] {
    Tensor tensor = Tensor::zeros({16});  // 64 bytes: exactly one block
    auto* dangling = static_cast<unsigned char*>(tensor.unsafe_data_ptr());
    tensor = Tensor();
    dangling[63] = 0;  // the last byte only
    Tensor other = Tensor::zeros({16});
    other = Tensor();  // ends the first block's quarantine: it is checked
  });
  EXPECT_EQ(report.mark_count("alloc.quarantine.overwritten"), 1u);
}

// A rank keeps at most 64 MiB of freed blocks: a bigger block goes back to the heap, one of
// exactly 64 MiB is kept.
TEST(SimAllocator, ABlockPastTheRanksCacheLimitIsNotReused) {
  constexpr std::int64_t kCapFloats = std::int64_t{16} << 20;  // 64 MiB of floats
  const SimReport over = sim::run(with_allocator(1, AllocatorPolicy::LifoReuse), [] {
    Tensor big = Tensor::empty({kCapFloats + 16});
    big = Tensor();
    const Tensor again = Tensor::empty({kCapFloats + 16});
  });
  EXPECT_EQ(over.mark_count("alloc.lifo_reuse"), 0u);
  const SimReport at = sim::run(with_allocator(1, AllocatorPolicy::LifoReuse), [] {
    Tensor big = Tensor::empty({kCapFloats});
    big = Tensor();
    const Tensor again = Tensor::empty({kCapFloats});
  });
  EXPECT_EQ(at.mark_count("alloc.lifo_reuse"), 1u);
}

// A block taken from the cache no longer counts against the limit: a 40 MiB block freed and
// reused over and over is reused every time.
TEST(SimAllocator, ABlockTakenBackLeavesTheCacheCount) {
  const SimReport report = sim::run(with_allocator(1, AllocatorPolicy::LifoReuse), [] {
    for (int i = 0; i < 3; ++i) {
      Tensor block = Tensor::empty({std::int64_t{10} << 20});  // 40 MiB
      block = Tensor();
    }
  });
  EXPECT_EQ(report.mark_count("alloc.lifo_reuse"), 2u);
}

#if !defined(CHORUS_ASAN) && !defined(CHORUS_TSAN)
// Pooled under guard pages reuses exact sizes only, as core's pool: a one-page request does not
// take a freed two-page block, a two-page one does.
TEST(SimAllocator, PooledWithGuardPagesReusesExactSizesOnly) {
  SimOptions options = with_allocator(1, AllocatorPolicy::Pooled);
  options.guard_pending_outputs = true;
  int small_reused = -1;
  int same_reused = -1;
  sim::run(options, [&] {
    const auto page_floats = static_cast<std::int64_t>(sysconf(_SC_PAGESIZE)) / 4;
    Tensor big = Tensor::empty({2 * page_floats});
    const void* address = big.unsafe_data_ptr();
    big = Tensor();
    const Tensor small = Tensor::empty({4});
    small_reused = small.unsafe_data_ptr() == address ? 1 : 0;
    const Tensor same = Tensor::empty({2 * page_floats});
    same_reused = same.unsafe_data_ptr() == address ? 1 : 0;
  });
  EXPECT_EQ(small_reused, 0);
  EXPECT_EQ(same_reused, 1);
}

// Pooled under guard pages keeps at most SimOptions::host_pool_bytes_max of freed blocks per rank,
// as core's pool does (until 2026-12-06 it kept 64 MiB whatever the option said). A 40 MiB block
// (above glibc's largest mmap threshold, 32 MiB, so the heap maps it on its own and unmaps it when
// freed): with no room it goes back to the heap at once, unmapped; with room it stays mapped in
// the pool and the next storage of its size gets it.
TEST(SimAllocator, PooledWithGuardPagesKeepsAtMostHostPoolBytesMax) {
  constexpr std::int64_t kFloats = std::int64_t{10} << 20;  // 40 MiB
  for (const std::size_t pool_bytes : {std::size_t{0}, std::size_t{64} << 20}) {
    SCOPED_TRACE("host_pool_bytes_max " + std::to_string(pool_bytes));
    SimOptions options = with_allocator(1, AllocatorPolicy::Pooled);
    options.guard_pending_outputs = true;
    options.host_pool_bytes_max = pool_bytes;
    bool mapped_after_free = false;
    bool reused = false;
    sim::run(options, [&] {
      Tensor big = Tensor::empty({kFloats});
      void* address = big.unsafe_data_ptr();
      big = Tensor();
      unsigned char resident = 0;
      mapped_after_free = mincore(address, 1, &resident) == 0;
      reused = Tensor::empty({kFloats}).unsafe_data_ptr() == address;
    });
    if (pool_bytes == 0) {
#if defined(__GLIBC__)
      EXPECT_FALSE(mapped_after_free);
#endif
    } else {
      EXPECT_TRUE(mapped_after_free);
      EXPECT_TRUE(reused);
    }
  }
}
#endif

}  // namespace
}  // namespace chorus
