// The work registry and the async semantics of pending tensors (Note [Work lifecycle],
// Note [Pending storage]), driven through a transport whose works complete only when the test
// says so.

#include "detail/work_registry.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "detail/generations.hpp"
#include "detail/rank_state.hpp"
#include "detail/storage.hpp"
#include "detail/tensor_access.hpp"
#include "support/expect_error.hpp"
#include "support/fake_transport.hpp"

namespace chorus {
namespace {

using testing::FakeTransport;
using testing::FakeWork;

// One rank (world size 1) bound to the test's thread, on the fake transport.
class FakeRank {
 public:
  FakeRank()
      : transport_(std::make_shared<FakeTransport>()), context_(transport_), binding_(&context_) {}

  FakeTransport& transport() { return *transport_; }
  RankContext& context() { return context_; }
  detail::WorkRegistry& registry() { return *context_.state().registry(); }

 private:
  std::shared_ptr<FakeTransport> transport_;
  RankContext context_;
  ScopedRankBinding binding_;
};

Tensor iota(std::int64_t n) {
  std::vector<std::int32_t> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i + 1);
  }
  return Tensor::from_vector(values);
}

TEST(WorkRegistry, CountsThroughIssueWaitWaitByViewAndDrop) {
  FakeRank rank;
  EXPECT_EQ(work_registry_size(), 0u);
  Tensor a = all_reduce(iota(4), "sum", {0});
  Tensor b = all_reduce(iota(4), "sum", {0});
  Tensor c = all_reduce(iota(4), "sum", {0});
  EXPECT_EQ(work_registry_size(), 3u);
  for (const auto& work : rank.transport().works()) {
    work->complete();
  }
  EXPECT_EQ(work_registry_size(), 3u) << "completion inside the transport does not retire";
  wait_tensor(a);
  EXPECT_EQ(work_registry_size(), 2u);
  wait_tensor(b.narrow(0, 1, 2));  // through a view
  EXPECT_EQ(work_registry_size(), 1u);
  c = Tensor();  // drop the last tensor of c's storage
  EXPECT_EQ(work_registry_size(), 0u);
  ASSERT_EQ(rank.registry().unwaited().size(), 1u);
  EXPECT_EQ(rank.registry().unwaited()[0].op, "all_reduce");
  EXPECT_EQ(rank.registry().unwaited()[0].seq, 2);
}

TEST(WorkRegistry, ViewsNeverWait) {
  FakeRank rank;
  Tensor t = all_reduce(Tensor::arange(24).view({2, 3, 4}), "sum", {0});
  const auto work = rank.transport().last_work();
  ASSERT_TRUE(t.is_pending());
  std::vector<Tensor> views = {t.view({6, 4}),    t.narrow(1, 1, 2),    t.select(0, 1),
                               t.transpose(0, 2), t.permute({2, 0, 1}), t.flatten(),
                               t.unsqueeze(0),    t.view({-1})};
  for (const Tensor& piece : t.chunk(2, 2)) {
    views.push_back(piece);
  }
  for (const Tensor& piece : t.split({1, 2}, 1)) {
    views.push_back(piece);
  }
  for (const Tensor& view : views) {
    EXPECT_TRUE(view.is_pending());
    EXPECT_TRUE(view.shares_storage(t));
    (void)view.sizes();
    (void)view.strides();
    (void)view.numel();
    (void)view.is_contiguous();
    (void)view.unsafe_data_ptr();
  }
  EXPECT_EQ(work->waits(), 0);
  EXPECT_EQ(work_registry_size(), 1u);
  work->complete();
  wait_tensor(t);
}

TEST(WorkRegistry, DataAccessWaitsFirstAndSecondWaitIsNoOp) {
  FakeRank rank;
  Tensor t = all_reduce(iota(5), "sum", {0});
  const auto work = rank.transport().last_work();
  work->complete_when_waited();
  EXPECT_EQ(t.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(work->waits(), 1);
  EXPECT_FALSE(t.is_pending());
  wait_tensor(t);
  wait_tensor(t.narrow(0, 0, 1));
  (void)t.data_ptr<std::int32_t>();
  EXPECT_EQ(work->waits(), 1) << "later waits and accesses do not reach the transport";
}

TEST(WorkRegistry, EveryDataAccessIsAChokePoint) {
  using Access = void (*)(const Tensor&);
  const std::vector<std::pair<const char*, Access>> accesses = {
      {"to_vector", [](const Tensor& t) { (void)t.to_vector<std::int32_t>(); }},
      {"item", [](const Tensor& t) { (void)t.narrow(0, 0, 1).item<std::int32_t>(); }},
      {"data_ptr", [](const Tensor& t) { (void)t.data_ptr<std::int32_t>(); }},
      {"contiguous", [](const Tensor& t) { (void)t.contiguous(); }},
      {"clone", [](const Tensor& t) { (void)t.clone(); }},
      {"to", [](const Tensor& t) { (void)t.to(DType::Float64); }},
      {"equal", [](const Tensor& t) { (void)t.equal(t); }},
      {"bitwise_equal", [](const Tensor& t) { (void)t.bitwise_equal(t); }},
      {"copy_ source", [](const Tensor& t) { (void)Tensor::zeros({3}, DType::Int32).copy_(t); }},
      {"copy_ target", [](const Tensor& t) { Tensor(t).copy_(Tensor::zeros({3}, DType::Int32)); }},
      {"to_string", [](const Tensor& t) { (void)t.to_string(); }},
      {"wait_tensor", [](const Tensor& t) { (void)wait_tensor(t); }},
  };
  for (const auto& [name, access] : accesses) {
    FakeRank rank;
    Tensor t = all_reduce(iota(3), "sum", {0});
    const auto work = rank.transport().last_work();
    work->complete_when_waited();
    access(t);
    EXPECT_EQ(work->waits(), 1) << name;
    EXPECT_FALSE(t.is_pending()) << name;
    EXPECT_EQ(work_registry_size(), 0u) << name;
  }
}

TEST(WorkRegistry, CoalescedWorkCountsOnceAndRetiresThroughAnyOutput) {
  FakeRank rank;
  std::vector<Tensor> outputs = all_reduce_coalesced({iota(2), iota(3), iota(4)}, "max", {0});
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(work_registry_size(), 1u);
  EXPECT_EQ(rank.transport().works().size(), 1u);
  rank.transport().last_work()->complete();
  wait_tensor(outputs[1]);
  EXPECT_EQ(work_registry_size(), 0u);
  for (const Tensor& output : outputs) {
    EXPECT_FALSE(output.is_pending());
  }
  EXPECT_EQ(outputs[2].to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3, 4}));
}

TEST(WorkRegistry, CoalescedWorkStaysUntilItsLastOutputIsDropped) {
  FakeRank rank;
  std::vector<Tensor> outputs = all_reduce_coalesced({iota(2), iota(3)}, "sum", {0});
  rank.transport().last_work()->complete();
  outputs[0] = Tensor();
  EXPECT_EQ(work_registry_size(), 1u) << "still registered under the other output";
  EXPECT_TRUE(rank.registry().unwaited().empty());
  outputs[1] = Tensor();
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_EQ(rank.registry().unwaited().size(), 1u);
}

TEST(WorkRegistry, WaitTensorsWaitsEachDistinctWorkOnce) {
  FakeRank rank;
  std::vector<Tensor> coalesced = all_reduce_coalesced({iota(2), iota(3)}, "sum", {0});
  Tensor single = all_reduce(iota(4), "sum", {0});
  for (const auto& work : rank.transport().works()) {
    work->complete_when_waited();
  }
  std::vector<Tensor> all = {coalesced[0], single, coalesced[1], coalesced[0].narrow(0, 0, 1)};
  std::vector<Tensor> returned = wait_tensors(all);
  ASSERT_EQ(returned.size(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_TRUE(returned[i].shares_storage(all[i]));
  }
  for (const auto& work : rank.transport().works()) {
    EXPECT_EQ(work->waits(), 1);
  }
  EXPECT_EQ(work_registry_size(), 0u);
}

// `count` works (sequence numbers 0, 1, ...) registered on `tensor`'s storage, pending until
// their fakes are completed or failed.
std::vector<std::shared_ptr<FakeWork>> pending_works_on(FakeRank& rank, const Tensor& tensor,
                                                        int count) {
  const auto& storage = detail::TensorAccess::storage(tensor);
  std::vector<std::shared_ptr<FakeWork>> fakes;
  for (int i = 0; i < count; ++i) {
    auto fake =
        std::make_shared<FakeWork>(transport::Fingerprint{1, i, {}},
                                   std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
    fakes.push_back(fake);
    auto work = std::make_shared<detail::PendingWork>(
        fake, detail::WorkInfo{0, "test", i, "[0]", {}}, nullptr,
        rank.context().state().transport_ptr(), std::chrono::hours(1));
    rank.registry().add(work, storage.get());
  }
  return fakes;
}

TEST(WorkRegistry, SeveralWorksOnOneStorageAreAllWaited) {
  FakeRank rank;
  Tensor t = Tensor::zeros({4}, DType::Int32);
  const std::vector<std::shared_ptr<FakeWork>> fakes = pending_works_on(rank, t, 3);
  EXPECT_EQ(work_registry_size(), 3u);
  for (const auto& fake : fakes) {
    fake->complete_when_waited();
  }
  wait_tensor(t);
  EXPECT_EQ(work_registry_size(), 0u);
  for (const auto& fake : fakes) {
    EXPECT_EQ(fake->waits(), 1);
  }
}

// A storage under several works that fail keeps the failure retired on it first: every access
// raises that one, never a later work's.
TEST(WorkRegistry, AStorageUnderSeveralFailedWorksKeepsTheFirstFailure) {
  FakeRank rank;
  Tensor t = Tensor::zeros({4}, DType::Int32);
  const std::vector<std::shared_ptr<FakeWork>> fakes = pending_works_on(rank, t, 2);
  fakes[0]->fail(
      make_error(ErrorCode::TransportError, ErrorContext{0, "test", 0, "[0]"}, "link down"));
  fakes[1]->fail(
      make_error(ErrorCode::RankFailure, ErrorContext{0, "test", 1, "[0]"}, "peer died"));
  EXPECT_THROW(wait_tensor(t), TransportError);
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_THROW(wait_tensor(t), TransportError) << "the first failure stays";
  EXPECT_THROW(t.to_vector<std::int32_t>(), TransportError);
}

TEST(WorkRegistry, NewStorageAtRecycledAddressIsNeverConfusedWithAnOldEntry) {
  FakeRank rank;
  std::vector<std::int32_t> buffer = {7, 8, 9};
  Tensor old_tensor = Tensor::from_blob(buffer.data(), {3}, DType::Int32);
  auto old_fake =
      std::make_shared<FakeWork>(transport::Fingerprint{1, 0, {}},
                                 std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
  auto old_work = std::make_shared<detail::PendingWork>(
      old_fake, detail::WorkInfo{0, "old", 0, "[0]", {}}, nullptr,
      rank.context().state().transport_ptr(), std::chrono::hours(1));
  rank.registry().add(old_work, detail::TensorAccess::storage(old_tensor).get());

  // A second storage at the very same address is a different storage: nothing pending on it.
  Tensor same_address = Tensor::from_blob(buffer.data(), {3}, DType::Int32);
  ASSERT_EQ(same_address.unsafe_data_ptr(), old_tensor.unsafe_data_ptr());
  EXPECT_FALSE(same_address.is_pending());
  EXPECT_EQ(same_address.to_vector<std::int32_t>(), (std::vector<std::int32_t>{7, 8, 9}));
  EXPECT_EQ(old_fake->waits(), 0) << "a read of the new storage must not wait on the old work";

  // The old storage dies (its work completed and retired), a newer storage at the same address
  // gets a work, and a late cleanup of the old work arrives: the newer entry survives.
  old_fake->complete();
  old_tensor = Tensor();
  EXPECT_EQ(work_registry_size(), 0u);
  Tensor newer = Tensor::from_blob(buffer.data(), {3}, DType::Int32);
  auto new_fake =
      std::make_shared<FakeWork>(transport::Fingerprint{1, 1, {}},
                                 std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
  auto new_work = std::make_shared<detail::PendingWork>(
      new_fake, detail::WorkInfo{0, "new", 1, "[0]", {}}, nullptr,
      rank.context().state().transport_ptr(), std::chrono::hours(1));
  rank.registry().add(new_work, detail::TensorAccess::storage(newer).get());
  rank.registry().retire(*old_work, nullptr);  // late
  EXPECT_EQ(work_registry_size(), 1u);
  EXPECT_TRUE(newer.is_pending());
  new_fake->complete_when_waited();
  wait_tensor(newer);
  EXPECT_EQ(new_fake->waits(), 1);
  EXPECT_EQ(work_registry_size(), 0u);
}

// The line of the all_reduce below, for the report check.
constexpr int kDroppedLine = __LINE__ + 3;
void issue_and_drop(FakeTransport& transport) {
  Tensor input = iota(2);
  Tensor dropped = all_reduce(input, "sum", {0});
  transport.last_work()->complete_when_waited();
}

TEST(WorkRegistry, DropCompletesTheWorkAndReportsItsCallSite) {
  FakeRank rank;
  issue_and_drop(rank.transport());
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_EQ(rank.transport().last_work()->waits(), 1) << "completed before the storage went";
  const std::vector<UnwaitedWork> unwaited = rank.registry().unwaited();
  ASSERT_EQ(unwaited.size(), 1u);
  EXPECT_EQ(unwaited[0].rank, 0);
  EXPECT_EQ(unwaited[0].op, "all_reduce");
  EXPECT_EQ(unwaited[0].seq, 0);
  EXPECT_EQ(unwaited[0].location.line(), kDroppedLine);
  EXPECT_NE(std::string(unwaited[0].location.file_name()).find("work_registry_test.cpp"),
            std::string::npos);
  EXPECT_FALSE(unwaited[0].at_rank_exit);
  EXPECT_TRUE(unwaited[0].error.empty());
  EXPECT_NE(unwaited[0].to_string().find("dropped un-waited"), std::string::npos);
}

// The report's line names each field that applies: operation #0 and a completion's error too,
// the sequence number and group left out when unknown (-1, empty).
TEST(WorkRegistry, AnUnwaitedLineNamesEveryFieldThatApplies) {
  UnwaitedWork work;
  work.rank = 2;
  work.op = "all_reduce";
  work.seq = 0;
  work.group = "[0, 2]";
  EXPECT_EQ(work.to_string(),
            "rank 2: all_reduce #0 on group [0, 2] issued at <unknown> was dropped un-waited");
  work.at_rank_exit = true;
  work.error = "link down";
  EXPECT_EQ(work.to_string(),
            "rank 2: all_reduce #0 on group [0, 2] issued at <unknown> was still pending when the "
            "rank ended; completing it failed: link down");
  work.seq = -1;
  work.group.clear();
  work.error.clear();
  EXPECT_EQ(work.to_string(),
            "rank 2: all_reduce issued at <unknown> was still pending when the rank ended");
}

TEST(WorkRegistry, FailedDropIsRaisedAtTheRanksNextCallOnce) {
  FakeRank rank;
  {
    Tensor dropped = all_reduce(iota(2), "sum", {0});
    rank.transport().last_work()->fail(make_error(
        ErrorCode::TransportError, ErrorContext{0, "all_reduce", 0, "[0]"}, "link down"));
  }  // the destructor records the failure and does not throw
  ASSERT_EQ(rank.registry().unwaited().size(), 1u);
  EXPECT_NE(rank.registry().unwaited()[0].error.find("link down"), std::string::npos);
  EXPECT_THROW(all_reduce(iota(2), "sum", {0}), TransportError);
  // Raised once; this call goes through.
  Tensor next = all_reduce(iota(2), "sum", {0});
  rank.transport().last_work()->complete();
  EXPECT_EQ(next.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
}

// RankContext::list_drops(false): drops are completed and their failures raised, but get no
// line in the report; works pending at the rank's end still do, and listing resumes when on.
TEST(WorkRegistry, UnlistedDropsAreCompletedWithoutAReportLine) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  Tensor kept;
  {
    ScopedRankBinding binding(&context);
    EXPECT_TRUE(context.list_drops(false)) << "on by default";
    issue_and_drop(*transport);
    EXPECT_EQ(transport->last_work()->waits(), 1) << "completed at the drop";
    {
      Tensor failed = all_reduce(iota(2), "sum", {0});
      transport->last_work()->fail(make_error(
          ErrorCode::TransportError, ErrorContext{0, "all_reduce", 1, "[0]"}, "link down"));
    }
    EXPECT_TRUE(context.state().registry()->unwaited().empty());
    EXPECT_THROW(all_reduce(iota(2), "sum", {0}), TransportError) << "its failure is raised";
    kept = all_reduce(iota(2), "sum", {0});
    transport->last_work()->complete_when_waited();
    EXPECT_FALSE(context.list_drops(true));
    issue_and_drop(*transport);
    ASSERT_EQ(context.state().registry()->unwaited().size(), 1u);
    EXPECT_EQ(context.list_drops(false), true);
  }
  const RankContext::Summary summary = context.finish();  // `kept` is pending at the end
  ASSERT_EQ(summary.unwaited.size(), 2u);
  EXPECT_FALSE(summary.unwaited[0].at_rank_exit);
  EXPECT_EQ(summary.unwaited[0].location.line(), kDroppedLine);
  EXPECT_TRUE(summary.unwaited[1].at_rank_exit);
  EXPECT_EQ(summary.unwaited[1].seq, 2);
}

// A result dropped while an exception unwinds the rank; its work completes once waited. The drop
// is deferred (Note [Work lifecycle], step 3): completed at the rank's next call.
std::shared_ptr<FakeWork> drop_while_unwinding(FakeTransport& transport) {
  std::shared_ptr<FakeWork> work;
  try {
    Tensor result = all_reduce(iota(2), "sum", {0});
    work = transport.last_work();
    work->complete_when_waited();
    throw std::runtime_error("user error");
  } catch (const std::runtime_error&) {
  }
  return work;
}

// list_drops applies to the drops made from then on: a deferred drop is listed or not as the
// setting was when it was dropped, not when it is completed.
TEST(WorkRegistry, AnUnlistedDropCompletedAfterListingResumesHasNoReportLine) {
  FakeRank rank;
  EXPECT_TRUE(rank.context().list_drops(false));
  const auto dropped = drop_while_unwinding(rank.transport());
  EXPECT_FALSE(rank.context().list_drops(true));
  EXPECT_EQ(work_registry_size(), 0u);  // completes the deferred drop
  EXPECT_EQ(dropped->finalizations(), 1);
  EXPECT_TRUE(rank.registry().unwaited().empty());
}

TEST(WorkRegistry, AListedDropCompletedAfterListingStopsHasItsReportLine) {
  FakeRank rank;
  const auto dropped = drop_while_unwinding(rank.transport());
  EXPECT_TRUE(rank.context().list_drops(false));
  EXPECT_EQ(work_registry_size(), 0u);  // completes the deferred drop
  EXPECT_EQ(dropped->finalizations(), 1);
  const std::vector<UnwaitedWork> unwaited = rank.registry().unwaited();
  ASSERT_EQ(unwaited.size(), 1u);
  EXPECT_EQ(unwaited[0].op, "all_reduce");
  EXPECT_EQ(unwaited[0].seq, 0);
  EXPECT_FALSE(unwaited[0].at_rank_exit);
}

TEST(WorkRegistry, TellsTheTransportWorkOfADropAndItsFinalizationOnly) {
  FakeRank rank;
  Tensor waited = all_reduce(iota(2), "sum", {0});
  const auto waited_work = rank.transport().last_work();
  waited_work->complete();
  wait_tensor(waited);
  EXPECT_EQ(waited_work->drops(), 0) << "a waited work is neither dropped nor finalized";
  EXPECT_EQ(waited_work->finalizations(), 0);
  issue_and_drop(rank.transport());
  const auto dropped_work = rank.transport().last_work();
  EXPECT_EQ(dropped_work->drops(), 1);
  EXPECT_EQ(dropped_work->defer_asked(), 1) << "asked once, at the drop; the fake says now";
  EXPECT_EQ(dropped_work->finalizations(), 1);
  EXPECT_FALSE(dropped_work->finalized_at_rank_exit());
  EXPECT_FALSE(dropped_work->finalized_failed());
}

TEST(WorkRegistry, TellsTheTransportWorkOfAFailedFinalizationAtRankExit) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  Tensor kept;
  {
    ScopedRankBinding binding(&context);
    kept = all_reduce(iota(2), "sum", {0});
  }
  const auto work = transport->last_work();
  work->fail(make_error(ErrorCode::Aborted, ErrorContext{0, "all_reduce", 0, "[0]"}, "aborted"));
  context.finish();
  EXPECT_EQ(work->drops(), 0) << "its tensor is still alive";
  EXPECT_EQ(work->finalizations(), 1);
  EXPECT_TRUE(work->finalized_at_rank_exit());
  EXPECT_TRUE(work->finalized_failed());
}

// The line of the all_reduce below, for the report check. Its work asks core to defer its
// finalization (transport::Work::defer_finalization) and completes once waited.
constexpr int kDeferredLine = __LINE__ + 3;
std::shared_ptr<FakeWork> issue_and_drop_deferred(FakeTransport& transport) {
  Tensor input = iota(2);
  Tensor dropped = all_reduce(input, "sum", {0});
  std::shared_ptr<FakeWork> work = transport.last_work();
  work->defer_finalization_when_dropped();
  work->complete_when_waited();
  return work;
}

// Expects `unwaited` to be the one report line of the drop in issue_and_drop_deferred, which
// issued operation `seq`.
void expect_deferred_drop_reported(const std::vector<UnwaitedWork>& unwaited,
                                   std::int64_t seq = 0) {
  ASSERT_EQ(unwaited.size(), 1u);
  EXPECT_EQ(unwaited[0].op, "all_reduce");
  EXPECT_EQ(unwaited[0].seq, seq);
  EXPECT_EQ(unwaited[0].location.line(), kDeferredLine);
  EXPECT_FALSE(unwaited[0].at_rank_exit) << "a deferred drop is still a drop";
}

TEST(WorkRegistry, DeferredDropIsFinalizedAtTheRanksNextCollective) {
  FakeRank rank;
  const auto dropped = issue_and_drop_deferred(rank.transport());
  EXPECT_EQ(dropped->drops(), 1);
  EXPECT_EQ(dropped->defer_asked(), 1);
  EXPECT_EQ(dropped->finalizations(), 0) << "deferred: not finalized at the drop";
  EXPECT_EQ(dropped->waits(), 0);
  EXPECT_EQ(rank.registry().size(), 1u);
  EXPECT_TRUE(rank.registry().unwaited().empty()) << "reported when finalized";
  Tensor next = all_reduce(iota(2), "sum", {0});  // finalizes the dropped work first
  EXPECT_EQ(dropped->finalizations(), 1);
  EXPECT_EQ(dropped->waits(), 1);
  EXPECT_FALSE(dropped->finalized_at_rank_exit());
  expect_deferred_drop_reported(rank.registry().unwaited());
  rank.transport().last_work()->complete();
  EXPECT_EQ(next.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(rank.registry().size(), 0u);
  expect_deferred_drop_reported(rank.registry().unwaited());  // once
}

TEST(WorkRegistry, DeferredDropIsFinalizedAtAnExplicitWait) {
  FakeRank rank;
  Tensor kept = all_reduce(iota(2), "sum", {0});
  const auto kept_work = rank.transport().last_work();
  const auto dropped = issue_and_drop_deferred(rank.transport());
  EXPECT_EQ(dropped->finalizations(), 0);
  kept_work->complete();
  wait_tensor(kept);
  EXPECT_EQ(dropped->finalizations(), 1);
  expect_deferred_drop_reported(rank.registry().unwaited(), 1);
  EXPECT_EQ(rank.registry().size(), 0u);
}

TEST(WorkRegistry, DeferredDropIsFinalizedAtRankExitAsADrop) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  std::shared_ptr<FakeWork> dropped;
  {
    ScopedRankBinding binding(&context);
    dropped = issue_and_drop_deferred(*transport);
  }
  EXPECT_EQ(dropped->finalizations(), 0);
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(dropped->finalizations(), 1);
  EXPECT_FALSE(dropped->finalized_at_rank_exit());
  expect_deferred_drop_reported(summary.unwaited);
  EXPECT_EQ(summary.error, nullptr);
}

TEST(WorkRegistry, FailedDeferredDropIsRaisedAtTheRanksNextCollectiveOnce) {
  FakeRank rank;
  {
    Tensor dropped = all_reduce(iota(2), "sum", {0});
    rank.transport().last_work()->defer_finalization_when_dropped();
    rank.transport().last_work()->fail(make_error(
        ErrorCode::TransportError, ErrorContext{0, "all_reduce", 0, "[0]"}, "link down"));
  }
  EXPECT_TRUE(rank.registry().unwaited().empty()) << "not finalized yet: no error recorded";
  // The deferred finalization's failure is raised.
  testing::expect_error<TransportError>([] { all_reduce(iota(2), "sum", {0}); },
                                        {"dropped un-waited", "link down"});
  EXPECT_EQ(rank.transport().works().size(), 1u) << "raised before the new collective started";
  ASSERT_EQ(rank.registry().unwaited().size(), 1u);
  EXPECT_NE(rank.registry().unwaited()[0].error.find("link down"), std::string::npos);
  Tensor next = all_reduce(iota(2), "sum", {0});  // raised once
  rank.transport().last_work()->complete();
  EXPECT_EQ(next.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
}

TEST(WorkRegistry, AnExplicitWaitFinishesItsOwnWorkBeforeRaisingAFailedDrop) {
  // A dropped result's failure is raised at the next explicit wait, but only after that wait's
  // own tensor is ready: raised first, it left the waited tensor pending for a caller that
  // catches it (and all_reduce_inplace returned with its own collective in flight).
  for (const bool many : {false, true}) {
    FakeRank rank;
    Tensor kept = all_reduce(iota(2), "sum", {0});
    const auto kept_work = rank.transport().last_work();
    kept_work->complete_when_waited();
    {
      Tensor dropped = all_reduce(iota(2), "sum", {0});
      rank.transport().last_work()->fail(make_error(
          ErrorCode::TransportError, ErrorContext{0, "all_reduce", 1, "[0]"}, "link down"));
    }
    testing::expect_error<TransportError>(
        [&] {
          if (many) {
            (void)wait_tensors({kept});
          } else {
            (void)wait_tensor(kept);
          }
        },
        {"link down"});
    EXPECT_EQ(kept_work->waits(), 1) << (many ? "wait_tensors" : "wait_tensor");
    EXPECT_FALSE(kept.is_pending());
    EXPECT_EQ(kept.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
  }
}

// Two dropped results whose collectives failed: each failure is raised once, in the order
// recorded, one per call (the later one used to be discarded with the first).
TEST(WorkRegistry, EveryFailedDropIsRaisedOnceInTurn) {
  FakeRank rank;
  {
    Tensor first = all_reduce(iota(2), "sum", {0});
    rank.transport().last_work()->fail(make_error(
        ErrorCode::TransportError, ErrorContext{0, "all_reduce", 0, "[0]"}, "link down"));
    Tensor second = all_reduce(iota(2), "sum", {0});
    rank.transport().last_work()->fail(
        make_error(ErrorCode::RankFailure, ErrorContext{0, "all_reduce", 1, "[0]"}, "peer died"));
  }
  // In the order recorded: `second` is destroyed, and its failure recorded, first.
  EXPECT_THROW(all_reduce(iota(2), "sum", {0}), RankFailure);
  EXPECT_THROW(all_reduce(iota(2), "sum", {0}), TransportError);
  Tensor next = all_reduce(iota(2), "sum", {0});  // nothing left to raise
  rank.transport().last_work()->complete();
  EXPECT_EQ(next.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
}

// The one left unraised when the rank ends is its error at exit.
TEST(WorkRegistry, AFailedDropLeftUnraisedIsTheRanksErrorAtExit) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    {
      Tensor first = all_reduce(iota(2), "sum", {0});
      transport->last_work()->fail(make_error(
          ErrorCode::TransportError, ErrorContext{0, "all_reduce", 0, "[0]"}, "link down"));
      Tensor second = all_reduce(iota(2), "sum", {0});
      transport->last_work()->fail(
          make_error(ErrorCode::RankFailure, ErrorContext{0, "all_reduce", 1, "[0]"}, "peer died"));
    }
    EXPECT_THROW((void)wait_tensors({}), RankFailure);  // `second`'s, recorded first
  }
  const RankContext::Summary summary = context.finish();
  ASSERT_NE(summary.error, nullptr);
  EXPECT_THROW(std::rethrow_exception(summary.error), TransportError);
}

TEST(WorkRegistry, FailedDeferredDropIsTheRanksErrorAtExit) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    Tensor dropped = all_reduce(iota(2), "sum", {0});
    transport->last_work()->defer_finalization_when_dropped();
    transport->last_work()->fail(
        make_error(ErrorCode::RankFailure, ErrorContext{0, "all_reduce", 0, "[0]"}, "peer died"));
  }
  const RankContext::Summary summary = context.finish();
  ASSERT_NE(summary.error, nullptr);
  EXPECT_THROW(std::rethrow_exception(summary.error), RankFailure);
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_FALSE(summary.unwaited[0].at_rank_exit);
  EXPECT_NE(summary.unwaited[0].error.find("peer died"), std::string::npos);
}

TEST(WorkRegistry, DropWhileUnwindingIsDeferredWithoutAskingTheTransport) {
  FakeRank rank;
  std::shared_ptr<FakeWork> dropped;
  try {
    Tensor result = all_reduce(iota(2), "sum", {0});
    dropped = rank.transport().last_work();
    dropped->complete_when_waited();
    throw std::runtime_error("user error");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(dropped->drops(), 1);
  EXPECT_EQ(dropped->defer_asked(), 0) << "deferred anyway: no question to ask";
  EXPECT_EQ(dropped->finalizations(), 0);
  EXPECT_EQ(work_registry_size(), 0u);  // settles it
  EXPECT_EQ(dropped->finalizations(), 1);
}

TEST(WorkRegistry, FailedWorkMakesItsStorageRaiseOnEveryAccess) {
  FakeRank rank;
  Tensor t = all_reduce(iota(2), "sum", {0});
  rank.transport().last_work()->fail(
      make_error(ErrorCode::Aborted, ErrorContext{0, "all_reduce", 0, "[0]"}, "aborted"));
  EXPECT_THROW(wait_tensor(t), Aborted);
  EXPECT_FALSE(t.is_pending());
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_THROW(t.to_vector<std::int32_t>(), Aborted) << "never read garbage silently";
  EXPECT_THROW(wait_tensor(t.narrow(0, 0, 1)), Aborted);
}

TEST(WorkRegistry, IssueOnOneThreadWaitOnAnotherDropOnAThird) {
  FakeRank rank;
  Tensor t = all_reduce(iota(6), "sum", {0});
  Tensor holder = t;
  const auto work = rank.transport().last_work();
  std::vector<std::int32_t> seen;
  std::thread waiter(
      [view = t.narrow(0, 2, 3), &seen] { seen = wait_tensor(view).to_vector<std::int32_t>(); });
  std::thread dropper([held = std::move(holder)]() mutable { held = Tensor(); });
  std::thread completer([work] { work->complete(); });
  t = Tensor();  // the main thread lets go too
  dropper.join();
  completer.join();
  waiter.join();
  EXPECT_EQ(seen, (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_TRUE(rank.registry().unwaited().empty()) << "waited through a view, not dropped";
}

TEST(WorkRegistry, LastTensorDroppedOnAnotherThreadWhileCompletedFromAThird) {
  FakeRank rank;
  Tensor t = all_reduce(iota(3), "sum", {0});
  const auto work = rank.transport().last_work();
  std::thread dropper([held = std::move(t)]() mutable { held = Tensor(); });
  std::thread completer([work] { work->complete(); });
  dropper.join();
  completer.join();
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_EQ(rank.registry().unwaited().size(), 1u);
}

TEST(WorkRegistry, ConcurrentWaitersRetireTheWorkOnce) {
  FakeRank rank;
  Tensor t = all_reduce(iota(8), "sum", {0});
  const auto work = rank.transport().last_work();
  std::vector<std::thread> waiters;
  std::vector<std::vector<std::int32_t>> seen(4);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    waiters.emplace_back([view = t.narrow(0, static_cast<std::int64_t>(i), 2), &seen, i] {
      seen[i] = view.to_vector<std::int32_t>();
    });
  }
  work->complete();
  for (std::thread& waiter : waiters) {
    waiter.join();
  }
  for (std::size_t i = 0; i < seen.size(); ++i) {
    const auto first = static_cast<std::int32_t>(i + 1);
    EXPECT_EQ(seen[i], (std::vector<std::int32_t>{first, first + 1}));
  }
  EXPECT_EQ(work_registry_size(), 0u);
}

TEST(WorkRegistry, RankFinishCompletesLeftoversAndReportsThemAtExit) {
  auto transport = std::make_shared<FakeTransport>();
  Tensor kept;
  RankContext::Summary summary;
  {
    RankContext context(transport);
    {
      ScopedRankBinding binding(&context);
      kept = all_reduce(iota(2), "sum", {0});
    }
    transport->last_work()->complete();
    summary = context.finish();
    EXPECT_EQ(context.state().registry()->size(), 0u);
  }
  EXPECT_FALSE(kept.is_pending());
  EXPECT_EQ(kept.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_TRUE(summary.unwaited[0].at_rank_exit);
  EXPECT_EQ(summary.error, nullptr);
}

// Note [Registry links]: waits out of issue order leave holes in the registry's work list, which
// is compacted as they pile up; counts stay exact, each work is waited once, and what is left at
// the rank's exit is finalized and reported in issue order.
TEST(WorkRegistry, OutOfOrderWaitsKeepCountsExactAndTheExitReportInIssueOrder) {
  constexpr int kWorks = 40;
  auto transport = std::make_shared<FakeTransport>();
  std::vector<Tensor> results;
  RankContext::Summary summary;
  {
    RankContext context(transport);
    {
      ScopedRankBinding binding(&context);
      for (int i = 0; i < kWorks; ++i) {
        results.push_back(all_reduce(iota(2), "sum", {0}));
      }
      for (const auto& work : transport->works()) {
        work->complete_when_waited();
      }
      // Every work whose index is not a multiple of 5, from the last to the first.
      std::size_t expected = kWorks;
      for (int i = kWorks - 1; i >= 0; --i) {
        if (i % 5 != 0) {
          wait_tensor(results[static_cast<std::size_t>(i)]);
          --expected;
          ASSERT_EQ(work_registry_size(), expected) << "after waiting #" << i;
        }
      }
      // One more wait on a waited result changes nothing.
      wait_tensor(results[1]);
      EXPECT_EQ(work_registry_size(), expected);
    }
    summary = context.finish();
    EXPECT_EQ(context.state().registry()->size(), 0u);
  }
  for (const auto& work : transport->works()) {
    EXPECT_EQ(work->waits(), 1);
  }
  ASSERT_EQ(summary.unwaited.size(), static_cast<std::size_t>(kWorks / 5));
  for (std::size_t k = 0; k < summary.unwaited.size(); ++k) {
    EXPECT_EQ(summary.unwaited[k].seq, static_cast<std::int64_t>(5 * k)) << "report line " << k;
    EXPECT_TRUE(summary.unwaited[k].at_rank_exit);
  }
  for (const Tensor& result : results) {
    EXPECT_FALSE(result.is_pending());
  }
}

TEST(WorkRegistry, FailedLeftoverAtRankExitIsReturnedAsTheRanksError) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  Tensor kept;
  {
    ScopedRankBinding binding(&context);
    kept = all_reduce(iota(2), "sum", {0});
  }
  transport->last_work()->fail(
      make_error(ErrorCode::RankFailure, ErrorContext{0, "all_reduce", 0, "[0]"}, "peer died"));
  RankContext::Summary summary = context.finish();
  ASSERT_NE(summary.error, nullptr);
  EXPECT_THROW(std::rethrow_exception(summary.error), RankFailure);
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_NE(summary.unwaited[0].error.find("peer died"), std::string::npos);
}

TEST(WorkRegistry, AFailedDropStillFinalizingElsewhereAtRankExitIsTheRanksError) {
  // Another thread drops the rank's last result and is held between the work's completion (a
  // failure) and recording it; the rank exits meanwhile. The exit completes the work too and
  // must record the failure itself: the other thread would record it only after the rank read
  // its errors, where nothing raises it.
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  Tensor result;
  {
    ScopedRankBinding binding(&context);
    result = all_reduce(iota(2), "sum", {0});
  }
  const auto work = transport->last_work();
  std::promise<void> reached;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  work->on_finalized_hook = [&reached, released] {
    reached.set_value();
    released.wait();
  };
  work->fail(
      make_error(ErrorCode::TransportError, ErrorContext{0, "all_reduce", 0, "[0]"}, "link down"));
  std::thread dropper([held = std::move(result)]() mutable { held = Tensor(); });
  reached.get_future().wait();  // the dropper completed the work and is held before recording
  const RankContext::Summary summary = context.finish();
  release.set_value();
  dropper.join();
  ASSERT_NE(summary.error, nullptr);
  EXPECT_THROW(std::rethrow_exception(summary.error), TransportError);
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_NE(summary.unwaited[0].error.find("link down"), std::string::npos);
  EXPECT_EQ(context.state().registry()->unwaited().size(), 1u) << "one report line";
  // Both completed the work, one recorded its failure: nothing is left to raise.
  EXPECT_EQ(context.state().registry()->take_deferred_error(), nullptr) << "recorded once";
}

// Works a rank completes together share one deadline (Note [Work lifecycle]): works whose peer
// is stuck cost the rank one timeout, not one each. These works never complete, so every wait
// times out; a deadline computed afresh per work would be later for each (it lay a timeout on).
constexpr std::chrono::milliseconds kStuckTimeout{20};

RankOptions stuck_options() {
  RankOptions options;
  options.timeout = kStuckTimeout;
  return options;
}

// `count` results that never complete, on `rank`'s context; their works in issue order.
std::vector<std::shared_ptr<FakeWork>> issue_stuck(FakeTransport& transport, RankContext& context,
                                                   int count, std::vector<Tensor>& results) {
  ScopedRankBinding binding(&context);
  for (int i = 0; i < count; ++i) {
    results.push_back(all_reduce(iota(2), "sum", {0}));
  }
  return transport.works();
}

void expect_one_deadline(const std::vector<std::shared_ptr<FakeWork>>& works) {
  ASSERT_FALSE(works.empty());
  for (std::size_t i = 0; i < works.size(); ++i) {
    EXPECT_EQ(works[i]->waits(), 1) << "work " << i;
    EXPECT_EQ(works[i]->last_deadline().at, works.front()->last_deadline().at) << "work " << i;
  }
}

TEST(WorkRegistry, LeftoversAtRankExitShareOneDeadline) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport, stuck_options());
  std::vector<Tensor> kept;
  const auto works = issue_stuck(*transport, context, 3, kept);
  const RankContext::Summary summary = context.finish();
  expect_one_deadline(works);
  ASSERT_NE(summary.error, nullptr);
  EXPECT_THROW(std::rethrow_exception(summary.error), Timeout);
  ASSERT_EQ(summary.unwaited.size(), 3u);
  for (const UnwaitedWork& line : summary.unwaited) {
    EXPECT_TRUE(line.at_rank_exit);
    EXPECT_NE(line.error.find("fake work timed out"), std::string::npos) << line.error;
  }
}

TEST(WorkRegistry, DeferredDropsSettledTogetherShareOneDeadline) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport, stuck_options());
  std::vector<Tensor> results;
  const auto works = issue_stuck(*transport, context, 3, results);
  for (const auto& work : works) {
    work->defer_finalization_when_dropped();
  }
  results.clear();  // three deferred drops
  {
    ScopedRankBinding binding(&context);
    EXPECT_THROW(work_registry_size(), Timeout) << "settles them; the first failure is raised";
    EXPECT_THROW(work_registry_size(), Timeout) << "then the second";
    EXPECT_THROW(work_registry_size(), Timeout) << "then the third";
    EXPECT_EQ(work_registry_size(), 0u);
  }
  expect_one_deadline(works);
}

TEST(WorkRegistry, TheWholeRankExitSharesOneDeadline) {
  // A deferred drop settled at the exit, then a leftover: one batch.
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport, stuck_options());
  std::vector<Tensor> results;
  auto works = issue_stuck(*transport, context, 2, results);
  works.front()->defer_finalization_when_dropped();
  results.erase(results.begin());  // deferred: settled first at the exit
  context.finish();
  expect_one_deadline(works);
}

TEST(WorkRegistry, WorksOfOneDroppedStorageShareOneDeadline) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport, stuck_options());
  ScopedRankBinding binding(&context);
  std::vector<std::shared_ptr<FakeWork>> fakes;
  {
    Tensor t = Tensor::zeros({4}, DType::Int32);
    const auto& storage = detail::TensorAccess::storage(t);
    for (int i = 0; i < 3; ++i) {
      auto fake = std::make_shared<FakeWork>(
          transport::Fingerprint{1, i, {}},
          std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
      fakes.push_back(fake);
      auto work = std::make_shared<detail::PendingWork>(
          fake, detail::WorkInfo{0, "test", i, "[0]", {}}, nullptr, context.state().transport_ptr(),
          kStuckTimeout);
      context.state().registry()->add(work, storage.get());
    }
  }  // the drop completes all three
  expect_one_deadline(fakes);
  EXPECT_EQ(context.state().registry()->size(), 0u);
}

// The works of one wait share one deadline too (Note [Work lifecycle], step 2), measured on the
// fake transport's virtual clock: a stuck work's wait moves it to the wait's deadline, so the
// clock shows how many timeouts the wait took, without sleeping.
constexpr std::chrono::minutes kVirtualTimeout{10};

RankOptions virtual_timeout_options() {
  RankOptions options;
  options.timeout = kVirtualTimeout;
  return options;
}

TEST(WorkRegistry, WaitTensorsOnStuckWorksTakesOneTimeout) {
  auto transport = std::make_shared<FakeTransport>();
  transport->use_virtual_clock();
  RankContext context(transport, virtual_timeout_options());
  {
    ScopedRankBinding binding(&context);
    std::vector<Tensor> results;
    for (int i = 0; i < 3; ++i) {
      results.push_back(all_reduce(iota(2), "sum", {0}));  // a peer that never joins
    }
    const transport::Duration start = transport->now();
    EXPECT_THROW(wait_tensors(results), Timeout);
    EXPECT_EQ(transport->now() - start, kVirtualTimeout) << "one timeout, not three";
    expect_one_deadline(transport->works());
    for (std::size_t i = 0; i < results.size(); ++i) {
      EXPECT_FALSE(results[i].is_pending()) << "result " << i;
      EXPECT_THROW((void)results[i].to_vector<std::int32_t>(), Timeout) << "result " << i;
    }
    EXPECT_EQ(work_registry_size(), 0u);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr) << "every failure was raised where it was waited";
  EXPECT_TRUE(summary.unwaited.empty());
}

TEST(WorkRegistry, StuckWorksOnOneStorageWaitedTogetherTakeOneTimeout) {
  auto transport = std::make_shared<FakeTransport>();
  transport->use_virtual_clock();
  RankContext context(transport, virtual_timeout_options());
  {
    ScopedRankBinding binding(&context);
    Tensor t = Tensor::zeros({4}, DType::Int32);
    const auto& storage = detail::TensorAccess::storage(t);
    std::vector<std::shared_ptr<FakeWork>> fakes;
    for (int i = 0; i < 3; ++i) {
      auto fake = std::make_shared<FakeWork>(
          transport::Fingerprint{1, i, {}},
          std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
      transport->record(fake);  // on the virtual clock
      fakes.push_back(fake);
      context.state().registry()->add(std::make_shared<detail::PendingWork>(
                                          fake, detail::WorkInfo{0, "test", i, "[0]", {}}, nullptr,
                                          context.state().transport_ptr(), kVirtualTimeout),
                                      storage.get());
    }
    const transport::Duration start = transport->now();
    EXPECT_THROW(wait_tensor(t), Timeout);
    EXPECT_EQ(transport->now() - start, kVirtualTimeout) << "one timeout, not three";
    expect_one_deadline(fakes);
    EXPECT_FALSE(t.is_pending());
    EXPECT_EQ(work_registry_size(), 0u);
  }
  EXPECT_EQ(context.finish().error, nullptr);
}

// A collective whose transport call throws (Note [Registration]): the room its registration
// reserved is given back while its output is still alive (the output dies as the call unwinds;
// giving the room back after that touched a freed storage: ASan's heap-use-after-free, and heap
// corruption under the simulator's threads executor). Nothing is registered, and the rank goes
// on.
TEST(WorkRegistry, ACollectiveWhoseTransportCallThrowsLeavesNothingRegistered) {
  FakeRank rank;
  Tensor input = iota(3);
  Tensor kept = all_reduce(iota(2), "sum", {0});  // a work already pending
  rank.transport().on_call = [] {
    throw TransportError(ErrorContext{0, "all_reduce", 1, "[0]"}, "refused by the transport");
  };
  EXPECT_THROW(all_reduce(input, "sum", {0}), TransportError);
  // (Not a coalesced call: a throw inside the transport's group leaves the fake's group open.)
  EXPECT_THROW(all_reduce_inplace(input, "sum", {0}), TransportError);
  rank.transport().on_call = nullptr;
  EXPECT_EQ(rank.transport().works().size(), 1u);
  EXPECT_FALSE(input.is_pending());
  EXPECT_EQ(work_registry_size(), 1u) << "the work pending before, only";
  for (const auto& work : rank.transport().works()) {
    work->complete_when_waited();
  }
  EXPECT_EQ(wait_tensor(kept).to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
  Tensor next = all_reduce(input, "sum", {0});
  rank.transport().last_work()->complete_when_waited();
  EXPECT_EQ(next.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(work_registry_size(), 0u);
}

TEST(WorkRegistry, OutsideARankTheRegistryIsUnreachable) {
  EXPECT_THROW(work_registry_size(), InvalidArgument);
  EXPECT_THROW(all_reduce(iota(2), "sum", {0}), InvalidArgument);
  Tensor plain = iota(2);
  EXPECT_EQ(wait_tensor(plain).to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2}))
      << "waiting a tensor with nothing pending is fine anywhere";
}

// A call's scratch group (RankState::push_expanded_group): the outermost one is kept inline,
// nested ones (a call inside a call, as tracing's waits make) each in a block of its own. A
// reference stays valid while deeper groups come and go, and a group given back is handed out
// again with its heap blocks (its contents are left as they were: expand_group_into overwrites
// them).
TEST(RankState, NestedExpandedGroupsStayPutWhileDeeperOnesComeAndGo) {
  detail::RankState state(std::make_shared<FakeTransport>(), RankOptions{});
  ExpandedGroup& outer = state.push_expanded_group();
  outer.tag = "outer";
  ExpandedGroup& second = state.push_expanded_group();
  second.tag = "second";
  ExpandedGroup& third = state.push_expanded_group();
  third.tag = "third";
  EXPECT_EQ(state.expanded_groups_in_use(), 3u);
  EXPECT_NE(&outer, &second);
  EXPECT_NE(&second, &third);
  state.pop_expanded_group(2);
  ExpandedGroup& third_again = state.push_expanded_group();
  EXPECT_EQ(&third_again, &third);
  EXPECT_EQ(third_again.tag, "third");
  ExpandedGroup& fourth = state.push_expanded_group();  // deeper than ever: a new block
  fourth.tag = "fourth";
  EXPECT_NE(&fourth, &third);
  EXPECT_EQ(state.expanded_groups_in_use(), 4u);
  state.pop_expanded_group(3);
  state.pop_expanded_group(2);
  state.pop_expanded_group(1);
  EXPECT_EQ(outer.tag, "outer");
  EXPECT_EQ(second.tag, "second");
  state.pop_expanded_group(0);
  EXPECT_EQ(state.expanded_groups_in_use(), 0u);
  EXPECT_EQ(&state.push_expanded_group(), &outer);
  state.pop_expanded_group(0);
}

// Note [Generations in batches]: numbers handed out by threads at once, each from its own batch,
// are never 0 and never repeat, within a thread and across threads, also past a batch's end.
TEST(Generations, AreUniqueAcrossThreadsAndBatches) {
  struct Counted {};
  constexpr std::size_t kPerThread = 3 * detail::kGenerationBatch + 7;
  std::vector<std::uint64_t> first(kPerThread);
  std::vector<std::uint64_t> second(kPerThread);
  std::thread other([&second] {
    for (std::uint64_t& generation : second) {
      generation = detail::next_generation<Counted>();
    }
  });
  for (std::uint64_t& generation : first) {
    generation = detail::next_generation<Counted>();
  }
  other.join();
  std::vector<std::uint64_t> all = first;
  all.insert(all.end(), second.begin(), second.end());
  std::sort(all.begin(), all.end());
  EXPECT_NE(all.front(), 0u);
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
  // Within a thread they count up by one inside a batch.
  EXPECT_EQ(first[1], first[0] + 1);
  EXPECT_EQ(second[1], second[0] + 1);
}

// wait_tensors over several failed works raises the first one's failure (in the tensors' order).
TEST(WorkRegistry, WaitTensorsRaisesTheFirstFailure) {
  FakeRank rank;
  const Tensor first = all_reduce(iota(2), "sum", {0});
  rank.transport().last_work()->fail(
      make_error(ErrorCode::TransportError, ErrorContext{0, "all_reduce", 0, "[0]"}, "link down"));
  const Tensor second = all_reduce(iota(2), "sum", {0});
  rank.transport().last_work()->fail(
      make_error(ErrorCode::RankFailure, ErrorContext{0, "all_reduce", 1, "[0]"}, "peer died"));
  EXPECT_THROW((void)wait_tensors({first, second}), TransportError);
}

// A deferred drop made by a finalization that runs inside the rank's exit (after the exit's scan
// for deferred drops) is a drop, not a work left at exit, and is listed as list_drops was when it
// was made (RankContext::list_drops; until 2026-12-06 it was listed as left at exit, always).
TEST(WorkRegistry, ADropMadeDuringTheExitsFinalizationsIsListedAsADrop) {
  for (const bool listed : {true, false}) {
    SCOPED_TRACE(listed ? "list_drops on" : "list_drops off");
    auto transport = std::make_shared<FakeTransport>();
    RankContext context(transport);
    std::shared_ptr<FakeWork> first_work;
    std::shared_ptr<FakeWork> second_work;
    {
      ScopedRankBinding binding(&context);
      EXPECT_TRUE(context.list_drops(listed));
      Tensor first = all_reduce(iota(2), "sum", {0});
      first_work = transport->last_work();
      auto second = std::make_shared<Tensor>(all_reduce(iota(2), "sum", {0}));
      second_work = transport->last_work();
      first_work->defer_finalization_when_dropped();
      second_work->defer_finalization_when_dropped();
      first_work->complete();
      second_work->complete();
      first_work->on_finalized_hook = [second]() mutable { *second = Tensor(); };
      first = Tensor();  // deferred: finalized at the exit, where it drops `second`
    }
    const RankContext::Summary summary = context.finish();
    EXPECT_EQ(summary.error, nullptr);
    EXPECT_EQ(first_work->finalizations(), 1);
    EXPECT_EQ(second_work->drops(), 1);
    EXPECT_EQ(second_work->finalizations(), 1);
    EXPECT_FALSE(second_work->finalized_at_rank_exit());
    std::vector<std::string> lines;
    for (const UnwaitedWork& line : summary.unwaited) {
      lines.push_back(std::string(line.op) + " #" + std::to_string(line.seq) +
                      (line.at_rank_exit ? " at exit" : " dropped"));
    }
    const std::vector<std::string> expected =
        listed ? std::vector<std::string>{"all_reduce #0 dropped", "all_reduce #1 dropped"}
               : std::vector<std::string>{};
    EXPECT_EQ(lines, expected);
  }
}

}  // namespace
}  // namespace chorus
