// Note [MPI mapping]: which MPI datatype and operation carry each (dtype, reduction); and the
// ring's chunk layout (Note [Ring all_reduce]). Pure functions: no MPI process needed.

#include "mapping.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "chorus/error.hpp"
#include "chorus/mpi/mpi.hpp"
#include "ring_all_reduce.hpp"

namespace chorus::mpi {
namespace {

struct Expected {
  DType dtype;
  const char* reduce_op;
  const char* datatype;
  const char* op;
  bool user_op;
  bool divide_after;
  bool scale_input;
  bool widened = false;
};

class MpiMapping : public ::testing::TestWithParam<Expected> {};

TEST_P(MpiMapping, PicksTheTypeAndOpWhoseArithmeticIsChorus) {
  const Expected& expected = GetParam();
  const ReduceOp reduce_op = expected.reduce_op == std::string("premul_sum")
                                 ? ReduceOp::premul_sum(0.5)
                                 : ReduceOp::parse(expected.reduce_op);
  const Mapping mapping = describe_mapping(expected.dtype, reduce_op);
  EXPECT_EQ(mapping.datatype, expected.datatype);
  EXPECT_EQ(mapping.op, expected.op);
  EXPECT_EQ(mapping.user_op, expected.user_op);
  EXPECT_EQ(mapping.divide_after, expected.divide_after);
  EXPECT_EQ(mapping.scale_input, expected.scale_input);
  EXPECT_EQ(mapping.widened, expected.widened);
}

INSTANTIATE_TEST_SUITE_P(
    Table, MpiMapping,
    ::testing::Values(
        // Integers wrap: unsigned arithmetic; ordered ops keep the sign.
        Expected{DType::Int32, "sum", "MPI_UINT32_T", "MPI_SUM", false, false, false},
        Expected{DType::Int64, "product", "MPI_UINT64_T", "MPI_PROD", false, false, false},
        Expected{DType::Int32, "min", "MPI_INT32_T", "MPI_MIN", false, false, false},
        Expected{DType::Int64, "max", "MPI_INT64_T", "MPI_MAX", false, false, false},
        Expected{DType::Int8, "max", "MPI_INT8_T", "MPI_MAX", false, false, false},
        Expected{DType::UInt8, "min", "MPI_UINT8_T", "MPI_MIN", false, false, false},
        Expected{DType::Int64, "bxor", "MPI_UINT64_T", "MPI_BXOR", false, false, false},
        Expected{DType::Int32, "avg", "MPI_UINT32_T", "MPI_SUM", false, true, false},
        // 8-bit sums and products: Open MPI's AVX component saturates them (ompi#8045).
        Expected{DType::Int8, "sum", "MPI_UINT8_T", "chorus_i8_sum", true, false, false},
        Expected{DType::UInt8, "product", "MPI_UINT8_T", "chorus_u8_product", true, false, false},
        Expected{DType::Int8, "avg", "MPI_UINT8_T", "chorus_i8_sum", true, true, false},
        Expected{DType::UInt8, "band", "MPI_UINT8_T", "MPI_BAND", false, false, false},
        // Bool bytes 0/1.
        Expected{DType::Bool, "min", "MPI_UINT8_T", "MPI_MIN", false, false, false},
        Expected{DType::Bool, "bor", "MPI_UINT8_T", "MPI_BOR", false, false, false},
        // Floats: MPI's sums; chorus's NaN-propagating min/max.
        Expected{DType::Float32, "sum", "MPI_FLOAT", "MPI_SUM", false, false, false},
        Expected{DType::Float64, "product", "MPI_DOUBLE", "MPI_PROD", false, false, false},
        Expected{DType::Float32, "max", "MPI_FLOAT", "chorus_f32_max", true, false, false},
        Expected{DType::Float64, "min", "MPI_DOUBLE", "chorus_f64_min", true, false, false},
        Expected{DType::Float32, "avg", "MPI_FLOAT", "MPI_SUM", false, true, false},
        Expected{DType::Float64, "premul_sum", "MPI_DOUBLE", "MPI_SUM", false, false, true},
        // 16-bit floats: sums and products as float32, rounded once (Note [Widened 16-bit
        // reductions]); min/max exact on the 16-bit elements, NaN-propagating.
        Expected{DType::Float16, "sum", "MPI_FLOAT", "MPI_SUM", false, false, false, true},
        Expected{DType::BFloat16, "product", "MPI_FLOAT", "MPI_PROD", false, false, false, true},
        Expected{DType::Float16, "avg", "MPI_FLOAT", "MPI_SUM", false, true, false, true},
        Expected{DType::BFloat16, "premul_sum", "MPI_FLOAT", "MPI_SUM", false, false, true, true},
        Expected{DType::Float16, "max", "MPI_UINT16_T", "chorus_fp16_max", true, false, false},
        Expected{DType::BFloat16, "min", "MPI_UINT16_T", "chorus_bf16_min", true, false, false},
        // Complex: MPI's complex sums.
        Expected{DType::Complex64, "sum", "MPI_C_FLOAT_COMPLEX", "MPI_SUM", false, false, false},
        Expected{DType::Complex128, "avg", "MPI_C_DOUBLE_COMPLEX", "MPI_SUM", false, true, false},
        Expected{DType::Complex64, "premul_sum", "MPI_C_FLOAT_COMPLEX", "MPI_SUM", false, false,
                 true}),
    // "Float16_max", not the bytes of the struct (which hold pointers: a name per build).
    [](const ::testing::TestParamInfo<Expected>& param_info) {
      return std::string(dtype_name(param_info.param.dtype)) + "_" + param_info.param.reduce_op;
    });

// Every allowed pair maps; user ops exactly where Note [MPI mapping] says.
TEST(MpiMappingSweep, EveryAllowedPairMaps) {
  int mapped = 0;
  for (const DType dtype : kAllDTypes) {
    for (const char* name : {"sum", "avg", "product", "min", "max", "band", "bor", "bxor"}) {
      const ReduceOp reduce_op = ReduceOp::parse(name);
      if (!reduce_op.check_dtype(dtype).empty()) {
        EXPECT_THROW((void)describe_mapping(dtype, reduce_op), InvalidArgument)
            << dtype_name(dtype) << " " << name;
        continue;
      }
      const Mapping mapping = describe_mapping(dtype, reduce_op);
      const bool half = dtype == DType::Float16 || dtype == DType::BFloat16;
      const bool ordered =
          reduce_op.kind() == ReduceOp::Kind::Min || reduce_op.kind() == ReduceOp::Kind::Max;
      const bool float_order = is_floating(dtype) && ordered;
      const bool byte_arithmetic =
          (dtype == DType::Int8 || dtype == DType::UInt8) &&
          (reduce_op.kind() == ReduceOp::Kind::Sum || reduce_op.kind() == ReduceOp::Kind::Avg ||
           reduce_op.kind() == ReduceOp::Kind::Product);
      EXPECT_EQ(mapping.user_op, float_order || byte_arithmetic)
          << dtype_name(dtype) << " " << name << " -> " << mapping.op;
      EXPECT_EQ(mapping.widened, half && !ordered) << dtype_name(dtype) << " " << name;
      EXPECT_EQ(mapping.divide_after, reduce_op.kind() == ReduceOp::Kind::Avg);
      EXPECT_FALSE(mapping.scale_input);
      ++mapped;
    }
  }
  EXPECT_EQ(mapped, 61);  // the allowed pairs of DESIGN 2.3 without premul_sum
}

TEST(MpiMappingSweep, RefusesWhatChorusRefuses) {
  EXPECT_THROW((void)describe_mapping(DType::Bool, "sum"), InvalidArgument);
  EXPECT_THROW((void)describe_mapping(DType::Complex64, "max"), InvalidArgument);
  EXPECT_THROW((void)describe_mapping(DType::Int32, ReduceOp::premul_sum(2.0)), InvalidArgument);
  EXPECT_THROW((void)describe_mapping(DType::Float32, "median"), InvalidArgument);
}

}  // namespace
}  // namespace chorus::mpi

namespace chorus::mpi::detail {
namespace {

// avg's post step divides by the whole group size: never narrowed to the element type.
TEST(MpiDivideInPlace, IntegersDivideByTheWholeGroupSizeTowardZero) {
  std::int8_t int8[3] = {-128, 100, -7};
  divide_in_place(int8, DType::Int8, 3, 128);
  EXPECT_EQ(int8[0], -1);
  EXPECT_EQ(int8[1], 0);
  EXPECT_EQ(int8[2], 0);
  std::int8_t hundred = 100;
  divide_in_place(&hundred, DType::Int8, 1, 200);
  EXPECT_EQ(hundred, 0);
  std::uint8_t uint8[2] = {255, 3};
  divide_in_place(uint8, DType::UInt8, 2, 256);  // a narrowed divisor would be 0
  EXPECT_EQ(uint8[0], 0);
  EXPECT_EQ(uint8[1], 0);
  std::int32_t int32[2] = {-7, 7};
  divide_in_place(int32, DType::Int32, 2, 2);
  EXPECT_EQ(int32[0], -3);
  EXPECT_EQ(int32[1], 3);
  std::int64_t int64 = -(std::int64_t{1} << 40);
  divide_in_place(&int64, DType::Int64, 1, 1024);
  EXPECT_EQ(int64, -(std::int64_t{1} << 30));
}

TEST(MpiDivideInPlace, FloatsAndComplexDivideEveryPart) {
  float f32[2] = {3.0f, -1.0f};
  divide_in_place(f32, DType::Float32, 2, 4);
  EXPECT_EQ(f32[0], 0.75f);
  EXPECT_EQ(f32[1], -0.25f);
  double complex128[2] = {6.0, -3.0};  // one Complex128 element: real, imaginary
  divide_in_place(complex128, DType::Complex128, 1, 3);
  EXPECT_EQ(complex128[0], 2.0);
  EXPECT_EQ(complex128[1], -1.0);
  float complex64[4] = {6.0f, -3.0f, 9.0f, 12.0f};  // two Complex64 elements: 4 floats
  divide_in_place(complex64, DType::Complex64, 2, 3);
  EXPECT_EQ(complex64[0], 2.0f);
  EXPECT_EQ(complex64[1], -1.0f);
  EXPECT_EQ(complex64[2], 3.0f);
  EXPECT_EQ(complex64[3], 4.0f);
}

// 16-bit averages are divided while widened to float32; dividing the 16-bit values is a bug.
TEST(MpiDivideInPlaceDeathTest, SixteenBitFloatsAreNotDividedInPlace) {
  std::uint16_t half = 0;
  EXPECT_DEATH(divide_in_place(&half, DType::Float16, 1, 2), "false");
  EXPECT_DEATH(divide_in_place(&half, DType::BFloat16, 1, 2), "false");
}

// Their sums and products are widened too: only min and max take a 16-bit user op.
TEST(MpiUserOpsDeathTest, SixteenBitFloatsTakeUserOpsForMinAndMaxOnly) {
  UserOps ops;
  EXPECT_DEATH(ops.get(DType::Float16, ReduceOp::Kind::Sum), "false");
  EXPECT_DEATH(ops.get(DType::BFloat16, ReduceOp::Kind::Product), "false");
}

// Note [Ring all_reduce]: chunk c of `count` elements over n ranks holds count / n elements, one
// more for the first count % n chunks, laid out in order.
TEST(MpiRingLayout, ChunksSplitTheRemainderOverTheFirstRanks) {
  const std::size_t offsets[4] = {0, 3, 6, 8};
  const std::size_t counts[4] = {3, 3, 2, 2};
  for (int chunk = 0; chunk < 4; ++chunk) {
    EXPECT_EQ(RingAllReduce::chunk_offset(10, 4, chunk), offsets[chunk]) << chunk;
    EXPECT_EQ(RingAllReduce::chunk_count(10, 4, chunk), counts[chunk]) << chunk;
  }
  EXPECT_EQ(RingAllReduce::chunk_count(2, 4, 2), std::size_t{0});  // fewer elements than ranks
  EXPECT_EQ(RingAllReduce::chunk_offset(2, 4, 3), std::size_t{2});
}

// A chunk's bytes travel as one int count of MPI_BYTE: the largest chunk may hold exactly
// INT_MAX bytes, not one element more.
TEST(MpiRingLayout, FitsUpToAnIntCountOfBytesPerChunk) {
  constexpr auto kIntMax = static_cast<std::size_t>(std::numeric_limits<int>::max());
  EXPECT_TRUE(RingAllReduce::fits(2 * kIntMax, DType::UInt8, 2));
  EXPECT_FALSE(RingAllReduce::fits(2 * kIntMax + 1, DType::UInt8, 2));  // chunk 0: INT_MAX + 1
  EXPECT_TRUE(RingAllReduce::fits(3 * (kIntMax / 4), DType::Float32, 3));
  EXPECT_FALSE(RingAllReduce::fits(3 * (kIntMax / 4) + 1, DType::Float32, 3));
}

// Note [Ring all_reduce], "Ties": the ring folds chunks out of group-rank order, which only a
// floating min/max (-0 against +0, NaN payloads) can tell; everything else takes the ring.
TEST(MpiRingLayout, KeepsOrderForAllButFloatingMinAndMax) {
  for (const DType dtype : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    EXPECT_FALSE(RingAllReduce::keeps_order(dtype, ReduceOp(ReduceOp::Kind::Min)))
        << dtype_name(dtype);
    EXPECT_FALSE(RingAllReduce::keeps_order(dtype, ReduceOp(ReduceOp::Kind::Max)))
        << dtype_name(dtype);
    EXPECT_TRUE(RingAllReduce::keeps_order(dtype, ReduceOp(ReduceOp::Kind::Sum)))
        << dtype_name(dtype);
  }
  for (const DType dtype : {DType::UInt8, DType::Int8, DType::Int32, DType::Int64}) {
    EXPECT_TRUE(RingAllReduce::keeps_order(dtype, ReduceOp(ReduceOp::Kind::Min)))
        << dtype_name(dtype);
    EXPECT_TRUE(RingAllReduce::keeps_order(dtype, ReduceOp(ReduceOp::Kind::Max)))
        << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace chorus::mpi::detail
