#pragma once

// The per-rank runtime, for launchers and transports (users do not need this header).
//
// A RankContext is everything chorus keeps per rank: the transport endpoint, the communicators,
// the work registry, the pooled host allocator, the unwaited-work report and deferred errors.
// Nothing in core is global that should be per rank: core reaches "the calling rank" only through
// RankContext::current(), which the launcher binds for the thread (or fiber) running the rank.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "chorus/call_site.hpp"
#include "chorus/device.hpp"

namespace chorus {

namespace transport {
class Transport;
}

namespace detail {
class RankState;
}

// A collective that was never waited: its result's last tensor died first (the work was completed
// then, as the seed's finalizer does), or it was still pending when its rank ended.
struct UnwaitedWork {
  int rank = -1;
  std::string op;
  std::int64_t seq = -1;
  std::string group;
  CallSite location;
  bool at_rank_exit = false;  // not dropped: its result was alive when the rank's exit completed it
  std::string error;          // non-empty if completing it failed

  // "rank 2: all_reduce #3 on group [0, 1] issued at a.cpp:12 (f) was dropped un-waited".
  std::string to_string() const;
};

// Where a rank's CPU tensor storages come from (Tensor's factories and collective outputs). By
// default a rank keeps a pool of freed blocks (RankOptions::host_pool_bytes_max); a launcher may
// install its own, as the simulator does to control address reuse (docs/simulator-alloc.md).
//
// Thread-safety: allocate() is called only on the rank's own thread/fiber; the returned deleter
// may run on any thread, also after the rank ended, so it must keep what it needs alive.
class HostAllocator {
 public:
  // Every block is aligned to at least this many bytes (kernels and DLPack rely on it).
  static constexpr std::size_t kAlignment = 64;

  virtual ~HostAllocator() = default;
  // At least `nbytes` (> 0) bytes, aligned to kAlignment; the shared_ptr's deleter gives them
  // back. Never null; throws std::bad_alloc when out of memory.
  virtual std::shared_ptr<void> allocate(std::size_t nbytes) = 0;
};

// Note [Device memory]
// Where a rank's Device::cuda storages come from. Core has no device kernels and includes no CUDA
// header: it asks this interface for memory and for contiguous copies, nothing else. A launcher
// whose transport has devices installs one (RankOptions::device_memory; the NCCL launcher does);
// without one, allocating a device tensor throws InvalidArgument.
//
// Ordering follows the rank's *current stream* of the device, which core passes to every call as
// `stream` (Note [Current stream] in chorus/stream.hpp; null: the legacy default stream): memory
// returned by allocate() is usable by work enqueued on it after the call, and its deleter frees it
// in that stream's order (the stream stays valid until the rank ended: the deleter may run late);
// copy() and zero() run after work enqueued on it before them. A copy from host memory may block
// the host until that earlier work finished (CUDA stages pageable memory that way); zero() never
// does. A wait on a device tensor orders that stream after the collective (Work::wait_on) instead
// of blocking the host, so a copy to the host that follows the wait sees the collective's result.
//
// Thread-safety: allocate() and copy() are called on the rank's own thread/fiber; the deleter of a
// block may run on any thread, also after the rank ended, so it must keep what it needs alive.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // At least `nbytes` (> 0) bytes on `device`, aligned to HostAllocator::kAlignment at least; the
  // shared_ptr's deleter frees them in `stream`'s order. Never null. Throws InvalidArgument for a
  // device this rank cannot use, TransportError (or std::bad_alloc) when allocation fails.
  virtual std::shared_ptr<void> allocate(Device device, std::size_t nbytes, void* stream) = 0;
  // Copies `nbytes` contiguous bytes from `src` (on `src_device`) to `dst` (on `dst_device`);
  // either side may be Device::cpu(). Returns once `dst` may be read on the host when it is host
  // memory, and once `src` may be reused when it is host memory; a copy between device buffers
  // may still be in flight on the stream. Throws TransportError when the device reports an
  // error.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device,
                    std::size_t nbytes, void* stream) = 0;
  // Sets `nbytes` bytes at `dst` (on `device`) to zero, in stream order, without blocking the
  // host (all-zero bytes are zero in every dtype: Tensor::zeros). Throws as copy() does.
  virtual void zero(void* dst, Device device, std::size_t nbytes, void* stream) = 0;
};

struct RankOptions {
  // How long a wait may take before it throws Timeout (on the transport's clock).
  std::chrono::nanoseconds timeout = std::chrono::minutes(10);
  // Bytes of freed host storage a rank keeps for reuse (the default allocator's pool).
  std::size_t host_pool_bytes_max = std::size_t{64} << 20;
  // The rank's host allocator; null: the pooled default above. Shared: it may outlive the rank
  // (its blocks' deleters may hold it).
  std::shared_ptr<HostAllocator> host_allocator;
  // The rank's device memory (Note [Device memory]); null: Device::cuda storages cannot be
  // allocated (from_blob and from_dlpack still wrap existing device memory).
  std::shared_ptr<DeviceMemory> device_memory;
};

class RankContext {
 public:
  RankContext(std::shared_ptr<transport::Transport> transport, RankOptions options = {});
  ~RankContext();
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  int rank() const noexcept;
  int world_size() const noexcept;
  transport::Transport& transport() noexcept;

  // What a rank leaves behind.
  struct Summary {
    std::vector<UnwaitedWork> unwaited;
    // The first error recorded while completing dropped or leftover works that the rank has
    // not raised yet (DESIGN 2.4: raised "at the end of run"); null if none.
    std::exception_ptr error;
  };

  // Whether the works this rank drops un-waited from now on get a line in its unwaited report
  // (Summary::unwaited, which the launchers print): on by default. Code that drops results on
  // purpose, to exercise the drop path, turns it off meanwhile: the lockstep property runner does
  // while a property runs (props::check_in_lockstep), as the simulator runner never prints its
  // runs' reports. The drops are completed as ever, a failure completing one is still raised
  // (deferred error), and works still pending when the rank ends are listed either way. A drop
  // whose completion is deferred (made while an exception unwinds, or deferred by the transport)
  // is listed as the setting was when it was dropped, not when it is completed. Returns the
  // previous setting. Call on the rank's own thread/fiber. Never throws.
  bool list_drops(bool on) noexcept;

  // Ends the rank: completes every work still registered (recording each as unwaited: a dropped
  // one as a drop, the others at exit) and returns the report. Never throws. Call once, on the
  // rank's own thread/fiber, after the rank function returned or threw, while the transport can
  // still make progress.
  Summary finish() noexcept;

  // The context bound to the calling thread/fiber, or null outside a rank.
  static RankContext* current() noexcept;
  // Binds `context` to the calling thread (fiber executors call this at every switch). Returns
  // the previous binding.
  static RankContext* bind(RankContext* context) noexcept;

  detail::RankState& state() noexcept { return *state_; }

 private:
  std::unique_ptr<detail::RankState> state_;
};

// Binds a RankContext to the current thread for a scope.
class ScopedRankBinding {
 public:
  explicit ScopedRankBinding(RankContext* context) noexcept
      : previous_(RankContext::bind(context)) {}
  ~ScopedRankBinding() { RankContext::bind(previous_); }
  ScopedRankBinding(const ScopedRankBinding&) = delete;
  ScopedRankBinding& operator=(const ScopedRankBinding&) = delete;

 private:
  RankContext* previous_;
};

}  // namespace chorus
