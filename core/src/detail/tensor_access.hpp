#pragma once

// Core-internal access to a Tensor's representation, for the collectives and the registry.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "chorus/tensor.hpp"
#include "detail/storage.hpp"

namespace chorus::detail {

struct TensorAccess {
  static const std::shared_ptr<Storage>& storage(const Tensor& tensor) noexcept {
    return tensor.storage_;
  }
  // The tensor's layout, shared by its copies and views of the same shape (null when undefined or
  // moved from).
  static const std::shared_ptr<const TensorLayout>& layout(const Tensor& tensor) noexcept {
    return tensor.layout_;
  }
  static Tensor make(std::shared_ptr<Storage> storage, Shape sizes, Shape strides,
                     std::int64_t offset, DType dtype, Device device) {
    return Tensor(std::move(storage), std::move(sizes), std::move(strides), offset, dtype, device);
  }
  // Tensor::empty without a copy of `shape`: a contiguous layout of that shape is reused when
  // one was made recently (Note [Shared layouts]).
  static Tensor empty(const Shape& shape, DType dtype, Device device);
  // empty(like.sizes(), like.dtype(), like.device()), sharing `like`'s layout when its strides
  // are the contiguous ones (Note [Shared layouts]): a collective's output shaped as its input
  // (all_reduce) finds its layout without the cache's search.
  static Tensor empty_like(const Tensor& like);
  // empty_like(like) from what the caller already knows of `like`'s layout:
  // `contiguous_strides` is has_contiguous_strides(like.sizes(), like.strides()) and `nbytes` is
  // like.nbytes() (Note [Remembered layout facts] in collectives.cpp).
  static Tensor empty_like(const Tensor& like, bool contiguous_strides, std::size_t nbytes);

 private:
  // The tail of both: a tensor of fresh storage of `nbytes` on `device` (not meta), laid out as
  // `layout`. Throws InvalidArgument for a negative device index. The layout by reference: it is
  // copied once, into the tensor (a by-value parameter was copied at empty_like's call site too,
  // through libstdc++'s out-of-line __shared_count copy, ~100 instructions a schedule).
  static Tensor empty_laid_out(std::size_t nbytes,
                               const std::shared_ptr<const TensorLayout>& layout, DType dtype,
                               Device device);
};

enum class DeviceAccess : std::uint8_t {
  Host,           // the caller reads or writes the bytes on the host: CPU tensors only
  OrderedByWait,  // the caller only needs the bytes ready for the tensor's device (CUDA too)
};

// THE choke point (Note [Pending storage]): pointer to the first element of `tensor` (null when
// it has no bytes), after waiting for every collective pending on its storage and rethrowing a
// failed one's error. Throws InvalidArgument naming `op` for undefined and meta tensors, and for
// CUDA tensors under DeviceAccess::Host. Every data access of a Tensor goes through here.
std::byte* access_data(const Tensor& tensor, const char* op, DeviceAccess access);

// Row-major strides of `sizes` (in elements), a size-0 dim counting as size 1 (as PyTorch's), or
// nullopt when the product of max(size, 1) over all dims does not fit in an int64
// (Note [Addressable layouts] in tensor.cpp). Never throws but std::bad_alloc.
std::optional<Shape> checked_contiguous_strides(const Shape& sizes);

// checked_contiguous_strides for a shape known to fit (CHORUS_CHECKed): that of an existing
// tensor, or one that passed checked_contiguous_strides.
Shape contiguous_strides(const Shape& sizes);

// Whether `strides` (as many as `sizes`) are exactly checked_contiguous_strides(sizes), a size-1
// dim's too, without building them; false where that product overflows.
bool has_contiguous_strides(const Shape& sizes, const Shape& strides) noexcept;

// The alignment, in bytes, of one element of `dtype` (alignof its C++ type): a tensor with
// elements starts at a multiple of it (Note [Addressable layouts]).
std::size_t element_alignment(DType dtype) noexcept;

// Product of `sizes` (1 for a 0-d shape).
std::int64_t shape_numel(const Shape& sizes);

// `dim` normalised to [0, ndim) (negative counts from the end). For an op that inserts a
// dimension, pass ndim + 1. Throws InvalidArgument naming `op` when out of range.
std::int64_t normalize_dim(std::int64_t dim, std::int64_t ndim, const char* op);

// "[2, 3]".
std::string shape_to_string(const Shape& sizes);

}  // namespace chorus::detail
