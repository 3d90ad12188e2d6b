// errors.*: bad input raises the documented error on every rank that passes it, naming the rank,
// and consumes no sequence number (a good call afterwards still pairs up, at the number the
// refusal named; a refusal on a group without the caller leaves that group's members in step);
// ranks that disagree end with CollectiveMismatch on every rank, never a hang (the simulator
// compares them at the rendezvous).

#include <algorithm>
#include <iterator>
#include <optional>

#include "battery/cases.hpp"
#include "battery/families.hpp"
#include "chorus/check.hpp"

namespace chorus::props::families {
namespace {

enum class Bad {
  OpForDType,        // an op the dtype does not allow
  UnknownOp,         // "bogus_op"
  ScatterDivisible,  // reduce_scatter along a dim the group size does not divide
  GatherDim,         // gather_dim out of range
  SplitCount,        // all_to_all split lists without one entry per group rank
  BroadcastSrc,      // src outside the group
  PermuteDuplicate,  // two members send to the same destination
  NotAMember,        // a group without the caller
};
constexpr int kBadCount = 8;
constexpr const char* kBadNames[] = {
    "op not allowed for the dtype",   "unknown reduce op",  "scatter dim not divisible",
    "gather_dim out of range",        "wrong split count",  "broadcast src out of range",
    "duplicate permute destinations", "caller not a member"};
static_assert(std::size(kBadNames) == kBadCount);
static_assert(kBadCount == static_cast<int>(Bad::NotAMember) + 1);

// NotAMember's group (new_group(ranks, kOtherGroupTag)): a tag of its own, so that it is never a
// layout's group, and not a "chorus." one, so that tests can plant transport bugs under it.
constexpr std::string_view kOtherGroupTag = "props.errors.other_group";

struct BadCase {
  Layout layout;
  Bad bad = Bad::OpForDType;
  OpDType disallowed;
  Shape shape;
  std::uint64_t data_seed = 0;
};

// The shape of the bad call's input where it is not the case's shape (the good call's): nullopt
// when they are the same. ScatterDivisible makes dim 0 group size * 2 + 1, which the group size
// never divides; SplitCount sends an empty [0]. The counterexample prints it and issue_bad uses
// it, so what the report names is what the run passed.
std::optional<Shape> bad_call_shape(const BadCase& c) {
  switch (c.bad) {
    case Bad::ScatterDivisible: {
      Shape shape = c.shape;
      CHORUS_CHECK(!shape.empty());
      shape[0] = c.layout.group_size() * 2 + 1;
      return shape;
    }
    case Bad::SplitCount:
      return Shape{0};
    default:
      return std::nullopt;
  }
}

void showValue(const BadCase& c, std::ostream& out) {
  out << kBadNames[static_cast<int>(c.bad)] << " on group ";
  showValue(c.layout, out);
  out << ", shape " << shape_text(c.shape);
  if (const std::optional<Shape> bad_shape = bad_call_shape(c)) {
    out << " (the bad call's: " << shape_text(*bad_shape) << ")";
  }
  if (c.bad == Bad::OpForDType) {
    out << ", ";
    showValue(c.disallowed, out);
  }
  out << ", data seed " << c.data_seed;
}

rc::Gen<BadCase> gen_bad_case(const World& world) {
  return rc::gen::exec([world] {
    BadCase c;
    c.layout = *gen_layout(world.size);
    // Every kind at every case size (rc::gen::inRange scales its range with the size: "caller
    // not a member" came only from size 93, so never at --cases 10).
    c.bad = static_cast<Bad>(*gen_index(kBadCount));
    c.disallowed = *gen_disallowed_op_dtype();
    c.shape = *gen_shape(2);
    if (c.shape.empty()) {
      c.shape.push_back(1);
    }
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

// Whether `rank` makes the bad call: the members at odd positions of their group, and every member
// of a group of one. Had the call consumed a sequence number, theirs would be one ahead of the
// other members' and the good call after it would not pair up. (Were every member to make it, a
// consumed number would go unnoticed.)
bool makes_bad_call(const Layout& layout, int rank) {
  const std::vector<int>* members = layout.members_of(rank);
  if (members == nullptr) {
    return false;
  }
  const auto position = std::find(members->begin(), members->end(), rank) - members->begin();
  return position % 2 == 1 || members->size() == 1;
}

// NotAMember's group: every rank of the world that does not make the bad call, the same group on
// every rank, so that its members can check after the refusals that it is still in step. Empty
// when every rank makes the bad call.
std::vector<int> other_group(const Layout& layout) {
  std::vector<int> ranks;
  for (int r = 0; r < world_size(); ++r) {
    if (!makes_bad_call(layout, r)) {
      ranks.push_back(r);
    }
  }
  return ranks;
}

// Issues the bad call (the result is dropped at once, if any call returns).
void issue_bad(const BadCase& c, const Tensor& input, int group_size) {
  const GroupSpec group = c.layout.spec();
  switch (c.bad) {
    case Bad::OpForDType:
      (void)all_reduce(Tensor::zeros(c.shape, c.disallowed.dtype), c.disallowed.op, group);
      return;
    case Bad::UnknownOp:
      (void)all_reduce(input, "bogus_op", group);
      return;
    case Bad::ScatterDivisible: {
      // group_size * 2 + 1 is never divisible by group_size > 1; for a group of one, a scatter
      // dim past the end instead.
      const Shape shape = *bad_call_shape(c);
      (void)reduce_scatter_tensor(Tensor::zeros(shape, DType::Float32), "sum",
                                  group_size > 1 ? 0 : static_cast<std::int64_t>(shape.size()),
                                  group);
      return;
    }
    case Bad::GatherDim:
      (void)all_gather_tensor(input, static_cast<std::int64_t>(c.shape.size()), group);
      return;
    case Bad::SplitCount: {
      const std::vector<std::int64_t> splits(static_cast<std::size_t>(group_size + 1), 0);
      (void)all_to_all_single(Tensor::zeros(*bad_call_shape(c), DType::Float32), splits, splits,
                              group);
      return;
    }
    case Bad::BroadcastSrc:
      (void)broadcast(input, group_size, group);
      return;
    case Bad::PermuteDuplicate: {
      // Everyone sends to group rank 0 (with one member: to 1, out of range).
      const std::vector<int> src_dst(static_cast<std::size_t>(group_size), group_size > 1 ? 0 : 1);
      (void)permute_tensor(input, src_dst, group);
      return;
    }
    case Bad::NotAMember: {
      const std::vector<int> other = other_group(c.layout);
      if (!other.empty()) {
        (void)all_reduce(input, "sum", new_group(other, std::string(kOtherGroupTag)));
        return;
      }
      // Every rank makes the bad call: a group of all the others (a world of one: a rank that
      // does not exist), whose members cannot check it afterwards.
      std::vector<int> others;
      for (int r = 0; r < world_size(); ++r) {
        if (r != rank()) {
          others.push_back(r);
        }
      }
      if (others.empty()) {
        others.push_back(rank() + 1);
      }
      (void)all_reduce(input, "sum", GroupSpec(others));
      return;
    }
  }
}

// NotAMember, on the members of the group the bad callers named (other_group): the refusals
// left it in step. Its next collective pairs up with the exact result, at the same sequence
// number on every member (compared by an all_gather on the group). The input has elements
// whatever the case's shape, so that a result out of step shows.
void check_other_group_in_step(const BadCase& c, const std::vector<int>& other, Env& env) {
  const ProcessGroup group = new_group(other, std::string(kOtherGroupTag));
  const Shape shape{4};
  const Tensor input = exact_input(c.data_seed, env.rank(), shape, DType::Float32);
  std::int64_t seq = -1;
  {
    const TraceScope trace;
    const Tensor result = all_reduce(input, "sum", group);
    env.require_bitwise_equal(result,
                              reference_reduce(c.data_seed, other, shape, DType::Float32, "sum"),
                              "an all_reduce on the group the refused calls named, after them");
    if (env.require(trace.records().size() == 1, "the all_reduce was traced")) {
      seq = trace.records().front().seq;
    }
  }
  const std::vector<std::int64_t> seqs =
      all_gather_tensor(Tensor::full({1}, static_cast<double>(seq), DType::Int64), 0, group)
          .to_vector<std::int64_t>();
  env.require(seq >= 0 && std::all_of(seqs.begin(), seqs.end(),
                                      [seq](std::int64_t other_seq) { return other_seq == seq; }),
              "the group's members numbered the all_reduce after the refusals alike (this "
              "rank: " +
                  std::to_string(seq) + ")");
}

void check_bad_input(const BadCase& c, Env& env) {
  const std::vector<int> other =
      c.bad == Bad::NotAMember ? other_group(c.layout) : std::vector<int>{};
  const bool in_other = std::find(other.begin(), other.end(), env.rank()) != other.end();
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members != nullptr) {
    const int size = c.layout.group_size();
    const Tensor input = exact_input(c.data_seed, env.rank(), c.shape, DType::Float32);
    std::optional<std::int64_t> refused_seq;
    if (makes_bad_call(c.layout, env.rank())) {
      CHORUS_CHECK(!in_other);
      const Refusal refusal = require_refusal(
          env, [&] { issue_bad(c, input, size); }, std::string(kBadNames[static_cast<int>(c.bad)]));
      const std::string& message = refusal.message;
      const std::string named = "[rank " + std::to_string(env.rank()) + "]";
      env.require(message.find(named) != std::string::npos,
                  "the error names the rank (" + named + "): " + message);
      env.require(work_registry_size() == 0, "a refused call registers nothing");
      refused_seq = refusal.seq;
      // A rank has no sequence numbers on a group it is not in.
      if (c.bad == Bad::NotAMember) {
        env.require(!refused_seq.has_value(),
                    "a refusal on a group without the caller names no sequence number: " + message);
      }
    }
    // No sequence number was consumed: a good call still pairs up with the other members', at
    // the number the refusal named (if it named one).
    const TraceScope trace;
    const Tensor good = all_reduce(input, "sum", c.layout.spec());
    env.require_bitwise_equal(
        good, reference_reduce(c.data_seed, *members, c.shape, DType::Float32, "sum"),
        "a good all_reduce after the refused call");
    if (refused_seq && env.require(trace.records().size() == 1, "the good call was traced")) {
      env.require(trace.records().front().seq == *refused_seq,
                  "the good call has the sequence number the refused call named (#" +
                      std::to_string(*refused_seq) + "), got #" +
                      std::to_string(trace.records().front().seq));
    }
  }
  if (in_other) {
    check_other_group_in_step(c, other, env);
  }
}

// ---- Mismatches between ranks (simulator only: on a real transport they would abort it)

// Shape: another element count. SameCountShape: the same count in another shape ([2, 3] against
// [3, 2]). GatherDim, ScatterDim: all_gather_tensor / reduce_scatter_tensor of the same shape
// along dim 0 against dim 1. The last three move the same element counts, so only the layout
// digest tells them apart (Note [Layout digest] in core/src/collectives.cpp).
enum class Mismatch { Shape, DType, ReduceOp, Op, Root, SameCountShape, GatherDim, ScatterDim };
constexpr int kMismatchCount = 8;
constexpr const char* kMismatchNames[] = {
    "shape (element count)",      "dtype",      "reduce op",  "op", "broadcast root",
    "shape (same element count)", "gather dim", "scatter dim"};
static_assert(std::size(kMismatchNames) == kMismatchCount);

struct MismatchCase {
  Mismatch kind = Mismatch::Shape;
  int odd = 0;  // the rank that differs
  Shape shape;  // drawn; mismatch_shape gives the one each rank passes
  int world_size = 1;
};

std::int64_t count_of(const Shape& shape) {
  std::int64_t count = 1;
  for (const std::int64_t size : shape) {
    count *= size;
  }
  return count;
}

// Another shape of the same element count: reversed ([2, 3] to [3, 2]) where that differs,
// otherwise with a trailing 1 ([2, 2] to [2, 2, 1], [] to [1]).
Shape same_count_other_shape(const Shape& shape) {
  Shape other(shape.rbegin(), shape.rend());
  if (other == shape) {
    other.push_back(1);
  }
  CHORUS_CHECK(other != shape);
  CHORUS_CHECK_EQ(count_of(other), count_of(shape));
  return other;
}

// The shape `c`'s ranks pass (`odd`: the rank that differs): the drawn shape, but for Shape and
// SameCountShape on the odd rank, GatherDim (two dims at least, so that dim 1 exists) and
// ScatterDim ([W, 2W]: both dims divisible by the world size, so either is a valid scatter dim).
// The counterexample prints it and check_mismatch uses it, so what the report names is what the
// run passed.
Shape mismatch_shape(const MismatchCase& c, bool odd) {
  switch (c.kind) {
    case Mismatch::Shape:
      return odd ? Shape{count_of(c.shape) + 1} : c.shape;
    case Mismatch::SameCountShape:
      return odd ? same_count_other_shape(c.shape) : c.shape;
    case Mismatch::GatherDim: {
      Shape shape = c.shape;
      shape.resize(std::max<std::size_t>(shape.size(), 2), 1);
      return shape;
    }
    case Mismatch::ScatterDim: {
      const auto world_ranks = static_cast<std::int64_t>(c.world_size);
      return {world_ranks, 2 * world_ranks};
    }
    default:
      return c.shape;
  }
}

void showValue(const MismatchCase& c, std::ostream& out) {
  const Shape shape = mismatch_shape(c, false);
  const Shape odd_shape = mismatch_shape(c, true);
  out << "rank " << c.odd << " passes a different " << kMismatchNames[static_cast<int>(c.kind)]
      << ", shape " << shape_text(shape);
  if (odd_shape != shape) {
    out << " (rank " << c.odd << "'s: " << shape_text(odd_shape) << ")";
  }
}

rc::Gen<MismatchCase> gen_mismatch_case(const World& world) {
  return rc::gen::exec([world] {
    MismatchCase c;
    // Every kind and odd rank at every case size (rc::gen::inRange scales its range with the size).
    c.kind = static_cast<Mismatch>(*gen_index(kMismatchCount));
    c.odd = *gen_index(world.size);
    c.shape = *gen_shape(2);
    c.world_size = world.size;
    return c;
  });
}

void check_mismatch(const MismatchCase& c, Env& env) {
  CHORUS_CHECK_EQ(c.world_size, world_size());
  const bool odd = env.rank() == c.odd;
  const Shape shape = mismatch_shape(c, odd);
  const DType dtype = odd && c.kind == Mismatch::DType ? DType::Float64 : DType::Float32;
  const Tensor input = Tensor::ones(shape, dtype);
  const std::int64_t dim = odd ? 1 : 0;  // GatherDim's and ScatterDim's
  std::string outcome = "returned normally";
  try {
    Tensor result;
    if (c.kind == Mismatch::Op && odd) {
      result = all_gather_tensor(input, 0, world());
    } else if (c.kind == Mismatch::Root) {
      result = broadcast(input, odd ? 1 : 0, world());
    } else if (c.kind == Mismatch::GatherDim) {
      result = all_gather_tensor(input, dim, world());
    } else if (c.kind == Mismatch::ScatterDim) {
      result = reduce_scatter_tensor(input, "sum", dim, world());
    } else {
      result = all_reduce(input, odd && c.kind == Mismatch::ReduceOp ? "max" : "sum", world());
    }
    (void)wait_tensor(result);
  } catch (const CollectiveMismatch&) {
    return;
  } catch (const std::exception& error) {
    outcome = std::string("threw ") + error.what();
  }
  env.fail("a rank of a mismatched collective " + outcome + " (expected CollectiveMismatch)");
}

}  // namespace

std::vector<Property> error_properties() {
  Needs mismatch_needs;
  mismatch_needs.simulator_only = true;
  mismatch_needs.world_size_min = 2;
  return {
      make_property<BadCase>("errors.invalid_argument",
                             "bad arguments raise InvalidArgument naming the rank on every "
                             "member, and consume no sequence number",
                             gen_bad_case, check_bad_input),
      make_property<MismatchCase>("errors.mismatch",
                                  "ranks that disagree on shape (element count or layout), "
                                  "dtype, reduce op, op, root, gather dim or scatter dim end with "
                                  "CollectiveMismatch on every rank, never a hang",
                                  gen_mismatch_case, check_mismatch, mismatch_needs),
  };
}

}  // namespace chorus::props::families
