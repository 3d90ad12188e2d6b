#include "detail/storage.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/runtime.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/errors.hpp"
#include "detail/generations.hpp"
#include "detail/host_pool.hpp"
#include "detail/rank_state.hpp"
#include "detail/work_registry.hpp"

namespace chorus::detail {
namespace {

// Generations for storage identity, unique across every rank of a process (tensors travel
// between the ranks of a simulated world), handed out in batches (Note [Generations in batches]).
struct StorageGenerations {};

}  // namespace

// The calling rank's registry, or null outside a rank.
const WorkRegistry* calling_registry() noexcept {
  RankContext* context = RankContext::current();
  return context == nullptr ? nullptr : context->state().registry().get();
}

Storage::Storage(std::shared_ptr<void> memory, std::size_t nbytes, Device device)
    : generation_(next_generation<StorageGenerations>()),
      memory_(std::move(memory)),
      nbytes_(nbytes),
      device_(device),
      maker_(calling_registry()) {
  if (nbytes_ > 0 && !device_.is_meta()) {
    CHORUS_CHECK(memory_ != nullptr);
  }
}

Storage::~Storage() {
  if (is_pending()) {
    if (std::shared_ptr<WorkRegistry> registry = registry_.lock()) {
      registry->on_storage_dropped(*this);
    }
  }
}

void Storage::attach_registry(WorkRegistry& registry) noexcept {
  if (!registry_.expired()) {
    CHORUS_CHECK(attached_ == &registry);  // one live registry per storage: its maker's
    return;
  }
  registry_ = registry.weak_from_this();
  attached_ = &registry;
}

// Both under the registry's mutex: a load and a release store (Note [Serialized state word]).
void Storage::add_pending() noexcept {
  const std::uint32_t before = state_.load(std::memory_order_relaxed);
  CHORUS_CHECK_LT(before & kPendingMask, kPendingMask);
  state_.store(before + 1, std::memory_order_release);
}

void Storage::remove_pending() noexcept {
  const std::uint32_t before = state_.load(std::memory_order_relaxed);
  CHORUS_CHECK_GT(before & kPendingMask, 0u);
  state_.store(before - 1, std::memory_order_release);
}

void Storage::set_failure(std::exception_ptr error) noexcept {
  CHORUS_CHECK(error != nullptr);
  if (has_failed()) {
    return;  // the first failure stays
  }
  failure_ = std::move(error);
  // Note [Serialized state word]: under the registry's mutex, as every write of state_.
  state_.store(state_.load(std::memory_order_relaxed) | kFailedBit, std::memory_order_release);
}

void Storage::wait_ready_slow() const {
  try {
    if (is_pending()) {
      // Note [Atomic counts per operation]: on the rank that made this storage, its registry is
      // the rank's own, alive while the rank runs, and the only one the storage's works are
      // registered with (attach_registry), so it is used without locking registry_.
      RankContext* context = RankContext::current();
      WorkRegistry* own = context != nullptr ? context->state().registry().get() : nullptr;
      if (own != nullptr && own == maker_) {
        // Written by this rank's thread when it registered (a storage is registered only with its
        // maker's registry, Storage::made_by): core's own invariant, checked in debug builds only
        // (Note [Registration's own checks] in work_registry.cpp), at every wait of a pending
        // storage.
        CHORUS_DCHECK(attached_ == maker_);
        own->wait_storage(*this);
      } else {
        wait_through_weak_registry();
      }
    }
    if (has_failed()) {
      std::rethrow_exception(failure_);
    }
  } catch (...) {
    // Another rank's result: its failure is raised as this rank's own.
    std::rethrow_exception(raised_by_calling_rank(std::current_exception()));
  }
}

void Storage::wait_through_weak_registry() const {
  std::shared_ptr<WorkRegistry> registry = registry_.lock();
  // A pending storage has a live registry: the registry retires every work before its rank
  // state goes away (RankContext::finish).
  CHORUS_CHECK(registry != nullptr);
  registry->wait_storage(*this);
}

// The allocator of a pooled storage's control block: the room in its block's header (Note [A
// block's control block in its header], host_allocator.cpp).
template <class T>
using RoomAllocator =
    PlacedAllocator<T, HostPool::kRoomBytes, alignof(std::max_align_t), &HostPool::release_room>;

// The one place that decides where a host storage's bytes come from: no bytes for an empty one;
// inside a rank, its pool (the usual case) or the allocator its options name; outside a rank,
// plain heap memory.
std::shared_ptr<Storage> make_host_storage(std::size_t nbytes) {
  std::shared_ptr<void> block;
  if (nbytes > 0) {
    if (RankContext* context = RankContext::current()) {
      RankState& state = context->state();
      HostAllocator* allocator = state.options().host_allocator.get();
      if (allocator == nullptr) [[likely]] {
        // A block of the rank's pool, with the storage in its header (Note [A block's control block
        // in its header]): nothing between the two can throw, so the room is always filled.
        HostPool::BlockWithRoom pooled = HostPool::allocate_with_room(state.host_pool(), nbytes);
        return std::allocate_shared<Storage>(RoomAllocator<Storage>(pooled.room),
                                             std::move(pooled.block), nbytes, Device::cpu());
      }
      block = allocator->allocate(nbytes);
      CHORUS_CHECK(block != nullptr);
      CHORUS_CHECK_EQ(reinterpret_cast<std::uintptr_t>(block.get()) % HostAllocator::kAlignment,
                      0u);
    } else {
      block = allocate_unpooled(nbytes);
    }
  }
  return std::allocate_shared<Storage>(transport::RecyclingAllocator<Storage>{}, std::move(block),
                                       nbytes, Device::cpu());  // Note [Recycled blocks]
}

namespace {

// The calling rank, which has device memory (RankOptions::device_memory); InvalidArgument
// naming `op` when there is no rank or no device memory.
RankState& rank_with_device_memory(Device device, const char* op) {
  RankContext* context = RankContext::current();
  if (context == nullptr) {
    throw_invalid(op, "cannot use " + device.to_string() +
                          " memory outside a rank: device memory belongs to a rank's launcher "
                          "(wrap existing device memory with Tensor::from_blob)");
  }
  if (context->state().options().device_memory == nullptr) {
    throw_invalid(op, "rank " + std::to_string(context->rank()) + " on transport '" +
                          std::string(context->transport().name()) + "' has no memory for " +
                          device.to_string() +
                          " (RankOptions::device_memory; the NCCL launcher installs one): "
                          "wrap existing device memory with Tensor::from_blob");
  }
  return context->state();
}

}  // namespace

DeviceMemoryOnStream device_memory_for(Device device, const char* op) {
  RankState& state = rank_with_device_memory(device, op);
  return {*state.options().device_memory, state.stream_of(device)};
}

std::shared_ptr<Storage> make_storage(std::size_t nbytes, Device device, const char* op) {
  CHORUS_DCHECK(!device.is_meta());  // its one caller, empty_laid_out, takes no meta device
  if (device.is_cpu()) {
    return make_host_storage(nbytes);
  }
  std::shared_ptr<void> memory;
  if (nbytes > 0) {
    RankState& state = rank_with_device_memory(device, op);
    std::shared_ptr<void> block =
        state.options().device_memory->allocate(device, nbytes, state.stream_of(device));
    CHORUS_CHECK(block != nullptr);
    // Counted until the block is given back (chorus::device_memory_allocated).
    state.device_bytes()->fetch_add(nbytes, std::memory_order_relaxed);
    void* data = block.get();
    memory = std::shared_ptr<void>(
        data, [block = std::move(block), bytes = state.device_bytes(), nbytes](void*) mutable {
          block.reset();
          bytes->fetch_sub(nbytes, std::memory_order_relaxed);
        });
  }
  return std::allocate_shared<Storage>(transport::RecyclingAllocator<Storage>{}, std::move(memory),
                                       nbytes, device);
}

}  // namespace chorus::detail
