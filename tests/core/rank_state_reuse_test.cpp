// A rank state that a RankContext which ended left on the thread is restarted by the next one
// (Note [Reused rank states] in core/src/runtime.cpp): it starts as a fresh one would, with no
// value of the rank before it. Under AddressSanitizer nothing is recycled (recycling_enabled()).

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/transport/group_label.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "detail/rank_state.hpp"
#include "support/fake_transport.hpp"

namespace chorus {
namespace {

using testing::FakeTransport;

RankOptions options_with_timeout(std::chrono::milliseconds timeout) {
  RankOptions options;
  options.timeout = timeout;
  return options;
}

// Everything a rank state computes as its rank runs, checked against what a fresh one holds.
void expect_fresh(detail::RankState& state, const FakeTransport& transport,
                  std::chrono::milliseconds timeout) {
  EXPECT_EQ(state.rank(), transport.rank());
  EXPECT_EQ(state.world_size(), transport.world_size());
  EXPECT_EQ(state.transport_ptr().get(), &transport);
  EXPECT_EQ(state.options().timeout, timeout);
  EXPECT_EQ(state.options().host_allocator, nullptr);
  EXPECT_EQ(state.options().device_memory, nullptr);
  EXPECT_EQ(state.registry()->size(), 0u);
  EXPECT_FALSE(state.registry()->may_need_settling());
  EXPECT_NE(state.host_pool(), nullptr);
  EXPECT_EQ(state.device_bytes()->load(), 0u);
  EXPECT_EQ(state.streams()->get(0), nullptr);
  EXPECT_EQ(state.stream_of(Device::cuda(0)), nullptr);
  EXPECT_EQ(state.expanded_groups_in_use(), 0u);
  EXPECT_FALSE(state.last_supported.has_value());
  std::vector<int> world_list;
  for (int r = 0; r < transport.world_size(); ++r) {
    world_list.push_back(r);
  }
  // world()'s slot may be kept (Note [Reused rank states]), as the slot a fresh state would make
  // at the rank's first call on world(), and the scratch group with world()'s expansion.
  ExpandedGroup& first_group = state.push_expanded_group();
  if (state.world_slot != nullptr) {
    EXPECT_NE(state.built_world_ranks(), nullptr);
    EXPECT_EQ(state.world_slot->comm, nullptr);
    EXPECT_EQ(state.world_slot->next_seq, 0);
    EXPECT_EQ(state.world_slot->label.str(), transport::group_label("", world_list));
    EXPECT_EQ(first_group, (ExpandedGroup{"", world_list, transport.world_size()}));
  } else {
    EXPECT_EQ(first_group, ExpandedGroup{});
  }
  state.pop_expanded_group(0);
  EXPECT_EQ(state.digested_layout, nullptr);
  EXPECT_EQ(state.digested_dim, 0);
  EXPECT_EQ(state.layout_digest, 0u);
  EXPECT_EQ(state.digested_numel, 0);
  EXPECT_FALSE(state.digested_contiguous);
  EXPECT_FALSE(state.digested_contiguous_strides);
  EXPECT_TRUE(state.send_counts_scratch.empty());
  EXPECT_TRUE(state.recv_counts_scratch.empty());
  EXPECT_FALSE(state.finished);
  EXPECT_EQ(state.trace, nullptr);
  if (const std::vector<int>* ranks = state.built_world_ranks(); ranks != nullptr) {
    EXPECT_EQ(*ranks, world_list) << "a kept world list is this world's";
  }
}

// A rank that ran collectives on world(), set a stream and left values in every remembered field.
void run_a_rank(const std::shared_ptr<FakeTransport>& transport, detail::RankState** state) {
  RankContext context(transport, options_with_timeout(std::chrono::milliseconds(200)));
  const ScopedRankBinding binding(&context);
  *state = &context.state();
  set_current_stream(Device::cuda(0), reinterpret_cast<void*>(0x1000));
  const Tensor input = Tensor::ones({4});
  for (int i = 0; i < 2; ++i) {
    const Tensor out = all_reduce(input, "sum", world());
    transport->last_work()->complete();
    EXPECT_EQ(out.data_ptr<float>()[0], 1.0F);
  }
  EXPECT_EQ(transport->comms_created, 1);
  EXPECT_NE(context.state().world_slot, nullptr);
  EXPECT_TRUE(context.state().last_supported.has_value());
  (void)context.finish();
}

TEST(RankStateReuse, TheNextRankOnTheThreadRestartsTheStateAsAFreshOne) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  detail::RankState* ended = nullptr;
  run_a_rank(std::make_shared<FakeTransport>(), &ended);

  const auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport, options_with_timeout(std::chrono::milliseconds(300)));
  const ScopedRankBinding binding(&context);
  ASSERT_EQ(&context.state(), ended) << "the state the rank before left is reused";
  EXPECT_NE(context.state().built_world_ranks(), nullptr) << "reused: its world list is kept";
  EXPECT_NE(context.state().world_slot, nullptr) << "and world()'s slot";
  expect_fresh(context.state(), *transport, std::chrono::milliseconds(300));
  EXPECT_EQ(current_stream(Device::cuda(0)), nullptr);

  // Its first collective makes the communicator on this rank's transport, from sequence 0.
  const Tensor out = all_reduce(Tensor::ones({4}), "sum", world());
  EXPECT_EQ(transport->comms_created, 1);
  EXPECT_EQ(transport->last_work()->fingerprint().seq, 0);
  transport->last_work()->complete();
  EXPECT_EQ(out.data_ptr<float>()[0], 1.0F);
  (void)context.finish();
}

// chorus::world()'s list is kept for a world of its size only.
TEST(RankStateReuse, ARestartedStateListsItsOwnWorld) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  detail::RankState* ended = nullptr;
  run_a_rank(std::make_shared<FakeTransport>(), &ended);
  const auto transport = std::make_shared<FakeTransport>(1, 3);
  RankContext context(transport, options_with_timeout(std::chrono::milliseconds(200)));
  ASSERT_EQ(&context.state(), ended);
  EXPECT_EQ(context.state().world_slot, nullptr) << "world()'s slot was another world's";
  expect_fresh(context.state(), *transport, std::chrono::milliseconds(200));
  EXPECT_EQ(*context.state().world_ranks(), (std::vector<int>{0, 1, 2}));
  (void)context.finish();
}

// What a work of the ended rank still holds (its streams) is not reused: the next rank gets
// fresh ones.
TEST(RankStateReuse, StreamsHeldPastTheRankAreNotReused) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  std::shared_ptr<detail::CurrentStreams> kept;
  {
    RankContext context(std::make_shared<FakeTransport>());
    kept = context.state().streams();
    kept->set(0, reinterpret_cast<void*>(0x1000));
    (void)context.finish();
  }
  RankContext context(std::make_shared<FakeTransport>());
  EXPECT_NE(context.state().streams(), kept);
  EXPECT_EQ(context.state().streams()->get(0), nullptr);
  (void)context.finish();
}

// A world larger than kReusedWorldSizeMax: its rank's state is not kept (it keeps room that grows
// with the world), so the next rank's state is a fresh one, without world()'s list or slot.
TEST(RankStateReuse, TheStateOfALargeWorldIsNotKept) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  for (const int size :
       {detail::RankState::kReusedWorldSizeMax, detail::RankState::kReusedWorldSizeMax + 1}) {
    detail::RankState* ended = nullptr;
    run_a_rank(std::make_shared<FakeTransport>(0, size), &ended);
    RankContext context(std::make_shared<FakeTransport>(0, size));
    const bool kept = size <= detail::RankState::kReusedWorldSizeMax;
    EXPECT_EQ(context.state().world_slot != nullptr, kept) << size;
    EXPECT_EQ(context.state().built_world_ranks() != nullptr, kept) << size;
    (void)context.finish();
  }
}

// An all_reduce of ones on `group`, completed: its sequence number on its communicator.
std::int64_t all_reduce_seq(FakeTransport& transport, const GroupSpec& group) {
  const Tensor out = all_reduce(Tensor::ones({2}, DType::Int32), "sum", group);
  const std::int64_t seq = transport.last_work()->fingerprint().seq;
  transport.last_work()->complete();
  EXPECT_EQ(out.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 1}));
  return seq;
}

// A partitioned group's slot is kept, its partition not (partitions_ emptied): the next run on
// the thread sets the partition up again on its own transport.
TEST(RankStateReuse, APartitionIsSetUpAgainInTheNextRun) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  using Parts = std::vector<std::vector<int>>;
  for (int run = 0; run < 3; ++run) {
    const auto transport = std::make_shared<FakeTransport>(2, 4);
    RankContext context(transport);
    const ScopedRankBinding binding(&context);
    EXPECT_EQ(all_reduce_seq(*transport, Parts{{0, 1}, {2, 3}}), 0) << run;
    EXPECT_EQ(all_reduce_seq(*transport, Parts{{0, 1}, {2, 3}}), 1) << run;
    EXPECT_EQ(transport->partition_calls.size(), 1u) << run;
    EXPECT_EQ(transport->comms_created, 1) << run;
    (void)context.finish();
  }
}

// A run with more slots than are kept ends them all, world()'s too: the next run's world() makes
// its slot again.
TEST(RankStateReuse, WorldAfterARunWithMoreSlotsThanAreKept) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  for (int run = 0; run < 3; ++run) {
    const auto transport = std::make_shared<FakeTransport>(0, 8);
    RankContext context(transport);
    const ScopedRankBinding binding(&context);
    EXPECT_EQ(all_reduce_seq(*transport, world()), 0) << run;
    for (int peer = 1; peer <= 5; ++peer) {
      EXPECT_EQ(all_reduce_seq(*transport, std::vector<int>{0, peer}), 0) << run;
    }
    EXPECT_EQ(all_reduce_seq(*transport, world()), 1) << run;
    EXPECT_EQ(transport->comms_created, 6) << run;
    (void)context.finish();
  }
}

// A kept state holds nothing of its run: the transport (and with it the communicators) ends with
// its RankContext.
TEST(RankStateReuse, TheTransportEndsWithItsContext) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  std::weak_ptr<FakeTransport> weak;
  {
    auto transport = std::make_shared<FakeTransport>(0, 2);
    weak = transport;
    RankContext context(std::move(transport));
    const ScopedRankBinding binding(&context);
    (void)all_reduce_seq(*weak.lock(), world());
    (void)context.finish();
  }
  EXPECT_TRUE(weak.expired());
}

// A rank that ended inside a TraceScope (a launcher's bug): the next rank does not trace into it.
TEST(RankStateReuse, TheNextRankDoesNotTraceIntoAnEndedRanksScope) {
  if (!transport::recycling_enabled()) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  detail::RankState* ended = nullptr;
  {
    RankContext context(std::make_shared<FakeTransport>());
    ended = &context.state();
    int not_a_scope = 0;
    context.state().trace = reinterpret_cast<TraceScope*>(&not_a_scope);
    (void)context.finish();
  }
  RankContext context(std::make_shared<FakeTransport>());
  const ScopedRankBinding binding(&context);
  ASSERT_EQ(&context.state(), ended);
  EXPECT_EQ(context.state().trace, nullptr);
  EXPECT_EQ(current_trace(), nullptr);
  (void)context.finish();
}

}  // namespace
}  // namespace chorus
