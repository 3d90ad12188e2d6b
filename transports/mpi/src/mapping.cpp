#include "mapping.hpp"

#include <complex>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/kernels.hpp"
#include "chorus/mpi/mpi.hpp"

namespace chorus::mpi {
namespace detail {
namespace {

Element unsigned_of_width(std::size_t bytes) {
  switch (bytes) {
    case 1:
      return Element::U8;
    case 2:
      return Element::U16;
    case 4:
      return Element::U32;
    default:
      CHORUS_CHECK_EQ(bytes, std::size_t{8});
      return Element::U64;
  }
}

Element signed_of(DType dtype) {
  switch (dtype) {
    case DType::Int8:
      return Element::I8;
    case DType::Int32:
      return Element::I32;
    case DType::Int64:
      return Element::I64;
    default:
      CHORUS_CHECK(dtype == DType::UInt8 || dtype == DType::Bool);
      return Element::U8;
  }
}

OpChoice builtin_of(ReduceOp::Kind kind) {
  switch (kind) {
    case ReduceOp::Kind::Sum:
    case ReduceOp::Kind::Avg:
    case ReduceOp::Kind::PremulSum:
      return OpChoice::Sum;
    case ReduceOp::Kind::Product:
      return OpChoice::Prod;
    case ReduceOp::Kind::Min:
      return OpChoice::Min;
    case ReduceOp::Kind::Max:
      return OpChoice::Max;
    case ReduceOp::Kind::BAnd:
      return OpChoice::BAnd;
    case ReduceOp::Kind::BOr:
      return OpChoice::BOr;
    case ReduceOp::Kind::BXor:
      return OpChoice::BXor;
    case ReduceOp::Kind::Invalid:
      break;
  }
  CHORUS_CHECK(false);
  return OpChoice::Sum;
}

// The kernels' reduction a user op applies at each step (avg and premul_sum sum).
ReduceOp::Kind step_kind(ReduceOp::Kind kind) {
  return kind == ReduceOp::Kind::Avg || kind == ReduceOp::Kind::PremulSum ? ReduceOp::Kind::Sum
                                                                          : kind;
}

int kind_index(ReduceOp::Kind kind) {
  switch (kind) {
    case ReduceOp::Kind::Sum:
      return 0;
    case ReduceOp::Kind::Product:
      return 1;
    case ReduceOp::Kind::Min:
      return 2;
    case ReduceOp::Kind::Max:
      return 3;
    default:
      CHORUS_CHECK(false);
      return 0;
  }
}

// One step of a user op: inout[i] = in[i] (op) inout[i] (MPI's operand order: `in` holds the
// lower ranks' partial result).
template <DType D, ReduceOp::Kind K>
void user_step(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
  const void* srcs[2] = {in, inout};
  kernels::reduce(inout, srcs, 2, static_cast<std::size_t>(*len), D, ReduceOp(K));
}

// Float16 and BFloat16 take a user op for min and max only: their sums and products are widened
// (Note [Widened 16-bit reductions]).
template <DType D>
MPI_User_function* user_function(ReduceOp::Kind kind) {
  constexpr bool kSixteenBit = D == DType::Float16 || D == DType::BFloat16;
  switch (kind) {
    case ReduceOp::Kind::Sum:
      if constexpr (!kSixteenBit) {
        return &user_step<D, ReduceOp::Kind::Sum>;
      }
      break;
    case ReduceOp::Kind::Product:
      if constexpr (!kSixteenBit) {
        return &user_step<D, ReduceOp::Kind::Product>;
      }
      break;
    case ReduceOp::Kind::Min:
      return &user_step<D, ReduceOp::Kind::Min>;
    case ReduceOp::Kind::Max:
      return &user_step<D, ReduceOp::Kind::Max>;
    default:
      break;
  }
  CHORUS_CHECK(false);
  return nullptr;
}

// Integers: the element read as its own type, widened, divided by the whole group size (a
// narrowed divisor would be wrong from 128 ranks on Int8, and zero at 256 on UInt8), narrowed
// back: C++ division toward zero, as the kernels' avg.
template <typename T>
void divide_integers(void* data, std::size_t count, int divisor) {
  using Wide = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
  T* values = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = static_cast<T>(static_cast<Wide>(values[i]) / static_cast<Wide>(divisor));
  }
}

template <typename T>
void divide_floats(void* data, std::size_t count, int divisor) {
  T* values = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = values[i] / static_cast<T>(divisor);
  }
}

}  // namespace

Plan plan_reduction(DType dtype, const ReduceOp& reduce_op) {
  CHORUS_CHECK(reduce_op.is_valid());
  CHORUS_CHECK(reduce_op.check_dtype(dtype).empty());
  const ReduceOp::Kind kind = reduce_op.kind();
  Plan plan;
  plan.divide_after = kind == ReduceOp::Kind::Avg;
  plan.scale_input = kind == ReduceOp::Kind::PremulSum;
  plan.op = builtin_of(kind);
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8:
    case DType::Int8:
    case DType::Int32:
    case DType::Int64: {
      const bool ordered = plan.op == OpChoice::Min || plan.op == OpChoice::Max;
      plan.element = ordered ? signed_of(dtype) : unsigned_of_width(element_size(dtype));
      const bool arithmetic = plan.op == OpChoice::Sum || plan.op == OpChoice::Prod;
      if (arithmetic && element_size(dtype) == 1) {
        // Note [MPI mapping]: Open MPI's AVX 8-bit sums saturate.
        plan.op = OpChoice::User;
        plan.user_kind = step_kind(kind);
      }
      break;
    }
    case DType::Float16:
    case DType::BFloat16:
      if (plan.op == OpChoice::Min || plan.op == OpChoice::Max) {
        plan.element = Element::U16;  // exact: no rounding, and NaN propagates (user op)
        plan.op = OpChoice::User;
        plan.user_kind = kind;
      } else {
        // Note [Widened 16-bit reductions]: sums and products travel as float32.
        plan.element = Element::Float;
        plan.widen = true;
      }
      break;
    case DType::Float32:
    case DType::Float64:
      plan.element = dtype == DType::Float32 ? Element::Float : Element::Double;
      if (plan.op == OpChoice::Min || plan.op == OpChoice::Max) {
        plan.op = OpChoice::User;  // NaN propagates in chorus, not in MPI_MIN/MPI_MAX
        plan.user_kind = kind;
      }
      break;
    case DType::Complex64:
    case DType::Complex128:
      plan.element = dtype == DType::Complex64 ? Element::FloatComplex : Element::DoubleComplex;
      CHORUS_CHECK(plan.op == OpChoice::Sum);  // check_dtype allows only sum/avg/premul_sum
      break;
  }
  if (plan.op != OpChoice::User) {
    CHORUS_CHECK(plan.user_kind == ReduceOp::Kind::Sum);
  }
  return plan;
}

Element movement_element(DType dtype) {
  if (dtype == DType::Complex128) {
    return Element::DoubleComplex;
  }
  return unsigned_of_width(element_size(dtype));
}

MPI_Datatype mpi_datatype(Element element) {
  switch (element) {
    case Element::U8:
      return MPI_UINT8_T;
    case Element::I8:
      return MPI_INT8_T;
    case Element::U16:
      return MPI_UINT16_T;
    case Element::I32:
      return MPI_INT32_T;
    case Element::U32:
      return MPI_UINT32_T;
    case Element::I64:
      return MPI_INT64_T;
    case Element::U64:
      return MPI_UINT64_T;
    case Element::Float:
      return MPI_FLOAT;
    case Element::Double:
      return MPI_DOUBLE;
    case Element::FloatComplex:
      return MPI_C_FLOAT_COMPLEX;
    case Element::DoubleComplex:
      return MPI_C_DOUBLE_COMPLEX;
  }
  CHORUS_CHECK(false);
  return MPI_DATATYPE_NULL;
}

MPI_Op builtin_op(OpChoice choice) {
  switch (choice) {
    case OpChoice::Sum:
      return MPI_SUM;
    case OpChoice::Prod:
      return MPI_PROD;
    case OpChoice::Min:
      return MPI_MIN;
    case OpChoice::Max:
      return MPI_MAX;
    case OpChoice::BAnd:
      return MPI_BAND;
    case OpChoice::BOr:
      return MPI_BOR;
    case OpChoice::BXor:
      return MPI_BXOR;
    case OpChoice::User:
      break;
  }
  CHORUS_CHECK(false);
  return MPI_OP_NULL;
}

std::string_view element_name(Element element) {
  switch (element) {
    case Element::U8:
      return "MPI_UINT8_T";
    case Element::I8:
      return "MPI_INT8_T";
    case Element::U16:
      return "MPI_UINT16_T";
    case Element::I32:
      return "MPI_INT32_T";
    case Element::U32:
      return "MPI_UINT32_T";
    case Element::I64:
      return "MPI_INT64_T";
    case Element::U64:
      return "MPI_UINT64_T";
    case Element::Float:
      return "MPI_FLOAT";
    case Element::Double:
      return "MPI_DOUBLE";
    case Element::FloatComplex:
      return "MPI_C_FLOAT_COMPLEX";
    case Element::DoubleComplex:
      return "MPI_C_DOUBLE_COMPLEX";
  }
  return "unknown";
}

std::string_view op_choice_name(OpChoice choice) {
  switch (choice) {
    case OpChoice::Sum:
      return "MPI_SUM";
    case OpChoice::Prod:
      return "MPI_PROD";
    case OpChoice::Min:
      return "MPI_MIN";
    case OpChoice::Max:
      return "MPI_MAX";
    case OpChoice::BAnd:
      return "MPI_BAND";
    case OpChoice::BOr:
      return "MPI_BOR";
    case OpChoice::BXor:
      return "MPI_BXOR";
    case OpChoice::User:
      return "user";
  }
  return "unknown";
}

std::string user_op_name(DType dtype, ReduceOp::Kind kind) {
  std::string_view type = dtype == DType::Float16    ? "fp16"
                          : dtype == DType::BFloat16 ? "bf16"
                          : dtype == DType::Float32  ? "f32"
                          : dtype == DType::Float64  ? "f64"
                          : dtype == DType::Int8     ? "i8"
                                                     : "u8";
  return "chorus_" + std::string(type) + "_" + std::string(reduce_kind_name(kind));
}

UserOps::~UserOps() {
  for (int dtype = 0; dtype < kDTypes; ++dtype) {
    for (int kind = 0; kind < kKinds; ++kind) {
      if (created_[dtype][kind]) {
        MPI_Op_free(&ops_[dtype][kind]);
      }
    }
  }
}

MPI_Op UserOps::get(DType dtype, ReduceOp::Kind kind) {
  const auto dtype_index = static_cast<int>(dtype);
  const int index = kind_index(kind);
  CHORUS_CHECK_LT(dtype_index, kDTypes);
  if (!created_[dtype_index][index]) {
    MPI_User_function* function = nullptr;
    switch (dtype) {
      case DType::Float16:
        function = user_function<DType::Float16>(kind);
        break;
      case DType::BFloat16:
        function = user_function<DType::BFloat16>(kind);
        break;
      case DType::Float32:
        function = user_function<DType::Float32>(kind);
        break;
      case DType::Float64:
        function = user_function<DType::Float64>(kind);
        break;
      case DType::Int8:
        function = user_function<DType::Int8>(kind);
        break;
      case DType::UInt8:
        function = user_function<DType::UInt8>(kind);
        break;
      default:
        CHORUS_CHECK(false);
    }
    // Sums and products commute bitwise (a + b == b + a). min/max do not quite: on ties (-0 and
    // +0, NaN payloads) the kernels keep the left operand, so MPI must keep rank order.
    const int commute = kind == ReduceOp::Kind::Sum || kind == ReduceOp::Kind::Product ? 1 : 0;
    CHORUS_CHECK_EQ(MPI_Op_create(function, commute, &ops_[dtype_index][index]), MPI_SUCCESS);
    created_[dtype_index][index] = true;
  }
  return ops_[dtype_index][index];
}

void divide_in_place(void* data, DType dtype, std::size_t count, int divisor) {
  CHORUS_CHECK_GT(divisor, 0);
  switch (dtype) {
    case DType::UInt8:
      divide_integers<std::uint8_t>(data, count, divisor);
      break;
    case DType::Int8:
      divide_integers<std::int8_t>(data, count, divisor);
      break;
    case DType::Int32:
      divide_integers<std::int32_t>(data, count, divisor);
      break;
    case DType::Int64:
      divide_integers<std::int64_t>(data, count, divisor);
      break;
    case DType::Float16:
    case DType::BFloat16:
      // Widened (Note [Widened 16-bit reductions]): divided as float32 before rounding.
      CHORUS_CHECK(false);
      break;
    case DType::Float32:
      divide_floats<float>(data, count, divisor);
      break;
    case DType::Float64:
      divide_floats<double>(data, count, divisor);
      break;
    case DType::Complex64:
      divide_floats<float>(data, 2 * count, divisor);  // real and imaginary parts
      break;
    case DType::Complex128:
      divide_floats<double>(data, 2 * count, divisor);
      break;
    case DType::Bool:
      CHORUS_CHECK(false);  // check_dtype refuses avg on Bool
  }
}

}  // namespace detail

Mapping describe_mapping(DType dtype, const ReduceOp& reduce_op) {
  if (!reduce_op.is_valid()) {
    throw InvalidArgument(ErrorContext{-1, "mpi::describe_mapping", -1, ""},
                          "Unrecognized reduce_op '" + reduce_op.invalid_name() + "'");
  }
  if (std::string reason = reduce_op.check_dtype(dtype); !reason.empty()) {
    throw InvalidArgument(ErrorContext{-1, "mpi::describe_mapping", -1, ""}, reason);
  }
  const detail::Plan plan = detail::plan_reduction(dtype, reduce_op);
  Mapping mapping;
  mapping.datatype = std::string(detail::element_name(plan.element));
  mapping.user_op = plan.op == detail::OpChoice::User;
  mapping.op = mapping.user_op ? detail::user_op_name(dtype, plan.user_kind)
                               : std::string(detail::op_choice_name(plan.op));
  mapping.divide_after = plan.divide_after;
  mapping.scale_input = plan.scale_input;
  mapping.widened = plan.widen;
  return mapping;
}

}  // namespace chorus::mpi
