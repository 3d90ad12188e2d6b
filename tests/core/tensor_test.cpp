// Tests of chorus::Tensor: factories, dtypes, views, strided copies, conversions, meta tensors.
// Exact inputs, bitwise comparisons. Pending-storage behaviour is tested with the collectives.

#include "chorus/tensor.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/half.hpp"
#include "support/expect_error.hpp"

namespace chorus {
namespace {

using testing::expect_invalid_argument;

template <class T>
void expect_bitwise_equal(const std::vector<T>& actual, const std::vector<T>& expected,
                          int line = __builtin_LINE()) {
  ASSERT_EQ(actual.size(), expected.size()) << "line " << line;
  if constexpr (std::is_same_v<T, bool>) {
    EXPECT_EQ(actual, expected) << "line " << line;
  } else if (!expected.empty()) {
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(), expected.size() * sizeof(T)), 0)
        << "line " << line;
  }
}

float float_from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
double double_from_bits(std::uint64_t bits) { return std::bit_cast<double>(bits); }

// Row-major reference gather: the elements of the view (sizes, strides, offset) of `base`.
template <class T>
std::vector<T> gather_reference(const std::vector<T>& base, const Shape& sizes,
                                const Shape& strides, std::int64_t offset) {
  std::int64_t numel = 1;
  for (const std::int64_t size : sizes) {
    numel *= size;
  }
  std::vector<T> out;
  for (std::int64_t k = 0; k < numel; ++k) {
    std::int64_t rest = k;
    std::int64_t position = offset;
    for (std::size_t d = sizes.size(); d-- > 0;) {
      position += (rest % sizes[d]) * strides[d];
      rest /= sizes[d];
    }
    out.push_back(base[static_cast<std::size_t>(position)]);
  }
  return out;
}

// ---- Factories.

TEST(TensorFactory, EmptyHasRowMajorStrides) {
  const Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.element_size(), 4u);
  EXPECT_EQ(t.dtype(), DType::Float32);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.storage_offset(), 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.is_pending());
  EXPECT_NE(t.unsafe_data_ptr(), nullptr);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.shares_storage(t));
}

// Note [Shared layouts]: fresh tensors of one shape share one sizes/strides layout, copies share
// their source's, and a view makes its own without touching the one it came from.
TEST(TensorFactory, FreshTensorsOfOneShapeShareTheirLayoutAndViewsMakeTheirOwn) {
  const Tensor a = Tensor::empty({2, 3});
  const Tensor b = Tensor::zeros({2, 3}, DType::Int8);
  EXPECT_EQ(a.sizes().data(), b.sizes().data());
  EXPECT_FALSE(a.shares_storage(b));
  const Tensor copy = a;  // NOLINT(performance-unnecessary-copy-initialization): the point
  EXPECT_EQ(copy.sizes().data(), a.sizes().data());

  const Tensor transposed = a.transpose(0, 1);
  EXPECT_EQ(transposed.sizes(), (Shape{3, 2}));
  EXPECT_EQ(transposed.strides(), (Shape{1, 3}));
  EXPECT_EQ(a.sizes(), (Shape{2, 3}));
  EXPECT_EQ(a.strides(), (Shape{3, 1}));

  // More shapes in turn than the cache keeps: every tensor still gets its own shape's layout.
  const std::vector<Shape> shapes = {{2, 3}, {3, 2}, {6}, {1, 6}, {6, 1}, {2, 1, 3}, {}};
  for (int round = 0; round < 3; ++round) {
    for (const Shape& shape : shapes) {
      const Tensor t = Tensor::empty(shape, DType::Float64);
      EXPECT_EQ(t.sizes(), shape);
      EXPECT_EQ(t.strides().size(), shape.size());
      EXPECT_TRUE(t.is_contiguous());
      EXPECT_EQ(t.numel(), shape.empty() ? 1 : 6);
      EXPECT_EQ(t.nbytes(), shape.empty() ? 8u : 48u);
    }
  }
  EXPECT_EQ(a.sizes(), (Shape{2, 3}));
}

// Note [Shared layouts]: the cache keeps the last four shapes made (round robin), so a loop over
// four shapes finds each one's layout. The shapes are used by no other test, so all four miss at
// first whatever the cache held.
TEST(TensorFactory, TheLayoutCacheKeepsFourShapes) {
  const std::vector<Shape> shapes = {{3, 5, 7}, {7, 5, 3}, {5, 3, 7}, {105, 1, 1}};
  std::vector<Tensor> first;
  for (const Shape& shape : shapes) {
    first.push_back(Tensor::empty(shape, DType::Int32));
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Tensor again = Tensor::empty(shapes[i], DType::UInt8);
    EXPECT_EQ(again.sizes().data(), first[i].sizes().data()) << "shape " << i;
  }
}

// A tensor made while the thread ends, after the layout cache is gone (from the destructor of a
// thread_local constructed before the cache): it gets a layout of its own (ASan flags a use of
// the destroyed cache).
std::atomic<bool> made_at_thread_exit{false};
struct MakesATensorAtThreadExit {
  MakesATensorAtThreadExit() = default;
  MakesATensorAtThreadExit(const MakesATensorAtThreadExit&) = delete;
  MakesATensorAtThreadExit& operator=(const MakesATensorAtThreadExit&) = delete;
  ~MakesATensorAtThreadExit() {
    const Tensor late = Tensor::empty({2, 3});
    made_at_thread_exit = late.sizes() == Shape{2, 3} && late.strides() == Shape{3, 1};
  }
};

TEST(TensorFactory, ATensorMadeAfterTheThreadsLayoutCacheIsGoneGetsItsOwnLayout) {
  std::thread([] {
    thread_local MakesATensorAtThreadExit made_later;  // destroyed after the cache below
    (void)&made_later;
    (void)Tensor::empty({2, 3});  // constructs this thread's layout cache
  }).join();
  EXPECT_TRUE(made_at_thread_exit.load());
}

TEST(TensorFactory, ZeroDimTensorHasOneElement) {
  const Tensor t = Tensor::full({}, 2.5, DType::Float64);
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_TRUE(t.sizes().empty());
  EXPECT_TRUE(t.strides().empty());
  EXPECT_EQ(t.item<double>(), 2.5);
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>{2.5});
  expect_invalid_argument([&] { (void)t.size(0); }, {"Tensor::size", "0-d tensor"});
}

TEST(TensorFactory, EmptyShapeHasNoElements) {
  const Tensor t = Tensor::zeros({2, 0, 3}, DType::Int32);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.strides(), (Shape{3, 3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.unsafe_data_ptr(), nullptr);
  EXPECT_TRUE(t.to_vector<std::int32_t>().empty());
  EXPECT_TRUE(t.clone().to_vector<std::int32_t>().empty());
  EXPECT_TRUE(t.equal(Tensor::ones({2, 0, 3}, DType::Int32)));
  EXPECT_EQ(t.view({0, 5}).sizes(), (Shape{0, 5}));
  EXPECT_EQ(t.transpose(0, 2).contiguous().sizes(), (Shape{3, 0, 2}));
  expect_invalid_argument([&] { (void)t.item<std::int32_t>(); },
                          {"Tensor::item", "expected a tensor with 1 element", "0 elements"});
}

TEST(TensorFactory, ZerosAreZeroBytesInEveryDtype) {
  for (const DType dtype : kAllDTypes) {
    const Tensor t = Tensor::zeros({3, 2}, dtype);
    const std::vector<std::byte> zero(t.nbytes(), std::byte{0});
    ASSERT_EQ(t.nbytes(), 6 * element_size(dtype));
    EXPECT_EQ(std::memcmp(t.unsafe_data_ptr(), zero.data(), zero.size()), 0) << dtype_name(dtype);
  }
}

TEST(TensorFactory, OnesConvertToEveryDtype) {
  EXPECT_EQ(Tensor::ones({2}, DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(Tensor::ones({2}, DType::UInt8).to_vector<std::uint8_t>(),
            (std::vector<std::uint8_t>{1, 1}));
  EXPECT_EQ(Tensor::ones({2}, DType::Int8).to_vector<std::int8_t>(),
            (std::vector<std::int8_t>{1, 1}));
  EXPECT_EQ(Tensor::ones({2}, DType::Int32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{1, 1}));
  EXPECT_EQ(Tensor::ones({2}, DType::Int64).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(Tensor::ones({1}, DType::Float16).item<Half>().bits, 0x3C00);
  EXPECT_EQ(Tensor::ones({1}, DType::BFloat16).item<BFloat16>().bits, 0x3F80);
  EXPECT_EQ(Tensor::ones({2}).to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
  EXPECT_EQ(Tensor::ones({2}, DType::Float64).to_vector<double>(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(Tensor::ones({1}, DType::Complex64).item<std::complex<float>>(),
            std::complex<float>(1.0f, 0.0f));
  EXPECT_EQ(Tensor::ones({1}, DType::Complex128).item<std::complex<double>>(),
            std::complex<double>(1.0, 0.0));
}

TEST(TensorFactory, FullConvertsValueAsKernelsFill) {
  EXPECT_EQ(Tensor::full({3}, 2.75, DType::Int32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{2, 2, 2}));
  EXPECT_EQ(Tensor::full({2}, -2.75, DType::Int8).to_vector<std::int8_t>(),
            (std::vector<std::int8_t>{-2, -2}));
  EXPECT_EQ(Tensor::full({1}, 0.5, DType::Bool).item<bool>(), true);
  EXPECT_EQ(Tensor::full({1}, 0.0, DType::Bool).item<bool>(), false);
  // 0.1 rounds to nearest even: binary16 0x2E66, bfloat16 0x3DCD.
  EXPECT_EQ(Tensor::full({1}, 0.1, DType::Float16).item<Half>().bits, 0x2E66);
  EXPECT_EQ(Tensor::full({1}, 0.1, DType::BFloat16).item<BFloat16>().bits, 0x3DCD);
  EXPECT_EQ(Tensor::full({1}, 0.1, DType::Float32).item<float>(), 0.1f);
  EXPECT_EQ(Tensor::full({1}, -1.5, DType::Complex128).item<std::complex<double>>(),
            std::complex<double>(-1.5, 0.0));
  EXPECT_EQ(Tensor::full({2, 2}, 7.0, DType::Int64).sizes(), (Shape{2, 2}));
  // Outside the integer's range after truncation, or NaN: 0 (as tensor.hpp says).
  EXPECT_EQ(Tensor::full({1}, 300.0, DType::UInt8).item<std::uint8_t>(), 0);
  EXPECT_EQ(Tensor::full({1}, -1.0, DType::UInt8).item<std::uint8_t>(), 0);
  EXPECT_EQ(Tensor::full({1}, -0.5, DType::UInt8).item<std::uint8_t>(), 0);
  EXPECT_EQ(Tensor::full({1}, 255.9, DType::UInt8).item<std::uint8_t>(), 255);
  EXPECT_EQ(Tensor::full({1}, 3e9, DType::Int32).item<std::int32_t>(), 0);
  EXPECT_EQ(Tensor::full({1}, std::nan(""), DType::Int64).item<std::int64_t>(), 0);
}

TEST(TensorFactory, ArangeCountsFromZero) {
  EXPECT_EQ(Tensor::arange(5, DType::Int64).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  const Tensor floats = Tensor::arange(4);
  EXPECT_EQ(floats.dtype(), DType::Float32);
  EXPECT_EQ(floats.to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(Tensor::arange(3, DType::Bool).to_vector<bool>(),
            (std::vector<bool>{false, true, true}));
  const Tensor halves = Tensor::arange(3, DType::Float16);
  EXPECT_EQ(halves.to_vector<Half>(),
            (std::vector<Half>{Half::from_bits(0x0000), Half::from_bits(0x3C00),
                               Half::from_bits(0x4000)}));
  EXPECT_EQ(Tensor::arange(0).sizes(), (Shape{0}));
  expect_invalid_argument([] { (void)Tensor::arange(-1); }, {"Tensor::arange", "n must be >= 0"});
}

TEST(TensorFactory, NegativeSizesThrow) {
  expect_invalid_argument(
      [] {
        (void)Tensor::empty({2, -1});
      },
      {"Tensor::empty", "[2, -1]", "negative size"});
  expect_invalid_argument([] { (void)Tensor::zeros({-3}); }, {"negative size"});
  expect_invalid_argument([] { (void)Tensor::full({-3}, 1.0, DType::Float32, Device::meta()); },
                          {"negative size"});
}

TEST(TensorFactory, HugeShapesThrow) {
  const std::int64_t big = std::int64_t{1} << 40;
  expect_invalid_argument([&] { (void)Tensor::empty({big, big}); }, {"Tensor::empty", "too large"});
}

TEST(TensorFactory, EmptyShapesWhoseStridesOverflowThrow) {
  // No element, but the strides of [0, 2^40, 2^40] would be [2^80, 2^40, 1]: a size-0 dim counts
  // as size 1 in the strides (as PyTorch's), so the shape is refused, meta tensors included.
  const std::int64_t big = std::int64_t{1} << 40;
  expect_invalid_argument(
      [&] {
        (void)Tensor::empty({0, big, big}, DType::Float32, Device::meta());
      },
      {"Tensor::empty",
       "shape [0, 1099511627776, 1099511627776] of Float32 is too large to "
       "address"});
  expect_invalid_argument([&] { (void)Tensor::zeros({big, big, 0}); }, {"too large to address"});
  float value = 0.0f;
  expect_invalid_argument(
      [&] {
        (void)Tensor::from_blob(&value, {0, big, big}, DType::Float32);
      },
      {"Tensor::from_blob", "too large to address"});
  // Strides that fit are kept exactly.
  const std::int64_t fits = std::int64_t{1} << 31;
  EXPECT_EQ(Tensor::empty({0, fits, fits}).strides(), (Shape{std::int64_t{1} << 62, fits, 1}));
  EXPECT_EQ(Tensor::empty({fits, fits, 0}, DType::UInt8, Device::meta()).strides(),
            (Shape{fits, 1, 1}));
}

TEST(TensorFactory, CudaFactoriesThrowOutsideARank) {
  // Device memory belongs to a rank (RankOptions::device_memory); tests/core/device_memory_test
  // covers ranks with and without it.
  expect_invalid_argument([] { (void)Tensor::zeros({2}, DType::Float32, Device::cuda()); },
                          {"outside a rank", "from_blob"});
  expect_invalid_argument([] { (void)Tensor::empty({2}, DType::Int32, Device::cuda(1)); },
                          {"cuda:1", "outside a rank"});
}

TEST(TensorFactory, FromVectorChecksElementCount) {
  const std::vector<float> values{1, 2, 3, 4, 5};
  expect_invalid_argument(
      [&] {
        (void)Tensor::from_vector(values, {2, 3});
      },
      {"Tensor::from_vector", "shape [2, 3] has 6 elements, but 5 values"});
  expect_invalid_argument([&] { (void)Tensor::from_vector(values, {5, -1}); }, {"negative size"});
  // More values than the shape holds are refused too, not cut short.
  expect_invalid_argument(
      [&] {
        (void)Tensor::from_vector(values, {2, 2});
      },
      {"Tensor::from_vector", "shape [2, 2] has 4 elements, but 5 values"});
  const Tensor t = Tensor::from_vector(values, {5, 1});
  EXPECT_EQ(t.sizes(), (Shape{5, 1}));
  EXPECT_EQ(t.to_vector<float>(), values);
  EXPECT_EQ(Tensor::from_vector(std::vector<float>{}).sizes(), (Shape{0}));
  EXPECT_EQ(Tensor::from_vector(std::vector<float>{4.0f}, {}).item<float>(), 4.0f);
}

// ---- Every dtype through from_vector / to_vector / item / data_ptr.

template <class T>
std::vector<T> sample_values();

template <>
std::vector<bool> sample_values() {
  return {true, false, true, true, false, false};
}
template <>
std::vector<std::uint8_t> sample_values() {
  return {0, 1, 127, 128, 254, 255};
}
template <>
std::vector<std::int8_t> sample_values() {
  return {-128, -1, 0, 1, 2, 127};
}
template <>
std::vector<std::int32_t> sample_values() {
  return {std::numeric_limits<std::int32_t>::min(), -1, 0, 1, 123456789,
          std::numeric_limits<std::int32_t>::max()};
}
template <>
std::vector<std::int64_t> sample_values() {
  return {std::numeric_limits<std::int64_t>::min(), -1, 0, 1, (std::int64_t{1} << 53) + 1,
          std::numeric_limits<std::int64_t>::max()};
}
template <>
std::vector<Half> sample_values() {
  // +0, -0, 1, max finite, smallest subnormal, NaN with a payload.
  return {Half::from_bits(0x0000), Half::from_bits(0x8000), Half::from_bits(0x3C00),
          Half::from_bits(0x7BFF), Half::from_bits(0x0001), Half::from_bits(0x7E01)};
}
template <>
std::vector<BFloat16> sample_values() {
  return {BFloat16::from_bits(0x0000), BFloat16::from_bits(0x8000), BFloat16::from_bits(0x3F80),
          BFloat16::from_bits(0x7F7F), BFloat16::from_bits(0x0001), BFloat16::from_bits(0x7FC1)};
}
template <>
std::vector<float> sample_values() {
  return {0.0f,
          -0.0f,
          1.5f,
          std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::denorm_min(),
          float_from_bits(0x7FC00123u)};
}
template <>
std::vector<double> sample_values() {
  return {0.0,
          -0.0,
          1.5,
          -std::numeric_limits<double>::infinity(),
          std::numeric_limits<double>::denorm_min(),
          double_from_bits(0x7FF8000000000123u)};
}
template <>
std::vector<std::complex<float>> sample_values() {
  return {{1.0f, 2.0f},
          {-0.0f, 0.0f},
          {std::numeric_limits<float>::infinity(), -1.0f},
          {3.5f, -4.25f},
          {float_from_bits(0x7FC00042u), 0.0f},
          {0.0f, 1e-30f}};
}
template <>
std::vector<std::complex<double>> sample_values() {
  return {{1.0, 2.0},
          {-0.0, 0.0},
          {std::numeric_limits<double>::infinity(), -1.0},
          {3.5, -4.25},
          {double_from_bits(0x7FF8000000000042u), 0.0},
          {0.0, 1e-300}};
}

template <class T>
class TensorDType : public ::testing::Test {};

using AllElementTypes =
    ::testing::Types<bool, std::uint8_t, std::int8_t, std::int32_t, std::int64_t, Half, BFloat16,
                     float, double, std::complex<float>, std::complex<double>>;
TYPED_TEST_SUITE(TensorDType, AllElementTypes);

TYPED_TEST(TensorDType, FromVectorToVectorRoundTripsBits) {
  using T = TypeParam;
  const std::vector<T> values = sample_values<T>();
  const Tensor t = Tensor::from_vector(values, {2, 3});
  EXPECT_EQ(t.dtype(), dtype_of<T>);
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.element_size(), element_size(dtype_of<T>));
  expect_bitwise_equal(t.to_vector<T>(), values);
  const Tensor flat = Tensor::from_vector(values);
  expect_bitwise_equal(flat.to_vector<T>(), values);
  expect_bitwise_equal(t.clone().to_vector<T>(), values);
  expect_bitwise_equal(t.transpose(0, 1).contiguous().transpose(0, 1).to_vector<T>(), values);
  const Tensor converted = t.to(dtype_of<T>);
  expect_bitwise_equal(converted.to_vector<T>(), values);
  EXPECT_TRUE(t.bitwise_equal(Tensor::from_vector(values, {2, 3})));
}

TYPED_TEST(TensorDType, ItemAndDataPtrReadElements) {
  using T = TypeParam;
  const std::vector<T> values = sample_values<T>();
  const Tensor t = Tensor::from_vector(values, {2, 3});
  expect_bitwise_equal(std::vector<T>{t.select(0, 1).select(0, 2).item<T>()},
                       std::vector<T>{values[5]});
  const T* data = t.data_ptr<T>();
  ASSERT_EQ(static_cast<const void*>(data), t.unsafe_data_ptr());
  std::vector<T> read;
  for (std::size_t i = 0; i < values.size(); ++i) {
    read.push_back(data[i]);
  }
  expect_bitwise_equal(read, values);
  // data_ptr of a view points at its first element.
  const T* second_row = t.select(0, 1).data_ptr<T>();
  EXPECT_EQ(second_row, data + 3);
}

TYPED_TEST(TensorDType, WrongElementTypeThrows) {
  using T = TypeParam;
  using Other = std::conditional_t<std::is_same_v<T, float>, std::int32_t, float>;
  const std::string expected = "tensor has dtype " + std::string(dtype_name(dtype_of<T>)) +
                               ", requested " + std::string(dtype_name(dtype_of<Other>));
  const Tensor t = Tensor::from_vector(sample_values<T>(), {6});
  expect_invalid_argument([&] { (void)t.to_vector<Other>(); }, {"Tensor::to_vector", expected});
  expect_invalid_argument([&] { (void)t.select(0, 0).item<Other>(); }, {"Tensor::item", expected});
  expect_invalid_argument([&] { (void)t.data_ptr<Other>(); }, {"Tensor::data_ptr", expected});
}

TEST(TensorDTypeMismatch, MessageNamesBothDTypes) {
  const Tensor t = Tensor::zeros({2});
  expect_invalid_argument([&] { (void)t.to_vector<std::int32_t>(); },
                          {"Tensor::to_vector: tensor has dtype Float32, requested Int32"});
  // Bool and UInt8 share a representation but are distinct dtypes: no silent conversion.
  const Tensor flags = Tensor::zeros({2}, DType::Bool);
  expect_invalid_argument([&] { (void)flags.to_vector<std::uint8_t>(); },
                          {"tensor has dtype Bool, requested UInt8"});
}

TEST(TensorDTypeMismatch, IsRefusedBeforeTheResultIsAllocated) {
  // 2^50 elements: a result vector of them cannot be allocated (4 PiB of floats), so only a
  // check made before allocating gives the InvalidArgument rather than a std::bad_alloc.
  const Tensor huge = Tensor::empty({std::int64_t{1} << 50}, DType::UInt8, Device::meta());
  expect_invalid_argument([&] { (void)huge.to_vector<float>(); },
                          {"Tensor::to_vector: tensor has dtype UInt8, requested Float32"});
  expect_invalid_argument([&] { (void)huge.to_vector<std::uint8_t>(); },
                          {"Tensor::to_vector", "meta"});
}

TEST(TensorItem, RequiresExactlyOneElement) {
  const Tensor t = Tensor::zeros({2, 3});
  expect_invalid_argument(
      [&] { (void)t.item<float>(); },
      {"Tensor::item", "expected a tensor with 1 element", "[2, 3]", "6 elements"});
  EXPECT_EQ(Tensor::full({1, 1, 1}, 3.0).item<float>(), 3.0f);
}

// ---- Undefined tensors.

TEST(TensorUndefined, HasNoShapeAndRejectsDataAccess) {
  const Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.unsafe_data_ptr(), nullptr);
  EXPECT_FALSE(t.is_pending());
  EXPECT_FALSE(t.shares_storage(t));
  EXPECT_EQ(t.to_string(), "Tensor(undefined)");
  expect_invalid_argument([&] { (void)t.to_vector<float>(); }, {"Tensor::to_vector", "undefined"});
  expect_invalid_argument([&] { (void)t.item<float>(); }, {"Tensor::item", "undefined"});
  expect_invalid_argument([&] { (void)t.data_ptr<float>(); }, {"undefined"});
  expect_invalid_argument([&] { (void)t.clone(); }, {"Tensor::clone", "undefined"});
  expect_invalid_argument([&] { (void)t.contiguous(); }, {"undefined"});
  expect_invalid_argument([&] { (void)t.to(DType::Int32); }, {"undefined"});
  expect_invalid_argument([&] { (void)t.equal(t); }, {"undefined"});
  expect_invalid_argument([&] { (void)t.view({1}); }, {"Tensor::view", "undefined"});
  expect_invalid_argument([&] { (void)t.narrow(0, 0, 0); }, {"undefined"});
  expect_invalid_argument([&] { (void)t.flatten(); }, {"undefined"});
  Tensor dst = Tensor::zeros({1});
  expect_invalid_argument([&] { dst.copy_(t); }, {"Tensor::copy_", "source is undefined"});
}

// ---- Views.

TEST(TensorView, ViewReshapesContiguous) {
  const Tensor base = Tensor::arange(6);
  const Tensor v = base.view({2, 3});
  EXPECT_EQ(v.sizes(), (Shape{2, 3}));
  EXPECT_EQ(v.strides(), (Shape{3, 1}));
  EXPECT_TRUE(v.shares_storage(base));
  EXPECT_EQ(v.unsafe_data_ptr(), base.unsafe_data_ptr());
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

// A size-1 dim of a view gets the stride it would have in a packed layout (view_strides).
TEST(TensorView, ViewGivesSizeOneDimsPackedStrides) {
  const Tensor base = Tensor::arange(6);
  EXPECT_EQ(base.view({2, 1, 3}).strides(), (Shape{3, 3, 1}));
  EXPECT_EQ(base.view({1, 6, 1}).strides(), (Shape{6, 1, 1}));
  EXPECT_EQ(base.view({2, 3}).view({2, 1, 3}).strides(), Tensor::empty({2, 1, 3}).strides());
}

TEST(TensorView, ViewToZeroDimNeedsOneElement) {
  const Tensor one = Tensor::full({1, 1}, 9.0);
  EXPECT_EQ(one.view({}).dim(), 0);
  EXPECT_EQ(one.view({}).item<float>(), 9.0f);
  expect_invalid_argument([] { (void)Tensor::arange(6).view({}); },
                          {"Tensor::view", "shape [] is invalid for 6 elements"});
}

TEST(TensorView, ViewInfersOneMinusOne) {
  const Tensor base = Tensor::arange(6);
  EXPECT_EQ(base.view({-1, 2}).sizes(), (Shape{3, 2}));
  EXPECT_EQ(base.view({3, -1}).sizes(), (Shape{3, 2}));
  EXPECT_EQ(base.view({-1}).sizes(), (Shape{6}));
  EXPECT_EQ(Tensor::zeros({0, 4}).view({-1, 2}).sizes(), (Shape{0, 2}));
}

TEST(TensorView, ViewRejectsInvalidShapes) {
  const Tensor base = Tensor::arange(6);
  expect_invalid_argument(
      [&] {
        (void)base.view({4, -1});
      },
      {"Tensor::view: shape [4, -1] is invalid for 6 elements"});
  expect_invalid_argument([&] { (void)base.view({-1, -1}); }, {"Tensor::view", "only one -1"});
  expect_invalid_argument([&] { (void)base.view({-2, 3}); }, {"Tensor::view", "[-2, 3]"});
  expect_invalid_argument([&] { (void)base.view({7}); }, {"shape [7] is invalid for 6 elements"});
  // -1 next to a zero size cannot be inferred.
  expect_invalid_argument(
      [] {
        (void)Tensor::zeros({0}).view({0, -1});
      },
      {"shape [0, -1] is invalid for 0 elements"});
}

TEST(TensorView, ViewOfNonContiguousFollowsStrides) {
  const Tensor base = Tensor::arange(24).view({2, 3, 4});
  const Tensor permuted = base.permute({1, 0, 2});  // sizes [3, 2, 4], strides [4, 12, 1]
  ASSERT_EQ(permuted.strides(), (Shape{4, 12, 1}));
  // Splitting the innermost (contiguous) dim and merging nothing is fine.
  const Tensor split = permuted.view({3, 2, 2, 2});
  EXPECT_EQ(split.strides(), (Shape{4, 12, 2, 1}));
  EXPECT_TRUE(split.shares_storage(base));
  EXPECT_EQ(split.to_vector<float>(), permuted.contiguous().view({3, 2, 2, 2}).to_vector<float>());
  // Merging dims 0 and 1 needs stride[0] == size[1] * stride[1]: 4 != 24.
  expect_invalid_argument(
      [&] {
        (void)permuted.view({6, 4});
      },
      {"Tensor::view", "[3, 2, 4]", "[4, 12, 1]", "without copying"});
  expect_invalid_argument([&] { (void)base.transpose(0, 2).view({24}); }, {"Tensor::view"});

  // A narrowed tensor: rows keep stride 4 but hold 2 elements.
  const Tensor narrowed = Tensor::arange(12).view({3, 4}).narrow(1, 1, 2);
  EXPECT_EQ(narrowed.view({3, 2, 1}).strides(), (Shape{4, 1, 1}));
  EXPECT_EQ(narrowed.view({3, 1, 2}).to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  expect_invalid_argument([&] { (void)narrowed.view({6}); }, {"Tensor::view"});
  // Narrowing the outer dim keeps the rest contiguous.
  const Tensor rows = Tensor::arange(12).view({3, 4}).narrow(0, 1, 2);
  EXPECT_EQ(rows.view({8}).to_vector<float>(), (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(rows.view({8}).storage_offset(), 4);
}

TEST(TensorView, ViewMatchesContiguousReference) {
  // Every successful view must read the same row-major values as viewing a contiguous copy.
  const Tensor base = Tensor::arange(48, DType::Int64).view({2, 4, 6});
  const std::vector<Tensor> sources = {
      base,
      base.transpose(0, 1),
      base.permute({2, 0, 1}),
      base.narrow(2, 1, 4),
      base.narrow(1, 0, 2),
      base.select(1, 2),
      base.unsqueeze(1).narrow(3, 0, 3),
      base.view({2, 4, 3, 2}).transpose(2, 3),
  };
  const std::vector<Shape> targets = {{-1},          {2, -1},    {-1, 2},    {4, -1, 2},
                                      {2, 2, -1},    {1, -1, 1}, {-1, 3},    {3, -1},
                                      {2, 1, 2, -1}, {-1, 4},    {2, -1, 3}, {-1, 2, 2}};
  int viewed = 0;
  int rejected = 0;
  for (const Tensor& source : sources) {
    const std::vector<std::int64_t> expected = source.contiguous().to_vector<std::int64_t>();
    for (const Shape& target : targets) {
      Tensor reference;
      try {
        reference = source.contiguous().view(target);
      } catch (const InvalidArgument&) {
        continue;  // the shape does not fit this element count
      }
      try {
        const Tensor v = source.view(target);
        ++viewed;
        EXPECT_TRUE(v.shares_storage(base));
        EXPECT_EQ(v.sizes(), reference.sizes());
        EXPECT_EQ(v.to_vector<std::int64_t>(), expected)
            << source.to_string(0) << " as " << reference.to_string(0);
      } catch (const InvalidArgument&) {
        ++rejected;
        EXPECT_FALSE(source.is_contiguous()) << "a contiguous tensor can always be viewed";
      }
    }
  }
  EXPECT_GT(viewed, 20);
  EXPECT_GT(rejected, 5);
}

TEST(TensorView, NarrowSharesStorage) {
  const Tensor base = Tensor::zeros({4, 5});
  const Tensor narrowed = base.narrow(1, 2, 2);
  EXPECT_EQ(narrowed.sizes(), (Shape{4, 2}));
  EXPECT_EQ(narrowed.strides(), (Shape{5, 1}));
  EXPECT_EQ(narrowed.storage_offset(), 2);
  EXPECT_TRUE(narrowed.shares_storage(base));
  EXPECT_FALSE(narrowed.is_contiguous());
  EXPECT_EQ(narrowed.unsafe_data_ptr(), static_cast<float*>(base.unsafe_data_ptr()) + 2);
  narrowed.data_ptr<float>()[0] = 7.0f;
  narrowed.data_ptr<float>()[5 + 1] = 8.0f;  // row 1, column 1 of the view
  const std::vector<float> values = base.to_vector<float>();
  EXPECT_EQ(values[2], 7.0f);
  EXPECT_EQ(values[5 + 3], 8.0f);
}

TEST(TensorView, NarrowAcceptsNegativeDimAndStart) {
  const Tensor base = Tensor::arange(10, DType::Int32).view({2, 5});
  const Tensor tail = base.narrow(-1, -3, 2);
  EXPECT_EQ(tail.storage_offset(), 2);
  EXPECT_EQ(tail.to_vector<std::int32_t>(), (std::vector<std::int32_t>{2, 3, 7, 8}));
  EXPECT_EQ(base.narrow(0, 2, 0).sizes(), (Shape{0, 5}));
}

TEST(TensorView, NarrowRejectsOutOfRange) {
  const Tensor base = Tensor::zeros({2, 5});
  expect_invalid_argument([&] { (void)base.narrow(1, 4, 2); },
                          {"Tensor::narrow", "start 4 + length 2 exceeds dim 1 of size 5"});
  expect_invalid_argument([&] { (void)base.narrow(1, 6, 0); }, {"Tensor::narrow", "start 6"});
  expect_invalid_argument([&] { (void)base.narrow(1, -6, 1); }, {"start -6"});
  expect_invalid_argument([&] { (void)base.narrow(1, 0, -1); }, {"length -1"});
  expect_invalid_argument(
      [&] { (void)base.narrow(2, 0, 1); },
      {"Tensor::narrow", "dim 2 is out of range for 2 dims (expected -2 to 1)"});
  expect_invalid_argument([&] { (void)base.narrow(-3, 0, 1); }, {"dim -3 is out of range"});
}

TEST(TensorView, SelectRemovesDim) {
  const Tensor base = Tensor::arange(12, DType::Int64).view({3, 4});
  const Tensor column = base.select(1, -1);
  EXPECT_EQ(column.sizes(), (Shape{3}));
  EXPECT_EQ(column.strides(), (Shape{4}));
  EXPECT_EQ(column.storage_offset(), 3);
  EXPECT_TRUE(column.shares_storage(base));
  EXPECT_EQ(column.to_vector<std::int64_t>(), (std::vector<std::int64_t>{3, 7, 11}));
  const Tensor element = base.select(0, 2).select(0, 1);
  EXPECT_EQ(element.dim(), 0);
  EXPECT_EQ(element.item<std::int64_t>(), 9);
  expect_invalid_argument([&] { (void)base.select(1, 4); },
                          {"Tensor::select", "index 4 is out of range for dim 1 of size 4"});
  expect_invalid_argument([&] { (void)base.select(0, -4); }, {"index -4"});
  expect_invalid_argument([&] { (void)element.select(0, 0); }, {"Tensor::select", "0-d"});
}

TEST(TensorView, TransposeSwapsSizesAndStrides) {
  const Tensor base = Tensor::arange(6).view({2, 3});
  const Tensor t = base.transpose(0, -1);
  EXPECT_EQ(t.sizes(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.shares_storage(base));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(base.transpose(1, 1).strides(), base.strides());
  expect_invalid_argument([&] { (void)base.transpose(0, 2); }, {"Tensor::transpose", "dim 2"});
}

// A tensor without elements is contiguous whatever its strides, wherever its size-0 dim is
// (is_contiguous looks for it in one pass with the strides): before or after a dim whose stride
// is off.
TEST(TensorView, ATensorWithoutElementsIsContiguousWhateverItsStrides) {
  const Tensor zero_inside = Tensor::empty({2, 0, 3}).transpose(0, 2);
  EXPECT_EQ(zero_inside.sizes(), (Shape{3, 0, 2}));
  EXPECT_EQ(zero_inside.strides(), (Shape{1, 3, 3}));
  EXPECT_TRUE(zero_inside.is_contiguous());
  const Tensor zero_last = Tensor::empty({3, 2, 0}).transpose(0, 1);
  EXPECT_EQ(zero_last.sizes(), (Shape{2, 3, 0}));
  EXPECT_EQ(zero_last.strides(), (Shape{1, 2, 1}));
  EXPECT_TRUE(zero_last.is_contiguous());
  EXPECT_FALSE(Tensor::empty({3, 2, 1}).transpose(0, 1).is_contiguous());
  EXPECT_TRUE(Tensor().is_contiguous());
  EXPECT_TRUE(Tensor::empty({}).is_contiguous());
}

// is_contiguous ignores the stride of a size-1 dim, which never steps: a transposed [3, 1] view
// (sizes [1, 3], strides [1, 1]) is contiguous, and contiguous() returns it as is.
TEST(TensorView, ASizeOneDimsStrideDoesNotMakeAViewNonContiguous) {
  const Tensor base = Tensor::arange(3).view({3, 1});
  const Tensor t = base.transpose(0, 1);
  EXPECT_EQ(t.sizes(), (Shape{1, 3}));
  EXPECT_EQ(t.strides(), (Shape{1, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.contiguous().shares_storage(base));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2}));
}

TEST(TensorView, PermuteReordersDims) {
  const Tensor base = Tensor::arange(24, DType::Int32).view({2, 3, 4});
  const Tensor p = base.permute({2, -3, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_TRUE(p.shares_storage(base));
  EXPECT_EQ(p.select(0, 1).select(0, 1).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{13, 17, 21}));
  expect_invalid_argument(
      [&] {
        (void)base.permute({0, 1});
      },
      {"Tensor::permute", "dims [0, 1] must list all 3 dims"});
  expect_invalid_argument(
      [&] {
        (void)base.permute({0, 1, 1});
      },
      {"Tensor::permute", "repeat dim 1"});
  expect_invalid_argument([&] { (void)base.permute({2, 1, -1}); }, {"repeat dim 2"});
  expect_invalid_argument([&] { (void)base.permute({0, 1, 3}); }, {"dim 3 is out of range"});
  EXPECT_EQ(Tensor::full({}, 1.0).permute({}).dim(), 0);
}

TEST(TensorView, ChunkUsesCeilSizes) {
  const auto chunk_sizes = [](const Tensor& t, std::int64_t n, std::int64_t dim = 0) {
    std::vector<std::int64_t> sizes;
    for (const Tensor& piece : t.chunk(n, dim)) {
      EXPECT_TRUE(piece.shares_storage(t));
      sizes.push_back(piece.size(dim));
    }
    return sizes;
  };
  const Tensor ten = Tensor::arange(10);
  EXPECT_EQ(chunk_sizes(ten, 3), (std::vector<std::int64_t>{4, 4, 2}));
  EXPECT_EQ(chunk_sizes(ten, 4), (std::vector<std::int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(chunk_sizes(ten, 1), (std::vector<std::int64_t>{10}));
  EXPECT_EQ(chunk_sizes(ten, 10), (std::vector<std::int64_t>(10, 1)));
  // Fewer pieces than asked, as torch.chunk: 6 in 4 -> pieces of 2; 2 in 4 -> pieces of 1.
  EXPECT_EQ(chunk_sizes(Tensor::arange(6), 4), (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ(chunk_sizes(Tensor::arange(2), 4), (std::vector<std::int64_t>{1, 1}));
  // An empty dim gives n empty pieces.
  EXPECT_EQ(chunk_sizes(Tensor::zeros({0}), 3), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(chunk_sizes(Tensor::zeros({0}), 1), (std::vector<std::int64_t>{0}));

  const Tensor matrix = Tensor::arange(12, DType::Int64).view({2, 6});
  const std::vector<Tensor> columns = matrix.chunk(3, -1);
  ASSERT_EQ(columns.size(), 3u);
  EXPECT_EQ(columns[1].sizes(), (Shape{2, 2}));
  EXPECT_EQ(columns[1].storage_offset(), 2);
  EXPECT_EQ(columns[1].to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 3, 8, 9}));

  expect_invalid_argument([&] { (void)ten.chunk(0); },
                          {"Tensor::chunk", "number of chunks must be > 0, got 0"});
  expect_invalid_argument([&] { (void)ten.chunk(-2); }, {"got -2"});
  expect_invalid_argument([&] { (void)ten.chunk(2, 1); }, {"Tensor::chunk", "dim 1"});
}

TEST(TensorView, ChunkIntoMorePiecesThanAVectorHoldsThrows) {
  // A size-0 dim gives n empty pieces (torch.chunk), so n = 2^60 cannot be returned: an
  // InvalidArgument, not std::length_error.
  const std::int64_t n = std::int64_t{1} << 60;
  expect_invalid_argument([&] { (void)Tensor::zeros({0}).chunk(n); },
                          {"Tensor::chunk",
                           "1152921504606846976 chunks of dim 0 of size 0 make "
                           "1152921504606846976 pieces, more than a vector can "
                           "hold"});
  // Likewise a meta dim of 2^62 split into 2^62 pieces of 1.
  const std::int64_t size = std::int64_t{1} << 62;
  expect_invalid_argument(
      [&] { (void)Tensor::empty({size}, DType::UInt8, Device::meta()).chunk(size); },
      {"Tensor::chunk", "make 4611686018427387904 pieces"});
}

TEST(TensorView, SplitBySizes) {
  const Tensor base = Tensor::arange(8, DType::Int32).view({2, 4});
  const std::vector<Tensor> pieces = base.split({1, 0, 3}, 1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 4}));
  EXPECT_EQ(pieces[1].sizes(), (Shape{2, 0}));
  EXPECT_EQ(pieces[2].to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(pieces[2].storage_offset(), 1);
  EXPECT_TRUE(pieces[2].shares_storage(base));
  EXPECT_EQ(base.split({2}).size(), 1u);
  expect_invalid_argument(
      [&] {
        (void)base.split({1, 2}, 1);
      },
      {"Tensor::split", "sizes [1, 2] sum to 3, but dim 1 has size 4"});
  expect_invalid_argument(
      [&] {
        (void)base.split({5, -1}, -1);
      },
      {"Tensor::split", "must all be >= 0"});
  expect_invalid_argument([&] { (void)base.split({2}, 2); }, {"Tensor::split", "dim 2"});
}

TEST(TensorView, FlattenGivesOneDim) {
  EXPECT_EQ(Tensor::full({}, 5.0).flatten().sizes(), (Shape{1}));
  EXPECT_EQ(Tensor::full({}, 5.0).flatten().item<float>(), 5.0f);
  const Tensor base = Tensor::arange(6).view({2, 3});
  const Tensor flat = base.flatten();
  EXPECT_EQ(flat.sizes(), (Shape{6}));
  EXPECT_TRUE(flat.shares_storage(base));
  const Tensor rows = Tensor::arange(16).view({4, 4}).narrow(0, 1, 2);
  EXPECT_EQ(rows.flatten().storage_offset(), 4);
  EXPECT_EQ(rows.flatten().to_vector<float>(), (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
  // A single column steps by the row stride.
  const Tensor column = Tensor::arange(16).view({4, 4}).narrow(1, 2, 1);
  EXPECT_EQ(column.flatten().strides(), (Shape{4}));
  EXPECT_EQ(column.flatten().to_vector<float>(), (std::vector<float>{2, 6, 10, 14}));
  expect_invalid_argument([&] { (void)base.transpose(0, 1).flatten(); },
                          {"Tensor::flatten", "without copying"});
}

TEST(TensorView, UnsqueezeInsertsSizeOneDim) {
  const Tensor base = Tensor::arange(6).view({2, 3});
  EXPECT_EQ(base.unsqueeze(0).sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(base.unsqueeze(0).strides(), (Shape{6, 3, 1}));
  EXPECT_EQ(base.unsqueeze(1).sizes(), (Shape{2, 1, 3}));
  EXPECT_EQ(base.unsqueeze(-1).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(base.unsqueeze(-1).strides(), (Shape{3, 1, 1}));
  EXPECT_TRUE(base.unsqueeze(1).is_contiguous());
  EXPECT_TRUE(base.unsqueeze(1).shares_storage(base));
  EXPECT_EQ(Tensor::full({}, 1.0).unsqueeze(0).sizes(), (Shape{1}));
  EXPECT_EQ(Tensor::full({}, 1.0).unsqueeze(-1).sizes(), (Shape{1}));
  expect_invalid_argument([&] { (void)base.unsqueeze(3); },
                          {"Tensor::unsqueeze", "dim 3 is out of range for 3 dims"});
  expect_invalid_argument([&] { (void)base.unsqueeze(-4); }, {"dim -4"});
}

TEST(TensorView, HugeArgumentsThrowInsteadOfOverflowing) {
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  const Tensor t = Tensor::arange(10);
  expect_invalid_argument(
      [&] {
        (void)t.view({std::int64_t{1} << 40, std::int64_t{1} << 40});
      },
      {"Tensor::view", "is invalid for 10 elements"});
  expect_invalid_argument(
      [&] {
        (void)t.view({std::int64_t{1} << 40, std::int64_t{1} << 40, -1});
      },
      {"Tensor::view"});
  expect_invalid_argument([&] { (void)t.narrow(0, 1, max); }, {"Tensor::narrow", "exceeds"});
  expect_invalid_argument([&] { (void)t.split({max, max}); }, {"Tensor::split", "overflow"});
  EXPECT_EQ(t.chunk(max).size(), 10u);
}

TEST(TensorView, EmptyViewsWhoseStridesOrOffsetsOverflowThrow) {
  const std::int64_t big = std::int64_t{1} << 40;
  // An empty view gets row-major strides, which must fit as for Tensor::empty.
  expect_invalid_argument(
      [] {
        (void)Tensor::zeros({0}).view({0, big, big});
      },
      {"Tensor::view",
       "shape [0, 1099511627776, 1099511627776] is too large "
       "to address"});
  EXPECT_EQ(Tensor::zeros({0}).view({0, big}).strides(), (Shape{big, 1}));
  // Shape [0, 2, 2^62 - 1] has strides [2^63 - 2, 2^62 - 1, 1], which fit; narrowing both
  // non-empty dims to their ends would put the storage offset at 3 * (2^62 - 1).
  const std::int64_t stride = (std::int64_t{1} << 62) - 1;
  const Tensor empty = Tensor::empty({0, 2, stride}, DType::UInt8, Device::meta());
  const Tensor at_end = empty.narrow(1, 2, 0);
  EXPECT_EQ(at_end.storage_offset(), 2 * stride);
  expect_invalid_argument([&] { (void)at_end.narrow(2, stride, 0); },
                          {"Tensor::narrow",
                           "storage offset 9223372036854775806 + "
                           "4611686018427387903 * stride 1 is too large to "
                           "address"});
  expect_invalid_argument([&] { (void)at_end.select(2, stride - 1); },
                          {"Tensor::select", "is too large to address"});
}

TEST(TensorView, ViewsNeverCopy) {
  const Tensor base = Tensor::zeros({4, 6}, DType::Int64);
  auto* first = static_cast<std::int64_t*>(base.unsafe_data_ptr());
  const std::vector<Tensor> views = {
      base.view({6, 4}),        base.narrow(0, 1, 2),
      base.select(1, 3),        base.transpose(0, 1),
      base.permute({1, 0}),     base.chunk(3, 1)[2],
      base.split({1, 3}, 0)[1], base.flatten(),
      base.unsqueeze(1),        base.view({2, 2, 6}).select(1, 1),
  };
  std::int64_t marker = 100;
  for (const Tensor& v : views) {
    EXPECT_TRUE(v.shares_storage(base));
    EXPECT_EQ(v.unsafe_data_ptr(), first + v.storage_offset());
    // A write through the view shows in the base.
    *v.data_ptr<std::int64_t>() = marker;
    EXPECT_EQ(base.to_vector<std::int64_t>()[static_cast<std::size_t>(v.storage_offset())], marker);
    ++marker;
  }
}

// ---- Strided copies.

TEST(TensorCopy, ContiguousGathersLikeReference) {
  // Views of a [2, 3, 4, 5] tensor in every element size; contiguous() must gather exactly the
  // elements a naive index walk over (sizes, strides, offset) finds.
  const auto check = [](DType dtype, auto tag) {
    using T = decltype(tag);
    const Tensor base = Tensor::arange(120, DType::Int64).to(dtype).view({2, 3, 4, 5});
    const std::vector<T> flat = base.to_vector<T>();
    const std::vector<Tensor> views = {
        base.permute({3, 1, 0, 2}),
        base.narrow(3, 1, 3).transpose(0, 2),
        base.select(2, 1).permute({2, 0, 1}),
        base.narrow(1, 1, 2).narrow(2, 1, 2).narrow(3, 2, 3),
        base.transpose(1, 3).unsqueeze(2),
        base.permute({1, 2, 3, 0}).narrow(0, 2, 1),
        base.view({6, 20}).transpose(0, 1).narrow(0, 3, 5),
    };
    for (const Tensor& v : views) {
      const Tensor c = v.contiguous();
      EXPECT_TRUE(c.is_contiguous());
      EXPECT_FALSE(c.shares_storage(base));
      EXPECT_EQ(c.sizes(), v.sizes());
      expect_bitwise_equal(c.to_vector<T>(),
                           gather_reference(flat, v.sizes(), v.strides(), v.storage_offset()));
      expect_bitwise_equal(v.to_vector<T>(), c.to_vector<T>());
      expect_bitwise_equal(v.clone().to_vector<T>(), c.to_vector<T>());
    }
  };
  check(DType::Int8, std::int8_t{});
  check(DType::Float16, Half{});
  check(DType::Float32, float{});
  check(DType::Int64, std::int64_t{});
  check(DType::Complex128, std::complex<double>{});
}

TEST(TensorCopy, ContiguousReturnsSameStorageWhenContiguous) {
  const Tensor base = Tensor::arange(12).view({3, 4});
  const Tensor same = base.contiguous();
  EXPECT_TRUE(same.shares_storage(base));
  EXPECT_EQ(same.unsafe_data_ptr(), base.unsafe_data_ptr());
  // A narrowed outer dim and size-1 dims with odd strides are still contiguous.
  const Tensor rows = base.narrow(0, 1, 1);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.contiguous().unsafe_data_ptr(), rows.unsafe_data_ptr());
  const Tensor column = base.narrow(1, 1, 1).transpose(0, 1);  // sizes [1, 3], strides [1, 4]
  EXPECT_FALSE(column.is_contiguous());
  const Tensor packed = column.contiguous();
  EXPECT_FALSE(packed.shares_storage(base));
  EXPECT_EQ(packed.strides(), (Shape{3, 1}));
  EXPECT_EQ(packed.to_vector<float>(), (std::vector<float>{1, 5, 9}));
}

// to(device) on the tensor's own device returns the tensor itself (as torch): no copy, no packing.
TEST(TensorCopy, ToItsOwnDeviceReturnsTheTensorItself) {
  const Tensor meta = Tensor::empty({2, 3}, DType::Float32, Device::meta());
  EXPECT_EQ(meta.to(Device::meta()).sizes().data(), meta.sizes().data());
  const Tensor base = Tensor::arange(6).view({2, 3});
  const Tensor same = base.to(Device::cpu());
  EXPECT_TRUE(same.shares_storage(base));
  EXPECT_EQ(same.unsafe_data_ptr(), base.unsafe_data_ptr());
  const Tensor transposed = base.transpose(0, 1);
  EXPECT_EQ(transposed.to(Device::cpu()).strides(), (Shape{1, 3}));  // not packed
}

TEST(TensorCopy, CloneIsIndependent) {
  const Tensor base = Tensor::arange(6, DType::Int32).view({2, 3});
  const Tensor copy = base.clone();
  EXPECT_FALSE(copy.shares_storage(base));
  EXPECT_NE(copy.unsafe_data_ptr(), base.unsafe_data_ptr());
  copy.data_ptr<std::int32_t>()[0] = 42;
  base.data_ptr<std::int32_t>()[1] = 43;
  EXPECT_EQ(base.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 43, 2, 3, 4, 5}));
  EXPECT_EQ(copy.to_vector<std::int32_t>(), (std::vector<std::int32_t>{42, 1, 2, 3, 4, 5}));
  const Tensor transposed = base.transpose(0, 1).clone();
  EXPECT_TRUE(transposed.is_contiguous());
  EXPECT_EQ(transposed.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 3, 43, 4, 2, 5}));
}

TEST(TensorCopy, CopyKeepsNanPayloads) {
  const std::vector<float> values{float_from_bits(0x7FC00001u), float_from_bits(0xFFC12345u),
                                  float_from_bits(0x7F800001u), -0.0f};
  const Tensor t = Tensor::from_vector(values, {2, 2});
  expect_bitwise_equal(t.clone().to_vector<float>(), values);
  Tensor dst = Tensor::zeros({2, 2});
  dst.transpose(0, 1).copy_(t.transpose(0, 1));
  expect_bitwise_equal(dst.to_vector<float>(), values);
  EXPECT_TRUE(dst.bitwise_equal(t));
}

TEST(TensorCopy, CopyConvertsDType) {
  Tensor dst = Tensor::zeros({2, 3}, DType::Int32);
  const Tensor src =
      Tensor::from_vector(std::vector<float>{1.5f, -2.5f, 3.0f, 0.0f, 7.9f, -0.5f}, {2, 3});
  Tensor& result = dst.copy_(src);
  EXPECT_EQ(&result, &dst);
  EXPECT_EQ(dst.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, -2, 3, 0, 7, 0}));
  EXPECT_EQ(src.to_vector<float>()[0], 1.5f) << "the source is never modified";
}

TEST(TensorCopy, CopyIntoStridedDestination) {
  // Conversion into a transposed destination writes the right memory locations.
  const Tensor base = Tensor::zeros({3, 2}, DType::Float64);
  Tensor dst = base.transpose(0, 1);  // sizes [2, 3], strides [1, 2]
  dst.copy_(Tensor::arange(6, DType::Int64).view({2, 3}));
  EXPECT_EQ(base.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // Same dtype, both strided.
  Tensor column = Tensor::zeros({2, 4}, DType::Int8).narrow(1, 1, 2);
  column.copy_(Tensor::arange(4, DType::Int8).view({2, 2}).transpose(0, 1));
  EXPECT_EQ(column.to_vector<std::int8_t>(), (std::vector<std::int8_t>{0, 2, 1, 3}));
}

TEST(TensorCopy, CopyBetweenOverlappingViews) {
  Tensor x = Tensor::arange(4, DType::Int64).view({2, 2});
  x.copy_(x.transpose(0, 1));
  EXPECT_EQ(x.to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 2, 1, 3}));
  Tensor shifted = Tensor::arange(5, DType::Int32);
  Tensor head = shifted.narrow(0, 0, 4);
  head.copy_(shifted.narrow(0, 1, 4));
  EXPECT_EQ(shifted.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3, 4, 4}));
}

TEST(TensorCopy, CopyBetweenTensorsOverSharedMemorySeesTheOverlap) {
  // Two from_blob tensors over one buffer have distinct storages: the overlap is in the bytes.
  std::vector<float> buffer{1, 2, 3, 4};
  Tensor a = Tensor::from_blob(buffer.data(), {2, 2}, DType::Float32);
  const Tensor b = Tensor::from_blob(buffer.data(), {2, 2}, DType::Float32);
  EXPECT_FALSE(a.shares_storage(b));
  a.copy_(b.transpose(0, 1));
  EXPECT_EQ(buffer, (std::vector<float>{1, 3, 2, 4}));

  // Between dtypes: the Float32 source is the first half of the Float64 destination's bytes.
  alignas(8) std::byte bytes[16] = {};
  const float source_values[2] = {1.5f, -2.0f};
  std::memcpy(bytes, source_values, sizeof(source_values));
  Tensor wide = Tensor::from_blob(bytes, {2}, DType::Float64);
  wide.copy_(Tensor::from_blob(bytes, {2}, DType::Float32));
  EXPECT_EQ(wide.to_vector<double>(), (std::vector<double>{1.5, -2.0}));

  // Interleaved halves of one buffer share no byte; each element lands where it should.
  std::vector<std::int32_t> words{0, 1, 2, 3, 4, 5};
  Tensor evens = Tensor::from_blob(words.data(), {3, 2}, DType::Int32).select(1, 0);
  evens.copy_(Tensor::from_blob(words.data(), {6}, DType::Int32).narrow(0, 3, 3));
  EXPECT_EQ(words, (std::vector<std::int32_t>{3, 1, 4, 3, 5, 5}));
}

TEST(TensorCopy, CopyRejectsShapeMismatch) {
  Tensor dst = Tensor::zeros({2, 3});
  expect_invalid_argument(
      [&] {
        dst.copy_(Tensor::zeros({3, 2}));
      },
      {"Tensor::copy_", "destination [2, 3], source [3, 2]"});
  expect_invalid_argument([&] { dst.copy_(Tensor::zeros({6})); }, {"Tensor::copy_"});
}

TEST(TensorConvert, ToConvertsAsKernels) {
  const Tensor src = Tensor::from_vector(std::vector<float>{1.0f / 3.0f, -2.5f, 0.0f, 65520.0f});
  EXPECT_EQ(src.to(DType::Float16).to_vector<Half>(),
            (std::vector<Half>{Half::from_bits(0x3555), Half::from_bits(0xC100),
                               Half::from_bits(0x0000), Half::from_bits(0x7C00)}));
  EXPECT_EQ(src.to(DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(src.to(DType::Int64).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{0, -2, 0, 65520}));
  EXPECT_EQ(src.to(DType::Complex64).to_vector<std::complex<float>>()[1],
            std::complex<float>(-2.5f, 0.0f));
  // Out of the integer's range: 0 (as full()).
  EXPECT_EQ(src.to(DType::Int8).to_vector<std::int8_t>(), (std::vector<std::int8_t>{0, -2, 0, 0}));
  EXPECT_EQ(Tensor::full({1}, 3e9).to(DType::Int32).item<std::int32_t>(), 0);
  // Strided sources convert in row-major order.
  const Tensor t = Tensor::arange(6, DType::Int32).view({2, 3}).transpose(0, 1);
  EXPECT_EQ(t.to(DType::Float64).to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // Same dtype: an independent copy.
  const Tensor same = src.to(DType::Float32);
  EXPECT_FALSE(same.shares_storage(src));
  EXPECT_TRUE(same.bitwise_equal(src));
}

TEST(TensorCompare, EqualComparesValuesBitwiseEqualComparesBytes) {
  const float nan = float_from_bits(0x7FC00001u);
  const Tensor a = Tensor::from_vector(std::vector<float>{1.0f, nan});
  const Tensor b = Tensor::from_vector(std::vector<float>{1.0f, nan});
  EXPECT_FALSE(a.equal(b)) << "NaN != NaN";
  EXPECT_TRUE(a.bitwise_equal(b));
  const Tensor zero = Tensor::from_vector(std::vector<float>{0.0f});
  const Tensor negative_zero = Tensor::from_vector(std::vector<float>{-0.0f});
  EXPECT_TRUE(zero.equal(negative_zero)) << "-0 == +0";
  EXPECT_FALSE(zero.bitwise_equal(negative_zero));
  // Different shapes or dtypes: false, not an error.
  const Tensor six = Tensor::arange(6);
  EXPECT_FALSE(six.equal(six.view({2, 3})));
  EXPECT_FALSE(six.bitwise_equal(six.view({2, 3})));
  EXPECT_FALSE(six.equal(Tensor::arange(6, DType::Float64)));
  EXPECT_FALSE(six.bitwise_equal(Tensor::arange(6, DType::Float64)));
  // Layout does not matter, only row-major values.
  const Tensor transposed = Tensor::arange(6).view({2, 3}).transpose(0, 1);
  const Tensor packed = Tensor::from_vector(std::vector<float>{0, 3, 1, 4, 2, 5}, {3, 2});
  EXPECT_TRUE(transposed.equal(packed));
  EXPECT_TRUE(transposed.bitwise_equal(packed));
  EXPECT_FALSE(transposed.equal(packed.transpose(0, 1).contiguous().view({3, 2})));
}

// ---- from_blob.

TEST(TensorFromBlob, WrapsWithoutCopying) {
  std::vector<std::int32_t> buffer{1, 2, 3, 4, 5, 6};
  const Tensor t = Tensor::from_blob(buffer.data(), {2, 3}, DType::Int32);
  EXPECT_EQ(t.unsafe_data_ptr(), buffer.data());
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.to_vector<std::int32_t>(), buffer);
  buffer[4] = 50;
  EXPECT_EQ(t.select(0, 1).select(0, 1).item<std::int32_t>(), 50);
  t.data_ptr<std::int32_t>()[0] = 10;
  EXPECT_EQ(buffer[0], 10);
}

TEST(TensorFromBlob, DeleterRunsOnceAfterLastTensorDies) {
  std::vector<float> buffer(8, 1.0f);
  int calls = 0;
  void* seen = nullptr;
  {
    Tensor t =
        Tensor::from_blob(buffer.data(), {2, 4}, DType::Float32, Device::cpu(), [&](void* p) {
          ++calls;
          seen = p;
        });
    const Tensor view = t.narrow(1, 1, 2);
    const Tensor copy = t;  // NOLINT(performance-unnecessary-copy-initialization)
    t = Tensor();
    EXPECT_EQ(calls, 0);
    EXPECT_EQ(view.to_vector<float>(), (std::vector<float>(4, 1.0f)));
    const Tensor packed = view.contiguous();  // a copy: does not hold the blob
    EXPECT_FALSE(packed.shares_storage(copy));
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, buffer.data());
}

TEST(TensorFromBlob, EmptyBlobStillRunsDeleter) {
  int calls = 0;
  int marker = 0;
  {
    const Tensor t =
        Tensor::from_blob(&marker, {0, 3}, DType::Float32, Device::cpu(), [&](void* p) {
          ++calls;
          EXPECT_EQ(p, &marker);
        });
    EXPECT_EQ(t.numel(), 0);
    EXPECT_TRUE(t.to_vector<float>().empty());
  }
  EXPECT_EQ(calls, 1);
}

// Only a shape with elements needs memory: an empty blob may be null, and its deleter gets null.
TEST(TensorFromBlob, AnEmptyBlobMayBeNull) {
  int calls = 0;
  {
    const Tensor t =
        Tensor::from_blob(nullptr, {0, 3}, DType::Float32, Device::cpu(), [&](void* p) {
          ++calls;
          EXPECT_EQ(p, nullptr);
        });
    EXPECT_EQ(t.sizes(), (Shape{0, 3}));
    EXPECT_EQ(t.unsafe_data_ptr(), nullptr);
    EXPECT_TRUE(t.to_vector<float>().empty());
  }
  EXPECT_EQ(calls, 1);
}

TEST(TensorFromBlob, InvalidArgumentsLeaveMemoryWithCaller) {
  int calls = 0;
  const auto deleter = [&](void*) { ++calls; };
  float value = 0.0f;
  expect_invalid_argument(
      [&] { (void)Tensor::from_blob(&value, {-1}, DType::Float32, Device::cpu(), deleter); },
      {"Tensor::from_blob", "negative size"});
  expect_invalid_argument(
      [&] { (void)Tensor::from_blob(nullptr, {2}, DType::Float32, Device::cpu(), deleter); },
      {"Tensor::from_blob", "data is null", "2 elements"});
  expect_invalid_argument(
      [&] { (void)Tensor::from_blob(&value, {1}, DType::Float32, Device::meta(), deleter); },
      {"Tensor::from_blob", "meta"});
  EXPECT_EQ(calls, 0);
}

TEST(TensorFromBlob, MisalignedDataThrowsAndLeavesMemoryWithCaller) {
  // The kernels read elements through typed pointers (UBSan: misaligned load otherwise).
  alignas(16) std::byte bytes[32] = {};
  int calls = 0;
  const auto deleter = [&](void*) { ++calls; };
  expect_invalid_argument(
      [&] { (void)Tensor::from_blob(bytes + 2, {2}, DType::Float32, Device::cpu(), deleter); },
      {"Tensor::from_blob", "data is not aligned for Float32 (4-byte alignment needed)"});
  expect_invalid_argument([&] { (void)Tensor::from_blob(bytes + 4, {1}, DType::Complex128); },
                          {"data is not aligned for Complex128 (8-byte alignment needed)"});
  EXPECT_EQ(calls, 0);
  // Alignment, not element size: Complex64 needs 4 bytes, 16-bit floats 2; an empty tensor has
  // no element to misalign.
  EXPECT_EQ(Tensor::from_blob(bytes + 4, {2}, DType::Complex64).unsafe_data_ptr(), bytes + 4);
  EXPECT_EQ(Tensor::from_blob(bytes + 2, {2}, DType::BFloat16).unsafe_data_ptr(), bytes + 2);
  EXPECT_EQ(Tensor::from_blob(bytes + 1, {0}, DType::Int64).numel(), 0);
}

TEST(TensorFromBlob, CudaMemoryIsNotReadOnTheHost) {
  // A fake device address: chorus must never dereference it.
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a fake address, never dereferenced
  auto* device_memory = reinterpret_cast<void*>(std::uintptr_t{0x1000});
  int calls = 0;
  {
    const Tensor t = Tensor::from_blob(device_memory, {2, 3}, DType::Float32, Device::cuda(1),
                                       [&](void*) { ++calls; });
    EXPECT_EQ(t.device(), Device::cuda(1));
    EXPECT_EQ(t.unsafe_data_ptr(), device_memory);
    EXPECT_EQ(t.narrow(1, 1, 2).unsafe_data_ptr(), static_cast<float*>(device_memory) + 1);
    EXPECT_EQ(t.to_string(), "Tensor(shape=[2, 3], dtype=Float32, device=cuda:1)");
    EXPECT_TRUE(t.contiguous().shares_storage(t));
    expect_invalid_argument([&] { (void)t.to_vector<float>(); },
                            {"Tensor::to_vector", "host data access", "cuda:1"});
    expect_invalid_argument([&] { (void)t.data_ptr<float>(); }, {"Tensor::data_ptr", "cuda:1"});
    expect_invalid_argument([&] { (void)t.clone(); }, {"Tensor::clone", "cuda:1"});
    expect_invalid_argument([&] { (void)t.transpose(0, 1).contiguous(); },
                            {"Tensor::contiguous", "cuda:1"});
    expect_invalid_argument([&] { (void)t.equal(t); }, {"Tensor::equal", "cuda:1"});
    Tensor host = Tensor::zeros({2, 3});
    expect_invalid_argument([&] { host.copy_(t); }, {"Tensor::copy_", "cuda:1"});
  }
  EXPECT_EQ(calls, 1);
}

// ---- Meta tensors.

TEST(TensorMeta, CarriesShapesOnly) {
  const Tensor t = Tensor::empty({2, 3}, DType::Float16, Device::meta());
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.device(), Device::meta());
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_EQ(t.unsafe_data_ptr(), nullptr);
  EXPECT_FALSE(t.is_pending());
  EXPECT_FALSE(t.shares_storage(t)) << "meta tensors have no storage to share";
  EXPECT_EQ(Tensor::zeros({4}, DType::Int32, Device::meta()).device(), Device::meta());
  EXPECT_EQ(Tensor::ones({4}, DType::Int32, Device::meta()).sizes(), (Shape{4}));
  EXPECT_EQ(Tensor::full({}, 3.0, DType::Int32, Device::meta()).dim(), 0);
  EXPECT_EQ(t.to_string(), "Tensor(shape=[2, 3], dtype=Float16, device=meta)");
}

TEST(TensorMeta, ViewsWorkOnShapes) {
  const Tensor t = Tensor::empty({4, 6}, DType::Float32, Device::meta());
  EXPECT_EQ(t.view({2, -1, 3}).sizes(), (Shape{2, 4, 3}));
  EXPECT_EQ(t.narrow(1, 2, 3).storage_offset(), 2);
  EXPECT_EQ(t.transpose(0, 1).strides(), (Shape{1, 6}));
  EXPECT_EQ(t.chunk(3, 1).size(), 3u);
  EXPECT_EQ(t.select(0, 1).device(), Device::meta());
  // Shape-only "copies": contiguous, clone and to give meta tensors.
  const Tensor packed = t.transpose(0, 1).contiguous();
  EXPECT_EQ(packed.device(), Device::meta());
  EXPECT_EQ(packed.strides(), (Shape{4, 1}));
  EXPECT_EQ(t.clone().sizes(), (Shape{4, 6}));
  EXPECT_EQ(t.to(DType::Int64).dtype(), DType::Int64);
  EXPECT_EQ(t.to(DType::Int64).device(), Device::meta());
  Tensor dst = Tensor::empty({4, 6}, DType::Int32, Device::meta());
  dst.copy_(t);
  expect_invalid_argument(
      [&] {
        dst.copy_(Tensor::empty({6, 4}, DType::Int32, Device::meta()));
      },
      {"Tensor::copy_", "shapes differ"});
}

TEST(TensorMeta, DataAccessThrows) {
  const Tensor t = Tensor::zeros({2}, DType::Float32, Device::meta());
  expect_invalid_argument([&] { (void)t.to_vector<float>(); }, {"Tensor::to_vector", "meta"});
  expect_invalid_argument([&] { (void)t.select(0, 0).item<float>(); }, {"Tensor::item", "meta"});
  expect_invalid_argument([&] { (void)t.data_ptr<float>(); }, {"Tensor::data_ptr", "meta"});
  expect_invalid_argument([&] { (void)t.equal(t); }, {"Tensor::equal", "meta"});
  expect_invalid_argument([&] { (void)t.bitwise_equal(t); }, {"Tensor::bitwise_equal", "meta"});
  Tensor host = Tensor::zeros({2});
  expect_invalid_argument([&] { host.copy_(t); }, {"Tensor::copy_", "meta"});
  Tensor meta = t;
  expect_invalid_argument([&] { meta.copy_(host); }, {"Tensor::copy_", "meta"});
}

// A moved-from tensor is undefined, as a moved-from at::Tensor: it kept defined() == true with
// no storage, claimed one element, and aborted on a CHECK when used.
TEST(TensorMove, AMovedFromTensorIsUndefined) {
  Tensor a = Tensor::arange(4, DType::Float32);
  const Tensor b = std::move(a);
  EXPECT_FALSE(a.defined());  // NOLINT(bugprone-use-after-move): what is tested
  EXPECT_EQ(a.numel(), 0);
  EXPECT_EQ(a.nbytes(), 0u);
  expect_invalid_argument([&] { (void)a.to_vector<float>(); }, {"undefined"});
  expect_invalid_argument([&] { (void)a.view({1}); }, {"undefined"});
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  Tensor c = Tensor::zeros({2});
  Tensor d;
  d = std::move(c);
  EXPECT_FALSE(c.defined());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(c.numel(), 0);
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{0, 0}));
  Tensor& same = d;
  d = std::move(same);  // NOLINT: self-move keeps the tensor (through a reference: clang warns)
  EXPECT_TRUE(d.defined());
}

// A DType value outside the enum has no element size: refused by every factory, where it made
// tensors with elements and no bytes (clone() then aborted).
TEST(TensorFactories, ADTypeOutsideTheEnumIsRefused) {
  const auto bad = static_cast<DType>(42);
  expect_invalid_argument([&] { (void)Tensor::empty({4}, bad); },
                          {"Tensor::empty", "dtype 42 is not a chorus DType"});
  expect_invalid_argument([&] { (void)Tensor::zeros({4}, bad); }, {"dtype 42"});
  expect_invalid_argument([&] { (void)Tensor::full({4}, 1.0, bad); }, {"dtype 42"});
  float storage[4] = {};
  expect_invalid_argument([&] { (void)Tensor::from_blob(storage, {4}, bad); },
                          {"Tensor::from_blob", "dtype 42"});
}

// ---- Printing.

TEST(TensorPrint, ToStringShowsShapeDTypeDeviceAndValues) {
  const Tensor t = Tensor::arange(6).view({2, 3});
  EXPECT_EQ(t.to_string(),
            "Tensor(shape=[2, 3], dtype=Float32, device=cpu, values=[0, 1, 2, 3, 4, 5])");
  EXPECT_EQ(t.to_string(4),
            "Tensor(shape=[2, 3], dtype=Float32, device=cpu, values=[0, 1, 2, 3, ...])");
  EXPECT_EQ(t.to_string(0), "Tensor(shape=[2, 3], dtype=Float32, device=cpu, values=[...])");
  EXPECT_EQ(t.to_string(6), t.to_string());
  EXPECT_EQ(t.to_string(-1), t.to_string()) << "a negative limit prints everything";
  EXPECT_EQ(t.transpose(0, 1).to_string(),
            "Tensor(shape=[3, 2], dtype=Float32, device=cpu, values=[0, 3, 1, 4, 2, 5])");
  std::ostringstream out;
  out << t;
  EXPECT_EQ(out.str(), t.to_string());
}

TEST(TensorPrint, FormatsEveryDType) {
  EXPECT_EQ(Tensor::from_vector(std::vector<bool>{true, false}).to_string(),
            "Tensor(shape=[2], dtype=Bool, device=cpu, values=[true, false])");
  EXPECT_EQ(Tensor::from_vector(std::vector<std::int8_t>{-3, 65}).to_string(),
            "Tensor(shape=[2], dtype=Int8, device=cpu, values=[-3, 65])");
  EXPECT_EQ(Tensor::from_vector(std::vector<std::uint8_t>{255}).to_string(),
            "Tensor(shape=[1], dtype=UInt8, device=cpu, values=[255])");
  EXPECT_EQ(Tensor::full({1}, 1.5, DType::Float16).to_string(),
            "Tensor(shape=[1], dtype=Float16, device=cpu, values=[1.5])");
  EXPECT_EQ(Tensor::full({1}, -2.0, DType::BFloat16).to_string(),
            "Tensor(shape=[1], dtype=BFloat16, device=cpu, values=[-2])");
  EXPECT_EQ(Tensor::from_vector(std::vector<std::complex<float>>{{1.0f, -2.5f}}).to_string(),
            "Tensor(shape=[1], dtype=Complex64, device=cpu, values=[(1,-2.5)])");
  EXPECT_EQ(Tensor::full({}, 7.0, DType::Int64).to_string(),
            "Tensor(shape=[], dtype=Int64, device=cpu, values=[7])");
  EXPECT_EQ(Tensor::zeros({0, 2}).to_string(),
            "Tensor(shape=[0, 2], dtype=Float32, device=cpu, values=[])");
}

}  // namespace
}  // namespace chorus
