// chorus::Tensor: factories, metadata, views and data access.
//
// Every data access reaches the bytes through one choke point, `access_data` below (wrapped by
// Tensor::checked_data_for_host), which waits on pending storage first; see
// Note [Pending storage] in detail/storage.hpp. Views and metadata never call it.

#include "chorus/tensor.hpp"

#include <algorithm>
#include <array>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/kernels.hpp"
#include "chorus/runtime.hpp"
#include "detail/errors.hpp"
#include "detail/format.hpp"
#include "detail/storage.hpp"
#include "detail/strided_copy.hpp"
#include "detail/tensor_access.hpp"

namespace chorus {
namespace detail {

// Note [Addressable layouts]
// Every tensor's layout keeps its arithmetic in range, so that element offsets, extents and byte
// counts never overflow (signed overflow is undefined behaviour; a wrapped byte count sizes a
// buffer too small for the copy that then fills it):
// - numel() * element_size() <= PTRDIFF_MAX, so nbytes() never wraps;
// - the product of max(size, 1) fits in an int64, so its shape has contiguous strides
//   (contiguous_strides counts a size-0 dim as size 1, as PyTorch does), empty tensors included:
//   clone, to_vector and the collectives lay out a copy of any tensor's shape;
// - the bytes its elements span, from the first element, fit in a ptrdiff_t;
// - size * stride fits in an int64 in every dim, so a dim's extent (which unsqueeze, view's run
//   merging and strided_copy's dim merging compute) never overflows;
// - a tensor with elements starts at a multiple of element_alignment(dtype): the kernels read
//   elements through typed pointers.
// The factories establish it: empty and from_blob through checked_nbytes, from_blob also checks
// alignment, and from_dlpack checks the producer's shape, strides and data. Views keep it: they
// address a subset of their base's elements, their shapes are the base's with dims dropped,
// shrunk, reordered or of size 1 added (or, for view, checked), and view's strides are no larger
// than its base's extents. The one sum it does not bound is the storage offset of a view that
// addresses no element (of an empty tensor, or narrow at the end of a dim) whose strides are
// near the int64 limit: narrow and select check theirs (view_offset).

std::optional<Shape> checked_contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  std::int64_t stride = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    // A zero-size dim still gets a usable stride, so later dims keep distinct strides.
    if (__builtin_mul_overflow(stride, std::max<std::int64_t>(sizes[i], 1), &stride)) {
      return std::nullopt;
    }
  }
  return strides;
}

// Compared as they are made (a contiguous tensor may have any stride at a size-1 dim).
bool has_contiguous_strides(const Shape& sizes, const Shape& strides) noexcept {
  std::int64_t expected = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    if (strides[i] != expected ||
        __builtin_mul_overflow(expected, std::max<std::int64_t>(sizes[i], 1), &expected)) {
      return false;
    }
  }
  return true;
}

Shape contiguous_strides(const Shape& sizes) {
  std::optional<Shape> strides = checked_contiguous_strides(sizes);
  CHORUS_CHECK(strides.has_value());
  return std::move(*strides);
}

std::size_t element_alignment(DType dtype) noexcept {
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8:
      return alignof(std::uint8_t);
    case DType::Int8:
      return alignof(std::int8_t);
    case DType::Int32:
      return alignof(std::int32_t);
    case DType::Int64:
      return alignof(std::int64_t);
    case DType::Float16:
      return alignof(Half);
    case DType::BFloat16:
      return alignof(BFloat16);
    case DType::Float32:
      return alignof(float);
    case DType::Float64:
      return alignof(double);
    case DType::Complex64:
      return alignof(std::complex<float>);
    case DType::Complex128:
      return alignof(std::complex<double>);
  }
  CHORUS_CHECK(false && "unknown dtype");
  return 1;
}

std::int64_t shape_numel(const Shape& sizes) {
  std::int64_t numel = 1;
  for (const std::int64_t size : sizes) {
    numel *= size;
  }
  return numel;
}

std::int64_t normalize_dim(std::int64_t dim, std::int64_t ndim, const char* op) {
  if (ndim <= 0) {
    throw_invalid(op, "dim " + std::to_string(dim) + " is out of range for a 0-d tensor");
  }
  if (dim < -ndim || dim >= ndim) {
    throw_invalid(op, "dim " + std::to_string(dim) + " is out of range for " +
                          std::to_string(ndim) + " dims (expected " + std::to_string(-ndim) +
                          " to " + std::to_string(ndim - 1) + ")");
  }
  return dim < 0 ? dim + ndim : dim;
}

std::string shape_to_string(const Shape& sizes) { return bracketed(sizes); }

// ---- The choke point.

// Pointer to the first element of `tensor` (null when it has no bytes), after waiting for any
// collective pending on its storage and rethrowing its failure. The only place in tensor.cpp
// that waits (Note [Pending storage]).
std::byte* access_data(const Tensor& tensor, const char* op, DeviceAccess access) {
  if (!tensor.defined()) {
    throw_invalid(op, "the tensor is undefined");
  }
  const Device device = tensor.device();
  if (device.is_meta()) {
    throw_invalid(op, "meta tensor of shape " + shape_to_string(tensor.sizes()) +
                          " has no data (meta tensors carry shapes only)");
  }
  if (device.is_cuda() && access == detail::DeviceAccess::Host) {
    throw_invalid(op, "host data access on a " + device.to_string() +
                          " tensor; chorus has no device kernels (copy it to the host with "
                          "to(Device::cpu()) first)");
  }
  const std::shared_ptr<Storage>& storage = TensorAccess::storage(tensor);
  CHORUS_CHECK(storage != nullptr);
  storage->wait_ready();
  return static_cast<std::byte*>(tensor.unsafe_data_ptr());
}

}  // namespace detail

namespace {

using detail::contiguous_strides;
using detail::shape_numel;
using detail::shape_to_string;
using detail::throw_invalid;

// ---- Shape arithmetic.

// Throws unless every size is >= 0; returns the byte count of `shape` elements of `dtype`,
// throwing when it does not fit in a ptrdiff_t (so element offsets never overflow) or when the
// shape's contiguous strides do not fit in an int64 (Note [Addressable layouts]).
std::size_t checked_nbytes(const Shape& shape, DType dtype, const char* op) {
  if (element_size(dtype) == 0) {  // a value outside the enum: elements without bytes
    throw_invalid(op, "dtype " + std::to_string(static_cast<int>(dtype)) +
                          " is not a chorus DType (Bool, UInt8, ..., Complex128)");
  }
  std::int64_t numel = 1;
  std::int64_t padded_numel = 1;  // the product of max(size, 1) (Note [Addressable layouts])
  bool overflow = false;
  for (const std::int64_t size : shape) {
    if (size < 0) {
      throw_invalid(op, "shape " + shape_to_string(shape) + " has a negative size");
    }
    overflow = overflow || __builtin_mul_overflow(numel, size, &numel) ||
               __builtin_mul_overflow(padded_numel, std::max<std::int64_t>(size, 1), &padded_numel);
  }
  std::int64_t nbytes = 0;
  overflow = overflow ||
             __builtin_mul_overflow(numel, static_cast<std::int64_t>(element_size(dtype)), &nbytes);
  if (overflow || nbytes > std::numeric_limits<std::ptrdiff_t>::max()) {
    throw_invalid(op, "shape " + shape_to_string(shape) + " of " + std::string(dtype_name(dtype)) +
                          " is too large to address");
  }
  return static_cast<std::size_t>(nbytes);
}

// Strides for viewing (sizes, strides) as `shape` without copying, or nullopt when the memory
// layout does not allow it. The old dims split into *runs*: maximal groups of consecutive dims
// (size-1 dims ignored) that step through memory as one dim would. A view is possible exactly
// when the new dims (size-1 dims ignored) can be grouped, in order, into products equal to those
// runs; each group then strides like its run.
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides, const Shape& shape) {
  const std::int64_t numel = shape_numel(sizes);
  CHORUS_CHECK_EQ(numel, shape_numel(shape));
  if (numel == 0) {
    // No element is ever addressed; the caller has checked that these strides fit.
    return contiguous_strides(shape);
  }

  struct Run {
    std::int64_t numel;
    std::int64_t inner_stride;
  };
  std::vector<Run> runs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) {
      continue;
    }
    std::int64_t extent = 0;  // fits (Note [Addressable layouts]); checked all the same
    const bool overflow = __builtin_mul_overflow(sizes[i], strides[i], &extent);
    CHORUS_CHECK(!overflow);
    if (!runs.empty() && runs.back().inner_stride == extent) {
      runs.back().numel *= sizes[i];
      runs.back().inner_stride = strides[i];
    } else {
      runs.push_back(Run{sizes[i], strides[i]});
    }
  }

  Shape result(shape.size(), 0);
  std::size_t next = 0;  // the first new dim not yet assigned to a run
  for (const Run& run : runs) {
    // Gather new dims until their product reaches the run's element count.
    std::vector<std::size_t> group;
    std::int64_t product = 1;
    while (product < run.numel && next < shape.size()) {
      if (shape[next] != 1) {
        group.push_back(next);
        product *= shape[next];
      }
      ++next;
    }
    if (product != run.numel) {
      return std::nullopt;
    }
    // The group's extents are at most the run's, which is one of the base's extents.
    std::int64_t stride = run.inner_stride;
    for (std::size_t k = group.size(); k-- > 0;) {
      result[group[k]] = stride;
      const bool overflow = __builtin_mul_overflow(stride, shape[group[k]], &stride);
      CHORUS_CHECK(!overflow);
    }
  }
  for (; next < shape.size(); ++next) {
    if (shape[next] != 1) {
      return std::nullopt;
    }
  }
  // Size-1 dims never step; give them the stride they would have in a packed layout.
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) {
      result[i] = 1;
      if (i + 1 < shape.size()) {
        const bool overflow = __builtin_mul_overflow(result[i + 1], shape[i + 1], &result[i]);
        CHORUS_CHECK(!overflow);
      }
    }
  }
  return result;
}

// The elements of `tensor` (first element at `first`) in row-major order: `first` itself when
// the tensor is contiguous, else a packed copy made in `scratch`.
const void* packed_elements(const Tensor& tensor, const void* first,
                            std::vector<std::byte>& scratch) {
  if (tensor.is_contiguous()) {
    return first;
  }
  scratch.resize(tensor.nbytes());
  detail::strided_copy(scratch.data(), contiguous_strides(tensor.sizes()), first, tensor.strides(),
                       tensor.sizes(), tensor.element_size());
  return scratch.data();
}

// The deleter of from_blob memory: runs the caller's deleter (if any) on `data` once armed, and
// nothing before (from_blob failed to allocate: the caller still owns the memory).
struct BlobRelease {
  void* data = nullptr;
  std::function<void(void*)> run;
  bool armed = false;

  void operator()(void* /*memory*/) const {
    if (armed && run) {
      run(data);
    }
  }
};

// ---- Printing.

void print_element(std::ostream& out, const std::byte* element, DType dtype) {
  const auto load = [element]<class T>(T value) {
    std::memcpy(&value, element, sizeof(T));
    return value;
  };
  switch (dtype) {
    case DType::Bool:
      out << (load(std::uint8_t{}) != 0 ? "true" : "false");
      return;
    case DType::UInt8:
      out << static_cast<unsigned>(load(std::uint8_t{}));
      return;
    case DType::Int8:
      out << static_cast<int>(load(std::int8_t{}));
      return;
    case DType::Int32:
      out << load(std::int32_t{});
      return;
    case DType::Int64:
      out << load(std::int64_t{});
      return;
    case DType::Float16:
      out << static_cast<float>(load(Half{}));
      return;
    case DType::BFloat16:
      out << static_cast<float>(load(BFloat16{}));
      return;
    case DType::Float32:
      out << load(float{});
      return;
    case DType::Float64:
      out << load(double{});
      return;
    case DType::Complex64:
      out << load(std::complex<float>{});
      return;
    case DType::Complex128:
      out << load(std::complex<double>{});
      return;
  }
}

void check_defined(const Tensor& tensor, const char* op) {
  if (!tensor.defined()) {
    throw_invalid(op, "the tensor is undefined");
  }
}

std::string element_count_text(std::int64_t count) {
  return std::to_string(count) + (count == 1 ? " element" : " elements");
}

// The storage offset of the view that starts `index` elements into dim `d` of `tensor` (narrow,
// select), which unsafe_data_ptr() turns into bytes. Throws InvalidArgument naming `op` when
// those do not fit in a ptrdiff_t: only possible for a view that addresses no element (an empty
// tensor, or narrow at the end of a dim) with a stride near the int64 limit
// (Note [Addressable layouts]).
std::int64_t view_offset(const Tensor& tensor, std::size_t d, std::int64_t index, const char* op) {
  const std::int64_t stride = tensor.strides()[d];
  std::int64_t offset = 0;
  std::int64_t offset_bytes = 0;
  if (__builtin_mul_overflow(index, stride, &offset) ||
      __builtin_add_overflow(tensor.storage_offset(), offset, &offset) ||
      __builtin_mul_overflow(offset, static_cast<std::int64_t>(tensor.element_size()),
                             &offset_bytes)) {
    throw_invalid(op, "storage offset " + std::to_string(tensor.storage_offset()) + " + " +
                          std::to_string(index) + " * stride " + std::to_string(stride) +
                          " is too large to address");
  }
  return offset;
}

// Note [Shared layouts]
// A Tensor holds its sizes and strides through one shared, immutable TensorLayout, so copying a
// tensor (a returned output, wait_tensor's result, a tensor kept by a pending work) copies a
// pointer, not two vectors. Views make a layout of their own. Contiguous layouts of fresh
// tensors come from a small per-thread cache keyed by shape: a loop of collectives on tensors of
// one shape makes its outputs without building a shape or strides vector. The cache holds only
// immutable values, so it is shared by every rank a thread runs (the simulator's fibers) without
// carrying anything from one rank to another but the vectors' memory.
constexpr std::size_t kLayoutCacheEntries = 4;

// Set when this thread's cache is destroyed (at thread exit; on the main thread, before every
// static object): a tensor made later, from another thread_local's or a static's destructor,
// gets a layout of its own. A bool has no destructor, so it is readable until the thread ends.
thread_local bool layout_cache_destroyed = false;

struct LayoutCache {
  LayoutCache() = default;
  LayoutCache(const LayoutCache&) = delete;
  LayoutCache& operator=(const LayoutCache&) = delete;
  ~LayoutCache() { layout_cache_destroyed = true; }

  std::array<std::shared_ptr<const detail::TensorLayout>, kLayoutCacheEntries> entries;
  std::size_t next = 0;  // the entry the next miss replaces (round robin)
};

std::shared_ptr<const detail::TensorLayout> make_contiguous_layout(const Shape& shape) {
  return std::make_shared<const detail::TensorLayout>(
      detail::TensorLayout{shape, detail::contiguous_strides(shape)});
}

std::shared_ptr<const detail::TensorLayout> contiguous_layout(const Shape& shape) {
  if (layout_cache_destroyed) {
    return make_contiguous_layout(shape);
  }
  thread_local LayoutCache cache;
  for (const std::shared_ptr<const detail::TensorLayout>& entry : cache.entries) {
    if (entry != nullptr && entry->sizes == shape) {
      return entry;
    }
  }
  auto layout = make_contiguous_layout(shape);
  cache.entries[cache.next] = layout;
  cache.next = (cache.next + 1) % kLayoutCacheEntries;
  return layout;
}

}  // namespace

Tensor detail::TensorAccess::empty(const Shape& shape, DType dtype, Device device) {
  const std::size_t nbytes = checked_nbytes(shape, dtype, "Tensor::empty");
  if (device.is_meta()) {
    return {nullptr, contiguous_layout(shape), 0, dtype, device};
  }
  return empty_laid_out(nbytes, contiguous_layout(shape), dtype, device);
}

Tensor detail::TensorAccess::empty_laid_out(std::size_t nbytes,
                                            const std::shared_ptr<const TensorLayout>& layout,
                                            DType dtype, Device device) {
  if (device.index() < 0) {
    throw_invalid("Tensor::empty", "device index must be >= 0, got " + device.to_string());
  }
  // Note [A fresh tensor's own checks]
  // The tensor is built member by member, not by the constructor, whose checks (a layout, its sizes
  // and strides of one rank, a storage exactly when not meta) guard the views and from_blob's
  // tensors. Here each holds by construction: the layout is a contiguous one made for its shape or
  // a live tensor's (which passed them), the device is not meta (empty() and empty_like() take meta
  // elsewhere) and make_storage returns a storage or throws. Debug builds still check
  // (CHORUS_DCHECK, Note [Debug-only checks]), and make_storage's own check of the device too. The
  // order is GCC's: the storage is made before the tensor, so that the members' assignments see the
  // defaults just stored (nothing to release) rather than memory a call in between might have
  // changed; the plain members are set before the layout's copy, whose count's increment (an int)
  // might alias the device's index for all GCC knows, so the defaults' stores die unwritten. ~26
  // instructions a fresh tensor, every collective's output among them.
  std::shared_ptr<Storage> storage = detail::make_storage(nbytes, device, "Tensor::empty");
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.defined_ = true;
  tensor.storage_ = std::move(storage);
  tensor.layout_ = layout;
  CHORUS_DCHECK(tensor.layout_ != nullptr);
  CHORUS_DCHECK_EQ(tensor.layout_->sizes.size(), tensor.layout_->strides.size());
  CHORUS_DCHECK(!device.is_meta() && tensor.storage_ != nullptr);
  return tensor;
}

Tensor detail::TensorAccess::empty_like(const Tensor& like) {
  const Shape& shape = like.sizes();
  const DType dtype = like.dtype();
  const Device device = like.device();
  if (device.is_meta() || like.layout_ == nullptr) {
    return empty(shape, dtype, device);
  }
  // The output's strides must be the contiguous ones, a size-1 dim's too: any other layout, or a
  // product that overflows, takes empty()'s path, errors included.
  if (!has_contiguous_strides(shape, like.strides())) {
    return empty(shape, dtype, device);
  }
  // What empty() makes, with `like`'s layout. checked_nbytes(shape, dtype) is like.nbytes():
  // `like` exists, so its shape passed it (Note [Addressable layouts]).
  return empty_laid_out(like.nbytes(), like.layout_, dtype, device);
}

Tensor detail::TensorAccess::empty_like(const Tensor& like, bool contiguous_strides,
                                        std::size_t nbytes) {
  CHORUS_DCHECK(like.layout_ == nullptr ||
                contiguous_strides == has_contiguous_strides(like.sizes(), like.strides()));
  CHORUS_DCHECK(nbytes == like.nbytes());
  const Device device = like.device();
  if (device.is_meta() || like.layout_ == nullptr || !contiguous_strides) {
    return empty(like.sizes(), like.dtype(), device);
  }
  return empty_laid_out(nbytes, like.layout_, like.dtype(), device);
}

// ---- Construction.

Tensor::Tensor() noexcept = default;

Tensor::Tensor(Tensor&& other) noexcept
    : storage_(std::move(other.storage_)),
      layout_(std::move(other.layout_)),
      offset_(other.offset_),
      dtype_(other.dtype_),
      device_(other.device_),
      defined_(std::exchange(other.defined_, false)) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    storage_ = std::move(other.storage_);
    layout_ = std::move(other.layout_);
    offset_ = other.offset_;
    dtype_ = other.dtype_;
    device_ = other.device_;
    defined_ = std::exchange(other.defined_, false);
  }
  return *this;
}

Tensor::Tensor(std::shared_ptr<detail::Storage> storage, Shape sizes, Shape strides,
               std::int64_t offset, DType dtype, Device device)
    : Tensor(std::move(storage),
             std::make_shared<const detail::TensorLayout>(
                 detail::TensorLayout{std::move(sizes), std::move(strides)}),
             offset, dtype, device) {}

Tensor::Tensor(std::shared_ptr<detail::Storage> storage,
               std::shared_ptr<const detail::TensorLayout> layout, std::int64_t offset, DType dtype,
               Device device)
    : storage_(std::move(storage)),
      layout_(std::move(layout)),
      offset_(offset),
      dtype_(dtype),
      device_(device),
      defined_(true) {
  CHORUS_CHECK(layout_ != nullptr);
  CHORUS_CHECK_EQ(layout_->sizes.size(), layout_->strides.size());
  CHORUS_CHECK_GE(offset_, 0);
  if (device_.is_meta()) {
    CHORUS_CHECK(storage_ == nullptr);
  } else {
    CHORUS_CHECK(storage_ != nullptr);
  }
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  return detail::TensorAccess::empty(shape, dtype, device);
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor tensor = empty(std::move(shape), dtype, device);
  if (device.is_cuda()) {  // zeroed in stream order: no host copy, no host block
    if (tensor.nbytes() > 0) {
      const auto [memory, stream] = detail::device_memory_for(device, "Tensor::zeros");
      memory.zero(tensor.unsafe_data_ptr(), device, tensor.nbytes(), stream);
    }
    return tensor;
  }
  // Fresh storage: nothing can be pending on it, so writing without waiting is safe.
  if (void* data = tensor.unsafe_data_ptr(); data != nullptr) {
    std::memset(data, 0, tensor.nbytes());  // all-zero bytes are zero in every dtype
  }
  return tensor;
}

Tensor Tensor::ones(Shape shape, DType dtype, Device device) {
  return full(std::move(shape), 1.0, dtype, device);
}

Tensor Tensor::full(Shape shape, double value, DType dtype, Device device) {
  Tensor tensor = empty(std::move(shape), dtype, device);
  if (device.is_cuda()) {  // no device kernels: filled on the host, then copied
    if (tensor.nbytes() > 0) {
      const Tensor host = full(tensor.sizes(), value, dtype, Device::cpu());
      const auto [memory, stream] = detail::device_memory_for(device, "Tensor::full");
      memory.copy(tensor.unsafe_data_ptr(), device, host.unsafe_data_ptr(), Device::cpu(),
                  tensor.nbytes(), stream);
    }
    return tensor;
  }
  // Fresh storage: nothing can be pending on it, so writing without waiting is safe.
  if (void* data = tensor.unsafe_data_ptr(); data != nullptr) {
    kernels::fill(data, dtype, value, static_cast<std::size_t>(tensor.numel()));
  }
  return tensor;
}

Tensor Tensor::arange(std::int64_t n, DType dtype) {
  if (n < 0) {
    throw_invalid("Tensor::arange", "n must be >= 0, got " + std::to_string(n));
  }
  Tensor tensor = empty({n}, dtype);
  // Generated as Int64 so integer dtypes get exact values beyond 2^53.
  std::vector<std::int64_t> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = i;
  }
  if (n > 0) {
    kernels::convert(tensor.unsafe_data_ptr(), dtype, values.data(), DType::Int64, values.size());
  }
  return tensor;
}

Tensor Tensor::from_blob(void* data, Shape shape, DType dtype, Device device,
                         std::function<void(void*)> deleter) {
  constexpr const char* kOp = "Tensor::from_blob";
  const std::size_t nbytes = checked_nbytes(shape, dtype, kOp);
  if (device.is_meta()) {
    throw_invalid(kOp,
                  "meta tensors have no memory to wrap (use Tensor::empty with "
                  "Device::meta())");
  }
  if (device.index() < 0) {
    throw_invalid(kOp, "device index must be >= 0, got " + device.to_string());
  }
  if (data == nullptr && nbytes > 0) {
    throw_invalid(kOp, "data is null but shape " + shape_to_string(shape) + " has " +
                           element_count_text(shape_numel(shape)));
  }
  // The kernels read elements through typed pointers (Note [Addressable layouts]).
  if (const std::size_t alignment = detail::element_alignment(dtype);
      nbytes > 0 && reinterpret_cast<std::uintptr_t>(data) % alignment != 0) {
    throw_invalid(kOp, "data is not aligned for " + std::string(dtype_name(dtype)) + " (" +
                           std::to_string(alignment) + "-byte alignment needed)");
  }
  // Every argument is checked before the deleter is handed to a shared_ptr: a throw above leaves
  // the memory with the caller. So does a std::bad_alloc below: the deleter is armed only once
  // the tensor is made (as in from_dlpack: a shared_ptr whose control block cannot be allocated
  // calls its deleter, as does the last owner of a half-made tensor).
  // An empty tensor owns no bytes (Storage wants null memory then); the deleter still gets
  // `data`.
  void* memory_data = nbytes == 0 ? nullptr : data;
  std::shared_ptr<void> memory(memory_data, BlobRelease{data, std::move(deleter)});
  auto storage = std::make_shared<detail::Storage>(memory, nbytes, device);
  Shape strides = contiguous_strides(shape);
  Tensor tensor(std::move(storage), std::move(shape), std::move(strides), 0, dtype, device);
  std::get_deleter<BlobRelease>(memory)->armed = true;  // from here on, the tensor owns `data`
  return tensor;
}

Tensor Tensor::from_host_bytes(const void* data, std::size_t count, DType dtype, Shape shape) {
  constexpr const char* kOp = "Tensor::from_vector";
  const std::size_t nbytes = checked_nbytes(shape, dtype, kOp);
  if (static_cast<std::uint64_t>(shape_numel(shape)) != count) {
    throw_invalid(kOp, "shape " + shape_to_string(shape) + " has " +
                           element_count_text(shape_numel(shape)) + ", but " +
                           std::to_string(count) + " values were given");
  }
  Tensor tensor = empty(std::move(shape), dtype);
  if (nbytes > 0) {
    // Fresh storage: nothing can be pending on it.
    std::memcpy(tensor.unsafe_data_ptr(), data, nbytes);
  }
  return tensor;
}

// ---- Metadata.

std::int64_t Tensor::size(std::int64_t dim) const {
  return layout()
      .sizes[static_cast<std::size_t>(detail::normalize_dim(dim, this->dim(), "Tensor::size"))];
}

std::int64_t Tensor::numel() const noexcept { return defined_ ? shape_numel(layout().sizes) : 0; }

std::size_t Tensor::nbytes() const noexcept {
  return static_cast<std::size_t>(numel()) * element_size();
}

bool Tensor::is_contiguous() const noexcept {
  if (!defined_) {
    return true;  // no elements
  }
  // One pass over the sizes (every collective asks this of its input): a tensor without elements
  // is contiguous whatever its strides, one with elements when its strides are the row-major ones
  // (numel() first was a second loop).
  const detail::TensorLayout& shape = layout();
  std::int64_t expected = 1;
  for (std::size_t i = shape.sizes.size(); i-- > 0;) {
    const std::int64_t size = shape.sizes[i];
    if (size == 1) {
      continue;  // a size-1 dim never steps, so its stride does not matter
    }
    if (size == 0) {
      return true;
    }
    if (shape.strides[i] != expected) {
      const auto before = shape.sizes.begin() + static_cast<std::ptrdiff_t>(i);
      return std::find(shape.sizes.begin(), before, 0) != before;  // contiguous if no elements
    }
    expected *= size;
  }
  return true;
}

bool Tensor::shares_storage(const Tensor& other) const noexcept {
  return storage_ != nullptr && storage_ == other.storage_;
}

void* Tensor::unsafe_data_ptr() const noexcept {
  if (storage_ == nullptr || storage_->data() == nullptr) {
    return nullptr;
  }
  return static_cast<std::byte*>(storage_->data()) +
         offset_ * static_cast<std::int64_t>(element_size());
}

bool Tensor::is_pending() const noexcept { return storage_ != nullptr && storage_->is_pending(); }

// ---- Views. None of these waits.

Tensor Tensor::view(Shape shape) const {
  constexpr const char* kOp = "Tensor::view";
  check_defined(*this, kOp);
  const std::int64_t numel = this->numel();
  std::optional<std::size_t> inferred;
  std::int64_t known = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && !inferred) {
      inferred = i;
    } else if (shape[i] < 0) {
      throw_invalid(kOp, "shape " + shape_to_string(shape) +
                             " is invalid: only one -1 is allowed and no other negative size");
    } else {
      overflow = overflow || __builtin_mul_overflow(known, shape[i], &known);
    }
  }
  if (overflow) {
    throw_invalid(
        kOp, "shape " + shape_to_string(shape) + " is invalid for " + element_count_text(numel));
  }
  if (inferred) {
    if (known == 0 || numel % known != 0) {
      throw_invalid(
          kOp, "shape " + shape_to_string(shape) + " is invalid for " + element_count_text(numel));
    }
    shape[*inferred] = numel / known;
  } else if (known != numel) {
    throw_invalid(
        kOp, "shape " + shape_to_string(shape) + " is invalid for " + element_count_text(numel));
  }
  // An empty view gets contiguous strides, which must fit (Note [Addressable layouts]);
  // otherwise its strides come from this tensor's, which do.
  if (numel == 0 && !detail::checked_contiguous_strides(shape)) {
    throw_invalid(kOp, "shape " + shape_to_string(shape) + " is too large to address");
  }
  std::optional<Shape> strides = view_strides(layout().sizes, layout().strides, shape);
  if (!strides) {
    throw_invalid(kOp, "cannot view a tensor of shape " + shape_to_string(layout().sizes) +
                           " and strides " + shape_to_string(layout().strides) + " as shape " +
                           shape_to_string(shape) + " without copying (call contiguous() first)");
  }
  return {storage_, std::move(shape), std::move(*strides), offset_, dtype_, device_};
}

Tensor Tensor::narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
  constexpr const char* kOp = "Tensor::narrow";
  check_defined(*this, kOp);
  const auto d = static_cast<std::size_t>(detail::normalize_dim(dim, this->dim(), kOp));
  const std::int64_t size = layout().sizes[d];
  if (start < -size || start > size) {
    throw_invalid(kOp, "start " + std::to_string(start) + " is out of range for dim " +
                           std::to_string(dim) + " of size " + std::to_string(size));
  }
  if (start < 0) {
    start += size;
  }
  if (length < 0 || length > size - start) {
    throw_invalid(kOp, "start " + std::to_string(start) + " + length " + std::to_string(length) +
                           " exceeds dim " + std::to_string(dim) + " of size " +
                           std::to_string(size) + " (length must be >= 0)");
  }
  const std::int64_t offset = view_offset(*this, d, start, kOp);
  Shape sizes = layout().sizes;
  sizes[d] = length;
  return {storage_, std::move(sizes), layout().strides, offset, dtype_, device_};
}

Tensor Tensor::select(std::int64_t dim, std::int64_t index) const {
  constexpr const char* kOp = "Tensor::select";
  check_defined(*this, kOp);
  const auto d = static_cast<std::size_t>(detail::normalize_dim(dim, this->dim(), kOp));
  const std::int64_t size = layout().sizes[d];
  if (index < -size || index >= size) {
    throw_invalid(kOp, "index " + std::to_string(index) + " is out of range for dim " +
                           std::to_string(dim) + " of size " + std::to_string(size));
  }
  if (index < 0) {
    index += size;
  }
  const std::int64_t offset = view_offset(*this, d, index, kOp);
  Shape sizes = layout().sizes;
  Shape strides = layout().strides;
  sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(d));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(d));
  return {storage_, std::move(sizes), std::move(strides), offset, dtype_, device_};
}

Tensor Tensor::transpose(std::int64_t dim0, std::int64_t dim1) const {
  constexpr const char* kOp = "Tensor::transpose";
  check_defined(*this, kOp);
  const auto d0 = static_cast<std::size_t>(detail::normalize_dim(dim0, dim(), kOp));
  const auto d1 = static_cast<std::size_t>(detail::normalize_dim(dim1, dim(), kOp));
  Shape sizes = layout().sizes;
  Shape strides = layout().strides;
  std::swap(sizes[d0], sizes[d1]);
  std::swap(strides[d0], strides[d1]);
  return {storage_, std::move(sizes), std::move(strides), offset_, dtype_, device_};
}

Tensor Tensor::permute(const std::vector<std::int64_t>& dims) const {
  constexpr const char* kOp = "Tensor::permute";
  check_defined(*this, kOp);
  if (static_cast<std::int64_t>(dims.size()) != dim()) {
    throw_invalid(kOp, "dims " + shape_to_string(dims) + " must list all " + std::to_string(dim()) +
                           " dims of a tensor of shape " + shape_to_string(layout().sizes));
  }
  std::vector<bool> seen(dims.size(), false);
  Shape sizes(dims.size());
  Shape strides(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const auto d = static_cast<std::size_t>(detail::normalize_dim(dims[i], dim(), kOp));
    if (seen[d]) {
      throw_invalid(kOp, "dims " + shape_to_string(dims) + " repeat dim " + std::to_string(d) +
                             " (expected a permutation)");
    }
    seen[d] = true;
    sizes[i] = layout().sizes[d];
    strides[i] = layout().strides[d];
  }
  return {storage_, std::move(sizes), std::move(strides), offset_, dtype_, device_};
}

std::vector<Tensor> Tensor::chunk(std::int64_t n, std::int64_t dim) const {
  constexpr const char* kOp = "Tensor::chunk";
  check_defined(*this, kOp);
  if (n <= 0) {
    throw_invalid(kOp, "the number of chunks must be > 0, got " + std::to_string(n));
  }
  const std::int64_t d = detail::normalize_dim(dim, this->dim(), kOp);
  const std::int64_t size = layout().sizes[static_cast<std::size_t>(d)];
  // A size-0 dim gives n empty pieces, as torch.chunk; otherwise pieces of ceil(size / n), at
  // most size of them. Counted first, so that a count no vector holds is an InvalidArgument, not
  // the std::length_error of allocating it.
  const std::int64_t piece = size / n + (size % n != 0 ? 1 : 0);  // ceil, without overflow
  const std::int64_t count = size == 0 ? n : size / piece + (size % piece != 0 ? 1 : 0);
  CHORUS_CHECK_LE(count, n);
  if (const std::size_t count_max = std::vector<Tensor>().max_size();
      static_cast<std::uint64_t>(count) > count_max) {
    throw_invalid(kOp, std::to_string(n) + " chunks of dim " + std::to_string(dim) + " of size " +
                           std::to_string(size) + " make " + std::to_string(count) +
                           " pieces, more than a vector can hold (" + std::to_string(count_max) +
                           ")");
  }
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(count), 0);
  for (std::int64_t k = 0; k < count && size > 0; ++k) {
    sizes[static_cast<std::size_t>(k)] = std::min(piece, size - k * piece);
  }
  if (size > 0) {
    CHORUS_CHECK_GE(sizes.back(), 1);
  }
  return split(sizes, d);
}

std::vector<Tensor> Tensor::split(const std::vector<std::int64_t>& sizes, std::int64_t dim) const {
  constexpr const char* kOp = "Tensor::split";
  check_defined(*this, kOp);
  const auto d = static_cast<std::size_t>(detail::normalize_dim(dim, this->dim(), kOp));
  std::int64_t total = 0;
  for (const std::int64_t size : sizes) {
    if (size < 0) {
      throw_invalid(kOp, "sizes " + shape_to_string(sizes) + " must all be >= 0");
    }
    if (__builtin_add_overflow(total, size, &total)) {
      throw_invalid(kOp, "sizes " + shape_to_string(sizes) + " overflow when summed, but dim " +
                             std::to_string(dim) + " has size " +
                             std::to_string(layout().sizes[d]));
    }
  }
  if (total != layout().sizes[d]) {
    throw_invalid(kOp, "sizes " + shape_to_string(sizes) + " sum to " + std::to_string(total) +
                           ", but dim " + std::to_string(dim) + " has size " +
                           std::to_string(layout().sizes[d]));
  }
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  std::int64_t start = 0;
  for (const std::int64_t size : sizes) {
    pieces.push_back(narrow(static_cast<std::int64_t>(d), start, size));
    start += size;
  }
  CHORUS_CHECK_EQ(start, layout().sizes[d]);
  return pieces;
}

Tensor Tensor::flatten() const {
  constexpr const char* kOp = "Tensor::flatten";
  check_defined(*this, kOp);
  Shape shape{numel()};
  std::optional<Shape> strides = view_strides(layout().sizes, layout().strides, shape);
  if (!strides) {
    throw_invalid(kOp, "cannot flatten a tensor of shape " + shape_to_string(layout().sizes) +
                           " and strides " + shape_to_string(layout().strides) +
                           " without copying (call contiguous() first)");
  }
  return {storage_, std::move(shape), std::move(*strides), offset_, dtype_, device_};
}

Tensor Tensor::unsqueeze(std::int64_t dim) const {
  constexpr const char* kOp = "Tensor::unsqueeze";
  check_defined(*this, kOp);
  const auto d = static_cast<std::size_t>(detail::normalize_dim(dim, this->dim() + 1, kOp));
  // The extent of the dim it goes before (as torch), or 1 at the end. Extents fit
  // (Note [Addressable layouts]); checked all the same.
  std::int64_t stride = 1;
  if (d < layout().sizes.size()) {
    const bool overflow = __builtin_mul_overflow(layout().sizes[d], layout().strides[d], &stride);
    CHORUS_CHECK(!overflow);
  }
  Shape sizes = layout().sizes;
  Shape strides = layout().strides;
  sizes.insert(sizes.begin() + static_cast<std::ptrdiff_t>(d), 1);
  strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(d), stride);
  return {storage_, std::move(sizes), std::move(strides), offset_, dtype_, device_};
}

// ---- Data access. Each goes through checked_data_for_host / access_data before touching bytes.

void* Tensor::checked_data_for_host(const char* what) const {
  return detail::access_data(*this, what, detail::DeviceAccess::Host);
}

void Tensor::check_element_type(DType expected, const char* what) const {
  if (!defined_) {
    throw_invalid(what, "the tensor is undefined");
  }
  if (expected != dtype_) {
    throw_invalid(what, "tensor has dtype " + std::string(dtype_name(dtype_)) + ", requested " +
                            std::string(dtype_name(expected)));
  }
}

void Tensor::check_single_element(const char* what) const {
  if (numel() != 1) {
    throw_invalid(what, "expected a tensor with 1 element, got shape " +
                            shape_to_string(layout().sizes) + " (" + element_count_text(numel()) +
                            ")");
  }
}

void Tensor::copy_to_host_bytes(void* out, DType expected, const char* op) const {
  copy_host_elements(out, checked_host_elements(expected, op));
}

const void* Tensor::checked_host_elements(DType expected, const char* op) const {
  check_element_type(expected, op);
  return checked_data_for_host(op);
}

void Tensor::copy_host_elements(void* out, const void* first) const {
  detail::strided_copy(out, contiguous_strides(layout().sizes), first, layout().strides,
                       layout().sizes, element_size());
}

namespace {

// The addresses [begin, end) from the lowest to the highest byte that `tensor`'s elements occupy
// ({0, 0} when it has none). Strides are >= 0, and the span fits in a ptrdiff_t
// (Note [Addressable layouts]).
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const Tensor& tensor) {
  const void* first = tensor.unsafe_data_ptr();
  if (first == nullptr || tensor.numel() == 0) {
    return {0, 0};
  }
  std::int64_t last = 0;  // the offset of the last element, in elements
  for (std::size_t i = 0; i < tensor.sizes().size(); ++i) {
    CHORUS_CHECK_GE(tensor.strides()[i], 0);
    last += (tensor.sizes()[i] - 1) * tensor.strides()[i];
  }
  const auto begin = reinterpret_cast<std::uintptr_t>(first);
  return {begin, begin + static_cast<std::uintptr_t>(last + 1) * tensor.element_size()};
}

// Whether `a` and `b` may touch a common byte. Memory, not storage, decides: two from_blob
// tensors over one buffer, or a tensor and its DLPack round trip, have distinct storages over the
// same bytes. Ranges that interleave without sharing an element (x[0::2], x[1::2]) count too:
// a copy through a temporary is correct for them, only slower.
bool bytes_overlap(const Tensor& a, const Tensor& b) {
  const auto [a_begin, a_end] = byte_range(a);
  const auto [b_begin, b_end] = byte_range(b);
  return a_begin < a_end && b_begin < b_end && a_begin < b_end && b_begin < a_end;
}

// Note [Device copies]
// Core has no device kernels, so what it does with CUDA bytes is whole contiguous copies through
// the rank's DeviceMemory (Note [Device memory]): between host and device, and device to device.
// Packing a non-contiguous CUDA tensor or converting its dtype would need a kernel: those throw
// InvalidArgument saying so. Waiting on a CUDA source orders the device's stream after its pending
// collectives (no host block); the copy, enqueued after, then reads the result.

// "<what> of a cuda:0 tensor of shape [2, 3] needs a device kernel, and chorus has none (<hint>)".
[[noreturn]] void throw_needs_kernel(const char* op, const Tensor& tensor, const char* what,
                                     const char* hint) {
  throw_invalid(op, std::string(what) + " of a " + tensor.device().to_string() +
                        " tensor of shape " + shape_to_string(tensor.sizes()) +
                        " needs a device kernel, and chorus has none (" + hint + ")");
}

constexpr const char* kContiguousOnly = "chorus copies whole contiguous device tensors only";
constexpr const char* kConvertOnHost = "convert on the host: to(Device::cpu()).to(dtype)";

// The device whose memory interface moves bytes between `a` and `b` (the CUDA one of the two).
Device copying_device(Device a, Device b) { return a.is_cuda() ? a : b; }

// `dst` (contiguous, not pending) gets `src`'s bytes; one of the two is a CUDA tensor; `src` is
// contiguous with dst's shape and dtype. Waits on `src` (in stream order when it is a device
// tensor).
void copy_contiguous_bytes(const Tensor& dst, const Tensor& src, const char* op) {
  const void* first = detail::access_data(src, op, detail::DeviceAccess::OrderedByWait);
  if (src.nbytes() == 0) {
    return;
  }
  const auto [memory, stream] =
      detail::device_memory_for(copying_device(dst.device(), src.device()), op);
  memory.copy(dst.unsafe_data_ptr(), dst.device(), first, src.device(), src.nbytes(), stream);
}

// A contiguous copy of `tensor` on `device`; one of the two devices is CUDA.
Tensor copy_between_devices(const Tensor& tensor, Device device, const char* op) {
  if (!tensor.defined()) {
    throw_invalid(op, "the tensor is undefined");
  }
  if (tensor.device().is_meta() || device.is_meta()) {
    throw_invalid(op, "cannot copy between " + tensor.device().to_string() + " and " +
                          device.to_string() + ": meta tensors carry shapes only");
  }
  // A CPU source is packed on the host; a CUDA one must be contiguous already.
  const Tensor source = tensor.device().is_cpu() ? tensor.contiguous() : tensor;
  if (!source.is_contiguous()) {
    throw_needs_kernel(op, tensor, "packing the elements", kContiguousOnly);
  }
  CHORUS_CHECK(source.device().is_cuda() || device.is_cuda());
  detail::device_memory_for(copying_device(source.device(), device), op);  // names `op` if none
  Tensor out = Tensor::empty(source.sizes(), source.dtype(), device);
  copy_contiguous_bytes(out, source, op);
  return out;
}

void copy_device_bytes(Tensor& dst, const Tensor& src, const char* op) {
  if (dst.device().is_meta() || src.device().is_meta()) {
    throw_invalid(op, "cannot copy between " + src.device().to_string() + " and " +
                          dst.device().to_string() + ": meta tensors carry shapes only");
  }
  if (dst.dtype() != src.dtype()) {
    throw_needs_kernel(op, dst.device().is_cuda() ? dst : src, "converting the dtype",
                       kConvertOnHost);
  }
  if (!dst.is_contiguous()) {
    throw_needs_kernel(op, dst, "writing non-contiguous elements", kContiguousOnly);
  }
  if (src.device().is_cuda() && !src.is_contiguous()) {  // refused before anything waits
    throw_needs_kernel(op, src, "reading non-contiguous elements", kContiguousOnly);
  }
  // The destination's pending collectives finish (in stream order) before it is overwritten.
  detail::access_data(dst, op, detail::DeviceAccess::OrderedByWait);
  if (bytes_overlap(dst, src)) {
    // Overlapping ranges (one pointer valid on host and device: managed or mapped memory
    // wrapped twice by from_blob): read from a private copy, on the source's side.
    const Tensor copy =
        src.device().is_cpu() ? src.clone() : copy_between_devices(src, src.device(), op);
    copy_contiguous_bytes(dst, copy, op);
    return;
  }
  copy_contiguous_bytes(dst, src.device().is_cpu() ? src.contiguous() : src, op);
}

}  // namespace

Tensor Tensor::to(Device device) const {
  constexpr const char* kOp = "Tensor::to";
  if (defined_ && device == device_) {
    return *this;  // as torch: no copy when already there
  }
  return copy_between_devices(*this, device, kOp);
}

Tensor Tensor::contiguous() const {
  constexpr const char* kOp = "Tensor::contiguous";
  if (defined_ && device_.is_meta()) {  // shapes only: nothing to wait for or copy
    return is_contiguous() ? *this : empty(layout().sizes, dtype_, device_);
  }
  if (defined_ && device_.is_cuda()) {
    if (!is_contiguous()) {
      throw_needs_kernel(kOp, *this, "packing the elements", kContiguousOnly);
    }
    // Waiting orders the caller's stream after pending work; no host access happens.
    detail::access_data(*this, kOp, detail::DeviceAccess::OrderedByWait);
    return *this;
  }
  checked_data_for_host(kOp);
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  constexpr const char* kOp = "Tensor::clone";
  if (defined_ && device_.is_meta()) {
    return empty(layout().sizes, dtype_, device_);
  }
  if (defined_ && device_.is_cuda()) {
    return copy_between_devices(*this, device_, kOp);
  }
  const void* first = checked_data_for_host(kOp);
  Tensor out = empty(layout().sizes, dtype_, device_);
  detail::strided_copy(out.unsafe_data_ptr(), out.strides(), first, layout().strides,
                       layout().sizes, element_size());
  return out;
}

Tensor Tensor::to(DType dtype) const {
  constexpr const char* kOp = "Tensor::to";
  if (defined_ && device_.is_meta()) {
    return empty(layout().sizes, dtype, device_);
  }
  if (defined_ && device_.is_cuda()) {
    if (dtype != dtype_) {
      throw_needs_kernel(kOp, *this, "converting the dtype", kConvertOnHost);
    }
    return copy_between_devices(*this, device_, kOp);
  }
  const void* first = checked_data_for_host(kOp);
  if (dtype == dtype_) {
    return clone();
  }
  Tensor out = empty(layout().sizes, dtype, device_);
  if (numel() > 0) {
    std::vector<std::byte> scratch;
    kernels::convert(out.unsafe_data_ptr(), dtype, packed_elements(*this, first, scratch), dtype_,
                     static_cast<std::size_t>(numel()));
  }
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  constexpr const char* kOp = "Tensor::copy_";
  if (!defined_ || !src.defined_) {
    throw_invalid(kOp, !defined_ ? "the destination is undefined" : "the source is undefined");
  }
  if (layout().sizes != src.sizes()) {
    throw_invalid(kOp, "shapes differ: destination " + shape_to_string(layout().sizes) +
                           ", source " + shape_to_string(src.sizes()));
  }
  if (device_.is_meta() && src.device_.is_meta()) {
    return *this;  // shapes only
  }
  if (const std::int64_t dim = detail::shared_location_dim(layout().sizes, layout().strides);
      dim >= 0) {
    throw_invalid(kOp, "the destination has stride 0 in dim " + std::to_string(dim) +
                           ", so several elements share one memory location");
  }
  if (device_.is_cpu() && src.device_.is_cuda() && dtype_ == src.dtype_ && !is_contiguous()) {
    // Only the CUDA side must be contiguous: the host destination is filled from a host copy.
    return copy_(copy_between_devices(src, Device::cpu(), kOp));
  }
  if (device_.is_cuda() || src.device_.is_cuda()) {
    copy_device_bytes(*this, src, kOp);
    return *this;
  }
  void* dst = checked_data_for_host(kOp);
  const void* first = src.checked_data_for_host(kOp);
  if (bytes_overlap(*this, src)) {
    // The ranges overlap (x.copy_(x.transpose(0, 1))): read from a private copy, since
    // strided_copy and kernels::convert want disjoint ranges.
    return copy_(src.clone());
  }
  if (numel() == 0) {
    return *this;
  }
  if (dtype_ == src.dtype_) {
    detail::strided_copy(dst, layout().strides, first, src.strides(), layout().sizes,
                         element_size());
    return *this;
  }
  std::vector<std::byte> src_scratch;
  const void* packed_src = packed_elements(src, first, src_scratch);
  const auto count = static_cast<std::size_t>(numel());
  if (is_contiguous()) {
    kernels::convert(dst, dtype_, packed_src, src.dtype_, count);
    return *this;
  }
  std::vector<std::byte> converted(nbytes());
  kernels::convert(converted.data(), dtype_, packed_src, src.dtype_, count);
  detail::strided_copy(dst, layout().strides, converted.data(), contiguous_strides(layout().sizes),
                       layout().sizes, element_size());
  return *this;
}

namespace {

// Compares the elements of `a` and `b` (after waiting on both) with `same(a_bytes, b_bytes)` on
// packed copies; tensors of different shape or dtype are never equal.
template <class Same>
bool compare_elements(const Tensor& a, const Tensor& b, const char* op, Same same) {
  const void* a_first = detail::access_data(a, op, detail::DeviceAccess::Host);
  const void* b_first = detail::access_data(b, op, detail::DeviceAccess::Host);
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) {
    return false;
  }
  if (a.numel() == 0) {
    return true;
  }
  std::vector<std::byte> a_scratch;
  std::vector<std::byte> b_scratch;
  return same(packed_elements(a, a_first, a_scratch), packed_elements(b, b_first, b_scratch));
}

}  // namespace

bool Tensor::equal(const Tensor& other) const {
  return compare_elements(*this, other, "Tensor::equal", [&](const void* a, const void* b) {
    return kernels::values_equal(a, b, dtype_, static_cast<std::size_t>(numel()));
  });
}

bool Tensor::bitwise_equal(const Tensor& other) const {
  return compare_elements(*this, other, "Tensor::bitwise_equal", [&](const void* a, const void* b) {
    return std::memcmp(a, b, nbytes()) == 0;
  });
}

std::string Tensor::to_string(std::int64_t max_values) const {
  if (!defined_) {
    return "Tensor(undefined)";
  }
  std::ostringstream out;
  out << "Tensor(shape=" << shape_to_string(layout().sizes) << ", dtype=" << dtype_name(dtype_)
      << ", device=" << device_.to_string();
  if (!device_.is_cpu()) {  // meta has no values; CUDA values are not readable from the host
    out << ")";
    return out.str();
  }
  const auto* first = static_cast<const std::byte*>(checked_data_for_host("Tensor::to_string"));
  const std::int64_t numel = this->numel();
  const std::int64_t shown = max_values < 0 ? numel : std::min(numel, max_values);
  const auto element_bytes = static_cast<std::int64_t>(element_size());
  out << ", values=[";
  for (std::int64_t k = 0; k < shown; ++k) {
    // Row-major index k -> element offset.
    std::int64_t offset = 0;
    std::int64_t rest = k;
    for (std::size_t d = layout().sizes.size(); d-- > 0;) {
      offset += (rest % layout().sizes[d]) * layout().strides[d];
      rest /= layout().sizes[d];
    }
    if (k > 0) {
      out << ", ";
    }
    print_element(out, first + offset * element_bytes, dtype_);
  }
  if (shown < numel) {
    out << (shown > 0 ? ", ..." : "...");
  }
  out << "])";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.to_string();
}

}  // namespace chorus
