// DLPack 0.6 exchange (DLManagedTensor), zero-copy both ways.
//
// Export hands out a DLManagedTensor whose manager_ctx owns a Tensor copy, so the storage (and
// the memory under it) stays alive until the consumer calls the deleter. Import wraps the
// producer's memory in a Storage whose memory deleter calls the producer's deleter, so it runs
// once, when the last chorus tensor (and any transport still using the memory) lets go.
//
// dtypes: DLPack 0.6 has no boolean code, so Bool is exported as kDLUInt/8 (bytes 0 or 1) and
// kDLUInt/8 always imports as UInt8.

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/tensor.hpp"
#include "detail/errors.hpp"
#include "detail/storage.hpp"
#include "detail/tensor_access.hpp"

namespace chorus {
namespace {

using detail::shape_to_string;
using detail::throw_invalid;

DLDataType to_dl_dtype(DType dtype) {
  const auto bits = static_cast<std::uint8_t>(element_size(dtype) * 8);
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8:
      return DLDataType{kDLUInt, bits, 1};
    case DType::Int8:
    case DType::Int32:
    case DType::Int64:
      return DLDataType{kDLInt, bits, 1};
    case DType::Float16:
    case DType::Float32:
    case DType::Float64:
      return DLDataType{kDLFloat, bits, 1};
    case DType::BFloat16:
      return DLDataType{kDLBfloat, bits, 1};
    case DType::Complex64:
    case DType::Complex128:
      return DLDataType{kDLComplex, bits, 1};
  }
  CHORUS_CHECK(false && "unknown dtype");
  return DLDataType{};
}

std::optional<DType> from_dl_dtype(DLDataType dtype) {
  if (dtype.lanes != 1) {
    return std::nullopt;
  }
  switch (dtype.code) {
    case kDLUInt:
      return dtype.bits == 8 ? std::optional(DType::UInt8) : std::nullopt;
    case kDLInt:
      switch (dtype.bits) {
        case 8:
          return DType::Int8;
        case 32:
          return DType::Int32;
        case 64:
          return DType::Int64;
        default:
          return std::nullopt;
      }
    case kDLFloat:
      switch (dtype.bits) {
        case 16:
          return DType::Float16;
        case 32:
          return DType::Float32;
        case 64:
          return DType::Float64;
        default:
          return std::nullopt;
      }
    case kDLBfloat:
      return dtype.bits == 16 ? std::optional(DType::BFloat16) : std::nullopt;
    case kDLComplex:
      switch (dtype.bits) {
        case 64:
          return DType::Complex64;
        case 128:
          return DType::Complex128;
        default:
          return std::nullopt;
      }
    default:
      return std::nullopt;
  }
}

std::string dl_dtype_to_string(DLDataType dtype) {
  return "(code " + std::to_string(dtype.code) + ", bits " + std::to_string(dtype.bits) +
         ", lanes " + std::to_string(dtype.lanes) + ")";
}

// What an exported DLManagedTensor owns: the tensor (hence its storage) and the shape and stride
// arrays its DLTensor points into.
struct ExportContext {
  Tensor tensor;
  Shape shape;
  Shape strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) noexcept {
  if (self != nullptr) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  }
}

// The deleter of an imported tensor's memory: hands `managed` back to its producer (calls its
// deleter) once the import owns it, and does nothing while `managed` is null (an import that
// failed to allocate: the caller still owns it).
struct ProducerRelease {
  DLManagedTensor* managed = nullptr;

  void operator()(void* /*first*/) const noexcept {
    if (managed != nullptr && managed->deleter != nullptr) {
      managed->deleter(managed);
    }
  }
};

}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  constexpr const char* kOp = "Tensor::to_dlpack";
  // The choke point; CUDA tensors export too (for them the wait orders the caller's stream).
  (void)detail::access_data(*this, kOp, detail::DeviceAccess::OrderedByWait);

  auto context = std::make_unique<ExportContext>();
  context->tensor = *this;
  context->shape = layout().sizes;
  context->strides = layout().strides;
  DLTensor& dl = context->managed.dl_tensor;
  // The first element itself, byte_offset 0, as PyTorch exports: some consumers ignore
  // byte_offset.
  dl.data = unsafe_data_ptr();
  dl.device = device_.is_cuda() ? DLDevice{kDLCUDA, device_.index()} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(layout().sizes.size());
  dl.dtype = to_dl_dtype(dtype_);
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  dl.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = &delete_export;
  return &context.release()->managed;
}

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  constexpr const char* kOp = "Tensor::from_dlpack";
  // Every check comes before ownership is taken: when this throws, `managed` still belongs to
  // the caller (its deleter has not run).
  if (managed == nullptr) {
    throw_invalid(kOp, "managed tensor is null");
  }
  const DLTensor& dl = managed->dl_tensor;
  const std::optional<DType> dtype = from_dl_dtype(dl.dtype);
  if (!dtype) {
    throw_invalid(kOp, "unsupported DLPack dtype " + dl_dtype_to_string(dl.dtype));
  }
  Device device;
  if (dl.device.device_type == kDLCPU) {
    device = Device::cpu();
  } else if (dl.device.device_type == kDLCUDA && dl.device.device_id >= 0) {
    device = Device::cuda(dl.device.device_id);
  } else {
    throw_invalid(kOp, "unsupported DLPack device (type " +
                           std::to_string(static_cast<int>(dl.device.device_type)) + ", id " +
                           std::to_string(dl.device.device_id) + "): expected kDLCPU or kDLCUDA");
  }
  if (dl.ndim < 0 || (dl.ndim > 0 && dl.shape == nullptr)) {
    throw_invalid(kOp, "invalid ndim " + std::to_string(dl.ndim) + " or missing shape");
  }
  const auto ndim = static_cast<std::size_t>(dl.ndim);
  Shape sizes(dl.shape, dl.shape + ndim);
  // Null strides mean row-major. Those of an empty shape may not fit in an int64 (as for
  // Tensor::empty); negative sizes count as 1 here and are rejected below.
  std::optional<Shape> strides = dl.strides == nullptr
                                     ? detail::checked_contiguous_strides(sizes)
                                     : std::optional(Shape(dl.strides, dl.strides + ndim));
  const std::string layout_text = "shape " + shape_to_string(sizes) + " with strides " +
                                  (strides ? shape_to_string(*strides) : "(row-major)");
  for (std::size_t i = 0; i < ndim; ++i) {
    if (sizes[i] < 0 || (strides && (*strides)[i] < 0)) {
      throw_invalid(kOp, layout_text + " is not supported (sizes and strides must be >= 0)");
    }
  }
  if (!strides) {
    throw_invalid(kOp, layout_text + " is too large to address");
  }
  // Note [Addressable layouts] (tensor.cpp), for a layout chorus did not make: numel() *
  // element_size() fits (nbytes() must not wrap, even with stride-0 dims that make numel far
  // larger than the span), so does the product of max(size, 1) (an empty import with stride-0
  // dims can have any sizes), size * stride fits in every dim, and so do the bytes the view
  // spans from its first element, 1 + sum((size - 1) * stride) elements.
  const auto element_bytes = static_cast<std::int64_t>(chorus::element_size(*dtype));
  std::int64_t numel = 1;
  std::int64_t padded_numel = 1;
  std::int64_t last = 0;
  bool overflow = false;
  for (std::size_t i = 0; i < ndim; ++i) {
    std::int64_t extent = 0;
    overflow =
        overflow || __builtin_mul_overflow(numel, sizes[i], &numel) ||
        __builtin_mul_overflow(padded_numel, std::max<std::int64_t>(sizes[i], 1), &padded_numel) ||
        __builtin_mul_overflow(sizes[i], (*strides)[i], &extent) ||
        // (size - 1) * stride <= extent, so only the sum can overflow.
        (sizes[i] > 0 && __builtin_add_overflow(last, extent - (*strides)[i], &last));
  }
  std::int64_t numel_bytes = 0;
  std::int64_t span_elements = 0;
  std::int64_t span_bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, element_bytes, &numel_bytes) ||
             __builtin_add_overflow(last, 1, &span_elements) ||
             __builtin_mul_overflow(span_elements, element_bytes, &span_bytes);
  constexpr std::int64_t kBytesMax = std::numeric_limits<std::ptrdiff_t>::max();
  if (overflow || numel_bytes > kBytesMax || span_bytes > kBytesMax) {
    throw_invalid(kOp, layout_text + " is too large to address");
  }
  const std::size_t nbytes = numel == 0 ? 0 : static_cast<std::size_t>(span_bytes);
  if (dl.data == nullptr && nbytes > 0) {
    throw_invalid(kOp, "data is null but shape " + shape_to_string(sizes) + " is not empty");
  }
  if (nbytes > 0) {
    // The kernels read elements through typed pointers, which is undefined behaviour at a
    // misaligned address, so the first element must be aligned for its type (hence every
    // element: strides count whole elements). DLPack 0.6 promises a 256-byte aligned `data`,
    // which producers do not all keep (not checked), and says nothing of byte_offset; PyTorch's
    // import checks neither.
    const auto address = reinterpret_cast<std::uintptr_t>(dl.data);
    std::uintptr_t first_address = 0;
    if (__builtin_add_overflow(address, dl.byte_offset, &first_address) ||
        dl.byte_offset > static_cast<std::uint64_t>(kBytesMax)) {
      throw_invalid(kOp,
                    "byte_offset " + std::to_string(dl.byte_offset) + " is too large to address");
    }
    if (const std::size_t alignment = detail::element_alignment(*dtype);
        first_address % alignment != 0) {
      throw_invalid(kOp, "data + byte_offset " + std::to_string(dl.byte_offset) +
                             " is not aligned for " + std::string(dtype_name(*dtype)) + " (" +
                             std::to_string(alignment) + "-byte alignment needed)");
    }
  }

  // The storage starts at the first element, so byte_offset need not be a multiple of the
  // element size (only of its alignment: Complex64 at byte_offset 4). An empty view owns no bytes
  // (Storage wants null memory then), but the producer's deleter still runs.
  void* first = nbytes == 0 ? nullptr : static_cast<std::byte*>(dl.data) + dl.byte_offset;
  // Ownership is taken last: the allocations below may throw std::bad_alloc, and `managed` must
  // then still be the caller's, its deleter not run. So the memory's deleter does nothing until
  // armed, once nothing is left to allocate (a shared_ptr whose control block cannot be
  // allocated calls its deleter, as does the last owner of a half-made tensor).
  std::shared_ptr<void> memory(first, ProducerRelease{});
  auto storage = std::make_shared<detail::Storage>(memory, nbytes, device);
  Tensor tensor = detail::TensorAccess::make(std::move(storage), std::move(sizes),
                                             std::move(*strides), 0, *dtype, device);
  std::get_deleter<ProducerRelease>(memory)->managed = managed;  // from here on, chorus owns it
  return tensor;
}

}  // namespace chorus
