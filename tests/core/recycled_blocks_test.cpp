// Per-thread recycling of the blocks collectives make and drop, and of the objects the simulator
// keeps from run to run (Note [Recycled blocks], chorus/transport/recycled_blocks.hpp). Under
// AddressSanitizer nothing is recycled: there the tests check that every block comes from operator
// new instead.

#include "chorus/transport/recycled_blocks.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
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

// RecycledObjects: a thread's stack of objects kept for reuse (the simulator's signature lists
// and slots), under the same rules as the block lists. It recycles whatever kRecycleBlocks says:
// its callers check that. Each test runs on a thread of its own, whose exit must destroy what
// its stack still keeps.
struct Counted {
  static inline int alive = 0;
  std::vector<int> values;  // room that moves with the object
  Counted() noexcept { ++alive; }
  Counted(Counted&& other) noexcept : values(std::move(other.values)) { ++alive; }
  Counted& operator=(Counted&& other) noexcept {
    values = std::move(other.values);
    return *this;
  }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  ~Counted() { --alive; }
};
using KeptCounted = RecycledObjects<Counted, 3>;

TEST(RecycledObjects, AStackKeepsAtMostItsLimitAndHandsBackTheLastGiven) {
  std::thread([] {
    Counted out;
    EXPECT_FALSE(KeptCounted::take(out));
    for (int i = 0; i < 3; ++i) {
      Counted given;
      given.values = {i};
      EXPECT_TRUE(KeptCounted::give(given));
      EXPECT_TRUE(given.values.empty()) << "moved into the stack";
    }
    Counted extra;
    extra.values = {9};
    EXPECT_FALSE(KeptCounted::give(extra)) << "a full stack refuses";
    EXPECT_EQ(extra.values, std::vector<int>{9}) << "a refused object is left as it was";
    ASSERT_TRUE(KeptCounted::take(out));
    EXPECT_EQ(out.values, std::vector<int>{2});
    ASSERT_TRUE(KeptCounted::take(out));
    EXPECT_EQ(out.values, std::vector<int>{1});
  }).join();
  EXPECT_EQ(Counted::alive, 0) << "the thread's exit destroys what its stack still keeps";
}

TEST(RecycledObjects, AThreadsStackClosesWhenTheThreadExits) {
  bool given_after_close = true;
  std::thread([&] {
    struct GiveAtExit {
      bool* given = nullptr;
      ~GiveAtExit() {
        Counted late;
        *given = KeptCounted::give(late);
      }
    };
    // Constructed before the stack's closer, so destroyed after it.
    thread_local GiveAtExit at_exit;
    at_exit.given = &given_after_close;
    Counted early;
    EXPECT_TRUE(KeptCounted::give(early));  // the closer destroys it
  }).join();
  EXPECT_FALSE(given_after_close);
  EXPECT_EQ(Counted::alive, 0);
}

// take_or_make moves the last kept object into the caller's, ending the kept one, or makes a fresh
// one when none is kept; a thread whose first use of the stack is a take_or_make still has its
// stack closed, and what it keeps ended, when it exits.
TEST(RecycledObjects, TakeOrMakeHandsBackTheLastGivenOrAFreshOne) {
  std::thread([] {
    {
      const Counted fresh = KeptCounted::take_or_make();
      EXPECT_TRUE(fresh.values.empty());
      EXPECT_EQ(Counted::alive, 1);
    }
    for (int i = 0; i < 2; ++i) {
      Counted given;
      given.values = {i, i};
      ASSERT_TRUE(KeptCounted::give(given));
    }
    EXPECT_EQ(Counted::alive, 2) << "the two kept";
    {
      const Counted taken = KeptCounted::take_or_make();
      EXPECT_EQ(taken.values, (std::vector<int>{1, 1}));
      EXPECT_EQ(Counted::alive, 2) << "the kept one ended as it was taken";
    }
    EXPECT_EQ(Counted::alive, 1);
  }).join();
  EXPECT_EQ(Counted::alive, 0) << "the thread's exit ends what its stack still keeps";
}

// RecycledRooms::take gives a room an earlier owner gave back, emptied, with its capacity.
TEST(RecycledRooms, ATakenRoomIsEmptyAndKeepsTheGivenCapacity) {
  struct Tag {};
  using Rooms = RecycledRooms<std::vector<int>, Tag>;
  std::thread([] {
    std::vector<int> first = Rooms::take();
    EXPECT_TRUE(first.empty());
    first.assign({1, 2, 3, 4, 5, 6, 7, 8});
    const std::size_t capacity = first.capacity();
    const int* room = first.data();
    Rooms::give(first);
    const std::vector<int> second = Rooms::take();
    EXPECT_TRUE(second.empty());
    if (recycling_enabled()) {
      EXPECT_TRUE(first.empty()) << "moved into the stack";
      EXPECT_EQ(second.capacity(), capacity);
      EXPECT_EQ(second.data(), room);
    }
  }).join();
}

}  // namespace
}  // namespace chorus::transport
