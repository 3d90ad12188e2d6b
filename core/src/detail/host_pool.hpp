#pragma once

// A rank's pool of host memory blocks. Collectives allocate outputs of the same sizes again and
// again; first touch of fresh pages costs ~15 us per 4 KiB page on our machines against
// 18 GB/s for re-touched memory, so freed blocks are kept (bucketed by exact rounded size) up to
// a byte limit and handed out again.
//
// Thread-safe: blocks may be freed on any thread. Each block holds the pool, so blocks
// freed after the rank ended still return safely (Note [A block's reference to its pool]).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/runtime.hpp"
#include "chorus/transport/futex_mutex.hpp"

namespace chorus::detail {

// An allocator that hands out one place chosen before, once: for a control block placed in memory
// its owner already holds (a pooled block's header, or the room beside it, Note [A block's control
// block in its header]). It fits objects of at most kPlaceBytes aligned to at most kPlaceAlign
// (checked at compile time for each type placed), and gives the place back with Release when the
// control block ends.
template <class T, std::size_t kPlaceBytes, std::size_t kPlaceAlign,
          void (*Release)(void*) noexcept>
class PlacedAllocator {
 public:
  using value_type = T;
  template <class U>
  struct rebind {
    using other = PlacedAllocator<U, kPlaceBytes, kPlaceAlign, Release>;
  };

  explicit PlacedAllocator(void* place) noexcept : place_(place) {}
  template <class U>
  PlacedAllocator(  // NOLINT(google-explicit-constructor)
      const PlacedAllocator<U, kPlaceBytes, kPlaceAlign, Release>& other) noexcept
      : place_(other.place_) {}

  // Their checks, of std::allocate_shared's use of its allocator (one object, given back where it
  // was placed), run in debug builds only: the deallocation's ran at the end of every pooled
  // block's and storage's control block, two a tensor.
  T* allocate([[maybe_unused]] std::size_t n) noexcept {
    static_assert(sizeof(T) <= kPlaceBytes && alignof(T) <= kPlaceAlign);
    CHORUS_DCHECK_EQ(n, 1u);
    return static_cast<T*>(place_);
  }
  void deallocate([[maybe_unused]] T* placed, [[maybe_unused]] std::size_t n) noexcept {
    CHORUS_DCHECK_EQ(n, 1u);
    CHORUS_DCHECK(static_cast<void*>(placed) == place_);
    Release(place_);
  }

  template <class U>
  bool operator==(
      const PlacedAllocator<U, kPlaceBytes, kPlaceAlign, Release>& other) const noexcept {
    return place_ == other.place_;
  }

 private:
  template <class U, std::size_t, std::size_t, void (*)(void*) noexcept>
  friend class PlacedAllocator;

  void* place_;
};

class HostPool {
 public:
  static constexpr std::size_t kAlignment = HostAllocator::kAlignment;

  explicit HostPool(std::size_t cached_bytes_max) : cached_bytes_max_(cached_bytes_max) {}
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Note [Spare host pools]: the pool for a new rank, keeping at most `cached_bytes_max` bytes
  // of freed blocks: one that a rank which ended on this thread left (with the blocks it
  // cached), or a fresh one.
  static std::shared_ptr<HostPool> make(std::size_t cached_bytes_max);
  // Keeps `pool` for make() on this thread when nothing else holds it (none of its blocks is
  // out), recycling is on and this thread keeps fewer than kSparePoolsMax; otherwise only drops
  // this reference. `pool` is null afterwards either way.
  static void park(std::shared_ptr<HostPool>&& pool) noexcept;
  static constexpr std::size_t kSparePoolsMax = 16;
  // A parked pool keeps at most this many bytes of its cached blocks.
  static constexpr std::size_t kSparePoolCachedBytesMax = std::size_t{64} << 10;

  // A 64-byte aligned block of at least `nbytes` (> 0) bytes from `pool`, given back to `pool`
  // when its last reference ends, and holding a copy of that reference until then (Note [A
  // block's reference to its pool]; its control block lives in the block, Note [A block's
  // control block in its header]). `pool` must own the pool: the pointer make() returned, or a copy
  // of it (not an aliasing or non-owning one, which would neither keep the pool alive nor count for
  // park). The library itself builds storages, so it takes allocate_with_room; this plain form is
  // the pool's tests' entry.
  static std::shared_ptr<void> allocate(const std::shared_ptr<HostPool>& pool, std::size_t nbytes);

  // The same with room beside the block for one object of at most kRoomBytes (its control block
  // and all: make_host_storage's Storage, Note [A block's control block in its header]), which the
  // caller must build there at once and whose allocator gives it back with release_room. The
  // block goes back to the pool once both its own control block and the room's object ended.
  static constexpr std::size_t kRoomBytes = 160;
  struct BlockWithRoom {
    std::shared_ptr<void> block;
    void* room;
  };
  static BlockWithRoom allocate_with_room(const std::shared_ptr<HostPool>& pool,
                                          std::size_t nbytes);
  static void release_room(void* room) noexcept;

  std::size_t cached_bytes() const;

 private:
  // Keeps at most `bytes` bytes of freed blocks from now on, freeing cached ones beyond that.
  void limit_to(std::size_t bytes) noexcept;
  void release(void* block, std::size_t rounded_bytes) noexcept;
  // release() past its fast path (Note [A released block's fast path]): out of line, so that the
  // fast path keeps a small frame.
  [[gnu::noinline]] void release_slow(void* block, std::size_t rounded_bytes) noexcept;
  // The free blocks of `rounded_bytes`, or null when that size has no bucket. Under mutex_.
  std::vector<void*>* bucket_locked(std::size_t rounded_bytes);

  // allocate and allocate_with_room: a block whose header has `owners` owners.
  static inline BlockWithRoom allocate_with_header(const std::shared_ptr<HostPool>& pool,
                                                   std::size_t nbytes, std::uint32_t owners);
  // One owner of the block whose header is at `header` has ended; the last gives the block back.
  static void release_header(void* header) noexcept;

  mutable transport::FutexMutex mutex_;                              // Note [Futex mutex]
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks_;  // rounded size -> blocks
  // The bucket used last (nodes of an unordered_map stay put until erased): a loop of
  // collectives of one size finds its blocks without hashing, whose modulo by the bucket count
  // is a division on every allocation and release.
  std::size_t last_size_ = 0;
  std::vector<void*>* last_blocks_ = nullptr;
  std::size_t cached_bytes_ = 0;
  std::size_t cached_bytes_max_;
};

// A 64-byte aligned heap block, freed on release (no pooling).
std::shared_ptr<void> allocate_unpooled(std::size_t nbytes);

}  // namespace chorus::detail
