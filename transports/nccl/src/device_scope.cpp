// Note [Device scopes] (device_scope.hpp).

#include "device_scope.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace chorus::nccl::detail {
namespace {

// The two driver calls, looked up once through the runtime; null where the driver lacks them.
struct DriverCalls {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_context_state = nullptr;
};

template <typename Function>
Function driver_call(const char* symbol, unsigned int introduced_in) noexcept {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t code =
      cudaGetDriverEntryPointByVersion(symbol, &function, introduced_in, cudaEnableDefault, &found);
#else  // before CUDA 12.5: the runtime's own version picks the symbol's
  (void)introduced_in;
  const cudaError_t code = cudaGetDriverEntryPoint(symbol, &function, cudaEnableDefault, &found);
#endif
  if (code != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr) {
    return nullptr;
  }
  return reinterpret_cast<Function>(function);
}

const DriverCalls& driver_calls() noexcept {
  static const DriverCalls calls{
      driver_call<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000),
      driver_call<PFN_cuDevicePrimaryCtxGetState_v7000>("cuDevicePrimaryCtxGetState", 7000)};
  return calls;
}

}  // namespace

DeviceScope::DeviceScope(int device) noexcept : device_(device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    previous_ = -1;
  }
  if (previous_ != device) {
    cudaSetDevice(device);
  }
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && previous_ != device_ && primary_context_active(previous_).value_or(true)) {
    cudaSetDevice(previous_);
  }
}

std::optional<bool> primary_context_active(int device) noexcept {
  const DriverCalls& calls = driver_calls();
  if (calls.device_get == nullptr || calls.primary_context_state == nullptr) {
    return std::nullopt;
  }
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (calls.device_get(&handle, device) != CUDA_SUCCESS ||
      calls.primary_context_state(handle, &flags, &active) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return active != 0;
}

}  // namespace chorus::nccl::detail
