// The work registry when memory runs out while it links a work (Note [Registry links]): a failed
// registration throws std::bad_alloc and leaves no half-made link behind, so the storages stay
// consistent and the rank ends cleanly; and while it completes works together as unwaited (a
// drop, deferred drops, the rank's exit), which never throw: what cannot be claimed now is
// completed in a later round. Its own executable: it replaces the global operator new.

#include <gtest/gtest.h>

#include <atomic>
#include <chorus/chorus.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "detail/rank_state.hpp"
#include "detail/storage.hpp"
#include "detail/tensor_access.hpp"
#include "detail/work_registry.hpp"
#include "support/fake_transport.hpp"

namespace {

// The size of the next allocation to refuse (0: none).
std::atomic<std::size_t> refuse_next_allocation_of{0};

// A StampedLinks' first spilled link: the registry's only allocation when a second link is made
// (once the registry's work list has room).
constexpr std::size_t kLinkBytes =
    sizeof(chorus::detail::StampedLinks<chorus::detail::PendingWork>::Link);

}  // namespace

void* operator new(std::size_t size) {
  std::size_t refused = size;
  if (size != 0 && refuse_next_allocation_of.compare_exchange_strong(refused, 0)) {
    throw std::bad_alloc();
  }
  if (void* block = std::malloc(size != 0 ? size : 1)) {
    return block;
  }
  throw std::bad_alloc();
}
void operator delete(void* block) noexcept { std::free(block); }
void operator delete(void* block, std::size_t) noexcept { std::free(block); }

namespace chorus {
namespace {

using testing::FakeTransport;
using testing::FakeWork;

// A transport work that completes when waited.
std::shared_ptr<FakeWork> fake_work() {
  auto fake =
      std::make_shared<FakeWork>(transport::Fingerprint{1, 0, {}},
                                 std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
  fake->complete_when_waited();
  return fake;
}

std::shared_ptr<detail::PendingWork> pending(RankContext& context,
                                             const std::shared_ptr<FakeWork>& fake,
                                             std::int64_t seq = 0) {
  return std::make_shared<detail::PendingWork>(fake, detail::WorkInfo{0, "test", seq, "[0]", {}},
                                               nullptr, context.state().transport_ptr(),
                                               std::chrono::hours(1));
}

// A batch of claims (works completed together as unwaited) holds its first inline and allocates
// for the second: that allocation fails.
const std::size_t kSecondClaimBytes = detail::WorkRegistry::second_claim_bytes();

// Expects the report to list works 0 and 1 in that order, as drops or as leftovers at exit.
void expect_two_lines(const std::vector<UnwaitedWork>& unwaited, bool at_rank_exit) {
  ASSERT_EQ(unwaited.size(), 2u);
  for (std::size_t i = 0; i < unwaited.size(); ++i) {
    EXPECT_EQ(unwaited[i].seq, static_cast<std::int64_t>(i));
    EXPECT_EQ(unwaited[i].at_rank_exit, at_rank_exit);
  }
}

// A second work on one storage spills the storage's list: that allocation fails.
TEST(RegistryOutOfMemory, ASecondWorkOnAStorageThatCannotBeLinkedIsNotRegistered) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3});
    detail::Storage* storage = detail::TensorAccess::storage(tensor).get();
    const auto first_fake = fake_work();
    const auto second_fake = fake_work();
    registry.add(pending(context, first_fake), storage);
    const auto second = pending(context, second_fake);
    refuse_next_allocation_of = kLinkBytes;
    EXPECT_THROW(registry.add(second, storage), std::bad_alloc);
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    EXPECT_EQ(registry.size(), 1u);
    EXPECT_TRUE(tensor.is_pending());
    wait_tensor(tensor);
    EXPECT_EQ(registry.size(), 0u);
    EXPECT_FALSE(tensor.is_pending());
    EXPECT_EQ(first_fake->waits(), 1);
    EXPECT_EQ(second_fake->waits(), 0) << "never registered, never waited";
    // Registering it again once memory is back works.
    registry.add(second, storage);
    EXPECT_TRUE(tensor.is_pending());
    tensor = Tensor();  // dropped: completed as unwaited
    EXPECT_EQ(registry.size(), 0u);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
  EXPECT_EQ(summary.unwaited.size(), 1u);
}

// A work under two storages spills its own list at the second: that allocation fails, and the
// link already made to the first storage is undone.
TEST(RegistryOutOfMemory, AWorkWhoseSecondStorageCannotBeLinkedLeavesTheFirstUntouched) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor a = Tensor::from_vector(std::vector<std::int32_t>{1});
    Tensor b = Tensor::from_vector(std::vector<std::int32_t>{2});
    {
      // One work registered and waited first: the registry's work list keeps room for one.
      Tensor warm = Tensor::from_vector(std::vector<std::int32_t>{0});
      registry.add(pending(context, fake_work()), detail::TensorAccess::storage(warm).get());
      wait_tensor(warm);
    }
    const auto fake = fake_work();
    const auto work = pending(context, fake);
    const std::vector<detail::Storage*> storages = {detail::TensorAccess::storage(a).get(),
                                                    detail::TensorAccess::storage(b).get()};
    refuse_next_allocation_of = kLinkBytes;
    EXPECT_THROW(registry.add(work, storages), std::bad_alloc);
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    EXPECT_EQ(registry.size(), 0u);
    EXPECT_FALSE(a.is_pending());
    EXPECT_FALSE(b.is_pending());
    EXPECT_EQ(a.to_vector<std::int32_t>(), std::vector<std::int32_t>{1});
    // b holds no link to the failed work: a new work on it is its only one.
    const auto next_fake = fake_work();
    registry.add(pending(context, next_fake), detail::TensorAccess::storage(b).get());
    EXPECT_EQ(registry.size(), 1u);
    wait_tensor(b);
    EXPECT_EQ(registry.size(), 0u);
    EXPECT_EQ(next_fake->waits(), 1);
    a = Tensor();
    b = Tensor();
    EXPECT_EQ(fake->waits(), 0);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
  EXPECT_TRUE(summary.unwaited.empty());
}

// ~Storage of a storage with two pending works: the first is completed at the drop, the second,
// for which no claim can be made, is left as a deferred drop (it terminated the process: the drop
// is noexcept).
TEST(RegistryOutOfMemory, ADropThatCannotClaimASecondWorkDefersIt) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3});
    const auto first = fake_work();
    const auto second = fake_work();
    registry.add(pending(context, first, 0), detail::TensorAccess::storage(tensor).get());
    registry.add(pending(context, second, 1), detail::TensorAccess::storage(tensor).get());
    refuse_next_allocation_of = kSecondClaimBytes;
    tensor = Tensor();
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    EXPECT_EQ(first->waits(), 1) << "completed at the drop";
    EXPECT_EQ(second->waits(), 0) << "deferred";
    EXPECT_EQ(second->drops(), 1);
    EXPECT_EQ(registry.size(), 1u);
    EXPECT_EQ(work_registry_size(), 0u);  // completes the deferred drop
    EXPECT_EQ(second->waits(), 1);
    expect_two_lines(registry.unwaited(), /*at_rank_exit=*/false);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
}

// Two deferred drops settled together: the second is claimed in a second round.
TEST(RegistryOutOfMemory, DeferredDropsThatCannotAllBeClaimedAtOnceAreCompletedInRounds) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    std::vector<std::shared_ptr<FakeWork>> fakes;
    for (std::int64_t seq = 0; seq < 2; ++seq) {
      Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1});
      fakes.push_back(fake_work());
      fakes.back()->defer_finalization_when_dropped();
      registry.add(pending(context, fakes.back(), seq),
                   detail::TensorAccess::storage(tensor).get());
    }  // both dropped, deferred
    EXPECT_EQ(registry.size(), 2u);
    refuse_next_allocation_of = kSecondClaimBytes;
    EXPECT_EQ(work_registry_size(), 0u);
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    for (const auto& fake : fakes) {
      EXPECT_EQ(fake->waits(), 1);
      EXPECT_EQ(fake->finalizations(), 1);
    }
    expect_two_lines(registry.unwaited(), /*at_rank_exit=*/false);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
}

// Two leftovers at the rank's exit: the second is claimed in a second round.
TEST(RegistryOutOfMemory, LeftoversThatCannotAllBeClaimedAtOnceAreCompletedInRounds) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  std::vector<Tensor> kept;
  std::vector<std::shared_ptr<FakeWork>> fakes;
  {
    ScopedRankBinding binding(&context);
    for (std::int64_t seq = 0; seq < 2; ++seq) {
      kept.push_back(Tensor::from_vector(std::vector<std::int32_t>{1}));
      fakes.push_back(fake_work());
      context.state().registry()->add(pending(context, fakes.back(), seq),
                                      detail::TensorAccess::storage(kept.back()).get());
    }
  }
  refuse_next_allocation_of = kSecondClaimBytes;
  const RankContext::Summary summary = context.finish();
  ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
  EXPECT_EQ(context.state().registry()->size(), 0u);
  for (const auto& fake : fakes) {
    EXPECT_EQ(fake->waits(), 1);
  }
  EXPECT_EQ(summary.error, nullptr);
  expect_two_lines(summary.unwaited, /*at_rank_exit=*/true);
}

}  // namespace
}  // namespace chorus
