#include "mapping.hpp"

#include <cstring>
#include <string>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/half.hpp"
#include "chorus/nccl/nccl.hpp"

namespace chorus::nccl {
namespace detail {
namespace {

Type unsigned_of(DType dtype) {
  switch (element_size(dtype)) {
    case 1:
      return Type::Uint8;
    case 4:
      return Type::Uint32;
    default:
      CHORUS_CHECK_EQ(element_size(dtype), std::size_t{8});
      return Type::Uint64;
  }
}

Type signed_of(DType dtype) {
  switch (dtype) {
    case DType::Int8:
      return Type::Int8;
    case DType::UInt8:
      return Type::Uint8;
    case DType::Int32:
      return Type::Int32;
    default:
      CHORUS_CHECK(dtype == DType::Int64);
      return Type::Int64;
  }
}

Type floating_of(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return Type::Float16;
    case DType::BFloat16:
      return Type::Bfloat16;
    case DType::Float32:
    case DType::Complex64:
      return Type::Float32;
    default:
      CHORUS_CHECK(dtype == DType::Float64 || dtype == DType::Complex128);
      return Type::Float64;
  }
}

// The op for a non-bitwise kind.
Op op_of(ReduceOp::Kind kind) {
  switch (kind) {
    case ReduceOp::Kind::Sum:
      return Op::Sum;
    case ReduceOp::Kind::Avg:
      return Op::Avg;
    case ReduceOp::Kind::Product:
      return Op::Prod;
    case ReduceOp::Kind::Min:
      return Op::Min;
    case ReduceOp::Kind::Max:
      return Op::Max;
    case ReduceOp::Kind::PremulSum:
      return Op::PremulSum;
    default:
      CHORUS_CHECK(false);
      return Op::Sum;
  }
}

bool is_bitwise(ReduceOp::Kind kind) {
  return kind == ReduceOp::Kind::BAnd || kind == ReduceOp::Kind::BOr ||
         kind == ReduceOp::Kind::BXor;
}

}  // namespace

std::optional<Plan> plan_reduction(DType dtype, const ReduceOp& reduce_op, std::string& problem) {
  // Every problem names the backend ("nccl: ..."), core's reasons included.
  if (!reduce_op.is_valid()) {
    problem = "nccl: Unrecognized reduce_op '" + reduce_op.invalid_name() + "'";
    return std::nullopt;
  }
  if (std::string reason = reduce_op.check_dtype(dtype); !reason.empty()) {
    problem = "nccl: " + reason;
    return std::nullopt;
  }
  const ReduceOp::Kind kind = reduce_op.kind();
  Plan plan;
  if (dtype == DType::Bool) {
    // check_dtype allows min/max/band/bor/bxor on Bool.
    plan.type = Type::Uint8;
    if (kind == ReduceOp::Kind::Min || kind == ReduceOp::Kind::BAnd) {
      plan.op = Op::Min;
    } else if (kind == ReduceOp::Kind::Max || kind == ReduceOp::Kind::BOr) {
      plan.op = Op::Max;
    } else {
      CHORUS_CHECK(kind == ReduceOp::Kind::BXor);
      problem =
          "nccl: reduce_op bxor on Bool is not supported by the NCCL backend (NCCL has no "
          "bitwise reductions)";
      return std::nullopt;
    }
    return plan;
  }
  if (is_bitwise(kind)) {
    CHORUS_CHECK(is_integer(dtype));  // check_dtype: bitwise ops need an integer or Bool dtype
    problem = "nccl: reduce_op " + std::string(reduce_kind_name(kind)) + " on " +
              std::string(dtype_name(dtype)) +
              " is not supported by the NCCL backend (NCCL has no bitwise reductions)";
    return std::nullopt;
  }
  plan.op = op_of(kind);
  if (is_integer(dtype)) {
    CHORUS_CHECK(plan.op != Op::PremulSum);  // check_dtype: premul_sum needs float or complex
    const bool wrapping = plan.op == Op::Sum || plan.op == Op::Prod;
    plan.type = wrapping ? unsigned_of(dtype) : signed_of(dtype);
    return plan;
  }
  plan.type = floating_of(dtype);
  if (is_complex(dtype)) {
    CHORUS_CHECK(plan.op == Op::Sum || plan.op == Op::Avg || plan.op == Op::PremulSum);
    plan.count_factor = 2;
  }
  return plan;
}

std::string_view type_name(Type type) noexcept {
  switch (type) {
    case Type::Int8:
      return "ncclInt8";
    case Type::Uint8:
      return "ncclUint8";
    case Type::Int32:
      return "ncclInt32";
    case Type::Uint32:
      return "ncclUint32";
    case Type::Int64:
      return "ncclInt64";
    case Type::Uint64:
      return "ncclUint64";
    case Type::Float16:
      return "ncclFloat16";
    case Type::Float32:
      return "ncclFloat32";
    case Type::Float64:
      return "ncclFloat64";
    case Type::Bfloat16:
      return "ncclBfloat16";
  }
  return "unknown";
}

std::string_view op_name(Op op) noexcept {
  switch (op) {
    case Op::Sum:
      return "ncclSum";
    case Op::Prod:
      return "ncclProd";
    case Op::Max:
      return "ncclMax";
    case Op::Min:
      return "ncclMin";
    case Op::Avg:
      return "ncclAvg";
    case Op::PremulSum:
      return "ncclRedOpCreatePreMulSum";
  }
  return "unknown";
}

std::string premul_scalar(Type type, double factor) {
  std::string bytes;
  auto put = [&bytes](const auto& value) {
    bytes.resize(sizeof(value));
    std::memcpy(bytes.data(), &value, sizeof(value));
  };
  switch (type) {
    case Type::Float16:
      put(float_to_half_bits(static_cast<float>(factor)));
      break;
    case Type::Bfloat16:
      put(float_to_bfloat16_bits(static_cast<float>(factor)));
      break;
    case Type::Float32:
      put(static_cast<float>(factor));
      break;
    case Type::Float64:
      put(factor);
      break;
    default:
      CHORUS_CHECK(false);  // premul_sum needs a floating type
  }
  return bytes;
}

}  // namespace detail

Mapping describe_mapping(DType dtype, const ReduceOp& reduce_op) {
  std::string problem;
  const std::optional<detail::Plan> plan = detail::plan_reduction(dtype, reduce_op, problem);
  if (!plan) {
    throw InvalidArgument(ErrorContext{-1, "nccl::describe_mapping", -1, ""}, problem);
  }
  Mapping mapping;
  mapping.datatype = std::string(detail::type_name(plan->type));
  mapping.op = std::string(detail::op_name(plan->op));
  mapping.count_factor = plan->count_factor;
  return mapping;
}

std::string mapping_problem(DType dtype, const ReduceOp& reduce_op) {
  std::string problem;
  if (detail::plan_reduction(dtype, reduce_op, problem)) {
    return {};
  }
  return problem;
}

}  // namespace chorus::nccl
