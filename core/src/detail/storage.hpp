#pragma once

// Note [Pending storage]
// A collective's output storage is *pending* from issue until its work is waited. The Storage
// holds a small atomic state word: the number of pending works registered under it, plus a
// "failed" bit. Every host data access of a Tensor goes through one choke point,
// Storage::wait_ready(): when the state word is 0 (the common case) it costs one acquire load;
// otherwise it asks the rank's WorkRegistry to wait for the works of this storage (see
// Note [Work lifecycle] in work_registry.hpp), then rethrows the failure if a work failed.
// Views share the Storage, so they see the same state without ever waiting on creation.
//
// Memory is owned by a shared_ptr<void> whose deleter frees (or returns to a pool) the block. A
// transport holds a copy of it (Buffer::keep_alive) until its operation completes, so memory a
// collective still writes is never freed under it, even when every Tensor is gone.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "chorus/device.hpp"
#include "detail/stamped_links.hpp"

namespace chorus {
class DeviceMemory;
}

namespace chorus::detail {

class PendingWork;
class WorkRegistry;

class Storage {
 public:
  // `memory` owns `nbytes` bytes at memory.get() (null when nbytes == 0) on `device`.
  Storage(std::shared_ptr<void> memory, std::size_t nbytes, Device device);
  // Dropping a pending storage completes its works first (Note [Work lifecycle]). Never throws.
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // A generation from a process-wide counter, never reused: the registry stamps its links with
  // it (Note [Registry links]), so a storage at a recycled address is never taken for an old one.
  std::uint64_t generation() const noexcept { return generation_; }
  void* data() const noexcept { return memory_.get(); }
  std::size_t nbytes() const noexcept { return nbytes_; }
  Device device() const noexcept { return device_; }
  const std::shared_ptr<void>& memory() const noexcept { return memory_; }

  // The choke point. Waits for pending works and rethrows a failed work's error.
  void wait_ready() const {
    if (state_.load(std::memory_order_acquire) != 0) [[unlikely]] {
      wait_ready_slow();
    }
  }
  bool is_pending() const noexcept {
    return (state_.load(std::memory_order_acquire) & kPendingMask) != 0;
  }
  bool has_failed() const noexcept {
    return (state_.load(std::memory_order_acquire) & kFailedBit) != 0;
  }

  // Whether the rank whose registry is `registry` made this storage (a storage made outside a
  // rank was made by none). Tensors travel between ranks of one process; only the maker
  // registers works under a storage, so two ranks never link works to one storage (each
  // registry guards its links with its own mutex), and a rank never has to take over a storage
  // another rank's collective may be about to write (Note [Pending storage]).
  bool made_by(const WorkRegistry* registry) const noexcept {
    return maker_ != nullptr && maker_ == registry;
  }

  // The registry this storage's works are registered with; null if never registered or gone.
  std::shared_ptr<WorkRegistry> registry() const noexcept { return registry_.lock(); }

  // ---- For WorkRegistry, under its lock (state_'s writers: Note [Serialized state word]).
  // A storage is registered only with the registry of the rank that made it (outputs are fresh
  // storages made by the collective that registers them; all_reduce_inplace registers the
  // caller's storage only when the caller made it, made_by). Takes `registry`'s
  // weak_from_this() only when it attaches (Note [Atomic counts per operation]).
  void attach_registry(WorkRegistry& registry) noexcept;
  void add_pending() noexcept;
  void remove_pending() noexcept;
  // Marks the storage failed; data access rethrows `error` from then on.
  void set_failure(std::exception_ptr error) noexcept;

 private:
  friend class WorkRegistry;

  static constexpr std::uint32_t kFailedBit = 0x8000'0000u;
  static constexpr std::uint32_t kPendingMask = 0x7fff'ffffu;

  void wait_ready_slow() const;
  // wait_ready_slow's wait from a thread other than the maker's rank: through registry_.
  void wait_through_weak_registry() const;

  std::uint64_t generation_;
  std::shared_ptr<void> memory_;
  std::size_t nbytes_;
  Device device_;
  // The registry of the rank that made it (null: made outside a rank). Compared, never followed:
  // the address of a registry gone may be reused by a later rank's, which then counts as the
  // maker, harmlessly, since the storage's own registry_ has expired.
  const WorkRegistry* maker_;
  // Note [Serialized state word]
  // state_ is written only by add_pending, remove_pending and set_failure, under the mutex of the
  // one registry the storage's works are registered with (attach_registry), and read anywhere. The
  // writers being serialized, each write is a relaxed load and a release store, not a
  // read-modify-write: in a process that ever had a second thread a read-modify-write is a locked
  // instruction (Note [Atomic counts per operation]), two per operation here. A reader's acquire
  // load still sees every value whole, and the release store of a count that drops publishes the
  // work's results (and a failure_ written before it).
  std::atomic<std::uint32_t> state_{0};
  std::weak_ptr<WorkRegistry> registry_;    // set before the storage's first work is listed
  const WorkRegistry* attached_ = nullptr;  // registry_'s target, for the check in attach
  std::exception_ptr failure_;              // written before kFailedBit is published
  // The works pending on this storage, in issue order (Note [Registry links]). Guarded by the
  // registry's mutex; mutable because waits and drops reach the registry with a const Storage.
  mutable StampedLinks<PendingWork> works_;
};

// A storage of `nbytes` uninitialised host bytes, 64-byte aligned: from the calling rank's pool, or
// its RankOptions::host_allocator when set; plain heap memory outside a rank.
std::shared_ptr<Storage> make_host_storage(std::size_t nbytes);

// The calling rank's device memory (Note [Device memory]) and its current stream of `device`
// (Note [Current stream]), which orders what it does there.
struct DeviceMemoryOnStream {
  DeviceMemory& memory;
  void* stream;
};
// InvalidArgument naming `op` and `device` when there is no device memory (outside a rank, or a
// rank whose launcher installed none).
DeviceMemoryOnStream device_memory_for(Device device, const char* op);

// A storage of `nbytes` uninitialised bytes on `device` (CPU or CUDA; not meta). CUDA bytes come
// from the calling rank's device memory; see device_memory_for for the errors.
std::shared_ptr<Storage> make_storage(std::size_t nbytes, Device device, const char* op);

}  // namespace chorus::detail
