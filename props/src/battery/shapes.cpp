// shape.*: the result shape of each collective is the one DESIGN 2.3's rules give, computed here
// from the input shape, and the same eagerly, on meta tensors under tracing, in the traced
// OpRecord, and from the public rule in chorus::meta. (The last four share chorus's rule
// functions, Note [One rule, three paths], so only the first can catch a wrong rule.)

#include "battery/cases.hpp"
#include "battery/families.hpp"

namespace chorus::props::families {
namespace {

constexpr const char* kShapeOps[] = {
    "all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
    "reduce",     "permute_tensor"};
constexpr int kShapeOpCount = static_cast<int>(std::size(kShapeOps));

struct ShapeCase {
  ReduceCase base;  // base.dim: gather/scatter dim
  int op = 0;       // index into kShapeOps
  bool equal_split = true;
};

// The ops that take a 0-d input (all but reduce_scatter and all_to_all_single, which split a
// dimension).
bool takes_0d(int op) { return op != 2 && op != 3; }

void showValue(const ShapeCase& c, std::ostream& out) {
  out << kShapeOps[c.op] << (c.op == 3 ? (c.equal_split ? " (equal split)" : " (splits)") : "")
      << ", ";
  showValue(c.base, out);
}

rc::Gen<ShapeCase> gen_shape_case(const World& world) {
  return rc::gen::exec([world] {
    ShapeCase c;
    c.op = *gen_index(kShapeOpCount);  // every op at every case size
    // A scatter case fits every op: dim's size is a multiple of the group size.
    c.base = *gen_scatter_case(world);
    if (c.op == 3) {
      // all_to_all splits along dim 0: make dim 0 the divisible one.
      c.base.shape[0] =
          c.base.shape[static_cast<std::size_t>(normalized_dim(c.base.dim, c.base.shape))];
      c.equal_split = !*gen_flag();
    }
    // A quarter of the cases of the ops that take one have a 0-d input, at any size (inRange
    // scales with it); all_gather's dim is then 0 or -1 (it gathers a 0-d input as one element
    // along dim 0). Shrinks towards the generated (n-d) shape.
    if (takes_0d(c.op) && *rc::gen::resize(rc::kNominalSize, rc::gen::inRange(0, 4)) == 3) {
      c.base.shape.clear();
      c.base.dim = c.base.dim < 0 ? -1 : 0;
    }
    return c;
  });
}

// Rows group rank m sends to n in the split form: 1 or 2, the same table on every rank.
std::int64_t rows_between(std::size_t m, std::size_t n) {
  return 1 + static_cast<std::int64_t>((m + n) % 2);
}

// The result shape by DESIGN 2.3's rules, from the input shape alone: all_gather multiplies the
// gather dim by the group size (a 0-d input gives [group size]), reduce_scatter divides the
// scatter dim by it, all_to_all_single's dim 0 is the sum of the output splits (the input's dim 0
// for the equal split), and the others keep the input's shape. `receives` are this rank's output
// splits (all_to_all_single with splits only).
Shape rule_shape(const ShapeCase& c, const Shape& input, std::int64_t group_size,
                 const std::vector<std::int64_t>& receives) {
  Shape out = input;
  const auto dim = [&] { return static_cast<std::size_t>(normalized_dim(c.base.dim, input)); };
  switch (c.op) {
    case 1:
      if (input.empty()) {
        return {group_size};
      }
      out[dim()] = input[dim()] * group_size;
      return out;
    case 2:
      CHORUS_CHECK_EQ(input[dim()] % group_size, 0);  // the generator makes it divisible
      out[dim()] = input[dim()] / group_size;
      return out;
    case 3:
      if (!c.equal_split) {
        out[0] = 0;
        for (const std::int64_t rows : receives) {
          out[0] += rows;
        }
      }
      return out;
    default:
      return out;
  }
}

struct Call {
  Tensor result;
  Shape rule;  // chorus::meta's answer
};

Call call(const ShapeCase& c, const Tensor& input, const std::vector<int>& members) {
  const ReduceCase& b = c.base;
  const GroupSpec group = b.layout.spec();
  const int size = b.layout.group_size();
  const auto me = static_cast<std::size_t>(index_of(members, rank()));
  switch (c.op) {
    case 0:
      return {all_reduce(input, b.op.op, group), meta::all_reduce_shape(input.sizes())};
    case 1:
      return {all_gather_tensor(input, b.dim, group),
              meta::all_gather_shape(input.sizes(), b.dim, size)};
    case 2:
      return {reduce_scatter_tensor(input, b.op.op, b.dim, group),
              meta::reduce_scatter_shape(input.sizes(), b.dim, size)};
    case 3: {
      if (c.equal_split) {
        return {all_to_all_single(input, std::nullopt, std::nullopt, group),
                meta::all_to_all_single_shape(input.sizes(), std::nullopt, std::nullopt, size)};
      }
      std::vector<std::int64_t> sends;
      std::vector<std::int64_t> receives;
      for (std::size_t n = 0; n < members.size(); ++n) {
        sends.push_back(rows_between(me, n));
        receives.push_back(rows_between(n, me));
      }
      return {all_to_all_single(input, receives, sends, group),
              meta::all_to_all_single_shape(input.sizes(), receives, sends, size)};
    }
    case 4:
      return {broadcast(input, 0, group), meta::broadcast_shape(input.sizes(), 0, size)};
    case 5:
      return {reduce(input, b.op.op, size - 1, group),
              meta::reduce_shape(input.sizes(), size - 1, size)};
    default: {
      std::vector<int> rotate;
      for (int m = 0; m < size; ++m) {
        rotate.push_back((m + 1) % size);
      }
      return {permute_tensor(input, rotate, group),
              meta::permute_tensor_shape(input.sizes(), rotate, size)};
    }
  }
}

void check_shapes(const ShapeCase& c, Env& env) {
  const std::vector<int>* members = c.base.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  Shape shape = c.base.shape;
  if (c.op == 3 && !c.equal_split) {
    // Input rows: what this rank sends in the split form.
    const auto me = static_cast<std::size_t>(index_of(*members, env.rank()));
    shape[0] = 0;
    for (std::size_t n = 0; n < members->size(); ++n) {
      shape[0] += rows_between(me, n);
    }
  }
  const DType dtype = c.base.op.dtype;
  const Tensor input = exact_input(c.base.data_seed, env.rank(), shape, dtype, c.base.op.op,
                                   c.base.layout.group_size());
  const bool reduces = c.op == 0 || c.op == 2 || c.op == 5;
  const TraceScope trace;
  const std::optional<Call> eager_call =
      reduces ? unless_refused(env, c.base.op, [&] { return call(c, input, *members); })
              : std::optional(call(c, input, *members));
  if (!eager_call) {
    return;
  }
  const Call& eager = *eager_call;
  const Call traced_meta = call(c, Tensor::empty(shape, dtype, Device::meta()), *members);
  if (trace.records().size() != 2) {
    env.fail("traced " + std::to_string(trace.records().size()) + " records, expected 2");
  }
  const OpRecord& eager_record = trace.records()[0];
  const OpRecord& meta_record = trace.records()[1];
  const auto text = [](const Shape& s) { return shape_text(s); };
  const int group_size = c.base.layout.group_size();
  std::vector<std::int64_t> receives;
  for (std::size_t m = 0; m < members->size(); ++m) {
    receives.push_back(rows_between(m, static_cast<std::size_t>(index_of(*members, env.rank()))));
  }
  const Shape expected = rule_shape(c, shape, group_size, receives);
  const std::string rule_text = " but the rule gives " + text(expected) + " (input " + text(shape) +
                                ", dim " + std::to_string(c.base.dim) + ", group size " +
                                std::to_string(group_size) + ")";
  env.require(eager.result.sizes() == expected, std::string(kShapeOps[c.op]) + ": eager shape " +
                                                    text(eager.result.sizes()) + rule_text);
  env.require(eager.rule == expected,
              std::string(kShapeOps[c.op]) + ": chorus::meta says " + text(eager.rule) + rule_text);
  env.require(eager.result.sizes() == eager.rule, std::string(kShapeOps[c.op]) + ": eager shape " +
                                                      text(eager.result.sizes()) +
                                                      " but chorus::meta says " + text(eager.rule));
  env.require(traced_meta.result.sizes() == eager.rule,
              std::string(kShapeOps[c.op]) + ": meta shape " + text(traced_meta.result.sizes()) +
                  " but eager " + text(eager.rule));
  env.require(traced_meta.result.device().is_meta(), "a meta input gives a meta output");
  env.require(eager_record.output_shapes == std::vector<Shape>{eager.rule} &&
                  meta_record.output_shapes == std::vector<Shape>{eager.rule},
              "traced output shapes equal the eager shape");
  env.require(
      meta_record.meta && meta_record.seq == -1 && !eager_record.meta && eager_record.seq >= 0,
      "the meta record communicates nothing (seq -1), the eager one does");
  env.require(eager_record.op == kShapeOps[c.op] && meta_record.op == kShapeOps[c.op],
              "records name the op");
  env.record(eager.result);
}

}  // namespace

std::vector<Property> shape_properties() {
  return {make_property<ShapeCase>(
      "shape.eager_meta_traced",
      "result shapes follow the rules and agree: eager, meta under tracing, the traced record and "
      "chorus::meta",
      gen_shape_case, check_shapes)};
}

}  // namespace chorus::props::families
