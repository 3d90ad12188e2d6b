// Tests of DLPack 0.6 export and import: zero copy, lifetimes, dtypes, devices, strides.

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/tensor.hpp"
#include "support/expect_error.hpp"

namespace chorus {
namespace {

using testing::expect_invalid_argument;

// A stand-in for a foreign producer (PyTorch, JAX): owns the shape and stride arrays and counts
// deleter calls.
struct Producer {
  Shape shape;
  std::optional<Shape> strides;
  int* deleter_calls = nullptr;
  DLManagedTensor managed{};
};

struct ManagedSpec {
  void* data = nullptr;
  DLDataType dtype{kDLFloat, 32, 1};
  DLDevice device{kDLCPU, 0};
  Shape shape;
  std::optional<Shape> strides;
  std::uint64_t byte_offset = 0;
};

DLManagedTensor* make_managed(const ManagedSpec& spec, int* deleter_calls) {
  auto* producer = new Producer{spec.shape, spec.strides, deleter_calls, {}};
  DLTensor& dl = producer->managed.dl_tensor;
  dl.data = spec.data;
  dl.device = spec.device;
  dl.ndim = static_cast<int>(spec.shape.size());
  dl.dtype = spec.dtype;
  dl.shape = producer->shape.data();
  dl.strides = producer->strides ? producer->strides->data() : nullptr;
  dl.byte_offset = spec.byte_offset;
  producer->managed.manager_ctx = producer;
  producer->managed.deleter = [](DLManagedTensor* self) {
    auto* owner = static_cast<Producer*>(self->manager_ctx);
    ++*owner->deleter_calls;
    delete owner;
  };
  return &producer->managed;
}

Shape dl_shape(const DLTensor& dl) { return {dl.shape, dl.shape + dl.ndim}; }
Shape dl_strides(const DLTensor& dl) { return {dl.strides, dl.strides + dl.ndim}; }

// ---- Export.

TEST(TensorDLPack, ExportSharesMemory) {
  const Tensor t = Tensor::arange(6).view({2, 3});
  DLManagedTensor* managed = t.to_dlpack();
  ASSERT_NE(managed, nullptr);
  const DLTensor& dl = managed->dl_tensor;
  EXPECT_EQ(dl.data, t.unsafe_data_ptr());
  EXPECT_EQ(dl.byte_offset, 0u);
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.device.device_id, 0);
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl_shape(dl), (Shape{2, 3}));
  EXPECT_EQ(dl_strides(dl), (Shape{3, 1}));
  EXPECT_EQ(dl.dtype.code, kDLFloat);
  EXPECT_EQ(dl.dtype.bits, 32);
  EXPECT_EQ(dl.dtype.lanes, 1);
  // A write through the exported pointer shows in the tensor.
  static_cast<float*>(dl.data)[4] = 40.0f;
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 40, 5}));
  managed->deleter(managed);
}

TEST(TensorDLPack, ExportDescribesStridedView) {
  const Tensor base = Tensor::arange(24, DType::Int64).view({2, 3, 4});
  const Tensor v = base.permute({2, 0, 1}).narrow(0, 1, 2);  // sizes [2, 2, 3], strides [1, 12, 4]
  DLManagedTensor* managed = v.to_dlpack();
  const DLTensor& dl = managed->dl_tensor;
  EXPECT_EQ(dl.data, static_cast<std::int64_t*>(base.unsafe_data_ptr()) + 1);
  EXPECT_EQ(dl.byte_offset, 0u);
  EXPECT_EQ(dl_shape(dl), (Shape{2, 2, 3}));
  EXPECT_EQ(dl_strides(dl), (Shape{1, 12, 4}));
  managed->deleter(managed);
}

TEST(TensorDLPack, ExportMapsEveryDType) {
  struct Expected {
    DType dtype;
    std::uint8_t code;
    std::uint8_t bits;
  };
  // DLPack 0.6 has no boolean code: Bool travels as kDLUInt/8 (bytes 0 or 1).
  const Expected table[] = {
      {DType::Bool, kDLUInt, 8},
      {DType::UInt8, kDLUInt, 8},
      {DType::Int8, kDLInt, 8},
      {DType::Int32, kDLInt, 32},
      {DType::Int64, kDLInt, 64},
      {DType::Float16, kDLFloat, 16},
      {DType::BFloat16, kDLBfloat, 16},
      {DType::Float32, kDLFloat, 32},
      {DType::Float64, kDLFloat, 64},
      {DType::Complex64, kDLComplex, 64},
      {DType::Complex128, kDLComplex, 128},
  };
  static_assert(std::size(table) == kNumDTypes);
  for (const Expected& expected : table) {
    DLManagedTensor* managed = Tensor::zeros({1}, expected.dtype).to_dlpack();
    EXPECT_EQ(managed->dl_tensor.dtype.code, expected.code) << dtype_name(expected.dtype);
    EXPECT_EQ(managed->dl_tensor.dtype.bits, expected.bits) << dtype_name(expected.dtype);
    EXPECT_EQ(managed->dl_tensor.dtype.lanes, 1) << dtype_name(expected.dtype);
    managed->deleter(managed);
  }
}

TEST(TensorDLPack, ExportKeepsStorageAliveUntilDeleter) {
  std::vector<std::int32_t> buffer{7, 8, 9};
  int calls = 0;
  DLManagedTensor* managed = nullptr;
  {
    const Tensor t =
        Tensor::from_blob(buffer.data(), {3}, DType::Int32, Device::cpu(), [&](void*) { ++calls; });
    managed = t.narrow(0, 1, 2).to_dlpack();
  }
  EXPECT_EQ(calls, 0) << "the exported tensor still owns the storage";
  EXPECT_EQ(managed->dl_tensor.data, buffer.data() + 1);
  EXPECT_EQ(static_cast<std::int32_t*>(managed->dl_tensor.data)[1], 9);
  managed->deleter(managed);
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ExportZeroDimAndEmpty) {
  DLManagedTensor* scalar = Tensor::full({}, 3.0, DType::Float64).to_dlpack();
  EXPECT_EQ(scalar->dl_tensor.ndim, 0);
  EXPECT_EQ(*static_cast<double*>(scalar->dl_tensor.data), 3.0);
  scalar->deleter(scalar);
  DLManagedTensor* empty = Tensor::zeros({0, 4}).to_dlpack();
  EXPECT_EQ(dl_shape(empty->dl_tensor), (Shape{0, 4}));
  EXPECT_EQ(empty->dl_tensor.data, nullptr);
  empty->deleter(empty);
}

TEST(TensorDLPack, ExportCudaTensorNamesDevice) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a fake address, never dereferenced
  auto* device_memory = reinterpret_cast<void*>(std::uintptr_t{0x2000});
  int calls = 0;
  DLManagedTensor* managed = nullptr;
  {
    const Tensor t = Tensor::from_blob(device_memory, {4}, DType::BFloat16, Device::cuda(2),
                                       [&](void*) { ++calls; });
    managed = t.to_dlpack();
  }
  EXPECT_EQ(managed->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(managed->dl_tensor.device.device_id, 2);
  EXPECT_EQ(managed->dl_tensor.data, device_memory);
  EXPECT_EQ(calls, 0);
  managed->deleter(managed);
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ExportRejectsMetaAndUndefined) {
  expect_invalid_argument(
      [] { (void)Tensor::empty({2}, DType::Float32, Device::meta()).to_dlpack(); },
      {"Tensor::to_dlpack", "meta"});
  expect_invalid_argument([] { (void)Tensor().to_dlpack(); }, {"Tensor::to_dlpack", "undefined"});
}

// ---- Import.

TEST(TensorDLPack, ImportWrapsMemoryZeroCopy) {
  std::vector<float> buffer{1, 2, 3, 4, 5, 6};
  int calls = 0;
  ManagedSpec spec;
  spec.data = buffer.data();
  spec.shape = {2, 3};
  spec.strides = Shape{3, 1};
  const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
  EXPECT_EQ(t.unsafe_data_ptr(), buffer.data());
  EXPECT_EQ(t.dtype(), DType::Float32);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.to_vector<float>(), buffer);
  t.data_ptr<float>()[5] = 60.0f;
  EXPECT_EQ(buffer[5], 60.0f);
  EXPECT_EQ(calls, 0);
}

TEST(TensorDLPack, ImportDeleterRunsWhenLastTensorDies) {
  std::vector<std::int64_t> buffer{1, 2, 3, 4};
  int calls = 0;
  ManagedSpec spec;
  spec.data = buffer.data();
  spec.dtype = DLDataType{kDLInt, 64, 1};
  spec.shape = {4};
  {
    Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    const Tensor view = t.narrow(0, 2, 2);
    const Tensor copy = t.clone();
    t = Tensor();
    EXPECT_EQ(calls, 0) << "a view still uses the memory";
    EXPECT_EQ(view.to_vector<std::int64_t>(), (std::vector<std::int64_t>{3, 4}));
    EXPECT_FALSE(copy.shares_storage(view));
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ImportNonContiguousWithByteOffset) {
  // A [3, 2] view with strides [1, 4] that starts one element into the buffer:
  // element (i, j) is buffer[1 + i + 4 * j].
  std::vector<std::int32_t> buffer(12);
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    buffer[i] = static_cast<std::int32_t>(100 + i);
  }
  int calls = 0;
  ManagedSpec spec;
  spec.data = buffer.data();
  spec.dtype = DLDataType{kDLInt, 32, 1};
  spec.shape = {3, 2};
  spec.strides = Shape{1, 4};
  spec.byte_offset = sizeof(std::int32_t);
  {
    const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.unsafe_data_ptr(), buffer.data() + 1);
    EXPECT_EQ(t.strides(), (Shape{1, 4}));
    EXPECT_FALSE(t.is_contiguous());
    const std::vector<std::int32_t> expected{101, 105, 102, 106, 103, 107};
    EXPECT_EQ(t.to_vector<std::int32_t>(), expected);
    const Tensor packed = t.contiguous();
    EXPECT_FALSE(packed.shares_storage(t));
    EXPECT_EQ(packed.to_vector<std::int32_t>(), expected);
    EXPECT_EQ(t.transpose(0, 1).to_vector<std::int32_t>(),
              (std::vector<std::int32_t>{101, 102, 103, 105, 106, 107}));
    EXPECT_EQ(t.transpose(0, 1).select(0, 1).strides(), (Shape{1}));
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ImportByteOffsetNeedNotBeAMultipleOfTheElementSize) {
  // byte_offset 4 into a buffer of Complex64 (8 bytes, aligned to 4): the tensor starts
  // mid-element, so the storage must start at the first element, not at byte_offset / 8
  // elements.
  alignas(8) float floats[6] = {0, 1, 2, 3, 4, 5};
  int calls = 0;
  ManagedSpec spec;
  spec.data = floats;
  spec.dtype = DLDataType{kDLComplex, 64, 1};
  spec.shape = {2};
  spec.byte_offset = 4;
  {
    const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.unsafe_data_ptr(), floats + 1);
    EXPECT_EQ(t.to_vector<std::complex<float>>(),
              (std::vector<std::complex<float>>{{1, 2}, {3, 4}}));
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ImportRejectsElementsMisalignedForTheirType) {
  // The kernels read elements through typed pointers: an Int32 at an odd address would be
  // undefined behaviour (UBSan: misaligned load), so the import refuses it.
  alignas(8) std::uint8_t bytes[12] = {0, 0, 1, 0, 0, 0, 2, 0, 0, 0};
  int calls = 0;
  ManagedSpec spec;
  spec.data = bytes;
  spec.dtype = DLDataType{kDLInt, 32, 1};
  spec.shape = {2};
  spec.byte_offset = 2;
  DLManagedTensor* managed = make_managed(spec, &calls);
  expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); },
                          {"Tensor::from_dlpack",
                           "data + byte_offset 2 is not aligned for Int32 (4-byte alignment "
                           "needed)"});
  EXPECT_EQ(calls, 0) << "a rejected tensor stays with the caller";
  managed->deleter(managed);
  EXPECT_EQ(calls, 1);

  // A misaligned `data` is refused the same way; an empty view has no element to misalign.
  spec.data = bytes + 1;
  spec.byte_offset = 0;
  managed = make_managed(spec, &calls);
  expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); },
                          {"data + byte_offset 0 is not aligned for Int32"});
  managed->deleter(managed);
  spec.shape = {0};
  EXPECT_EQ(Tensor::from_dlpack(make_managed(spec, &calls)).numel(), 0);
  EXPECT_EQ(calls, 3);
}

TEST(TensorDLPack, ImportNullStridesMeansRowMajor) {
  std::vector<double> buffer{1, 2, 3, 4, 5, 6};
  int calls = 0;
  ManagedSpec spec;
  spec.data = buffer.data();
  spec.dtype = DLDataType{kDLFloat, 64, 1};
  spec.shape = {3, 2};
  {
    const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.strides(), (Shape{2, 1}));
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.select(0, 2).to_vector<double>(), (std::vector<double>{5, 6}));
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ImportZeroStrideBroadcast) {
  std::vector<float> row{1, 2, 3};
  int calls = 0;
  ManagedSpec spec;
  spec.data = row.data();
  spec.shape = {2, 3};
  spec.strides = Shape{0, 1};
  {
    Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
    EXPECT_TRUE(t.clone().equal(Tensor::from_vector(std::vector<float>{1, 2, 3, 1, 2, 3}, {2, 3})));
    expect_invalid_argument(
        [&] {
          t.copy_(Tensor::zeros({2, 3}));
        },
        {"Tensor::copy_", "stride 0 in dim 0"});
  }
  EXPECT_EQ(calls, 1);
}

// Only a stride 0 that is stepped shares a location among elements: a size-1 dim's stride is
// never stepped, so a destination with stride 0 there is written; one with stride 0 in an inner
// dim of size > 1 is refused, naming that dim.
TEST(TensorDLPack, ImportedZeroStrideIsRefusedAsADestinationOnlyWhereItIsStepped) {
  std::vector<float> row{1, 2, 3};
  int calls = 0;
  ManagedSpec spec;
  spec.data = row.data();
  spec.shape = {1, 3};
  spec.strides = Shape{0, 1};
  {
    Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    t.copy_(Tensor::from_vector(std::vector<float>{4, 5, 6}, {1, 3}));
    EXPECT_EQ(row, (std::vector<float>{4, 5, 6}));
  }
  spec.shape = {3, 2};
  spec.strides = Shape{1, 0};
  {
    Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{4, 4, 5, 5, 6, 6}));
    expect_invalid_argument(
        [&] {
          t.copy_(Tensor::zeros({3, 2}));
        },
        {"Tensor::copy_", "stride 0 in dim 1"});
  }
  EXPECT_EQ(row, (std::vector<float>{4, 5, 6})) << "nothing was written";
  EXPECT_EQ(calls, 2);
}

TEST(TensorDLPack, ImportEmptyTensorWithNullData) {
  int calls = 0;
  ManagedSpec spec;
  spec.shape = {0, 3};
  {
    const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.numel(), 0);
    EXPECT_TRUE(t.to_vector<float>().empty());
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ImportCudaTensorStaysOnDevice) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a fake address, never dereferenced
  auto* device_memory = reinterpret_cast<void*>(std::uintptr_t{0x4000});
  int calls = 0;
  ManagedSpec spec;
  spec.data = device_memory;
  spec.dtype = DLDataType{kDLFloat, 16, 1};
  spec.device = DLDevice{kDLCUDA, 3};
  spec.shape = {8};
  {
    const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
    EXPECT_EQ(t.device(), Device::cuda(3));
    EXPECT_EQ(t.dtype(), DType::Float16);
    EXPECT_EQ(t.unsafe_data_ptr(), device_memory);
    expect_invalid_argument([&] { (void)t.to_vector<Half>(); }, {"host data access", "cuda:3"});
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorDLPack, ImportMapsEveryDType) {
  struct Case {
    DLDataType dl;
    DType dtype;
  };
  const Case cases[] = {
      {{kDLUInt, 8, 1}, DType::UInt8},         {{kDLInt, 8, 1}, DType::Int8},
      {{kDLInt, 32, 1}, DType::Int32},         {{kDLInt, 64, 1}, DType::Int64},
      {{kDLFloat, 16, 1}, DType::Float16},     {{kDLBfloat, 16, 1}, DType::BFloat16},
      {{kDLFloat, 32, 1}, DType::Float32},     {{kDLFloat, 64, 1}, DType::Float64},
      {{kDLComplex, 64, 1}, DType::Complex64}, {{kDLComplex, 128, 1}, DType::Complex128},
  };
  alignas(16) std::byte buffer[32] = {};
  for (const Case& c : cases) {
    int calls = 0;
    ManagedSpec spec;
    spec.data = buffer;
    spec.dtype = c.dl;
    spec.shape = {2};
    EXPECT_EQ(Tensor::from_dlpack(make_managed(spec, &calls)).dtype(), c.dtype);
    EXPECT_EQ(calls, 1);
  }
}

TEST(TensorDLPack, ImportRejectsWhatChorusLacksAndKeepsOwnership) {
  float value = 0.0f;
  const auto rejected = [&](const ManagedSpec& spec, std::initializer_list<std::string> fragments,
                            int line = __builtin_LINE()) {
    int calls = 0;
    DLManagedTensor* managed = make_managed(spec, &calls);
    expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); }, fragments, line);
    EXPECT_EQ(calls, 0) << "line " << line << ": a rejected tensor stays with the caller";
    managed->deleter(managed);
    EXPECT_EQ(calls, 1);
  };
  ManagedSpec base;
  base.data = &value;
  base.shape = {1};

  ManagedSpec spec = base;
  spec.dtype = DLDataType{kDLUInt, 16, 1};
  rejected(spec, {"Tensor::from_dlpack", "unsupported DLPack dtype (code 1, bits 16, lanes 1)"});
  spec.dtype = DLDataType{kDLFloat, 32, 4};
  rejected(spec, {"unsupported DLPack dtype", "lanes 4"});
  spec.dtype = DLDataType{kDLOpaqueHandle, 64, 1};
  rejected(spec, {"unsupported DLPack dtype"});
  spec.dtype = DLDataType{kDLBfloat, 32, 1};
  rejected(spec, {"unsupported DLPack dtype"});
  spec.dtype = DLDataType{kDLComplex, 32, 1};
  rejected(spec, {"unsupported DLPack dtype"});

  spec = base;
  spec.device = DLDevice{kDLOpenCL, 0};
  rejected(spec, {"Tensor::from_dlpack", "unsupported DLPack device (type 4"});
  spec.device = DLDevice{kDLCUDA, -1};
  rejected(spec, {"unsupported DLPack device"});

  spec = base;
  spec.shape = {2, 1};
  spec.strides = Shape{-1, 1};
  rejected(spec, {"Tensor::from_dlpack", "strides [-1, 1]", "must be >= 0"});
  spec.shape = {-2};
  spec.strides = std::nullopt;
  rejected(spec, {"shape [-2]"});

  spec = base;
  spec.data = nullptr;
  rejected(spec, {"Tensor::from_dlpack", "data is null"});

  expect_invalid_argument([] { (void)Tensor::from_dlpack(nullptr); },
                          {"Tensor::from_dlpack", "null"});
}

TEST(TensorDLPack, ImportRejectsElementBytesThatOverflowWhateverTheSpan) {
  // 2^62 + 1 Float32 elements with stride 0: the span is one float, but numel() * 4 wraps to 4,
  // so nbytes() would be 4 and equal() would pack 2^62 floats into a 4-byte buffer.
  float value = 7.0f;
  int calls = 0;
  ManagedSpec spec;
  spec.data = &value;
  spec.shape = {(std::int64_t{1} << 62) + 1};
  spec.strides = Shape{0};
  DLManagedTensor* managed = make_managed(spec, &calls);
  expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); },
                          {"Tensor::from_dlpack",
                           "shape [4611686018427387905] with strides [0] is too large to "
                           "address"});
  EXPECT_EQ(calls, 0);
  managed->deleter(managed);

  // The largest broadcast whose bytes fit: nbytes() is exact.
  spec.shape = {std::numeric_limits<std::int64_t>::max() / 4};
  const Tensor widest = Tensor::from_dlpack(make_managed(spec, &calls));
  EXPECT_EQ(widest.nbytes(), std::size_t{std::numeric_limits<std::int64_t>::max() / 4} * 4);
  EXPECT_EQ(widest.narrow(0, 5, 2).to_vector<float>(), (std::vector<float>{7.0f, 7.0f}));
}

TEST(TensorDLPack, ImportSpanArithmeticNeverOverflows) {
  std::uint8_t bytes[4] = {};
  const auto rejected = [&](const Shape& shape, const Shape& strides, const std::string& detail,
                            int line = __builtin_LINE()) {
    int calls = 0;
    ManagedSpec spec;
    spec.data = bytes;
    spec.dtype = DLDataType{kDLUInt, 8, 1};
    spec.shape = shape;
    spec.strides = strides;
    DLManagedTensor* managed = make_managed(spec, &calls);
    expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); },
                            {"Tensor::from_dlpack", detail}, line);
    EXPECT_EQ(calls, 0) << "line " << line;
    managed->deleter(managed);
  };
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  const std::int64_t quarter = std::int64_t{1} << 62;
  // The last element's offset is max: one more element (the span) overflows.
  rejected({2, 2, 2}, {quarter - 1, quarter - 1, 1},
           "shape [2, 2, 2] with strides [4611686018427387903, 4611686018427387903, 1] is too "
           "large to address");
  rejected({2}, {max}, "shape [2] with strides [9223372036854775807] is too large to address");
  // The span (2^62 + 1 bytes) fits, but size * stride does not (unsqueeze(0) computes it).
  rejected({2}, {quarter}, "shape [2] with strides [4611686018427387904] is too large to address");
  // A size-1 dim may have any stride: it never steps, and its extent is the stride itself.
  int calls = 0;
  ManagedSpec spec;
  spec.data = bytes;
  spec.dtype = DLDataType{kDLUInt, 8, 1};
  spec.shape = {1};
  spec.strides = Shape{max};
  const Tensor t = Tensor::from_dlpack(make_managed(spec, &calls));
  EXPECT_EQ(t.unsqueeze(0).strides(), (Shape{max, max}));
  EXPECT_EQ(t.unsqueeze(0).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0}));
}

TEST(TensorDLPack, ImportEmptyShapesWhoseContiguousStridesOverflowThrow) {
  // Null strides of shape [0, 2^40, 2^40] would be [2^80, 2^40, 1]: the size-0 dim counts as 1
  // (as PyTorch's), so they overflow.
  const std::int64_t big = std::int64_t{1} << 40;
  int calls = 0;
  ManagedSpec spec;
  spec.shape = {0, big, big};
  DLManagedTensor* managed = make_managed(spec, &calls);
  expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); },
                          {"Tensor::from_dlpack",
                           "shape [0, 1099511627776, 1099511627776] with strides (row-major) is "
                           "too large to address"});
  EXPECT_EQ(calls, 0);
  managed->deleter(managed);
  // Explicit strides do not help: clone() and to_vector() lay out a contiguous copy.
  spec.strides = Shape{0, 0, 0};
  managed = make_managed(spec, &calls);
  expect_invalid_argument([&] { (void)Tensor::from_dlpack(managed); },
                          {"shape [0, 1099511627776, 1099511627776] with strides [0, 0, 0] is too "
                           "large to address"});
  managed->deleter(managed);
  spec.strides = std::nullopt;
  const std::int64_t fits = std::int64_t{1} << 31;
  spec.dtype = DLDataType{kDLUInt, 8, 1};
  spec.shape = {0, fits, fits};
  const Tensor empty = Tensor::from_dlpack(make_managed(spec, &calls));
  EXPECT_EQ(empty.strides(), (Shape{std::int64_t{1} << 62, fits, 1}));
  EXPECT_TRUE(empty.to_vector<std::uint8_t>().empty());
  EXPECT_EQ(empty.clone().sizes(), (Shape{0, fits, fits}));
}

// ---- Round trips.

TEST(TensorDLPack, RoundTripEveryDTypeIsZeroCopy) {
  for (const DType dtype : kAllDTypes) {
    const Tensor t = Tensor::arange(6, dtype).view({3, 2});
    const Tensor back = Tensor::from_dlpack(t.to_dlpack());
    EXPECT_EQ(back.unsafe_data_ptr(), t.unsafe_data_ptr()) << dtype_name(dtype);
    EXPECT_EQ(back.sizes(), t.sizes());
    EXPECT_EQ(back.strides(), t.strides());
    EXPECT_EQ(back.device(), Device::cpu());
    if (dtype == DType::Bool) {
      // No boolean code in DLPack 0.6: the same bytes come back as UInt8.
      EXPECT_EQ(back.dtype(), DType::UInt8);
      EXPECT_EQ(back.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0, 1, 1, 1, 1, 1}));
    } else {
      EXPECT_EQ(back.dtype(), dtype);
      EXPECT_TRUE(back.bitwise_equal(t)) << dtype_name(dtype);
    }
  }
}

TEST(TensorDLPack, RoundTripNonContiguousView) {
  const Tensor base = Tensor::arange(20, DType::Int32).view({4, 5});
  const Tensor v = base.narrow(1, 1, 3).transpose(0, 1);  // sizes [3, 4], strides [1, 5]
  Tensor back = Tensor::from_dlpack(v.to_dlpack());
  EXPECT_EQ(back.unsafe_data_ptr(), v.unsafe_data_ptr());
  EXPECT_EQ(back.strides(), (Shape{1, 5}));
  EXPECT_TRUE(back.equal(v));
  // Writes through the imported tensor land in the original memory.
  back.copy_(Tensor::zeros({3, 4}, DType::Int32));
  EXPECT_EQ(base.select(1, 0).to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 5, 10, 15}));
  EXPECT_EQ(base.select(1, 2).to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 0, 0, 0}));
}

TEST(TensorDLPack, CopyBetweenATensorAndItsRoundTripSeesTheOverlap) {
  // The import has a storage of its own over the same bytes: copy_ must still read through a
  // temporary.
  Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const Tensor back = Tensor::from_dlpack(t.to_dlpack());
  EXPECT_FALSE(back.shares_storage(t));
  t.copy_(back.transpose(0, 1));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 3, 2, 4}));
}

TEST(TensorDLPack, RoundTripKeepsMemoryUntilBothSidesLetGo) {
  std::vector<float> buffer{1, 2};
  int calls = 0;
  Tensor back;
  {
    const Tensor t = Tensor::from_blob(buffer.data(), {2}, DType::Float32, Device::cpu(),
                                       [&](void*) { ++calls; });
    back = Tensor::from_dlpack(t.to_dlpack());
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(back.to_vector<float>(), buffer);
  back = Tensor();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace chorus
