// Group desugaring (DESIGN 2.2, the seed's _expand_group) and every desugaring error.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace chorus {
namespace {

sim::SimOptions quiet(int world_size) {
  sim::SimOptions options;
  options.world_size = world_size;
  options.print_failures = false;
  options.seed_from_environment = false;
  return options;
}

// Runs `body` on every rank of a world of `size` and rethrows a failed expectation's exception.
template <class Body>
void on_ranks(int size, Body body) {
  sim::run(quiet(size), body);
}

void expect_invalid(const std::function<void()>& call, const std::string& message_part) {
  try {
    call();
    ADD_FAILURE() << "expected InvalidArgument containing '" << message_part << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
    EXPECT_EQ(e.context().rank, rank());
  }
}

TEST(Group, RankListExpandsToItselfWithTheCallTag) {
  on_ranks(4, [] {
    const ExpandedGroup group = expand_group({2, 0, 3}, "t");
    EXPECT_EQ(group.tag, "t");
    EXPECT_EQ(group.ranks, (std::vector<int>{2, 0, 3}));
    EXPECT_EQ(group.group_size, 3);
    EXPECT_EQ(group.members_of(0), (std::vector<int>{2, 0, 3}));
    EXPECT_TRUE(group.members_of(1).empty());
  });
}

TEST(Group, TwoDimensionalListIsMpmdWithTheCallersSubList) {
  on_ranks(6, [] {
    const ExpandedGroup group = expand_group({{0, 1, 2}, {3, 4, 5}});
    EXPECT_EQ(group.ranks, (std::vector<int>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(group.group_size, 3);
    const std::vector<int> expected =
        rank() < 3 ? std::vector<int>{0, 1, 2} : std::vector<int>{3, 4, 5};
    EXPECT_EQ(group.members_of(rank()), expected);
    // The collective runs within the sub-list.
    Tensor sum = all_reduce(Tensor::full({1}, rank(), DType::Int32), "sum", {{0, 1, 2}, {3, 4, 5}});
    EXPECT_EQ(sum.item<std::int32_t>(), rank() < 3 ? 3 : 12);
  });
}

TEST(Group, TwoDimensionalListFromVectors) {
  on_ranks(4, [] {
    const std::vector<std::vector<int>> lists = {{0, 2}, {1, 3}};
    const ExpandedGroup group = expand_group(lists);
    EXPECT_EQ(group.group_size, 2);
    EXPECT_EQ(group.members_of(3), (std::vector<int>{1, 3}));
    // One-rank sub-groups need the explicit type: `{{0}, {1}}` is ambiguous in C++.
    EXPECT_EQ(expand_group(std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}).group_size, 1);
  });
}

TEST(Group, WorldIsEveryRankWithTheSameTagEverywhere) {
  std::vector<std::string> tags(5);
  on_ranks(5, [&tags] {
    const ProcessGroup group = world();
    EXPECT_EQ(group.ranks(), (std::vector<int>{0, 1, 2, 3, 4}));
    EXPECT_EQ(group.size(), 5);
    tags[static_cast<std::size_t>(rank())] = group.tag();
    EXPECT_EQ(expand_group(world()), expand_group({0, 1, 2, 3, 4}));
    // A value: equal to every other world() and to the same ranks built by new_group, whether or
    // not the two share their rank list; a different tag or list is a different group.
    EXPECT_EQ(world(), group);
    EXPECT_EQ(new_group({0, 1, 2, 3, 4}), group);
    EXPECT_FALSE(new_group({0, 1, 2, 3, 4}, "t") == group);
    EXPECT_FALSE(new_group({4, 3, 2, 1, 0}) == group);
  });
  for (const std::string& tag : tags) {
    EXPECT_EQ(tag, tags[0]);
  }
}

// A collective skips the rank-list checks for the list world() hands out on its own rank (valid
// by construction), and only for that one: a world() kept from a larger run is another rank's
// list, and is checked, and refused, like any other.
TEST(Group, AWorldGroupKeptFromALargerRunIsRefusedInASmallerOne) {
  std::optional<ProcessGroup> kept;
  on_ranks(4, [&kept] {
    (void)all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>();
    if (rank() == 3) {
      kept = world();
    }
  });
  ASSERT_TRUE(kept.has_value());
  std::vector<std::string> outcomes(2);
  on_ranks(2, [&] {
    expect_invalid([&] { (void)all_reduce(Tensor::ones({2}), "sum", *kept); },
                   "process group [0, 1, 2, 3] holds rank 2, out of range [0, 2)");
    outcomes[static_cast<std::size_t>(rank())] =
        std::to_string(all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>()[0]);
  });
  EXPECT_EQ(outcomes, (std::vector<std::string>{"2.000000", "2.000000"}));
}

// Collectives expand their group into a list recycled from call to call
// (RankState::push_expanded_group): a group must never see the ranks or tag of the one before.
TEST(Group, ConsecutiveCollectivesOnDifferentGroupsDoNotMixTheirRanks) {
  on_ranks(4, [] {
    const int r = rank();
    EXPECT_EQ(all_reduce(Tensor::ones({1}), "sum", world()).item<float>(), 4.0f);
    const std::vector<std::vector<int>> pairs = {{0, 1}, {2, 3}};
    Tensor pair_sum = all_reduce(Tensor::full({1}, static_cast<float>(r)), "sum", pairs);
    EXPECT_EQ(pair_sum.item<float>(), r < 2 ? 1.0f : 5.0f);
    const ProcessGroup tagged = new_group({0, 1, 2, 3}, "tagged");
    EXPECT_EQ(all_reduce(Tensor::ones({1}), "sum", tagged).item<float>(), 4.0f);
    const std::vector<int> odd_even = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    EXPECT_EQ(all_reduce(Tensor::full({1}, static_cast<float>(r)), "sum", odd_even).item<float>(),
              r % 2 == 0 ? 2.0f : 4.0f);
    EXPECT_EQ(all_reduce(Tensor::ones({1}), "sum", world()).item<float>(), 4.0f);
  });
}

TEST(Group, UntaggedNewGroupIsTheSameGroupAsItsRankList) {
  on_ranks(3, [] {
    const ProcessGroup group = new_group({0, 1});
    EXPECT_EQ(expand_group(group), expand_group({0, 1}));
    if (rank() < 2) {
      // Same communicator: the ops pair up in order across both spellings.
      Tensor a = all_reduce(Tensor::ones({1}), "sum", group);
      Tensor b = all_reduce(Tensor::ones({2}), "sum", {0, 1});
      EXPECT_EQ(a.item<float>(), 2.0f);
      EXPECT_EQ(b.to_vector<float>(), std::vector<float>(2, 2.0f));
    }
  });
}

TEST(Group, TagsMakeDifferentGroups) {
  on_ranks(2, [] {
    const ProcessGroup tagged = new_group({0, 1}, "other");
    EXPECT_EQ(tagged.tag(), "other");
    EXPECT_NE(expand_group(tagged), expand_group({0, 1}));
    // Different communicators: issuing them in opposite orders is not a mismatch.
    Tensor first;
    Tensor second;
    if (rank() == 0) {
      first = all_reduce(Tensor::ones({1}), "sum", tagged);
      second = all_reduce(Tensor::ones({3}), "sum", {0, 1});
    } else {
      second = all_reduce(Tensor::ones({3}), "sum", {0, 1});
      first = all_reduce(Tensor::ones({1}), "sum", tagged);
    }
    EXPECT_EQ(first.item<float>(), 2.0f);
    EXPECT_EQ(second.to_vector<float>(), std::vector<float>(3, 2.0f));
    // The call's tag wins over the group's own.
    EXPECT_EQ(expand_group(tagged, "call").tag, "call");
  });
}

TEST(Group, NewGroupIsLocalAndNonMembersCannotUseIt) {
  on_ranks(3, [] {
    const ProcessGroup pair = new_group({0, 2});  // every rank may create it
    EXPECT_EQ(pair.contains(rank()), rank() != 1);
    EXPECT_EQ(pair.group_rank(2), 1);
    if (rank() == 1) {
      expect_invalid([&] { (void)all_reduce(Tensor::ones({1}), "sum", pair); },
                     "rank 1 is not a member of the group");
    } else {
      EXPECT_EQ(all_reduce(Tensor::ones({1}), "sum", pair).item<float>(), 2.0f);
    }
  });
}

TEST(Group, DeviceMeshSlicesAlongADim) {
  on_ranks(6, [] {
    const DeviceMesh mesh({2, 3}, {0, 1, 2, 3, 4, 5});
    EXPECT_EQ(mesh.ndim(), 2);
    EXPECT_EQ(mesh.size(-1), 3);
    const int r = rank();
    const ExpandedGroup rows = expand_group(MeshDim{mesh, 1});
    const ExpandedGroup columns = expand_group(MeshDim{mesh, 0});
    const int row = r / 3;
    const int column = r % 3;
    EXPECT_EQ(rows.ranks, (std::vector<int>{row * 3, row * 3 + 1, row * 3 + 2}));
    EXPECT_EQ(columns.ranks, (std::vector<int>{column, column + 3}));
    Tensor row_sum = all_reduce(Tensor::full({1}, r, DType::Int32), "sum", MeshDim{mesh, 1});
    Tensor column_sum = all_reduce(Tensor::full({1}, r, DType::Int32), "sum", MeshDim{mesh, -2});
    EXPECT_EQ(row_sum.item<std::int32_t>(), 9 * row + 3);
    EXPECT_EQ(column_sum.item<std::int32_t>(), 2 * column + 3);
    // A 1-D mesh alone is all its ranks.
    EXPECT_EQ(expand_group(DeviceMesh({6}, {5, 4, 3, 2, 1, 0})).ranks,
              (std::vector<int>{5, 4, 3, 2, 1, 0}));
  });
}

TEST(Group, EveryDesugaringErrorNamesTheProblem) {
  on_ranks(4, [] {
    expect_invalid(
        [] {
          (void)expand_group({{0, 1}, {2}});
        },
        "group sizes must be identical found 2 and 1");
    expect_invalid(
        [] {
          (void)expand_group(DeviceMesh({2, 2}, {0, 1, 2, 3}));
        },
        "Only 1D mesh is supported");
    expect_invalid([] { (void)expand_group(std::vector<int>{}); }, "empty");
    expect_invalid([] { (void)expand_group({0, 1, 1}); }, "holds rank 1 more than once");
    expect_invalid([] { (void)expand_group({{0, 1}, {1, 2}}); }, "more than once");
    expect_invalid([] { (void)expand_group({0, 4}); }, "out of range [0, 4)");
    expect_invalid([] { (void)expand_group({-1, 0}); }, "out of range");
    expect_invalid([] { (void)new_group({}); }, "empty");
    expect_invalid([] { (void)new_group({0, 7}); }, "out of range");
    expect_invalid([] { (void)new_group({3, 3}); }, "more than once");
    expect_invalid([] { (void)DeviceMesh({2, 2}, {0, 1, 2}); }, "holds 4 ranks but 3 were given");
    expect_invalid([] { (void)DeviceMesh({2, 0}, {}); }, "non-positive");
    // Products that wrap: 3 * 6148914691236517206 is 2 modulo 2^64, and 2^32 * 2^32 is 0.
    expect_invalid(
        [] {
          (void)DeviceMesh({3, 6148914691236517206}, {0, 1});
        },
        "holds more ranks than an int64 counts, but 2 were given");
    expect_invalid(
        [] {
          (void)DeviceMesh({std::int64_t{1} << 32, std::int64_t{1} << 32}, {});
        },
        "holds more ranks than an int64 counts, but 0 were given");
    expect_invalid([] { (void)DeviceMesh({2}, {1, 1}); }, "repeated rank 1");
    if (rank() >= 2) {
      expect_invalid(
          [] {
            (void)expand_group(MeshDim{DeviceMesh({2}, {0, 1}), 0});
          },
          "is not in the mesh");
    }
    expect_invalid(
        [] {
          (void)expand_group(MeshDim{DeviceMesh({2, 2}, {0, 1, 2, 3}), 2});
        },
        "MeshDim");
  });
}

// A MeshDim's mesh is checked against the world like any other rank list, on every rank, before
// the caller's slice is taken: rank 0's column [0, 2] is in range, but the mesh names rank 7 of a
// 4-rank world.
TEST(Group, AMeshDimsMeshIsCheckedAgainstTheWorldBeforeItIsSliced) {
  on_ranks(4, [] {
    expect_invalid(
        [] {
          (void)expand_group(MeshDim{DeviceMesh({2, 2}, {0, 1, 2, 7}), 0});
        },
        "mesh [0, 1, 2, 7] holds rank 7, out of range [0, 4)");
  });
}

TEST(Group, RepeatedRanksAreFoundInListsOfEverySize) {
  // Short lists are compared pairwise, longer ones through a bitset, lists naming ranks of 8192
  // and more by sorting a copy: each path finds a repeat wherever it sits, and none invents one.
  on_ranks(1, [] {
    for (const int size : {2, 8, 9, 64, 65, 200, 8191}) {
      std::vector<int> ranks(static_cast<std::size_t>(size));
      for (int i = 0; i < size; ++i) {
        ranks[static_cast<std::size_t>(i)] = size - 1 - i;  // descending: no repeat
      }
      EXPECT_NO_THROW((void)DeviceMesh({size}, ranks)) << size;
      for (const int at : {1, size / 2, size - 1}) {
        std::vector<int> repeated = ranks;
        repeated[static_cast<std::size_t>(at)] = ranks[0];  // the first rank again
        expect_invalid([&] { (void)DeviceMesh({size}, repeated); },
                       "hold a negative or repeated rank " + std::to_string(size - 1));
      }
    }
    // Ranks past the bitset, and a negative rank beside small ones (no bitset then either).
    expect_invalid(
        [] {
          (void)DeviceMesh({3}, {9000, 1, 9000});
        },
        "hold a negative or repeated rank 9000");
    EXPECT_NO_THROW((void)DeviceMesh({9}, {9000, 1, 2, 3, 4, 5, 6, 7, 8}));
    expect_invalid(
        [] {
          (void)DeviceMesh({10}, {-3, 1, 2, 3, 4, 5, 6, 7, 8, 9});
        },
        "hold a negative or repeated rank -3");
    // Inside a collective's group check, with the group's context.
    expect_invalid(
        [] {
          (void)expand_group({0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
        },
        "holds rank 0 more than once");
  });
}

TEST(Group, RankAndWorldSizeOutsideARankThrow) {
  EXPECT_THROW(rank(), InvalidArgument);
  EXPECT_THROW(world_size(), InvalidArgument);
  EXPECT_THROW(world(), InvalidArgument);
  EXPECT_THROW(new_group({0}), InvalidArgument);
  // Structure is still checked outside a rank; the range is not known there.
  EXPECT_THROW(expand_group({0, 0}), InvalidArgument);
  EXPECT_EQ(expand_group({5, 9}).group_size, 2);
}

}  // namespace
}  // namespace chorus
