#pragma once

// Note [Device scopes]
// Core calls the transport's memory functions and NcclWork::wait_on on whatever thread drops a
// tensor or waits, and a communicator may be aborted or destroyed there too: a rank's own thread,
// the watchdog's, or a thread of the user's that never selected a device. Each such call selects
// its block's or communicator's device for its duration and then puts the thread's earlier
// selection back, but only where that creates no context. On a thread that never selected a
// device cudaGetDevice answers 0, and since CUDA 12 cudaSetDevice creates the device's primary
// context at once: putting "device 0" back would leave a context (hundreds of MiB) on GPU 0 in
// every process whose rank uses another GPU, the stray GPU 0 entries of nvidia-smi that PyTorch's
// device guards avoid the same way. So a scope puts the earlier device back only when that
// device's primary context is active already (cuDevicePrimaryCtxGetState, through the runtime's
// driver entry-point query: chorus does not link libcuda itself); otherwise the thread keeps the
// scope's device, whose context the call needed anyway (a later CUDA call of that thread that
// counted on the implicit device 0 then runs on the rank's device). When the driver cannot say,
// the earlier device is put back.

#include <optional>

namespace chorus::nccl::detail {

// Selects `device` on the calling thread for a scope (Note [Device scopes]).
class DeviceScope {
 public:
  explicit DeviceScope(int device) noexcept;
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_;
  int previous_ = -1;  // the thread's device before the scope; -1 if unknown
};

// Whether `device`'s primary context is active; nullopt if the driver cannot say.
std::optional<bool> primary_context_active(int device) noexcept;

}  // namespace chorus::nccl::detail
