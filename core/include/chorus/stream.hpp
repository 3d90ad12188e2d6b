#pragma once

// The calling rank's current stream per device (Note [Current stream]).

#include <memory>

#include "chorus/device.hpp"

namespace chorus {

namespace detail {
class CurrentStreams;
}

// Note [Current stream]
// Device work of a rank is ordered on the rank's *current stream* of that device, as PyTorch
// orders it on torch.cuda.current_stream(): a collective on CUDA tensors starts after the work
// already enqueued on it, a wait on a CUDA result makes it wait for the collective (no host
// block), and device allocations, copies and zeroing (Note [Device memory]) run in its order.
//
// A stream is the transport's handle, passed as `void*` so that no CUDA header reaches core (for
// CUDA a cudaStream_t). Null is the legacy default stream, every device's current stream until
// the rank sets another. The caller owns the stream: it must outlive the work ordered on it and
// the device memory allocated while it was current (a block is freed in the order of the stream
// it was allocated on, as in PyTorch's caching allocator; use it on other streams only when they
// are ordered before that stream's later work).
//
// The setting belongs to the calling rank, not to a thread or the process: simulated ranks share
// a thread and each has its own. A wait uses the stream current when it runs (a result issued
// under one stream and waited under another orders the second), as torch's wait_tensor does.
// Transports without devices (the simulator's host ranks, MPI) and the simulator's CUDA devices
// ignore the stream; the simulator's stream waits are waits of the rank.

// The calling rank's current stream of `device` (null: the legacy default stream). Throws
// InvalidArgument outside a rank and for a device other than Device::cuda(i).
void* current_stream(Device device);

// Makes `stream` (null: the legacy default stream) the calling rank's current stream of
// `device`. Throws as current_stream does.
void set_current_stream(Device device, void* stream);

// Makes `stream` the current stream of `device` for a scope, then restores the one before
// (torch.cuda.stream(s) as a context manager), on the rank that made the guard.
class StreamGuard {
 public:
  StreamGuard(Device device, void* stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

  void* previous() const noexcept { return previous_; }

 private:
  std::shared_ptr<detail::CurrentStreams> streams_;  // the rank's
  Device device_;
  void* previous_ = nullptr;
};

}  // namespace chorus
