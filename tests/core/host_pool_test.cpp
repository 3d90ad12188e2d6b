// The rank's pool of freed host blocks (core/src/detail/host_pool.hpp).

#include "detail/host_pool.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace chorus::detail {
namespace {

TEST(HostPool, ReusesAFreedBlockOfTheSameSize) {
  auto pool = std::make_shared<HostPool>(1024);
  void* first = nullptr;
  {
    std::shared_ptr<void> block = pool->allocate(512);
    first = block.get();
  }
  EXPECT_EQ(pool->cached_bytes(), 512u);
  std::shared_ptr<void> again = pool->allocate(512);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

TEST(HostPool, EvictsOtherSizesToKeepTheBlockJustFreed) {
  auto pool = std::make_shared<HostPool>(1024);
  pool->allocate(256).reset();
  pool->allocate(512).reset();
  EXPECT_EQ(pool->cached_bytes(), 768u);
  void* large = nullptr;
  {
    std::shared_ptr<void> block = pool->allocate(1024);
    large = block.get();
  }
  EXPECT_EQ(pool->cached_bytes(), 1024u);  // the 256 and 512 blocks made room
  std::shared_ptr<void> again = pool->allocate(1024);
  EXPECT_EQ(again.get(), large);
}

// The pool remembers the bucket it used last; evicting that bucket must make it forget it (under
// the asan-ubsan preset a stale bucket is a heap-use-after-free here). The bucket evicted is the
// last used only when the block that evicted it is not kept after all: the blocks of its own size
// leave no room for it.
TEST(HostPool, ForgetsTheLastBucketWhenItIsEvicted) {
  auto pool = std::make_shared<HostPool>(1280);
  std::shared_ptr<void> a = pool->allocate(512);
  std::shared_ptr<void> b = pool->allocate(512);
  std::shared_ptr<void> c = pool->allocate(512);
  a.reset();
  b.reset();
  pool->allocate(256).reset();  // the 256 bucket is the last used
  EXPECT_EQ(pool->cached_bytes(), 1280u);
  c.reset();  // evicts the 256 bucket, then finds no room beside the two 512 blocks: freed
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  std::shared_ptr<void> small = pool->allocate(256);  // fresh: no 256 block is cached
  EXPECT_NE(small, nullptr);
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  std::shared_ptr<void> cached = pool->allocate(512);
  EXPECT_EQ(pool->cached_bytes(), 512u);
}

TEST(HostPool, NeverEvictsForABlockOverTheLimitOrOfTheSameSize) {
  auto pool = std::make_shared<HostPool>(1024);
  std::shared_ptr<void> a = pool->allocate(512);
  std::shared_ptr<void> b = pool->allocate(512);
  std::shared_ptr<void> c = pool->allocate(512);
  a.reset();
  b.reset();
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  c.reset();  // same size as every cached block: freed, nothing evicted
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  pool->allocate(4096).reset();  // over the limit: freed, nothing evicted
  EXPECT_EQ(pool->cached_bytes(), 1024u);
}

}  // namespace
}  // namespace chorus::detail
