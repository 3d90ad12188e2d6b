// Which group specs reach the transport as a partition of the world (Note [Partitioned groups],
// transport.hpp): a list of rank lists covering the world and a MeshDim of a mesh over the whole
// world do, once per (tag, partition) and rank; rank lists, ProcessGroups, 1-D meshes and specs
// that leave a rank out do not. Driven through the fake transport placed at one rank of a larger
// world, which records every create_partition_comm.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <memory>
#include <string>
#include <vector>

#include "support/fake_transport.hpp"

namespace chorus {
namespace {

using testing::FakeTransport;
using Parts = std::vector<std::vector<int>>;

// Rank `rank` of a world of `world_size`, bound to the test's thread, on the fake transport.
class PlacedRank {
 public:
  PlacedRank(int rank, int world_size)
      : transport_(std::make_shared<FakeTransport>(rank, world_size)),
        context_(transport_),
        binding_(&context_) {}

  FakeTransport& transport() { return *transport_; }

  // An all_reduce on `group` (tag `tag`), completed by hand: the fake transport finishes nothing
  // on its own.
  void all_reduce_on(const GroupSpec& group, std::string_view tag = "") {
    const Tensor result = all_reduce(Tensor::ones({2}, DType::Int32), "sum", group, tag);
    transport_->last_work()->complete();
    EXPECT_EQ(result.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 1}));
  }

 private:
  std::shared_ptr<FakeTransport> transport_;
  RankContext context_;
  ScopedRankBinding binding_;
};

TEST(Partition, ListOfListsCoveringTheWorldIsPassedOnceWithTheCallersPart) {
  PlacedRank rank(2, 4);
  rank.all_reduce_on(Parts{{0, 1}, {2, 3}});
  ASSERT_EQ(rank.transport().partition_calls.size(), 1u);
  const FakeTransport::PartitionCall& call = rank.transport().partition_calls.front();
  EXPECT_EQ(call.tag, "");
  EXPECT_EQ(call.partition.parts, (Parts{{0, 1}, {2, 3}}));
  EXPECT_EQ(call.partition.index, 1);
  EXPECT_EQ(call.partition.own(), (std::vector<int>{2, 3}));
  EXPECT_FALSE(call.had_existing);
  EXPECT_EQ(rank.transport().comms_created, 1);  // the default: create_comm of the own part

  // Later operations on the partition reuse core's communicator.
  rank.all_reduce_on(Parts{{0, 1}, {2, 3}});
  EXPECT_EQ(rank.transport().partition_calls.size(), 1u);
  EXPECT_EQ(rank.transport().comms_created, 1);
}

TEST(Partition, TagAndPartOrderMakeDifferentPartitions) {
  PlacedRank rank(3, 4);
  rank.all_reduce_on(Parts{{0, 1}, {2, 3}}, "t");
  rank.all_reduce_on(Parts{{0, 1}, {2, 3}});
  rank.all_reduce_on(Parts{{2, 3}, {0, 1}});  // the same part, another color: set up again
  ASSERT_EQ(rank.transport().partition_calls.size(), 3u);
  EXPECT_EQ(rank.transport().partition_calls[0].tag, "t");
  EXPECT_EQ(rank.transport().partition_calls[1].tag, "");
  EXPECT_FALSE(rank.transport().partition_calls[1].had_existing);
  EXPECT_EQ(rank.transport().partition_calls[2].partition.index, 0);
  // Its own part (tag "", [2, 3]) exists already: the transport is told, and keeps it.
  EXPECT_TRUE(rank.transport().partition_calls[2].had_existing);
  EXPECT_EQ(rank.transport().comms_created, 2);  // ('t', [2, 3]) and ('', [2, 3])
}

TEST(Partition, AnEarlierPlainGroupIsPassedAsExisting) {
  PlacedRank rank(1, 4);
  rank.all_reduce_on({0, 1});
  EXPECT_TRUE(rank.transport().partition_calls.empty());
  rank.all_reduce_on(Parts{{0, 1}, {2, 3}});
  ASSERT_EQ(rank.transport().partition_calls.size(), 1u);
  EXPECT_TRUE(rank.transport().partition_calls.front().had_existing);
  EXPECT_EQ(rank.transport().partition_calls.front().partition.index, 0);
  EXPECT_EQ(rank.transport().comms_created, 1);
}

TEST(Partition, MeshDimOverTheWorldIsPassedAsItsSlices) {
  PlacedRank rank(4, 6);
  const DeviceMesh mesh({2, 3}, {0, 1, 2, 3, 4, 5});
  rank.all_reduce_on(MeshDim{mesh, 0});   // columns
  rank.all_reduce_on(MeshDim{mesh, 1});   // rows
  rank.all_reduce_on(MeshDim{mesh, -1});  // rows again: the same partition
  ASSERT_EQ(rank.transport().partition_calls.size(), 2u);
  EXPECT_EQ(rank.transport().partition_calls[0].partition.parts, (Parts{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(rank.transport().partition_calls[0].partition.index, 1);
  EXPECT_EQ(rank.transport().partition_calls[1].partition.parts, (Parts{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(rank.transport().partition_calls[1].partition.index, 1);
  EXPECT_EQ(rank.transport().comms_created, 2);
}

TEST(Partition, MeshDimOfAPermutedThreeDimensionalMesh) {
  PlacedRank rank(0, 8);
  const DeviceMesh mesh({2, 2, 2}, {7, 6, 5, 4, 3, 2, 1, 0});
  rank.all_reduce_on(MeshDim{mesh, 1});
  ASSERT_EQ(rank.transport().partition_calls.size(), 1u);
  const transport::Partition& partition = rank.transport().partition_calls[0].partition;
  EXPECT_EQ(partition.parts, (Parts{{7, 5}, {6, 4}, {3, 1}, {2, 0}}));
  EXPECT_EQ(partition.index, 3);
  for (const std::vector<int>& part : partition.parts) {
    EXPECT_EQ(mesh.dim_ranks(1, part.front()), part);  // each part is a dim group
  }
  EXPECT_EQ(partition.problem(8, 0), "");
}

TEST(Partition, GroupsOfOneListOrNotCoveringTheWorldAreNotPartitions) {
  PlacedRank rank(2, 4);
  rank.all_reduce_on({2, 3});
  rank.all_reduce_on({0, 1, 2, 3});                            // the world, as a rank list
  rank.all_reduce_on(world());                                 // a ProcessGroup
  rank.all_reduce_on(new_group({3, 2}, "g"));                  // a tagged ProcessGroup
  rank.all_reduce_on(DeviceMesh({4}, {0, 1, 2, 3}));           // a 1-D mesh
  rank.all_reduce_on(Parts{{2, 3}});                           // leaves ranks 0 and 1 out
  rank.all_reduce_on(MeshDim{DeviceMesh({1, 2}, {2, 3}), 1});  // a mesh over half the world
  EXPECT_TRUE(rank.transport().partition_calls.empty());
  // ('', [2, 3]) is shared by the first, the list of one list and the mesh slice; ('', [0, 1, 2,
  // 3]) by the rank list, world() and the 1-D mesh; and ('g', [3, 2]).
  EXPECT_EQ(rank.transport().comms_created, 3);
}

TEST(Partition, ProblemNamesWhatIsNotAPartition) {
  EXPECT_EQ((transport::Partition{{{0, 1}, {2, 3}}, 1}.problem(4, 3)), "");
  EXPECT_NE((transport::Partition{{{0, 1}, {2, 3}}, 1}.problem(4, 0)), "");  // not in part 1
  EXPECT_NE((transport::Partition{{{0, 1}, {2, 3}}, 2}.problem(4, 0)), "");  // no part 2
  EXPECT_NE((transport::Partition{{{0, 1}, {1, 2}}, 0}.problem(4, 0)), "");  // rank 1 twice
  EXPECT_NE((transport::Partition{{{0, 1}}, 0}.problem(4, 0)), "");          // 2 of 4 ranks
  EXPECT_NE((transport::Partition{{{0, 1}, {2}}, 0}.problem(3, 0)), "");     // unequal sizes
  EXPECT_NE((transport::Partition{{}, 0}.problem(1, 0)), "");
  EXPECT_EQ((transport::Partition{{{0}}, 0}.problem(1, 0)), "");
}

}  // namespace
}  // namespace chorus
