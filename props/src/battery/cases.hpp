#pragma once

// The battery's case pieces: group layouts, shapes, exact inputs and the reference model they
// are checked against. Internal to chorus::props.
//
// Note [Exact inputs]
// Every input element is a small integer (or a complex number with small integer parts) drawn
// from a hash of (data seed, rank, element index), in a range chosen per op and dtype so that
// every partial result of any reduction order is exactly representable: sums of at most 1024
// values in [-4, 4], products of values in [-2, 2] over at most 8 ranks (|p| <= 256, a power of
// two: exact in bfloat16; larger groups, Int8 and UInt8 use [-1, 1] or [0, 1]), premul_sum
// factors that are powers of two. The
// reference folds in int64, double or complex<double> and converts once to the dtype, which
// rounds exactly as chorus does (avg's one division: rounding the exact quotient to double and
// then to the dtype equals rounding it to the dtype once, since 53 >= 2p + 2 for p = 24, 11, 8;
// chorus rounds it to float and then to a 16-bit type, innocuous for the same reason). So the
// comparison is bitwise, with no tolerance.

#include <rapidcheck.h>

#include <complex>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/chorus.hpp"
#include "chorus/props/property.hpp"
#include "shape_text.hpp"

namespace chorus::props::families {

// ---- Generators that shrink (rc::gen::element and elementOf do not).

// An index in [0, count), any of them at every case size, shrinking towards 0. Drawn at the
// nominal size: rc::gen::inRange scales its range with the size, and the runners' case sizes stop
// at 99, so the top of a range of more than about 50 was never drawn (the 79th (op, dtype) pair,
// roots 62 and 63 of a 64-rank group). Choices and roots use it; sizes grow with the case.
template <class T = int>
rc::Gen<T> gen_index(T count) {
  return rc::gen::resize(rc::kNominalSize, rc::gen::inRange<T>(0, count));
}
// One of `values`, any of them at every case size, shrinking towards the first.
template <class T>
rc::Gen<T> gen_element_of(std::vector<T> values) {
  const std::size_t count = values.size();
  return rc::gen::map(gen_index<std::size_t>(count),
                      [values = std::move(values)](std::size_t i) { return values[i]; });
}
// A multiple of `unit` that moves data most of the time: unit or 2 * unit (alike, at every case
// size), or 0 (nothing to move) one time in eight, as an explicit choice like gen_shape's empty
// dims. rc::gen::inRange(0, 3) * unit, which this replaced, was 0 at every case size below 25
// and half the time up to 74: half the cases of the properties that used it moved no data.
template <class T>
rc::Gen<T> gen_multiple(T unit) {
  return rc::gen::weightedOneOf<T>(
      {{7, rc::gen::map(gen_index<T>(2), [unit](T k) { return (k + 1) * unit; })},
       {1, rc::gen::just(T{0})}});
}
// false or true, shrinking towards false.
inline rc::Gen<bool> gen_flag() {
  return rc::gen::map(rc::gen::inRange(0, 2), [](int bit) { return bit == 1; });
}

// ---- Group layouts: every form a GroupSpec takes.
// The tag of the Tagged layout's group: a communicator of its own, apart from the untagged one
// of the same ranks (and from the lockstep runner's verdicts, tag "chorus.check.verdicts").
inline constexpr std::string_view kLayoutTag = "chorus.check.tagged";
struct Layout {
  // World: world()'s ranks as a list. Subset: a rank list. Lists: 2-D MPMD rank lists. Mesh: a
  // MeshDim of a 2-D DeviceMesh. Tagged: a ProcessGroup new_group(ranks, kLayoutTag). Mesh1D: a
  // 1-D DeviceMesh.
  enum class Kind { World, Subset, Lists, Mesh, Tagged, Mesh1D };
  static constexpr int kKinds = static_cast<int>(Kind::Mesh1D) + 1;
  Kind kind = Kind::World;
  // World, Subset, Tagged, Mesh1D: one list (group order). Lists: the sub-lists. Mesh: every
  // slice along mesh_dim (to answer members_of); the spec is the MeshDim.
  std::vector<std::vector<int>> lists;
  Shape mesh_shape;
  std::vector<int> mesh_ranks;
  std::int64_t mesh_dim = 0;

  // Call inside a rank (Tagged makes its ProcessGroup there, with new_group).
  GroupSpec spec() const;
  // The caller's group, in group order; empty when `rank` is not a member.
  const std::vector<int>* members_of(int rank) const;
  int group_size() const { return static_cast<int>(lists.front().size()); }
};
void showValue(const Layout& layout, std::ostream& out);
rc::Gen<Layout> gen_layout(int world_size);
// Only layouts where every rank is a member (World, Lists, Mesh; Tagged and Mesh1D of every
// rank).
rc::Gen<Layout> gen_covering_layout(int world_size);

// A permutation of 0..n-1 that shrinks towards the identity.
rc::Gen<std::vector<int>> gen_permutation(int n);

// ---- Shapes: up to `dims_max` dims of 0..4 elements (0 sometimes: empty tensors are a case).
rc::Gen<Shape> gen_shape(int dims_max = 3);

// ---- Dtypes and ops.
rc::Gen<DType> gen_dtype();
// An (op, dtype) pair the op allows; premul_sum with a power-of-two factor.
struct OpDType {
  ReduceOp op = ReduceOp::Kind::Sum;
  DType dtype = DType::Float32;
};
void showValue(const OpDType& value, std::ostream& out);
rc::Gen<OpDType> gen_op_dtype();
// Pairs the op does not allow (for the bad-input properties).
rc::Gen<OpDType> gen_disallowed_op_dtype();

// Note [Reductions a transport lacks]
// Cases are generated alike on every transport (Note [Property runners]), so a case may reduce
// with an op the transport underneath cannot run: NCCL has no bitwise reductions on integers.
// Such a case checks the refusal instead of the result: its first reducing call (`issue`) must
// throw InvalidArgument carrying the transport's reason (chorus::unsupported_reduction), and the
// case ends there. Every member refuses alike before anything is numbered, so the ranks stay in
// step. The simulator and MPI run every pair check_dtype allows, so there every case runs as
// written. Returns what `issue` returned, or nullopt when the transport refused it.
template <class Issue>
auto unless_refused(Env& env, const OpDType& op, Issue&& issue)
    -> std::optional<std::invoke_result_t<Issue&>> {
  const std::string reason = unsupported_reduction(op.dtype, op.op);
  if (reason.empty()) {
    return issue();
  }
  const std::string message = env.require_throws<InvalidArgument>(
      [&issue] { (void)issue(); }, "a reduction the transport lacks (" + reason + ")");
  env.require(message.find(reason) != std::string::npos,
              "the refusal of a reduction the transport lacks names the transport's reason '" +
                  reason + "': " + message);
  return std::nullopt;
}

// A refused call's message and the sequence number its error's context names (nullopt when it
// names none: ErrorContext::seq -1). Read from the error, not from its text, whose detail may
// hold anything ("detail #5" is no sequence number). Fails like Env::require_throws unless
// `body` throws InvalidArgument.
struct Refusal {
  std::string message;
  std::optional<std::int64_t> seq;
};
template <class Body>
Refusal require_refusal(Env& env, Body&& body, std::string_view what) {
  std::optional<std::int64_t> seq;
  std::string message = env.require_throws<InvalidArgument>(
      [&] {
        try {
          std::forward<Body>(body)();
        } catch (const InvalidArgument& error) {
          if (error.context().seq >= 0) {
            seq = error.context().seq;
          }
          throw;
        }
      },
      what);
  return {std::move(message), seq};
}

// ---- Exact inputs (Note [Exact inputs]).
// Rank `rank`'s input for `op` (sum if none) of `shape` and `dtype`, for a group of
// `group_size` (products need smaller values in larger groups).
Tensor exact_input(std::uint64_t data_seed, int rank, const Shape& shape, DType dtype,
                   const ReduceOp& op = ReduceOp::Kind::Sum, int group_size = 1);
// The reduction of the members' exact inputs, folded in group order by the reference model.
Tensor reference_reduce(std::uint64_t data_seed, const std::vector<int>& members,
                        const Shape& shape, DType dtype, const ReduceOp& op);

// ---- Input forms.
// Note [Input forms]
// A collective reads its input through the tensor's view: its storage offset and strides. A
// battery that only ever passes fresh contiguous tensors (offset 0) cannot tell a transport
// buffer taken at the storage's start from one taken at the data, nor a strided input read as if
// it were packed. So the cases that feed exact inputs to a collective also draw the form the
// input takes, with the same values: fresh; a contiguous narrow, at a nonzero storage offset, of
// a larger buffer filled with junk; or a non-contiguous view (strides doubled, interleaved with
// junk, at offset 1, and with two dims or more transposed). Junk is kJunkValue, a value no
// exact input takes (but Bool's true), so reading it changes the result. Forms shrink towards
// fresh.
enum class InputForm { Fresh, Offset, Strided };
inline constexpr int kInputFormCount = 3;
inline constexpr double kJunkValue = 99;
const char* input_form_name(InputForm form) noexcept;
rc::Gen<InputForm> gen_input_form();
// `input`'s values (same shape and dtype) in `form`: `input` itself when fresh, otherwise a view
// into a new junk-filled buffer. Never waits (`input` must not be pending).
Tensor in_form(const Tensor& input, InputForm form);

// ---- The common case: a group, an (op, dtype), a shape, an extra integer, a data seed and the
// form of the inputs (Note [Input forms]).
struct ReduceCase {
  Layout layout;
  OpDType op;
  Shape shape;
  std::int64_t dim = 0;  // the scatter/gather dim, or a root (reduce's dst, broadcast's src)
  std::uint64_t data_seed = 0;
  InputForm form = InputForm::Fresh;
};
void showValue(const ReduceCase& c, std::ostream& out);
// `dim` a group rank (a root); any_dtype: the dtype need not suit the op (copies).
rc::Gen<ReduceCase> gen_reduce_case(const World& world, bool any_dtype);
// At least one dim, whose size at `dim` is a multiple of the group size (gen_multiple: 0 one time
// in eight); `dim` negative (counted from the end) half of the time.
rc::Gen<ReduceCase> gen_scatter_case(const World& world);
// `dim` in [0, ndim) (normalised form of a possibly negative dim).
std::int64_t normalized_dim(std::int64_t dim, const Shape& shape);

// The caller's index in `members` (its group rank); -1 if absent.
int index_of(const std::vector<int>& members, int rank);

}  // namespace chorus::props::families
