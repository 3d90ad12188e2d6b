#pragma once

// Note [Pinned staging pool]
// Staging copies a CPU buffer through pinned host memory (Note [NCCL work lifecycle]).
// cudaMallocHost is slow, and cudaFreeHost synchronises the device: a free while a collective
// waits for a peer stalls until that peer arrives (NVIDIA/nccl#48), and the frees run in a Work's
// cleanup, on the watchdog or a waiting thread. So blocks are kept for reuse: a block comes back
// to a list per size class (powers of two, at least 4 KiB) and is handed out again; the pool
// keeps at most `keep_bytes` in all. A block beyond that is not freed where it is given back
// (a Work's cleanup, on the watchdog: a cudaFreeHost there would wait for the very kernel the
// watchdog has to time out) but by free_unkept(), which the transport calls as it starts an
// operation, before it takes the communicator's lock (the watchdog needs that lock to abort a
// hung kernel), or when the pool ends. A request whose class exceeds `keep_bytes` is never kept: it
// gets whole 4 KiB pages, not a power of two. Thread-safe: blocks come back from any thread. A
// block keeps its pool alive; the pool frees what it kept when the last block and the last owner
// are gone. No CUDA here: the allocation functions are given, so the unit tests run it on host
// memory.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace chorus::nccl::detail {

class BlockPool : public std::enable_shared_from_this<BlockPool> {
 public:
  // `allocate(bytes)` returns a block of at least `bytes` or throws; `free` gives one back.
  using Allocate = std::function<void*(std::size_t)>;
  using Free = std::function<void(void*)>;

  static std::shared_ptr<BlockPool> make(Allocate allocate, Free free, std::size_t keep_bytes) {
    return std::shared_ptr<BlockPool>(
        new BlockPool(std::move(allocate), std::move(free), keep_bytes));
  }
  ~BlockPool() {
    for (auto& [size, blocks] : free_) {
      for (void* block : blocks) {
        free_block_(block);
      }
    }
    for (void* block : unkept_) {
      free_block_(block);
    }
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least max(bytes, 1) bytes; freeing the shared_ptr gives it back to the pool.
  std::shared_ptr<void> take(std::size_t bytes) {
    std::size_t size = size_class(bytes);
    if (size > keep_bytes_) {
      size = (std::max<std::size_t>(bytes, 1) + kMinBlock - 1) / kMinBlock * kMinBlock;
    }
    void* block = nullptr;
    {
      const std::lock_guard lock(mutex_);
      if (auto found = free_.find(size); found != free_.end() && !found->second.empty()) {
        block = found->second.back();
        found->second.pop_back();
        kept_ -= size;
      }
    }
    if (block == nullptr) {
      block = allocate_(size);
      const std::lock_guard lock(mutex_);
      ++allocations_;
    }
    return {block, [pool = shared_from_this(), size](void* data) { pool->give_back(data, size); }};
  }

  // Frees the blocks given back beyond what the pool keeps (outside the pool's lock). Call where
  // a free may wait for the device: not under a lock the watchdog needs.
  void free_unkept() {
    std::vector<void*> blocks;
    {
      const std::lock_guard lock(mutex_);
      blocks.swap(unkept_);
    }
    for (void* block : blocks) {
      free_block_(block);
    }
  }

  // The size class of `bytes`: the smallest power of two at least max(bytes, kMinBlock).
  static std::size_t size_class(std::size_t bytes) {
    if (bytes > (std::size_t{1} << 62)) {
      return bytes;  // no power of two above it fits
    }
    std::size_t size = kMinBlock;
    while (size < bytes) {
      size *= 2;
    }
    return size;
  }

  std::size_t kept_bytes() const {
    const std::lock_guard lock(mutex_);
    return kept_;
  }
  std::size_t allocations() const {  // calls of `allocate` so far
    const std::lock_guard lock(mutex_);
    return allocations_;
  }

  static constexpr std::size_t kMinBlock = 4096;

 private:
  BlockPool(Allocate allocate, Free free, std::size_t keep_bytes)
      : allocate_(std::move(allocate)), free_block_(std::move(free)), keep_bytes_(keep_bytes) {}

  void give_back(void* block, std::size_t size) noexcept {
    {
      const std::lock_guard lock(mutex_);
      try {
        if (kept_ + size <= keep_bytes_ && size == size_class(size)) {
          free_[size].push_back(block);
          kept_ += size;
        } else {
          unkept_.push_back(block);  // freed by the next take() or the destructor
        }
        return;
      } catch (...) {
        // Out of memory for the list: free the block below instead.
      }
    }
    free_block_(block);
  }

  Allocate allocate_;
  Free free_block_;
  std::size_t keep_bytes_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // by size class
  std::vector<void*> unkept_;                       // given back beyond keep_bytes_, not yet freed
  std::size_t kept_ = 0;
  std::size_t allocations_ = 0;
};

}  // namespace chorus::nccl::detail
