#pragma once

// How chorus dtypes and reductions become MPI datatypes and operations (Note [MPI mapping]).

#include <mpi.h>

#include <cstdint>
#include <string_view>

#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"

namespace chorus::mpi::detail {

// Note [MPI mapping]
// Elements travel as fixed-width MPI types. Reductions pick the type whose MPI arithmetic gives
// chorus::kernels' bits (Note [Reduction order] in chorus/kernels.hpp):
// - integer sum/product/bitwise: the unsigned type of the same width (wrapping arithmetic, the
//   same bits as two's complement, and no signed overflow inside MPI); min/max: the signed type.
//   Except 8-bit sum and product: chorus user ops. Open MPI 4.1's AVX reduction component
//   saturates 8- and 16-bit integer sums from 16 elements up (open-mpi/ompi#8045, closed
//   "wontfix"); the property battery found it here as an Int8 all_reduce that returned 0xff.
// - Bool (bytes 0/1): unsigned char; min = band, max = bor.
// - Float32/Float64/complex sum and product: MPI's own (one rounding per step, as the kernels).
// - Float32/Float64 min/max: chorus user ops, because MPI_MIN/MPI_MAX drop NaN where chorus (and
//   NCCL, and torch) propagate it.
// - Float16/BFloat16 (MPI has no half types): sum, product, avg and premul_sum are widened: the
//   transport reduces float32 copies with MPI_FLOAT and rounds once at completion (Note
//   [Widened 16-bit reductions] in mpi_transport.cpp); min/max are chorus user ops over the
//   16-bit elements (exact).
// - avg: sum, then the transport divides by the group size; premul_sum(f): the transport sums a
//   scaled copy f * x of the input. Both are post/pre steps of the Work, not MPI ops. The small
//   direct exchanges (Note [Direct exchanges]) reduce with chorus's kernels instead, avg and
//   premul_sum included.
// Data movement (gather, broadcast, all_to_all) uses the unsigned type of the element's width
// (Complex128: MPI_C_DOUBLE_COMPLEX), so counts stay element counts.
enum class Element : std::uint8_t {
  U8,
  I8,
  U16,
  I32,
  U32,
  I64,
  U64,
  Float,
  Double,
  FloatComplex,
  DoubleComplex,
};

enum class OpChoice : std::uint8_t { Sum, Prod, Min, Max, BAnd, BOr, BXor, User };

struct Plan {
  Element element = Element::U8;
  OpChoice op = OpChoice::Sum;
  // For OpChoice::User: the kernels' reduction each step applies (Sum, Product, Min or Max).
  ReduceOp::Kind user_kind = ReduceOp::Kind::Sum;
  bool divide_after = false;
  bool scale_input = false;
  // Float16/BFloat16 sum, avg, premul_sum, product: `element` is Float, and the transport
  // widens the input and rounds the result once (Note [Widened 16-bit reductions]).
  bool widen = false;
};

// `reduce_op` must be valid for `dtype`; CHORUS_CHECKed.
Plan plan_reduction(DType dtype, const ReduceOp& reduce_op);
Element movement_element(DType dtype);

MPI_Datatype mpi_datatype(Element element);
MPI_Op builtin_op(OpChoice choice);
std::string_view element_name(Element element);
std::string_view op_choice_name(OpChoice choice);
// "chorus_fp16_max", "chorus_i8_sum", ...
std::string user_op_name(DType dtype, ReduceOp::Kind kind);

// The chorus user-defined MPI_Ops of one process, created on first use and freed with the object
// (before MPI_Finalize). Callers hold the process's MPI lock.
class UserOps {
 public:
  UserOps() = default;
  ~UserOps();
  UserOps(const UserOps&) = delete;
  UserOps& operator=(const UserOps&) = delete;

  MPI_Op get(DType dtype, ReduceOp::Kind kind);

 private:
  static constexpr int kDTypes = 11;
  static constexpr int kKinds = 4;  // Sum, Product, Min, Max
  MPI_Op ops_[kDTypes][kKinds] = {};
  bool created_[kDTypes][kKinds] = {};
};

// Divides `count` elements of `dtype` in place by `divisor` (avg's post step): integers truncate
// toward zero. Not for Float16 or BFloat16, whose averages are divided while widened (Note
// [Widened 16-bit reductions]).
void divide_in_place(void* data, DType dtype, std::size_t count, int divisor);

}  // namespace chorus::mpi::detail
