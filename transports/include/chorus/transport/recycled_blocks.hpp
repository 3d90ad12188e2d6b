#pragma once

// Note [Recycled blocks]
// Every collective makes and drops the same few objects: core's PendingWork, its output's
// Storage and the control block of that storage's memory, and the transport's work (SimWork,
// MpiWork). They are allocated through RecyclingAllocator: a block given back goes to a short
// per-thread list of blocks of its size, and the next allocation of that size on the thread takes
// it again, instead of glibc's free and malloc (~195 instructions a pair in a simulated schedule,
// where most frees find tcache's seven entries full). A block is plain operator-new memory, so one
// freed on another thread joins that thread's list. A list holds at most kRecycledBlocksMax
// blocks; beyond that they are deleted, so an idle thread keeps at most that many blocks of each
// size it freed until it exits. When a thread exits its lists are emptied and closed: a block
// given back after that (a static Tensor destroyed after the main thread's thread-locals) is
// deleted at once. A list registers its closing at its first take or give on the thread; glibc
// runs a closing registered while the thread exits too, except on the main thread once exit() has
// run its thread-locals' destructors: a list first used by a static destructor keeps its few
// blocks until the process ends.
//
// Under AddressSanitizer nothing is recycled, so a use after free still reports
// (ThreadSanitizer and valgrind see no free for a recycled object, so they miss a use after its
// release). An allocation served from a list does not reach operator new, which the
// out-of-memory tests replace to refuse each allocation in turn: their operator new
// (tests/support/refusing_new.cpp) turns recycling off through the test seam
// testing::recycle_blocks_enabled, so every allocation is theirs.

#include <atomic>
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace chorus::transport {

inline constexpr std::size_t kRecycledBlocksMax = 64;

namespace testing {
// Test seam (Note [Recycled blocks]): false, every block comes from operator new and goes back
// to operator delete.
inline std::atomic<bool> recycle_blocks_enabled{true};
}  // namespace testing

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kRecycleBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kRecycleBlocks = false;
#else
inline constexpr bool kRecycleBlocks = true;
#endif
#else
inline constexpr bool kRecycleBlocks = true;
#endif

// Whether blocks and objects are recycled now: not under AddressSanitizer, nor while the test seam
// is off.
inline bool recycling_enabled() noexcept {
  return kRecycleBlocks && testing::recycle_blocks_enabled.load(std::memory_order_relaxed);
}

// Note [Registered closing]
// A per-thread list or stack of kept blocks or objects is emptied and closed at thread exit by a
// thread_local Closer, constructed (its destructor registered) by the first take or give on the
// thread. The list's own state byte says whether that happened: a give reads it once, beside the
// count, where it read a `closed` flag, the count again (to find it empty) and then the
// Closer's guard variable through another thread-local address at every give to an empty list,
// nearly every give of a block that one operation takes and gives back (~8 instructions a give).
// Zero, as the zero-initialised list starts, is Unregistered.
enum class ListState : unsigned char { Unregistered, Open, Closed };

// Registers the closing of the calling thread's list whose state is `state`, once: a thread_local
// Closer (the list's class's), whose destructor empties and closes the list.
template <class Closer>
void register_closing(ListState& state) noexcept {
  if (state == ListState::Unregistered) [[unlikely]] {
    thread_local Closer closer;  // constructed once per thread
    static_cast<void>(closer);
    state = ListState::Open;
  }
}

// Whether a list whose state is `state` may keep one more item (its count allowing): not once it
// is closed; an unregistered one registers its closing first.
template <class Closer>
[[gnu::always_inline]] inline bool open_for_give(ListState& state) noexcept {
  if (state != ListState::Open) [[unlikely]] {
    if (state == ListState::Closed) {
      return false;
    }
    register_closing<Closer>(state);
  }
  return true;
}

// The calling thread's list of free blocks of `Size` bytes.
template <std::size_t Size>
class RecycledBlocks {
 public:
  // A block of Size bytes from the list, or null when it is empty.
  static void* take() noexcept {
    List& list = this_thread();
    if (list.count > 0) {
      return list.blocks[--list.count];
    }
    register_closing<Closer>(list.state);  // the slow path, before an operator new
    return nullptr;
  }
  // Keeps `block` (Size bytes from operator new) for a later take(); false when the list is full
  // or closed (the caller deletes it then).
  static bool give(void* block) noexcept {
    List& list = this_thread();
    if (!open_for_give<Closer>(list.state) || list.count == kRecycledBlocksMax) {
      return false;
    }
    list.blocks[list.count++] = block;
    return true;
  }

 private:
  // Trivially destructible and zero-initialised, so it can be read until the thread is gone.
  struct List {
    void* blocks[kRecycledBlocksMax];
    std::size_t count;
    ListState state;
  };
  static List& this_thread() noexcept {
    thread_local List list{};
    return list;
  }
  struct Closer {
    Closer() = default;
    Closer(const Closer&) = delete;
    Closer& operator=(const Closer&) = delete;
    ~Closer() {
      List& list = this_thread();
      while (list.count > 0) {
        ::operator delete(list.blocks[--list.count]);
      }
      list.state = ListState::Closed;
    }
  };
};

// The calling thread's stack of at most Max objects of type T kept for reuse (the simulator's
// recycled signature lists and slots, core's expanded groups and work lists), under Note [Recycled
// blocks]'s rules: trivially destructible, zero-initialised storage that can be read until the
// thread is gone, emptied and closed at thread exit, the closing registered by the first take or
// give on the thread (Note [Registered closing]). T's move constructor and move assignment must not
// throw. Tag tells apart users that keep the same T. Whether to recycle at all
// (recycling_enabled()) is the caller's check.
template <class T, std::size_t Max, class Tag = T>
class RecycledObjects {
 public:
  // Moves a kept object into `out`; false (`out` untouched) when none is kept.
  static bool take(T& out) noexcept {
    Stack& stack = this_thread();
    if (stack.count == 0) {
      register_closing<Closer>(stack.state);  // the slow path: the caller makes a fresh one
      return false;
    }
    T* kept = stack.at(--stack.count);
    out = std::move(*kept);
    kept->~T();
    return true;
  }
  // A kept object moved out, or a fresh T() when none is kept. Returned as a prvalue, so it is
  // made in the caller's object (RecycledRooms::take): take(out) made that object empty first
  // and then move-assigned into it, freeing what it held (nothing), ~8 instructions more.
  static T take_or_make() noexcept {
    static_assert(std::is_nothrow_default_constructible_v<T> &&
                  std::is_nothrow_move_constructible_v<T>);
    Stack& stack = this_thread();
    if (stack.count == 0) {
      register_closing<Closer>(stack.state);  // the slow path: the caller gets a fresh one
      return T();
    }
    // The kept object ends after the result is made from it (locals end after the return
    // value's initialisation).
    struct End {
      T* kept;
      explicit End(T* object) noexcept : kept(object) {}
      End(const End&) = delete;
      End& operator=(const End&) = delete;
      ~End() { kept->~T(); }
    } end{stack.at(--stack.count)};
    return T(std::move(*end.kept));
  }
  // Keeps `object` (moved from) for a later take(); false (`object` untouched) when the stack is
  // full or closed.
  static bool give(T& object) noexcept {
    Stack& stack = this_thread();
    if (!open_for_give<Closer>(stack.state) || stack.count == Max) {
      return false;
    }
    new (stack.room[stack.count++]) T(std::move(object));
    return true;
  }

 private:
  struct Stack {
    alignas(T) unsigned char room[Max][sizeof(T)];
    std::size_t count;
    ListState state;

    T* at(std::size_t i) noexcept { return std::launder(reinterpret_cast<T*>(room[i])); }
  };
  static Stack& this_thread() noexcept {
    thread_local Stack stack{};
    return stack;
  }
  struct Closer {
    Closer() = default;
    Closer(const Closer&) = delete;
    Closer& operator=(const Closer&) = delete;
    ~Closer() {
      Stack& stack = this_thread();
      while (stack.count > 0) {
        stack.at(--stack.count)->~T();
      }
      stack.state = ListState::Closed;
    }
  };
};

// Note [Recycled rooms]
// Some containers are made anew by every run or operation, though one of the same kind ended
// before on the thread: a communicator key's member list and chorus::world()'s list in core (Note
// [Recycled rank states]); a group's member list, its index key and its abort reason (Note
// [Recycled group rooms]), an operation's signature list (Note [Recycled signature lists]) and the
// fiber executor's lanes in the simulator.
// RecycledRooms keeps such a container's room (its capacity) when its owner ends, and the next
// take() on the thread starts from it: only room travels between runs, never a value, since
// give() empties a container before keeping it and nothing else puts one on the stack. A room
// larger than kRecycledRoomBytesMax is left to its owner to free (a rank of a large MPI or NCCL
// job need not keep it), as is every room while recycling is off (recycling_enabled()) or the
// stack holds RoomsMax; a room no larger than a fresh one's (an empty vector's, a short string's
// inline room) is not worth keeping. Otherwise under Note [Recycled blocks]' rules, through
// RecycledObjects.
inline constexpr std::size_t kRecycledRoomBytesMax = 4096;

template <class Room, class Tag, std::size_t RoomsMax = 16>
class RecycledRooms {
 public:
  // An empty room an earlier owner left on this thread, or a fresh empty one.
  static Room take() noexcept { return recycling_enabled() ? Kept::take_or_make() : Room(); }
  // Empties `room` and keeps it for a later take(), unless recycling is off, the room is no
  // larger than a fresh one's or large, or the stack is full or closed (then `room` keeps it and
  // its owner frees it).
  static void give(Room& room) noexcept {
    if (!recycling_enabled() || room.capacity() <= Room().capacity() ||
        room.capacity() * sizeof(typename Room::value_type) > kRecycledRoomBytesMax) {
      return;
    }
    room.clear();
    (void)Kept::give(room);
  }

 private:
  using Kept = RecycledObjects<Room, RoomsMax, Tag>;
};

// An allocator for std::allocate_shared and shared_ptr control blocks whose single-object
// blocks are recycled per thread (Note [Recycled blocks]).
template <class T>
class RecyclingAllocator {
 public:
  using value_type = T;

  RecyclingAllocator() noexcept = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U>& /*other*/) noexcept {}  // NOLINT(*-explicit-*)

  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    if (n == 1 && recycling_enabled()) {
      if (void* block = RecycledBlocks<sizeof(T)>::take()) {
        return static_cast<T*>(block);
      }
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* block, std::size_t n) noexcept {
    if (n == 1 && recycling_enabled() && RecycledBlocks<sizeof(T)>::give(block)) {
      return;
    }
    ::operator delete(block);
  }

  template <class U>
  bool operator==(const RecyclingAllocator<U>& /*other*/) const noexcept {
    return true;
  }
};

// A base for a class T whose objects are made one at a time with plain `new` and ended with
// `delete` (through a std::unique_ptr to a base with a virtual destructor, say): their blocks are
// recycled through RecyclingAllocator<T> (Note [Recycled blocks]). A class derived from T, of
// another size, gets plain operator new and delete.
template <class T>
class RecycledNew {
 public:
  static void* operator new(std::size_t size) {
    return size == sizeof(T) ? RecyclingAllocator<T>{}.allocate(1) : ::operator new(size);
  }
  static void operator delete(void* block, std::size_t size) noexcept {
    if (size == sizeof(T)) {
      RecyclingAllocator<T>{}.deallocate(static_cast<T*>(block), 1);
    } else {
      ::operator delete(block);
    }
  }
};

}  // namespace chorus::transport
