#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "detail/host_pool.hpp"

namespace chorus::detail {
namespace {

std::size_t round_up(std::size_t nbytes) {
  return (nbytes + HostPool::kAlignment - 1) / HostPool::kAlignment * HostPool::kAlignment;
}

void* aligned_block(std::size_t rounded_bytes) {
  void* block = std::aligned_alloc(HostPool::kAlignment, rounded_bytes);
  if (block == nullptr) {
    throw std::bad_alloc();
  }
  return block;
}

// Note [Spare host pools]
// Every rank makes a pool (RankState) and every run of the simulator makes its ranks anew, so
// a schedule of 4 ranks made 4 pools and their first blocks (glibc's aligned_alloc, ~640
// instructions a block, and the pool's bucket map and lists) and freed it all again at its end:
// 13.9 k of the 245.9 k instructions of bench_sim's schedule of 4 ranks x 8 collectives. A rank's
// pool that nothing else holds when the rank ends (no block of it still out: every tensor of
// the rank is gone) is parked on the thread instead, keeping at most kSparePoolCachedBytesMax
// bytes of its cached blocks, and the next rank made on that thread takes it (with the limit
// of its own options). A thread keeps at most kSparePoolsMax pools (so at most 1 MiB of idle
// blocks' bytes, and their headers, Note [A block's control block in its header]) until it exits,
// as recycled blocks are kept (Note [Recycled blocks] in chorus/transport/recycled_blocks.hpp);
// nothing is parked under AddressSanitizer or while the out-of-memory tests' seam turns recycling
// off, so those tests still see every allocation.
struct SparePoolsTag {};
using SparePools =
    transport::RecycledObjects<std::shared_ptr<HostPool>, HostPool::kSparePoolsMax, SparePoolsTag>;

}  // namespace

std::shared_ptr<HostPool> HostPool::make(std::size_t cached_bytes_max) {
  std::shared_ptr<HostPool> pool;
  if (transport::recycling_enabled() && SparePools::take(pool)) {
    pool->limit_to(cached_bytes_max);
    return pool;
  }
  return std::make_shared<HostPool>(cached_bytes_max);
}

void HostPool::park(std::shared_ptr<HostPool>&& pool) noexcept {
  // use_count() == 1: no other reference (no block holds one) can appear any more;
  // only a holder could copy it.
  if (pool != nullptr && transport::recycling_enabled() && pool.use_count() == 1) {
    pool->limit_to(kSparePoolCachedBytesMax);  // make() sets the next rank's limit
    if (SparePools::give(pool)) {
      return;  // moved from: null
    }
  }
  pool.reset();
}

void HostPool::limit_to(std::size_t bytes) noexcept {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  cached_bytes_max_ = bytes;
  for (auto& [size, blocks] : free_blocks_) {
    while (cached_bytes_ > bytes && !blocks.empty()) {
      std::free(blocks.back());
      blocks.pop_back();
      CHORUS_CHECK_GE(cached_bytes_, size);
      cached_bytes_ -= size;
    }
  }
}

HostPool::~HostPool() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* block : blocks) {
      std::free(block);
    }
  }
}

// Note [A block's control block in its header]
// A block's shared_ptr needs a control block, and a host storage (make_host_storage) one of its
// own, each a heap block of its own (recycled per thread, Note [Recycled blocks]): taken when
// the block was handed out and given back after the deleter had returned the bytes to the pool,
// ~34 instructions a block besides the pool's own work, and as much for the storage's. Each
// block the pool makes now has kHeaderBytes more, before its bytes: its control block is built
// there (a PlacedAllocator hands out the header) with the pool's reference, the block's rounded
// size and a count of the header's owners beside it, and room for one more object (the storage, its
// control block and all: allocate_with_room, and the caller's allocator gives it back with
// release_room). The block, its control block and its storage are one allocation. The deleter
// keeps the bytes (KeepsBytes); they go back to the pool when the last owner of the header, the
// block's control block or the storage's, is given back (release_header): the block's right after
// its deleter ran, the storage's after ~Storage, in either order (a transport may keep the bytes
// after the last tensor went, Buffer::keep_alive), each later if a weak_ptr of it outlives its
// last shared_ptr (chorus takes none). The two control blocks stay apart, so ~Storage, and its
// drop notice, still run when the last tensor goes. A count of 1 is final (counts only fall), so
// the last owner reads it and the first alone decrements it: one read-modify-write per storage,
// none for a block without one. The last owner moves the pool's reference out of the header before
// it gives the block back (another thread may take it at once) and drops it after, so the pool
// outlives the call. The header comes before the bytes, not after them (where it was first), so
// that a write past a block's end still lands in AddressSanitizer's redzone (the pool is on there),
// not silently in its control block or size; the pool's lists hold the allocations, the bytes are
// kHeaderBytes in. The cached byte counts and limits count the blocks' bytes without their headers,
// as before: a cached block really holds kHeaderBytes more, which matters for small blocks only (a
// parked pool's kSparePoolCachedBytesMax of 256-byte blocks holds twice that). The room fits a
// Storage with libstdc++'s control block and no more (storage.cpp's static_assert says so at
// compile time if Storage grows; libc++'s control block is 8 bytes larger).
namespace {

// A block's header, before its bytes: its control block, the pool's reference, the count of the
// header's owners (the control block, and the object in the room when there is one), the block's
// rounded size, and the room.
constexpr std::size_t kControlBlockBytes = 48;
constexpr std::size_t kPoolReferenceOffset = kControlBlockBytes;
constexpr std::size_t kOwnersOffset = kPoolReferenceOffset + sizeof(std::shared_ptr<HostPool>);
constexpr std::size_t kRoundedOffset = kOwnersOffset + 8;
constexpr std::size_t kRoomOffset = 96;
constexpr std::size_t kHeaderBytes = kRoomOffset + HostPool::kRoomBytes;
static_assert(kRoundedOffset + sizeof(std::size_t) <= kRoomOffset);
static_assert(kHeaderBytes % HostPool::kAlignment == 0 &&
              kRoomOffset % alignof(std::max_align_t) == 0);

template <class T>
T* in_header(void* header, std::size_t offset) noexcept {
  return static_cast<T*>(static_cast<void*>(static_cast<char*>(header) + offset));
}

// The deleter of a pooled block: the bytes outlive the call (HostPool::release_header gives them
// back).
struct KeepsBytes {
  void operator()(void* /*block*/) const noexcept {}
};

}  // namespace

void HostPool::release_header(void* header) noexcept {
  // Note [A block's control block in its header]: the last of the header's owners gives the block
  // back. A count of 1 is final (counts only fall), and needs no read-modify-write.
  auto* owners = in_header<std::atomic<std::uint32_t>>(header, kOwnersOffset);
  if (owners->load(std::memory_order_acquire) != 1 &&
      owners->fetch_sub(1, std::memory_order_acq_rel) != 1) {
    return;  // the other owner gives it back
  }
  owners->~atomic();
  std::shared_ptr<HostPool>* slot =
      in_header<std::shared_ptr<HostPool>>(header, kPoolReferenceOffset);
  const std::shared_ptr<HostPool> owner = std::move(*slot);
  slot->~shared_ptr();
  const std::size_t rounded = *in_header<std::size_t>(header, kRoundedOffset);
  owner->release(header, rounded);  // the allocation, which starts with the header
}

void HostPool::release_room(void* room) noexcept {
  release_header(static_cast<char*>(room) - kRoomOffset);
}

// Note [A block's reference to its pool]
// A block holds its pool (in its header, Note [A block's control block in its header]), so that a
// block freed after its rank ended (a tensor kept past the run) still returns to a live pool; the
// pool goes with its last block. The block copies the reference the caller holds (the rank's),
// rather than taking one from the pool (enable_shared_from_this): a copy of a shared_ptr is a plain
// increment until the process first starts a second thread (libstdc++ then counts atomically for
// good, Note [Atomic counts per operation]), where shared_from_this() locks a weak_ptr, a locked
// compare-exchange on every block even then. The guarantee is the same: the block holds one strong
// reference until it is back in the pool. HostPool::park's use_count() == 1 still means that no
// block is out.
//
// Inlined into allocate and allocate_with_room, its only users (and, through link-time
// optimization, into make_storage): GCC kept it out of line, and a call that returns the block
// and its room through memory cost ~25 instructions a storage more than it saved.
[[gnu::always_inline]] inline HostPool::BlockWithRoom HostPool::allocate_with_header(
    const std::shared_ptr<HostPool>& pool, std::size_t nbytes, std::uint32_t owners) {
  // Core's own invariants (the rank's pool, set for its life; the bucket's bytes counted in
  // cached_bytes_), checked in debug builds only: an allocation's entry, ~4 instructions a
  // fresh tensor.
  CHORUS_DCHECK(pool != nullptr);
  CHORUS_CHECK_GT(nbytes, 0u);
  HostPool& self = *pool;
  const std::size_t rounded = round_up(nbytes);
  void* block = nullptr;
  {
    std::lock_guard<transport::FutexMutex> lock(self.mutex_);
    std::vector<void*>* blocks = self.bucket_locked(rounded);
    if (blocks != nullptr && !blocks->empty()) {
      block = blocks->back();
      blocks->pop_back();
      CHORUS_DCHECK_GE(self.cached_bytes_, rounded);
      self.cached_bytes_ -= rounded;
    }
  }
  if (block == nullptr) {
    block = aligned_block(kHeaderBytes + rounded);
  }
  // Note [A block's control block in its header]: the header's parts first, then the control block,
  // whose allocation cannot fail. The pool's lists hold the allocation, the header first.
  void* header = block;
  void* bytes = static_cast<char*>(block) + kHeaderBytes;
  ::new (in_header<void>(header, kPoolReferenceOffset)) std::shared_ptr<HostPool>(pool);
  ::new (in_header<void>(header, kOwnersOffset)) std::atomic<std::uint32_t>(owners);
  *in_header<std::size_t>(header, kRoundedOffset) = rounded;
  return {std::shared_ptr<void>(
              bytes, KeepsBytes{},
              PlacedAllocator<char, kControlBlockBytes, kAlignment, &release_header>(header)),
          in_header<void>(header, kRoomOffset)};
}

std::shared_ptr<void> HostPool::allocate(const std::shared_ptr<HostPool>& pool,
                                         std::size_t nbytes) {
  return allocate_with_header(pool, nbytes, 1).block;
}

HostPool::BlockWithRoom HostPool::allocate_with_room(const std::shared_ptr<HostPool>& pool,
                                                     std::size_t nbytes) {
  return allocate_with_header(pool, nbytes, 2);
}

void HostPool::release(void* block, std::size_t rounded_bytes) noexcept {
  // Note [A released block's fast path]
  // Nearly every block goes back to the bucket used last, with room under the byte limit and in
  // the bucket's list: kept there without the general path's frame (its list of evicted blocks,
  // its handler), which cost ~20 of its ~66 instructions per block. Anything else (eviction, a
  // new bucket, a list to grow, a block over the limit) takes the general path, release_slow,
  // which decides as before.
  {
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    if (last_blocks_ != nullptr && last_size_ == rounded_bytes &&
        cached_bytes_ + rounded_bytes <= cached_bytes_max_ &&
        last_blocks_->size() < last_blocks_->capacity()) {
      last_blocks_->push_back(block);  // within capacity: cannot throw
      cached_bytes_ += rounded_bytes;
      return;
    }
  }
  release_slow(block, rounded_bytes);
}

void HostPool::release_slow(void* block, std::size_t rounded_bytes) noexcept {
  // Blocks of other sizes evicted to make room, freed after the lock is released.
  std::vector<void*> evicted;
  bool kept = false;
  {
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    try {
      if (rounded_bytes <= cached_bytes_max_ && cached_bytes_ + rounded_bytes > cached_bytes_max_) {
        // The block just freed is the likeliest to be asked for again (a loop of collectives
        // of one size); blocks of other sizes make room for it. Without this, blocks cached
        // from earlier, smaller sizes kept every larger output uncached, paying first touch
        // of all its pages on every collective (bench_mpi: ~250 ms per 64 MiB output).
        for (auto it = free_blocks_.begin();
             it != free_blocks_.end() && cached_bytes_ + rounded_bytes > cached_bytes_max_;) {
          if (it->first == rounded_bytes) {
            ++it;
            continue;
          }
          while (!it->second.empty() && cached_bytes_ + rounded_bytes > cached_bytes_max_) {
            evicted.push_back(it->second.back());
            it->second.pop_back();
            CHORUS_CHECK_GE(cached_bytes_, it->first);
            cached_bytes_ -= it->first;
          }
          if (it->second.empty()) {
            if (&it->second == last_blocks_) {
              last_blocks_ = nullptr;
            }
            it = free_blocks_.erase(it);
          } else {
            ++it;
          }
        }
      }
      if (cached_bytes_ + rounded_bytes <= cached_bytes_max_) {
        std::vector<void*>* blocks = bucket_locked(rounded_bytes);
        if (blocks == nullptr) {
          blocks = &free_blocks_[rounded_bytes];
          last_size_ = rounded_bytes;
          last_blocks_ = blocks;
        }
        blocks->push_back(block);
        cached_bytes_ += rounded_bytes;
        kept = true;
      }
    } catch (...) {
      // Out of memory for the lists: free the block (what was evicted is freed too).
    }
  }
  for (void* old_block : evicted) {
    std::free(old_block);
  }
  if (!kept) {
    std::free(block);
  }
}

std::vector<void*>* HostPool::bucket_locked(std::size_t rounded_bytes) {
  if (last_blocks_ != nullptr && last_size_ == rounded_bytes) {
    return last_blocks_;
  }
  const auto it = free_blocks_.find(rounded_bytes);
  if (it == free_blocks_.end()) {
    return nullptr;
  }
  last_size_ = rounded_bytes;
  last_blocks_ = &it->second;
  return last_blocks_;
}

std::size_t HostPool::cached_bytes() const {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  return cached_bytes_;
}

std::shared_ptr<void> allocate_unpooled(std::size_t nbytes) {
  CHORUS_CHECK_GT(nbytes, 0u);
  return std::shared_ptr<void>(aligned_block(round_up(nbytes)), [](void* p) { std::free(p); });
}

}  // namespace chorus::detail
