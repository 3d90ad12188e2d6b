// The work registry when memory runs out while it links a work (Note [Registry links]): a failed
// registration throws std::bad_alloc and leaves no half-made link behind, so the storages stay
// consistent and the rank ends cleanly. Its own executable: it replaces the global operator new.

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
                                             const std::shared_ptr<FakeWork>& fake) {
  return std::make_shared<detail::PendingWork>(fake, detail::WorkInfo{0, "test", 0, "[0]", {}},
                                               nullptr, context.state().transport_ptr(),
                                               std::chrono::hours(1));
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

}  // namespace
}  // namespace chorus
