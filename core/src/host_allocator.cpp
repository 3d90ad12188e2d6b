#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>

#include "chorus/check.hpp"
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
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_blocks_.find(rounded);
    if (it != free_blocks_.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      CHORUS_CHECK_GE(cached_bytes_, rounded);
      cached_bytes_ -= rounded;
    }
  }
  if (block == nullptr) {
    block = aligned_block(rounded);
  }
  std::shared_ptr<HostPool> self = shared_from_this();
  return std::shared_ptr<void>(
      block, [self = std::move(self), rounded](void* p) { self->release(p, rounded); });
}

void HostPool::release(void* block, std::size_t rounded_bytes) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_bytes_ + rounded_bytes <= cached_bytes_max_) {
      try {
        free_blocks_[rounded_bytes].push_back(block);
        cached_bytes_ += rounded_bytes;
        return;
      } catch (...) {
        // Out of memory for the free list: fall through and free the block.
      }
    }
  }
  std::free(block);
}

std::size_t HostPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

std::shared_ptr<void> allocate_unpooled(std::size_t nbytes) {
  CHORUS_CHECK_GT(nbytes, 0u);
  return std::shared_ptr<void>(aligned_block(round_up(nbytes)), [](void* p) { std::free(p); });
}

}  // namespace chorus::detail
