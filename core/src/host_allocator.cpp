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

}  // namespace

HostPool::~HostPool() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* block : blocks) {
      std::free(block);
    }
  }
}

std::shared_ptr<void> HostPool::allocate(std::size_t nbytes) {
  CHORUS_CHECK_GT(nbytes, 0u);
  const std::size_t rounded = round_up(nbytes);
  void* block = nullptr;
  {
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    std::vector<void*>* blocks = bucket_locked(rounded);
    if (blocks != nullptr && !blocks->empty()) {
      block = blocks->back();
      blocks->pop_back();
      CHORUS_CHECK_GE(cached_bytes_, rounded);
      cached_bytes_ -= rounded;
    }
  }
  if (block == nullptr) {
    block = aligned_block(rounded);
  }
  std::shared_ptr<HostPool> self = shared_from_this();
  // The control block is recycled (Note [Recycled blocks]).
  return std::shared_ptr<void>(
      block, [self = std::move(self), rounded](void* p) { self->release(p, rounded); },
      transport::RecyclingAllocator<char>{});
}

void HostPool::release(void* block, std::size_t rounded_bytes) noexcept {
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
