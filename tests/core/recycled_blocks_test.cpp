// Per-thread recycling of the blocks collectives make and drop (Note [Recycled blocks],
// chorus/transport/recycled_blocks.hpp). Under AddressSanitizer nothing is recycled: there the
// tests check that every block comes from operator new instead.

#include "chorus/transport/recycled_blocks.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace chorus::transport {
namespace {

struct Payload {
  std::int64_t values[5] = {1, 2, 3, 4, 5};
};

TEST(RecycledBlocks, ASharedObjectDroppedGivesItsBlockToTheNextOne) {
  std::shared_ptr<Payload> first = std::allocate_shared<Payload>(RecyclingAllocator<Payload>{});
  first->values[4] = 50;
  const void* address = first.get();
  first.reset();
  const std::shared_ptr<Payload> second =
      std::allocate_shared<Payload>(RecyclingAllocator<Payload>{});
  EXPECT_EQ(second->values[4], 5);  // constructed again, whatever the block held
  if (kRecycleBlocks) {
    EXPECT_EQ(second.get(), address);
  }
}

// A block size of its own, so other tests' blocks are not on the list.
using Block = std::byte[200];
using Blocks = RecycledBlocks<sizeof(Block)>;

TEST(RecycledBlocks, AListKeepsAtMostItsLimitAndGivesBackInReverse) {
  if (!kRecycleBlocks) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  while (void* stale = Blocks::take()) {
    ::operator delete(stale);
  }
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < kRecycledBlocksMax + 3; ++i) {
    blocks.push_back(::operator new(sizeof(Block)));
  }
  std::size_t kept = 0;
  for (void* block : blocks) {
    if (Blocks::give(block)) {
      ++kept;
    } else {
      ::operator delete(block);  // full: the caller deletes it
    }
  }
  EXPECT_EQ(kept, kRecycledBlocksMax);
  for (std::size_t i = kRecycledBlocksMax; i-- > 0;) {
    EXPECT_EQ(Blocks::take(), blocks[i]);
    ::operator delete(blocks[i]);
  }
  EXPECT_EQ(Blocks::take(), nullptr);
}

// A thread's lists are emptied and closed when it exits: a block given back after that, here
// by a thread-local destroyed after the list's closer, is refused (and deleted by its caller).
TEST(RecycledBlocks, AThreadsListClosesWhenTheThreadExits) {
  if (!kRecycleBlocks) {
    GTEST_SKIP() << "nothing is recycled under AddressSanitizer";
  }
  bool given_before_exit = false;
  bool given_after_close = true;
  std::thread([&] {
    struct GiveAtExit {
      bool* given = nullptr;
      ~GiveAtExit() {
        void* block = ::operator new(sizeof(Block));
        *given = Blocks::give(block);
        if (!*given) {
          ::operator delete(block);
        }
      }
    };
    // Constructed before the list's closer, so destroyed after it.
    thread_local GiveAtExit at_exit;
    at_exit.given = &given_after_close;
    given_before_exit = Blocks::give(::operator new(sizeof(Block)));  // the closer deletes it
  }).join();
  EXPECT_TRUE(given_before_exit);
  EXPECT_FALSE(given_after_close);
}

}  // namespace
}  // namespace chorus::transport
