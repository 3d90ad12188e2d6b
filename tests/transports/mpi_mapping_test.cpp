// Note [MPI mapping]: which MPI datatype and operation carry each (dtype, reduction). Pure
// functions: no MPI process needed.

#include <gtest/gtest.h>

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
        // 16-bit floats: user ops over 16-bit elements.
        Expected{DType::Float16, "sum", "MPI_UINT16_T", "chorus_fp16_sum", true, false, false},
        Expected{DType::BFloat16, "product", "MPI_UINT16_T", "chorus_bf16_product", true, false,
                 false},
        Expected{DType::Float16, "avg", "MPI_UINT16_T", "chorus_fp16_sum", true, true, false},
        Expected{DType::BFloat16, "premul_sum", "MPI_UINT16_T", "chorus_bf16_sum", true, false,
                 true},
        Expected{DType::Float16, "max", "MPI_UINT16_T", "chorus_fp16_max", true, false, false},
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
      const bool float_order =
          (dtype == DType::Float32 || dtype == DType::Float64) &&
          (reduce_op.kind() == ReduceOp::Kind::Min || reduce_op.kind() == ReduceOp::Kind::Max);
      const bool byte_arithmetic =
          (dtype == DType::Int8 || dtype == DType::UInt8) &&
          (reduce_op.kind() == ReduceOp::Kind::Sum || reduce_op.kind() == ReduceOp::Kind::Avg ||
           reduce_op.kind() == ReduceOp::Kind::Product);
      EXPECT_EQ(mapping.user_op, half || float_order || byte_arithmetic)
          << dtype_name(dtype) << " " << name << " -> " << mapping.op;
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
