#pragma once

// chorus::Tensor: a strided view of shared storage, whose storage may be *pending* while a
// collective still writes into it. See Note [Pending storage] in core/src/detail/storage.hpp.
//
// Thread-safety: a Tensor is a value; distinct Tensor objects may be used from distinct threads
// even when they share storage. Mutating one Tensor object (assignment, copy_) from two threads
// at once is a data race, as for any value type. Waiting on pending storage is thread-safe.

#include <complex>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/device.hpp"
#include "chorus/dtype.hpp"

struct DLManagedTensor;  // <dlpack/dlpack.h>; include it to use to_dlpack/from_dlpack

namespace chorus {

using Shape = std::vector<std::int64_t>;

namespace detail {
class Storage;
struct TensorAccess;

// A tensor's sizes and strides, immutable once made and shared by every tensor that has the
// same ones (Note [Shared layouts] in tensor.cpp): copying a tensor copies no vectors.
struct TensorLayout {
  Shape sizes;
  Shape strides;  // in elements
};
// The layout of an undefined tensor.
inline const TensorLayout kEmptyTensorLayout{};
}  // namespace detail

class Tensor {
 public:
  // An undefined tensor: no storage, dim() == 0, numel() == 0; any data access throws.
  Tensor() noexcept;
  Tensor(const Tensor&) = default;
  Tensor& operator=(const Tensor&) = default;
  // A moved-from tensor is undefined (defined() false, and any use throws InvalidArgument "the
  // tensor is undefined"), as a moved-from at::Tensor is.
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() = default;

  // ---- Factories. CPU storage comes from the calling rank's pooled allocator (plain heap
  // memory outside a rank). Device::meta() makes a storage-less tensor. Device::cuda() storage
  // comes from the rank's device memory (RankOptions::device_memory, which the NCCL launcher
  // installs; without it InvalidArgument, and from_blob wraps existing device memory instead);
  // zeros/ones/full fill on the host and copy. Negative sizes throw InvalidArgument.
  static Tensor empty(Shape shape, DType dtype = DType::Float32, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype = DType::Float32, Device device = Device::cpu());
  static Tensor ones(Shape shape, DType dtype = DType::Float32, Device device = Device::cpu());
  // `value` is converted to `dtype` (rounded to nearest even for 16-bit floats, truncated toward
  // zero for integers, != 0 for Bool; complex dtypes get a zero imaginary part). A value outside
  // an integer dtype's range after truncation, and NaN, become 0 (where a C++ cast would be
  // undefined behaviour): full({1}, 300, UInt8) and full({1}, -1, UInt8) hold 0.
  static Tensor full(Shape shape, double value, DType dtype = DType::Float32,
                     Device device = Device::cpu());
  // 0, 1, ..., n-1 as a 1-D tensor.
  static Tensor arange(std::int64_t n, DType dtype = DType::Float32);

  // Copies `values` into a new CPU tensor of dtype `dtype_of<T>`. `shape` defaults to
  // {values.size()}; its element count must equal values.size() (else InvalidArgument).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values);

  // Wraps caller memory without copying: a contiguous tensor of `shape` at `data`, which must be
  // aligned for `dtype` (a multiple of alignof its C++ type) unless the shape is empty. `deleter`
  // (if any) runs once, when the last tensor using this memory dies and no collective still
  // uses it. The caller keeps `data` valid until then. Throws InvalidArgument (bad arguments) or
  // std::bad_alloc; either way the deleter has not run and the memory stays the caller's.
  static Tensor from_blob(void* data, Shape shape, DType dtype, Device device = Device::cpu(),
                          std::function<void(void*)> deleter = {});

  // ---- DLPack (zero-copy exchange with PyTorch, JAX, CuPy).
  // Waits for pending work first. The returned DLManagedTensor keeps the storage alive until
  // its deleter is called. Meta tensors cannot be exported (InvalidArgument).
  DLManagedTensor* to_dlpack() const;
  // Takes ownership of `managed` (its deleter runs when the last tensor dies). Rejects dtypes
  // and devices chorus does not have, layouts too large to address, and elements not aligned for
  // their type (InvalidArgument). When it throws (std::bad_alloc included), `managed` is still
  // the caller's and its deleter has not run.
  static Tensor from_dlpack(DLManagedTensor* managed);

  // ---- Metadata. Never waits. The vectors sizes() and strides() return are shared with other
  // tensors of the same layout (as torch's IntArrayRef views them): a reference to one is valid
  // until this tensor is next assigned to or destroyed.
  bool defined() const noexcept { return defined_; }
  const Shape& sizes() const noexcept { return layout().sizes; }
  const Shape& strides() const noexcept { return layout().strides; }  // in elements
  std::int64_t size(std::int64_t dim) const;  // negative dims count from the end
  std::int64_t dim() const noexcept { return static_cast<std::int64_t>(sizes().size()); }
  std::int64_t numel() const noexcept;
  std::int64_t storage_offset() const noexcept { return offset_; }  // in elements
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  std::size_t element_size() const noexcept { return chorus::element_size(dtype_); }
  std::size_t nbytes() const noexcept;
  bool is_contiguous() const noexcept;
  // Whether both tensors view the same storage (same memory, same pending state).
  bool shares_storage(const Tensor& other) const noexcept;

  // ---- Views: share storage, never wait, never copy. Invalid arguments throw InvalidArgument.
  // `shape` may hold one -1, inferred from numel(). Needs strides compatible with the new shape
  // (always true for contiguous tensors).
  Tensor view(Shape shape) const;
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  Tensor select(std::int64_t dim, std::int64_t index) const;  // removes `dim`
  Tensor transpose(std::int64_t dim0, std::int64_t dim1) const;
  Tensor permute(const std::vector<std::int64_t>& dims) const;
  // `n` pieces of ceil(size/n) along `dim`; the last may be smaller, and fewer than `n` pieces
  // result when size < n (torch.chunk). A size-0 dim gives `n` empty pieces (torch.chunk too);
  // more pieces than a std::vector can hold throw InvalidArgument.
  std::vector<Tensor> chunk(std::int64_t n, std::int64_t dim = 0) const;
  // Pieces of the given sizes along `dim`; the sizes must sum to size(dim).
  std::vector<Tensor> split(const std::vector<std::int64_t>& sizes, std::int64_t dim = 0) const;
  Tensor flatten() const;  // a 1-D view; throws InvalidArgument when strides do not allow one
  Tensor unsqueeze(std::int64_t dim) const;

  // ---- Data access: each waits first when a collective is pending on this storage (blocking
  // the host for CPU tensors), and rethrows that collective's error if it failed. Host data
  // access on meta or CUDA tensors throws InvalidArgument.
  //
  // T must be the C++ type of dtype() (see DTypeOf); a mismatch throws InvalidArgument.
  template <class T>
  std::vector<T> to_vector() const;
  template <class T>
  T item() const;  // numel() must be 1
  // Pointer to the first element (storage offset applied). Waits.
  template <class T>
  T* data_ptr() const;

  // Itself when contiguous (after waiting), else a contiguous copy.
  Tensor contiguous() const;
  // A contiguous copy with its own storage.
  Tensor clone() const;
  // A copy converted to `dtype` (same conversions as full(): from a floating dtype to an integer
  // one, truncated toward zero, and 0 for NaN and for values outside the integer's range).
  Tensor to(DType dtype) const;
  // A contiguous copy on `device`; *this when already there (as torch). Copies between host and
  // CUDA memory go through the rank's device memory (Note [Device memory]); waiting on a CUDA
  // source orders the copy after its pending collectives. Core has no device kernels: a
  // non-contiguous CUDA source throws InvalidArgument (a CPU source is packed on the host).
  Tensor to(Device device) const;
  // Copies `src` into this tensor's elements (shapes must be equal; dtypes may differ and are
  // converted as by to()). Waits on both. Returns *this. `src` may overlap this tensor's memory
  // (a view of it, another from_blob or DLPack tensor over the same bytes): it is then read
  // through a temporary copy. With a CUDA tensor on either side, the dtypes must match and the
  // CUDA side(s) be contiguous (no device kernels: InvalidArgument).
  Tensor& copy_(const Tensor& src);
  // Same shape, same dtype, equal values (floating: NaN != NaN, -0 == +0, as torch.equal).
  bool equal(const Tensor& other) const;
  // Same shape, same dtype, identical element bytes (NaN payloads included).
  bool bitwise_equal(const Tensor& other) const;

  // The escape hatch: raw pointer to the first element, WITHOUT waiting. Reading it while
  // is_pending() is a race that the simulator makes visible (poisoned outputs).
  void* unsafe_data_ptr() const noexcept;

  // True from the issue of a collective writing this storage until that work is waited through
  // any route (wait_tensor, wait_tensors, a data access, an in-place op) or the storage dropped.
  bool is_pending() const noexcept;

  // "Tensor(shape=[2, 3], dtype=Float32, device=cpu, values=[...])"; waits to print values.
  std::string to_string(std::int64_t max_values = 16) const;

 private:
  friend struct detail::TensorAccess;

  Tensor(std::shared_ptr<detail::Storage> storage, Shape sizes, Shape strides, std::int64_t offset,
         DType dtype, Device device);
  Tensor(std::shared_ptr<detail::Storage> storage,
         std::shared_ptr<const detail::TensorLayout> layout, std::int64_t offset, DType dtype,
         Device device);

  const detail::TensorLayout& layout() const noexcept {
    return layout_ != nullptr ? *layout_ : detail::kEmptyTensorLayout;
  }

  static Tensor from_host_bytes(const void* data, std::size_t count, DType dtype, Shape shape);
  // Waits; contiguous element copy. Errors name `op`.
  void copy_to_host_bytes(void* out, DType expected, const char* op = "Tensor::to_vector") const;
  // copy_to_host_bytes in two steps, so a caller can allocate `out` only once the tensor passed:
  // checked_host_elements checks the dtype and the device and waits (errors name `op`), and
  // returns the first element; copy_host_elements copies every element from it into `out`.
  const void* checked_host_elements(DType expected, const char* op) const;
  void copy_host_elements(void* out, const void* first) const;
  void check_element_type(DType expected, const char* what) const;
  void check_single_element(const char* what) const;
  void* checked_data_for_host(const char* what) const;  // waits, checks device

  std::shared_ptr<detail::Storage> storage_;
  std::shared_ptr<const detail::TensorLayout> layout_;  // null when undefined or moved from
  std::int64_t offset_ = 0;
  DType dtype_ = DType::Float32;
  Device device_ = Device::cpu();
  bool defined_ = false;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// ---- Template definitions.

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  constexpr DType kDType = dtype_of<T>;
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<std::uint8_t> bytes(values.begin(), values.end());
    return from_host_bytes(bytes.data(), bytes.size(), kDType, std::move(shape));
  } else {
    return from_host_bytes(values.data(), values.size(), kDType, std::move(shape));
  }
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values) {
  return from_vector(values, Shape{static_cast<std::int64_t>(values.size())});
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  constexpr DType kDType = dtype_of<T>;
  // Checked (and waited) before the result is allocated: a wrong dtype or a meta tensor of any
  // size is an InvalidArgument, not a std::bad_alloc.
  const void* first = checked_host_elements(kDType, "Tensor::to_vector");
  const auto count = static_cast<std::size_t>(numel());
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<std::uint8_t> bytes(count);
    copy_host_elements(bytes.data(), first);
    return std::vector<bool>(bytes.begin(), bytes.end());
  } else {
    std::vector<T> out(count);
    copy_host_elements(out.data(), first);
    return out;
  }
}

template <class T>
T Tensor::item() const {
  constexpr DType kDType = dtype_of<T>;
  check_element_type(kDType, "Tensor::item");
  check_single_element("Tensor::item");
  if constexpr (std::is_same_v<T, bool>) {
    std::uint8_t byte = 0;
    copy_to_host_bytes(&byte, kDType, "Tensor::item");
    return byte != 0;
  } else {
    T value{};
    copy_to_host_bytes(&value, kDType, "Tensor::item");
    return value;
  }
}

template <class T>
T* Tensor::data_ptr() const {
  check_element_type(dtype_of<T>, "Tensor::data_ptr");
  return static_cast<T*>(checked_data_for_host("Tensor::data_ptr"));
}

}  // namespace chorus
