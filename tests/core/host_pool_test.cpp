// The rank's pool of freed host blocks (core/src/detail/host_pool.hpp).

#include "detail/host_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "chorus/transport/recycled_blocks.hpp"

namespace chorus::detail {
namespace {

TEST(HostPool, ReusesAFreedBlockOfTheSameSize) {
  auto pool = std::make_shared<HostPool>(1024);
  void* first = nullptr;
  {
    std::shared_ptr<void> block = HostPool::allocate(pool, 512);
    first = block.get();
  }
  EXPECT_EQ(pool->cached_bytes(), 512u);
  std::shared_ptr<void> again = HostPool::allocate(pool, 512);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

TEST(HostPool, EvictsOtherSizesToKeepTheBlockJustFreed) {
  auto pool = std::make_shared<HostPool>(1024);
  HostPool::allocate(pool, 256).reset();
  HostPool::allocate(pool, 512).reset();
  EXPECT_EQ(pool->cached_bytes(), 768u);
  void* large = nullptr;
  {
    std::shared_ptr<void> block = HostPool::allocate(pool, 1024);
    large = block.get();
  }
  EXPECT_EQ(pool->cached_bytes(), 1024u);  // the 256 and 512 blocks made room
  std::shared_ptr<void> again = HostPool::allocate(pool, 1024);
  EXPECT_EQ(again.get(), large);
}

// The pool remembers the bucket it used last; evicting that bucket must make it forget it (under
// the asan-ubsan preset a stale bucket is a heap-use-after-free here). The bucket evicted is the
// last used only when the block that evicted it is not kept after all: the blocks of its own size
// leave no room for it.
TEST(HostPool, ForgetsTheLastBucketWhenItIsEvicted) {
  auto pool = std::make_shared<HostPool>(1280);
  std::shared_ptr<void> a = HostPool::allocate(pool, 512);
  std::shared_ptr<void> b = HostPool::allocate(pool, 512);
  std::shared_ptr<void> c = HostPool::allocate(pool, 512);
  a.reset();
  b.reset();
  HostPool::allocate(pool, 256).reset();  // the 256 bucket is the last used
  EXPECT_EQ(pool->cached_bytes(), 1280u);
  c.reset();  // evicts the 256 bucket, then finds no room beside the two 512 blocks: freed
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  std::shared_ptr<void> small = HostPool::allocate(pool, 256);  // fresh: no 256 block is cached
  EXPECT_NE(small, nullptr);
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  std::shared_ptr<void> cached = HostPool::allocate(pool, 512);
  EXPECT_EQ(pool->cached_bytes(), 512u);
}

TEST(HostPool, NeverEvictsForABlockOverTheLimitOrOfTheSameSize) {
  auto pool = std::make_shared<HostPool>(1024);
  std::shared_ptr<void> a = HostPool::allocate(pool, 512);
  std::shared_ptr<void> b = HostPool::allocate(pool, 512);
  std::shared_ptr<void> c = HostPool::allocate(pool, 512);
  a.reset();
  b.reset();
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  c.reset();  // same size as every cached block: freed, nothing evicted
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  HostPool::allocate(pool, 4096).reset();  // over the limit: freed, nothing evicted
  EXPECT_EQ(pool->cached_bytes(), 1024u);
}

// Blocks of other sizes are evicted only until the block just freed fits: two of the four 128-byte
// blocks make room for the 768-byte one, the other two stay cached.
TEST(HostPool, EvictsOnlyAsManyBlocksAsTheBlockJustFreedNeeds) {
  auto pool = std::make_shared<HostPool>(1024);
  std::shared_ptr<void> large = HostPool::allocate(pool, 768);
  {
    std::vector<std::shared_ptr<void>> small;
    for (int i = 0; i < 4; ++i) {
      small.push_back(HostPool::allocate(pool, 128));
    }
  }
  EXPECT_EQ(pool->cached_bytes(), 512u);
  large.reset();  // 512 + 768 > 1024: evicts two 128-byte blocks, not all four
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  std::shared_ptr<void> a = HostPool::allocate(pool, 128);
  std::shared_ptr<void> b = HostPool::allocate(pool, 128);
  EXPECT_EQ(pool->cached_bytes(), 768u);  // both came from the cache
}

// Note [Spare host pools]. Takes every pool parked on this thread (by earlier tests' ranks), so
// that the next make() is fresh unless the test parks one; they are dropped with the holder.
std::vector<std::shared_ptr<HostPool>> take_spare_pools() {
  std::vector<std::shared_ptr<HostPool>> taken;
  for (std::size_t i = 0; i < HostPool::kSparePoolsMax; ++i) {
    taken.push_back(HostPool::make(1024));
  }
  return taken;
}

TEST(HostPool, AParkedPoolIsTheNextMadeOnTheThreadWithItsBlocks) {
  const auto others = take_spare_pools();
  std::shared_ptr<HostPool> pool = HostPool::make(1024);
  HostPool* const parked = pool.get();
  void* block = nullptr;
  {
    std::shared_ptr<void> held = HostPool::allocate(pool, 512);
    block = held.get();
  }
  HostPool::park(std::move(pool));
  EXPECT_EQ(pool, nullptr);
  std::shared_ptr<HostPool> next = HostPool::make(2048);
  if (!transport::recycling_enabled()) {  // AddressSanitizer: nothing is parked
    EXPECT_EQ(next->cached_bytes(), 0u);
    return;
  }
  ASSERT_EQ(next.get(), parked);
  EXPECT_EQ(next->cached_bytes(), 512u);
  EXPECT_EQ(HostPool::allocate(next, 512).get(), block);
  // The new limit holds: 2048 bytes are kept now, not 1024.
  std::shared_ptr<void> a = HostPool::allocate(next, 1024);
  std::shared_ptr<void> b = HostPool::allocate(next, 1024);
  a.reset();
  b.reset();
  EXPECT_EQ(next->cached_bytes(), 2048u);
}

// Each block holds its pool (a copy of the caller's reference, not one taken from the
// pool itself): a block freed after every other holder of its pool let go (its rank ended)
// still returns to a live pool, which goes with the last block.
TEST(HostPool, ABlockOutlivingEveryOtherHolderKeepsItsPool) {
  auto pool = std::make_shared<HostPool>(1024);
  const std::weak_ptr<HostPool> watch = pool;
  std::shared_ptr<void> block = HostPool::allocate(pool, 512);
  std::shared_ptr<void> other = HostPool::allocate(pool, 256);
  EXPECT_EQ(watch.use_count(), 3);  // the caller's and one per block
  pool.reset();
  other.reset();
  EXPECT_EQ(watch.use_count(), 1);
  std::shared_ptr<HostPool> alive = watch.lock();
  ASSERT_NE(alive, nullptr);
  EXPECT_EQ(alive->cached_bytes(), 256u);  // `other` went back to it
  alive.reset();
  block.reset();  // the last holder: the pool frees its blocks and goes
  EXPECT_TRUE(watch.expired());
}

// Note [A block's control block in its header]: a block's control block and its pool's reference
// live before its bytes, in the same allocation. Every byte of the block is the caller's: filling
// them all leaves the block's return to its pool intact, and the block goes back (with the same
// address) only once its control block ends, after the last weak_ptr of it too.
TEST(HostPool, ABlocksBytesAreAllItsOwnAndItGoesBackWithItsControlBlock) {
  auto pool = std::make_shared<HostPool>(1024);
  const std::weak_ptr<HostPool> watch = pool;
  std::shared_ptr<void> block = HostPool::allocate(pool, 500);  // 512 bytes, rounded
  void* const bytes = block.get();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(bytes) % HostPool::kAlignment, 0u);
  std::memset(bytes, 0xff, 512);
  std::weak_ptr<void> weak = block;
  block.reset();
  EXPECT_EQ(pool->cached_bytes(), 0u);  // the control block is still alive: so is the block
  weak.reset();
  EXPECT_EQ(pool->cached_bytes(), 512u);
  std::shared_ptr<void> again = HostPool::allocate(pool, 512);
  EXPECT_EQ(again.get(), bytes);
  std::memset(again.get(), 0xff, 512);
  pool.reset();
  EXPECT_FALSE(watch.expired());  // the block's reference, in its header
  again.reset();                  // the last holder: the pool goes with it
  EXPECT_TRUE(watch.expired());
}

// A block with room for one more object (make_host_storage's Storage and its control block) goes
// back to its pool once both its own control block and the room's owner let go, in either order,
// and its pool lives until then.
TEST(HostPool, ABlockWithRoomGoesBackOnceBothOwnersLetGo) {
  auto pool = std::make_shared<HostPool>(1024);
  const std::weak_ptr<HostPool> watch = pool;
  void* first = nullptr;
  {
    HostPool::BlockWithRoom block = HostPool::allocate_with_room(pool, 512);
    first = block.block.get();
    std::memset(block.room, 0xff, HostPool::kRoomBytes);  // all the caller's
    std::memset(first, 0xff, 512);
    block.block.reset();
    EXPECT_EQ(pool->cached_bytes(), 0u);  // the room's owner still holds it
    HostPool::release_room(block.room);
    EXPECT_EQ(pool->cached_bytes(), 512u);
  }
  HostPool::BlockWithRoom again = HostPool::allocate_with_room(pool, 512);
  EXPECT_EQ(again.block.get(), first);
  HostPool::release_room(again.room);  // the room's owner first, this time
  EXPECT_EQ(pool->cached_bytes(), 0u);
  pool.reset();
  EXPECT_FALSE(watch.expired());  // the block's reference, in its header
  again.block.reset();            // the last owner: back to the pool, which then goes
  EXPECT_TRUE(watch.expired());
}

// Note [A block's control block in its header]: the header is before the bytes, so a write just
// past a pooled block's end is AddressSanitizer's to report (the pool is on under it), as it was
// before the block had a header; after the bytes (where it was first), the write landed in it
// unreported. Under AddressSanitizer only (the asan-ubsan preset): elsewhere nothing would report
// it.
TEST(HostPoolDeathTest, AWritePastABlocksEndIsAddressSanitizersToReport) {
  if (transport::kRecycleBlocks) {
    GTEST_SKIP() << "needs AddressSanitizer (the asan-ubsan preset)";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto pool = std::make_shared<HostPool>(1024);
        std::shared_ptr<void> block = HostPool::allocate(pool, 512);
        volatile char* past_end = static_cast<char*>(block.get()) + 512;
        *past_end = 1;
      },
      "heap-buffer-overflow");
}

TEST(HostPool, APoolWithABlockOutIsNotParked) {
  const auto others = take_spare_pools();
  std::shared_ptr<HostPool> pool = HostPool::make(1024);
  HostPool* const first = pool.get();
  std::shared_ptr<void> out = HostPool::allocate(pool, 256);  // it holds the pool
  HostPool::park(std::move(pool));
  std::shared_ptr<HostPool> next = HostPool::make(1024);
  EXPECT_NE(next.get(), first);  // `first` is still alive: a different pool
  EXPECT_EQ(next->cached_bytes(), 0u);
  out.reset();  // back to the first pool, which then goes
}

TEST(HostPool, AParkedPoolKeepsAtMostItsShareAndTheNewLimit) {
  const auto others = take_spare_pools();
  constexpr std::size_t kBlock = HostPool::kSparePoolCachedBytesMax / 2;
  std::shared_ptr<HostPool> pool = HostPool::make(std::size_t{1} << 20);
  {
    std::vector<std::shared_ptr<void>> blocks;
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(HostPool::allocate(pool, kBlock));
    }
  }
  EXPECT_EQ(pool->cached_bytes(), 4 * kBlock);
  HostPool::park(std::move(pool));
  std::shared_ptr<HostPool> next = HostPool::make(std::size_t{1} << 20);
  const bool parks = transport::recycling_enabled();  // not under AddressSanitizer
  EXPECT_EQ(next->cached_bytes(), parks ? HostPool::kSparePoolCachedBytesMax : 0u);
  HostPool::park(std::move(next));
  std::shared_ptr<HostPool> last = HostPool::make(kBlock);  // a limit below what was kept
  EXPECT_EQ(last->cached_bytes(), parks ? kBlock : 0u);
}

TEST(HostPool, NothingIsParkedWhileRecyclingIsOff) {
  const auto others = take_spare_pools();
  transport::testing::recycle_blocks_enabled = false;
  std::shared_ptr<HostPool> pool = HostPool::make(1024);
  HostPool::allocate(pool, 512).reset();
  HostPool::park(std::move(pool));
  std::shared_ptr<HostPool> next = HostPool::make(1024);
  transport::testing::recycle_blocks_enabled = true;
  EXPECT_EQ(next->cached_bytes(), 0u);  // a parked pool would have kept the 512 bytes
}

}  // namespace
}  // namespace chorus::detail
