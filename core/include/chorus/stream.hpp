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
// the rank sets another. The caller owns the stream and keeps it valid until the rank ends
// (chorus::run returned): a device block is freed in the order of the stream that was current
// when it was allocated, and a block a collective used is freed only once the transport saw
// the collective finish, which may be after the tensor and even the rank function are gone. Use
// a block on another stream only when that stream is ordered before the allocation stream's
// later work (PyTorch's record_stream rule). When the rank function returns, every device goes
// back to the legacy default stream: what the rank left pending is completed on it, then on the
// host.
//
// The setting belongs to the calling rank, not to a thread or the process: simulated ranks share
// a thread and each has its own. A wait uses the stream current when it runs (a result issued
// under one stream and waited under another orders the second), as torch's wait_tensor does.
// Transports without devices (the simulator's host ranks, MPI) and the simulator's CUDA devices
// ignore the stream; the simulator's stream waits are waits of the rank.

// The calling rank's current stream of `device` (null: the legacy default stream). Throws
// InvalidArgument outside a rank and for a device other than Device::cuda(i), 0 <= i < 1024.
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
