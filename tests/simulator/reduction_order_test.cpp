// Reduction order modes (Note [Reduction order modes], simulator/src/world.hpp): fixed, ring,
// tree and adversarial orders give the sums their order implies, the same bits on every rank,
// integer results that no order changes, and marks where they act.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chorus/chorus.hpp>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using sim::ReductionOrder;
using sim::SimOptions;
using sim::SimReport;

constexpr ReductionOrder kAllOrders[] = {ReductionOrder::Fixed, ReductionOrder::Ring,
                                         ReductionOrder::Tree, ReductionOrder::Adversarial};

std::string mark_of(ReductionOrder order) {
  switch (order) {
    case ReductionOrder::Fixed:
      return "reduction.fixed";
    case ReductionOrder::Ring:
      return "reduction.ring";
    case ReductionOrder::Tree:
      return "reduction.tree";
    case ReductionOrder::Adversarial:
      return "reduction.adversarial";
  }
  return "";
}

// Rank r contributes kContribution[r]: float sums of these depend on the order, since 1e8f
// absorbs a 1 (the float spacing there is 8). In group-rank order ((1 + 1e8) - 1e8) + 1 = 1;
// pairwise (1 + 1e8) + (-1e8 + 1) = 0; in the ring starting at rank 1, (1e8 - 1e8) + 1 + 1 = 2;
// starting at rank 2, ((-1e8 + 1) + 1) + 1e8 = 0; starting at rank 3, ((1 + 1) + 1e8) - 1e8 = 0.
constexpr float kContribution[] = {1.0f, 1e8f, -1e8f, 1.0f};
constexpr int kRanks = 4;

SimOptions options_for(ReductionOrder order, std::uint64_t seed = 0) {
  SimOptions options = testing::quiet_options(kRanks, seed);
  options.reduction_order = order;
  return options;
}

// Each rank's float results of `body` (called with the rank's contribution), as bits; the report
// in `report`.
std::vector<std::vector<std::uint32_t>> bits_per_rank(
    const SimOptions& options, const std::function<std::vector<float>(float)>& body,
    SimReport* report = nullptr) {
  std::vector<std::vector<std::uint32_t>> bits(static_cast<std::size_t>(options.world_size));
  SimReport result = sim::run(options, [&] {
    std::vector<std::uint32_t>& mine = bits[testing::rank_slot()];
    for (const float value : body(kContribution[testing::rank_slot() % kRanks])) {
      mine.push_back(std::bit_cast<std::uint32_t>(value));
    }
  });
  if (report != nullptr) {
    *report = std::move(result);
  }
  return bits;
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits;
  for (const float value : values) {
    bits.push_back(std::bit_cast<std::uint32_t>(value));
  }
  return bits;
}

// Every rank got `expected`, bit for bit.
void expect_on_every_rank(const std::vector<std::vector<std::uint32_t>>& bits,
                          const std::vector<float>& expected) {
  for (std::size_t r = 0; r < bits.size(); ++r) {
    EXPECT_EQ(bits[r], bits_of(expected)) << "rank " << r;
  }
}

// all_reduce of four elements, each the rank's contribution: with a ring, element c is chunk c.
std::vector<float> all_reduce_four(float contribution) {
  return all_reduce(Tensor::full({4}, contribution), "sum", world()).to_vector<float>();
}

TEST(ReductionOrder, CraftedFloatsSumInEachModesOrderWithTheSameBitsEverywhere) {
  struct Case {
    ReductionOrder order;
    std::vector<float> expected;
  };
  const Case cases[] = {
      {ReductionOrder::Fixed, {1, 1, 1, 1}},
      // Chunk c starts at rank c + 1 (operation #0).
      {ReductionOrder::Ring, {2, 0, 0, 1}},
      {ReductionOrder::Tree, {0, 0, 0, 0}},
  };
  for (const Case& test_case : cases) {
    SCOPED_TRACE(mark_of(test_case.order));
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      SimReport report;
      expect_on_every_rank(
          bits_per_rank(options_for(test_case.order, seed), all_reduce_four, &report),
          test_case.expected);
      EXPECT_EQ(report.mark_count(mark_of(test_case.order)), 1u);
      for (const ReductionOrder other : kAllOrders) {
        if (other != test_case.order) {
          EXPECT_EQ(report.mark_count(mark_of(other)), 0u);
        }
      }
    }
  }
}

TEST(ReductionOrder, RingTurnsWithTheOperationsSequenceNumber) {
  SimReport report;
  const auto bits = bits_per_rank(
      options_for(ReductionOrder::Ring),
      [](float contribution) {
        std::vector<float> values = all_reduce_four(contribution);  // operation #0
        for (const float value : all_reduce_four(contribution)) {   // #1: chunk c from c + 2
          values.push_back(value);
        }
        return values;
      },
      &report);
  expect_on_every_rank(bits, {2, 0, 0, 1, 0, 0, 1, 2});
  EXPECT_EQ(report.mark_count("reduction.ring"), 2u);
}

TEST(ReductionOrder, ReduceScatterReduceAndCoalescedOpsFollowTheOrder) {
  // reduce_scatter (#0): block d is the ring's chunk d. reduce to rank 0 (#1): chunks as
  // all_reduce, turned by one. all_reduce_coalesced (#2): each op of the batch in the order.
  const auto program = [](float contribution) {
    std::vector<float> values =
        reduce_scatter_tensor(Tensor::full({kRanks}, contribution), "sum", 0, world())
            .to_vector<float>();
    for (const float value :
         reduce(Tensor::full({kRanks}, contribution), "sum", 0, world()).to_vector<float>()) {
      values.push_back(value);
    }
    for (const Tensor& tensor : all_reduce_coalesced(
             {Tensor::full({1}, contribution), Tensor::full({2}, contribution)}, "sum", world())) {
      for (const float value : tensor.to_vector<float>()) {
        values.push_back(value);
      }
    }
    return values;
  };
  // Ring, per rank: its reduce_scatter block, the root's four chunks (others get zeros), the
  // batch.
  SimReport report;
  const auto ring = bits_per_rank(options_for(ReductionOrder::Ring), program, &report);
  const std::vector<float> ring_block = {2, 0, 0, 1};
  for (std::size_t r = 0; r < ring.size(); ++r) {
    const std::vector<float> root =
        r == 0 ? std::vector<float>{0, 0, 1, 2} : std::vector<float>(kRanks, 0.0f);
    // Operation #2: a one-element op is one chunk, starting at rank 3; two elements are chunks
    // 0 and 1 (of one element each), starting at ranks 3 and 0.
    const std::vector<float> batch = {0, 0, 1};
    // Sized first: inserting into a one-element vector trips GCC 12's -Warray-bounds at -O3.
    std::vector<float> expected(1 + root.size() + batch.size());
    expected[0] = ring_block[r];
    std::copy(root.begin(), root.end(), expected.begin() + 1);
    std::copy(batch.begin(), batch.end(),
              expected.begin() + 1 + static_cast<std::ptrdiff_t>(root.size()));
    EXPECT_EQ(ring[r], bits_of(expected)) << "rank " << r;
  }
  EXPECT_EQ(report.mark_count("reduction.ring"), 4u);  // one per reduction op

  const auto tree = bits_per_rank(options_for(ReductionOrder::Tree), program, &report);
  for (std::size_t r = 0; r < tree.size(); ++r) {
    std::vector<float> expected = {0};
    expected.insert(expected.end(), {0, 0, 0, 0, 0, 0, 0});  // reduce's, then the batch's
    EXPECT_EQ(tree[r], bits_of(expected)) << "rank " << r;
  }
  EXPECT_EQ(report.mark_count("reduction.tree"), 4u);
}

// Note [All-reduce blocks]: an all_reduce larger than a block (128 KiB) is reduced and copied out
// a block at a time. 80000 floats are three blocks, the last one partial; every element of every
// block must sum in the mode's order, out of place and in place.
TEST(ReductionOrder, LargeAllReducesSumEveryBlockInTheModesOrder) {
  constexpr std::int64_t kCount = 80000;
  const auto program = [](float contribution) {
    std::vector<float> values =
        all_reduce(Tensor::full({kCount}, contribution), "sum", world()).to_vector<float>();
    Tensor in_place = Tensor::full({kCount}, contribution);
    for (const float value : all_reduce_inplace(in_place, "sum", world()).to_vector<float>()) {
      values.push_back(value);
    }
    return values;
  };
  expect_on_every_rank(bits_per_rank(options_for(ReductionOrder::Fixed), program),
                       std::vector<float>(2 * kCount, 1.0f));
  expect_on_every_rank(bits_per_rank(options_for(ReductionOrder::Tree), program),
                       std::vector<float>(2 * kCount, 0.0f));
  // Ring's chunks are quarters of the whole buffer (rank c + 1 first for chunk c, operation #0).
  std::vector<float> ring;
  for (const float chunk : {2.0f, 0.0f, 0.0f, 1.0f}) {
    ring.insert(ring.end(), kCount / kRanks, chunk);
  }
  for (const float chunk : {0.0f, 0.0f, 1.0f, 2.0f}) {  // operation #1 turns by one
    ring.insert(ring.end(), kCount / kRanks, chunk);
  }
  expect_on_every_rank(bits_per_rank(options_for(ReductionOrder::Ring), program), ring);
  // One drawn order per operation, the same for every block.
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    const auto bits = bits_per_rank(options_for(ReductionOrder::Adversarial, seed), program);
    for (const auto& rank_bits : bits) {
      ASSERT_EQ(rank_bits.size(), 2u * kCount);
      EXPECT_TRUE(std::all_of(rank_bits.begin(), rank_bits.begin() + kCount,
                              [&](std::uint32_t b) { return b == rank_bits.front(); }));
      EXPECT_TRUE(std::all_of(rank_bits.begin() + kCount, rank_bits.end(),
                              [&](std::uint32_t b) { return b == rank_bits.back(); }));
      EXPECT_EQ(rank_bits, bits.front());
    }
  }
}

// Outputs of 16 MiB or more in all are copied out with non-temporal stores (Note [All-reduce
// blocks]): 4 ranks x (2^20 + 3) floats, out of place and in place on memory 4 bytes off a
// 16-byte boundary, so the copies have an unaligned head and a tail.
TEST(ReductionOrder, LargeOutputsStreamedPastTheCachesHoldEveryElement) {
  constexpr std::int64_t kCount = (std::int64_t{1} << 20) + 3;
  std::vector<std::vector<float>> buffers(kRanks, std::vector<float>(kCount + 4));
  std::vector<int> wrong(kRanks, -1);
  const SimReport report = sim::run(options_for(ReductionOrder::Fixed), [&] {
    const std::size_t me = testing::rank_slot();
    const float contribution = kContribution[me];
    const std::vector<float> out_of_place =
        all_reduce(Tensor::full({kCount}, contribution), "sum", world()).to_vector<float>();
    std::vector<float>& buffer = buffers[me];
    std::fill(buffer.begin(), buffer.end(), contribution);
    Tensor in_place = Tensor::from_blob(buffer.data() + 1, {kCount}, DType::Float32);
    all_reduce_inplace(in_place, "sum", world());
    int count = 0;
    for (const float value : out_of_place) {
      count += std::bit_cast<std::uint32_t>(value) == std::bit_cast<std::uint32_t>(1.0f) ? 0 : 1;
    }
    for (std::int64_t i = 1; i <= kCount; ++i) {
      count += buffer[static_cast<std::size_t>(i)] == 1.0f ? 0 : 1;
    }
    // The neighbours of the in-place tensor are untouched.
    count += buffer.front() == contribution ? 0 : 1;
    count += buffer[static_cast<std::size_t>(kCount) + 1] == contribution ? 0 : 1;
    wrong[me] = count;
  });
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(wrong, std::vector<int>(kRanks, 0));
  EXPECT_EQ(report.mark_count("allreduce.streaming"), 2u);
}

// An output that overlaps another member's input a block further on: copying a block out early
// would overwrite input not yet read, so such an operation is reduced whole first (Note
// [All-reduce blocks]). Ranks 0 and 1 reduce in place on one buffer, rank 1's tensor starting a
// block after rank 0's; every element must be 1 + 1 + 2 + 3 = 7, never 7 + 1 + 5.
TEST(ReductionOrder, AnOutputOverlappingAnotherMembersInputIsReducedWhole) {
  constexpr std::int64_t kBlock = 32768;  // floats in 128 KiB
  constexpr std::int64_t kCount = 3 * kBlock;
  std::vector<float> shared(static_cast<std::size_t>(kCount + kBlock), 1.0f);
  std::vector<std::vector<float>> results(kRanks);
  const SimReport report = sim::run(options_for(ReductionOrder::Fixed), [&] {
    const std::size_t me = testing::rank_slot();
    Tensor tensor = me == 0   ? Tensor::from_blob(shared.data(), {kCount}, DType::Float32)
                    : me == 1 ? Tensor::from_blob(shared.data() + kBlock, {kCount}, DType::Float32)
                              : Tensor::full({kCount}, static_cast<double>(me));
    results[me] = all_reduce_inplace(tensor, "sum", world()).to_vector<float>();
  });
  EXPECT_TRUE(report.ok());
  for (std::size_t r = 2; r < results.size(); ++r) {
    EXPECT_EQ(results[r], std::vector<float>(kCount, 7.0f)) << "rank " << r;
  }
  EXPECT_EQ(shared, std::vector<float>(shared.size(), 7.0f));
}

// Rank 0's output overlapping another member's input an element further on, in a small operation
// (one block): reduced straight into rank 0's output, each element written would be read again as
// rank 2's next input, so the operation is reduced aside and copied out (complete_operation's
// overlap test). Every element must be 1 + 2 + 1 + 3 = 7.
TEST(ReductionOrder, RankZerosOutputOverlappingAnotherMembersInputIsReducedAside) {
  constexpr std::int64_t kCount = 64;
  std::vector<float> shared(static_cast<std::size_t>(kCount + 1), 1.0f);
  std::vector<std::vector<float>> results(kRanks);
  const SimReport report = sim::run(options_for(ReductionOrder::Fixed), [&] {
    const std::size_t me = testing::rank_slot();
    Tensor tensor = me == 0   ? Tensor::from_blob(shared.data() + 1, {kCount}, DType::Float32)
                    : me == 2 ? Tensor::from_blob(shared.data(), {kCount}, DType::Float32)
                              : Tensor::full({kCount}, static_cast<double>(me == 1 ? 2 : 3));
    results[me] = all_reduce_inplace(tensor, "sum", world()).to_vector<float>();
  });
  EXPECT_TRUE(report.ok());
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r], std::vector<float>(kCount, 7.0f)) << "rank " << r;
  }
  EXPECT_EQ(shared, std::vector<float>(shared.size(), 7.0f));
}

TEST(ReductionOrder, AvgAndPremulSumCombineInTheOrder) {
  const auto program = [](float contribution) {
    const Tensor input = Tensor::full({1}, contribution);
    return std::vector<float>{all_reduce(input, "avg", world()).item<float>(),
                              all_reduce(input, ReduceOp::premul_sum(0.5), world()).item<float>()};
  };
  // avg divides the sum once: 1 / 4 and 0 / 4. premul_sum halves each contribution first:
  // ((0.5 + 5e7) - 5e7) + 0.5 = 0.5 in rank order, (0.5 + 5e7) + (-5e7 + 0.5) = 0 pairwise.
  expect_on_every_rank(bits_per_rank(options_for(ReductionOrder::Fixed), program), {0.25f, 0.5f});
  expect_on_every_rank(bits_per_rank(options_for(ReductionOrder::Tree), program), {0.0f, 0.0f});
}

TEST(ReductionOrder, AdversarialOrdersDifferAcrossSeedsAndAgreeAcrossRanks) {
  std::set<std::vector<std::uint32_t>> results;
  for (std::uint64_t seed = 0; seed < 32; ++seed) {
    SimReport report;
    const auto bits =
        bits_per_rank(options_for(ReductionOrder::Adversarial, seed), all_reduce_four, &report);
    for (std::size_t r = 1; r < bits.size(); ++r) {
      ASSERT_EQ(bits[r], bits[0]) << "seed " << seed << ", rank " << r;
    }
    results.insert(bits[0]);
    EXPECT_EQ(report.mark_count("reduction.adversarial"), 1u);
    EXPECT_EQ(report.mark_count("reduction.fixed"), 0u);
  }
  EXPECT_GE(results.size(), 2u);
}

TEST(ReductionOrder, AdversarialChoicesReplayAndAllZeroChoicesGiveTheFixedOrder) {
  // A seed whose drawn order does not give the fixed order's result.
  SimReport drawn;
  std::vector<std::vector<std::uint32_t>> drawn_bits;
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    drawn_bits =
        bits_per_rank(options_for(ReductionOrder::Adversarial, seed), all_reduce_four, &drawn);
    if (drawn_bits[0] != bits_of({1, 1, 1, 1})) {
      break;
    }
  }
  ASSERT_NE(drawn_bits[0], bits_of({1, 1, 1, 1}));
  // Its replay token (same mode) gives the same bits.
  SimOptions replay = options_for(ReductionOrder::Adversarial);
  replay.replay = drawn.replay_token;
  EXPECT_EQ(bits_per_rank(replay, all_reduce_four), drawn_bits);
  // Every choice 0: the members in rank order, folded left to right.
  SimOptions zeros = options_for(ReductionOrder::Adversarial);
  zeros.choices = std::vector<std::uint64_t>{};
  expect_on_every_rank(bits_per_rank(zeros, all_reduce_four), {1, 1, 1, 1});
}

TEST(ReductionOrder, OnlyAdversarialDrawsChoices) {
  // Fixed, ring and tree leave the decision stream as it was: same seed, same choice list.
  std::vector<std::vector<std::uint64_t>> choices;
  std::vector<std::uint64_t> steps;
  for (const ReductionOrder order : kAllOrders) {
    SimReport report;
    (void)bits_per_rank(options_for(order, 7), all_reduce_four, &report);
    choices.push_back(report.choices);
    steps.push_back(report.steps);
  }
  EXPECT_EQ(choices[1], choices[0]);
  EXPECT_EQ(choices[2], choices[0]);
  EXPECT_EQ(choices[0].size(), steps[0]);  // one choice per scheduling decision
  // Adversarial draws 2 * (4 - 1) more: a permutation and a tree shape.
  EXPECT_EQ(choices[3].size(), steps[3] + 6);
}

class ReductionOrderIntegers : public ::testing::TestWithParam<int> {};

TEST_P(ReductionOrderIntegers, AreTheSameInEveryMode) {
  const int size = GetParam();
  // Rank r contributes {r + 1, -2r, r * r, 3}: exact sums, maxima and products.
  std::int64_t sum0 = 0, sum1 = 0, sum2 = 0, product = 1, max2 = 0;
  for (std::int64_t r = 0; r < size; ++r) {
    sum0 += r + 1;
    sum1 += -2 * r;
    sum2 += r * r;
    product *= r + 1;
    max2 = std::max(max2, r * r);
  }
  const std::vector<std::int64_t> expected = {sum0, sum1, sum2, 3 * size, max2, product};
  for (const ReductionOrder order : kAllOrders) {
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      SimOptions options = testing::quiet_options(size, seed);
      options.reduction_order = order;
      std::vector<std::vector<std::int64_t>> results(static_cast<std::size_t>(size));
      const SimReport report = sim::run(options, [&] {
        const std::int64_t r = rank();
        const Tensor input = Tensor::from_vector<std::int64_t>({r + 1, -2 * r, r * r, 3});
        std::vector<std::int64_t> mine =
            all_reduce(input, "sum", world()).to_vector<std::int64_t>();
        mine.push_back(all_reduce(input, "max", world()).to_vector<std::int64_t>()[2]);
        mine.push_back(all_reduce(input, "product", world()).to_vector<std::int64_t>()[0]);
        results[testing::rank_slot()] = mine;
      });
      for (std::size_t r = 0; r < results.size(); ++r) {
        EXPECT_EQ(results[r], expected) << mark_of(order) << ", seed " << seed << ", rank " << r;
      }
      EXPECT_EQ(report.mark_count(mark_of(order)), 3u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReductionOrderIntegers,
                         ::testing::ValuesIn(testing::kWorldSizes), testing::world_name);

}  // namespace
}  // namespace chorus
