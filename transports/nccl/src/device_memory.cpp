// chorus::nccl::cuda_device_memory — Device::cuda storages for a rank on the NCCL transport
// (Note [Device memory] in chorus/runtime.hpp; Note [CUDA device memory] below).

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "chorus/error.hpp"
#include "chorus/nccl/nccl.hpp"
#include "chorus/runtime.hpp"
#include "device_scope.hpp"
#include "nccl_transport.hpp"

namespace chorus::nccl {
namespace {

// Note [CUDA device memory]
// The NCCL transport orders every operation after the caller's work on the rank's current stream
// and a wait makes that stream wait on the operation's event (Note [NCCL work lifecycle]; Note
// [Current stream] in chorus/stream.hpp: the legacy default stream unless the rank set another).
// Memory follows the stream core passes with each call:
// - allocate: cudaMallocFromPoolAsync on it. Work enqueued later on it (and the NCCL operations,
//   which are ordered after it) may use the block.
// - free: cudaFreeAsync on the allocation's stream, on the block's device. A collective that still
//   writes the block holds it through its Work's keep-alive until the operation completed (core
//   keeps a stream-waited work until then: Note [Stream-waited works]), and a waited or
//   finalized collective has ordered the current stream after itself, so the free never
//   overtakes a collective. Work the caller enqueued on other streams must be ordered before
//   the allocation stream's later work (PyTorch's record_stream rule).
// - copy: cudaMemcpyAsync on it: after every collective waited before it. A copy to or from host
//   memory then synchronises the stream, so it returns once the host side may be read or reused
//   (blocking the host until the collectives waited before it finished, bounded by the watchdog,
//   which aborts a communicator whose operation outlives the timeout).
// - zero: cudaMemsetAsync on it; the host never waits.
// - blocks come from a pool of chorus's own (DevicePool) that keeps what is freed; a device
//   without stream-ordered pools gets TransportError at the first allocation (the staging of CPU
//   tensors needs cudaMallocAsync too).
// The deleter may run on any thread: it selects the block's device first and puts the thread's
// previous device back where that creates no context (Note [Device scopes]).

// chorus's own stream-ordered pool on one device: what is freed stays cached for the next
// allocation (release threshold: unlimited) without changing the device's default pool, which
// other code in the process shares. Destroyed when the last block and the DeviceMemory are gone
// (CUDA releases it once its outstanding frees completed).
class DevicePool {
 public:
  explicit DevicePool(int device) {
    const detail::DeviceScope scope(device);
    int supported = 0;
    if (const cudaError_t code =
            cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
        code != cudaSuccess || supported == 0) {
      problem_ = "cuda:" + std::to_string(device) +
                 " has no stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported " +
                 (code != cudaSuccess ? "query failed: " + detail::cuda_error_text(code)
                                      : std::string("is 0")) +
                 "); chorus allocates CUDA storage with cudaMallocFromPoolAsync";
      return;
    }
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    if (const cudaError_t code = cudaMemPoolCreate(&pool_, &props); code != cudaSuccess) {
      pool_ = nullptr;
      problem_ = "cudaMemPoolCreate on cuda:" + std::to_string(device) +
                 " failed: " + detail::cuda_error_text(code);
      return;
    }
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  ~DevicePool() {
    if (pool_ != nullptr) {
      cudaMemPoolDestroy(pool_);
    }
  }
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  cudaMemPool_t pool() const noexcept { return pool_; }
  // Why there is no pool ("" when there is one).
  const std::string& problem() const noexcept { return problem_; }

 private:
  cudaMemPool_t pool_ = nullptr;
  std::string problem_;
};

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device)
      : device_(device), pool_(std::make_shared<DevicePool>(device)) {}

  std::shared_ptr<void> allocate(Device device, std::size_t nbytes, void* stream) override {
    check_device(device, "allocate");
    if (pool_->pool() == nullptr) {
      throw TransportError(context("allocate"), "nccl: " + pool_->problem());
    }
    const detail::DeviceScope scope(device_);
    void* block = nullptr;
    if (const cudaError_t code =
            cudaMallocFromPoolAsync(&block, nbytes, pool_->pool(), detail::cuda_stream(stream));
        code != cudaSuccess) {
      throw TransportError(context("allocate"), "nccl: cudaMallocFromPoolAsync of " +
                                                    std::to_string(nbytes) + " bytes on " +
                                                    device.to_string() +
                                                    " failed: " + detail::cuda_error_text(code));
    }
    // The deleter keeps the pool alive; cudaFreeAsync never blocks the thread it runs on (the
    // watchdog's, when a finished operation lets go of its buffers). It frees in the order of the
    // allocation's stream (Note [Current stream]: the caller keeps that stream alive).
    return {block,
            [index = device_, pool = pool_, on = detail::cuda_stream(stream)](void* pointer) {
              const detail::DeviceScope free_scope(index);
              cudaFreeAsync(pointer, on);  // a failure here has nobody to tell
            }};
  }

  void zero(void* dst, Device device, std::size_t nbytes, void* stream) override {
    check_device(device, "zero");
    const detail::DeviceScope scope(device_);
    if (const cudaError_t code = cudaMemsetAsync(dst, 0, nbytes, detail::cuda_stream(stream));
        code != cudaSuccess) {
      throw TransportError(context("zero"), "nccl: cudaMemsetAsync of " + std::to_string(nbytes) +
                                                " bytes on " + device.to_string() +
                                                " failed: " + detail::cuda_error_text(code));
    }
  }

  // On the stream, after its earlier work. A copy to or from host memory synchronises the stream:
  // it returns once the host side may be read or reused (cudaMemcpy's behaviour, which a copy
  // from pinned memory would not have with cudaMemcpyAsync alone); one between device buffers may
  // still be in flight.
  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes,
            void* stream) override {
    if (dst_device.is_cuda()) {
      check_device(dst_device, "copy");
    }
    if (src_device.is_cuda()) {
      check_device(src_device, "copy");
    }
    const detail::DeviceScope scope(device_);
    const cudaStream_t on = detail::cuda_stream(stream);
    cudaError_t code = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, on);
    if (code == cudaSuccess && (dst_device.is_cpu() || src_device.is_cpu())) {
      code = cudaStreamSynchronize(on);
    }
    if (code != cudaSuccess) {
      throw TransportError(context("copy"), "nccl: cudaMemcpyAsync of " + std::to_string(nbytes) +
                                                " bytes from " + src_device.to_string() + " to " +
                                                dst_device.to_string() +
                                                " failed: " + detail::cuda_error_text(code));
    }
  }

 private:
  ErrorContext context(const char* what) const {
    return ErrorContext{-1, std::string("nccl device memory ") + what, -1, ""};
  }

  void check_device(Device device, const char* what) const {
    if (!device.is_cuda() || device.index() != device_) {
      throw InvalidArgument(context(what), "this rank's device is cuda:" + std::to_string(device_) +
                                               ", not " + device.to_string() +
                                               " (one rank uses one device)");
    }
  }

  int device_;
  std::shared_ptr<DevicePool> pool_;
};

}  // namespace

std::shared_ptr<DeviceMemory> cuda_device_memory(int device) {
  return std::make_shared<CudaDeviceMemory>(device);
}

}  // namespace chorus::nccl
