#pragma once

// How chorus dtypes and reductions become NCCL datatypes and operations (Note [NCCL mapping]).
// Pure: no CUDA or NCCL header, so the table is unit-tested without a device.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"

namespace chorus::nccl::detail {

// Note [NCCL mapping]
// - Integer sum/product: the unsigned type of the same width (wrapping arithmetic, the bits of
//   two's complement, no signed overflow on the device); min/max and avg: the signed type (avg is
//   NCCL's sum-then-divide on integers, which must divide signed values). Int8 has ncclInt8,
//   UInt8 ncclUint8.
// - Bool (bytes 0/1): ncclUint8; min and band = ncclMin, max and bor = ncclMax. bxor has no
//   NCCL counterpart: InvalidArgument. Bitwise ops on integers: none in NCCL, InvalidArgument.
// - Float16/BFloat16/Float32/Float64: ncclFloat16/ncclBfloat16/ncclFloat32/ncclFloat64 with the
//   op itself; avg = ncclAvg; premul_sum = an op from ncclRedOpCreatePreMulSum with the factor
//   converted to the dtype (rounded to nearest even for 16-bit floats).
// - Complex64/Complex128 (sum, avg, premul_sum only, ReduceOp::check_dtype): pairs of
//   ncclFloat32/ncclFloat64, twice the count. Element-wise on real and imaginary parts is exact
//   for these three ops (a real factor scales both parts).
// - Data movement (gather, scatter, broadcast, all_to_all) is bytes: ncclUint8, count * size.
// NCCL's reduction order and its float accumulation are its own: results agree with
// chorus::kernels' bits for integers, Bool and min/max, not necessarily for floating sums.
enum class Type : std::uint8_t {
  Int8,
  Uint8,
  Int32,
  Uint32,
  Int64,
  Uint64,
  Float16,
  Float32,
  Float64,
  Bfloat16,
};
enum class Op : std::uint8_t { Sum, Prod, Max, Min, Avg, PremulSum };

struct Plan {
  Type type = Type::Uint8;
  Op op = Op::Sum;
  int count_factor = 1;
};

// The plan, or nullopt with `problem` set ("nccl: ...").
std::optional<Plan> plan_reduction(DType dtype, const ReduceOp& reduce_op, std::string& problem);

std::string_view type_name(Type type) noexcept;
std::string_view op_name(Op op) noexcept;

// The premul_sum factor as the bytes of one `type` element (host memory for
// ncclScalarHostImmediate). `type` is a floating type.
std::string premul_scalar(Type type, double factor);

}  // namespace chorus::nccl::detail
