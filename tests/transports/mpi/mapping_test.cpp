// Note [MPI mapping]: which MPI datatype and operation carry each (dtype, reduction). Pure
// functions: no MPI process needed.

#include "mapping.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "chorus/error.hpp"
#include "chorus/mpi/mpi.hpp"

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
                 true}));

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

}  // namespace
}  // namespace chorus::mpi::detail
