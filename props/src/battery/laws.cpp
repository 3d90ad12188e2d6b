// law.*: algebraic laws between collectives, on exact inputs (Note [Exact inputs]), compared
// bitwise.

#include <numeric>

#include "battery/cases.hpp"
#include "battery/families.hpp"

namespace chorus::props::families {
namespace {

// ---- all_gather(reduce_scatter(x, op, d), d) = all_reduce(x, op)

void check_scatter_gather(const ReduceCase& c, Env& env) {
  if (c.layout.members_of(env.rank()) == nullptr) {
    return;
  }
  const GroupSpec group = c.layout.spec();
  const Tensor input = in_form(
      exact_input(c.data_seed, env.rank(), c.shape, c.op.dtype, c.op.op, c.layout.group_size()),
      c.form);
  const std::optional<Tensor> scattered = unless_refused(
      env, c.op, [&] { return reduce_scatter_tensor(input, c.op.op, c.dim, group); });
  if (!scattered) {
    return;
  }
  const Tensor gathered = all_gather_tensor(*scattered, c.dim, group);
  const Tensor reduced = all_reduce(input, c.op.op, group);
  env.require_bitwise_equal(gathered, reduced,
                            "all_gather_tensor(reduce_scatter_tensor(x, op, d), d) vs all_reduce");
  env.record(gathered);
}

// ---- coalesced = separate

struct CoalescedCase {
  Layout layout;
  OpDType op;
  int form = 0;  // 0 all_reduce, 1 all_gather (dim 0), 2 reduce_scatter (dim 0)
  std::vector<Shape> shapes;
  std::uint64_t data_seed = 0;
};

void showValue(const CoalescedCase& c, std::ostream& out) {
  static constexpr const char* kForms[] = {"all_reduce_coalesced",
                                           "all_gather_into_tensor_coalesced",
                                           "reduce_scatter_tensor_coalesced"};
  out << kForms[c.form] << " on group ";
  showValue(c.layout, out);
  out << ", ";
  showValue(c.op, out);
  out << ", shapes";
  for (const Shape& shape : c.shapes) {
    out << " " << shape_text(shape);
  }
  out << ", data seed " << c.data_seed;
}

rc::Gen<CoalescedCase> gen_coalesced_case(const World& world) {
  return rc::gen::exec([world] {
    CoalescedCase c;
    c.layout = *gen_layout(world.size);
    c.op = *gen_op_dtype();
    c.form = *gen_index(3);  // every form at every case size
    const int count = *rc::gen::inRange(1, 4);
    for (int i = 0; i < count; ++i) {
      Shape shape = *gen_shape(2);
      // Dim 0 divisible by the group size (reduce_scatter's rule; harmless for the others), and 0
      // only one time in eight (gen_multiple).
      shape.insert(shape.begin(), *gen_multiple<std::int64_t>(c.layout.group_size()));
      c.shapes.push_back(std::move(shape));
    }
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

void check_coalesced(const CoalescedCase& c, Env& env) {
  if (c.layout.members_of(env.rank()) == nullptr) {
    return;
  }
  const GroupSpec group = c.layout.spec();
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    inputs.push_back(exact_input(c.data_seed + i, env.rank(), c.shapes[i], c.op.dtype, c.op.op,
                                 c.layout.group_size()));
  }
  const std::optional<std::vector<Tensor>> outputs =
      c.form == 1
          ? std::optional(all_gather_into_tensor_coalesced(inputs, group))
          : unless_refused(env, c.op, [&] {
              return c.form == 0
                         ? all_reduce_coalesced(inputs, c.op.op, group)
                         : reduce_scatter_tensor_coalesced(
                               inputs, c.op.op, std::vector<std::int64_t>(inputs.size(), 0), group);
            });
  if (!outputs) {
    return;
  }
  const std::vector<Tensor>& coalesced = *outputs;
  env.require(work_registry_size() == 1, "a coalesced call registers one work, registry holds " +
                                             std::to_string(work_registry_size()));
  if (coalesced.size() != inputs.size()) {
    env.fail("a coalesced call returned " + std::to_string(coalesced.size()) + " outputs for " +
             std::to_string(inputs.size()) + " inputs");
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor separate = c.form == 0   ? all_reduce(inputs[i], c.op.op, group)
                            : c.form == 1 ? all_gather_tensor(inputs[i], 0, group)
                                          : reduce_scatter_tensor(inputs[i], c.op.op, 0, group);
    env.require_bitwise_equal(coalesced[i], separate,
                              "coalesced output " + std::to_string(i) + " vs the separate call");
    env.record(coalesced[i]);
  }
}

// ---- all_gather along d = each member's input as the chunk at its group rank

struct GatherCase {
  Layout layout;
  DType dtype = DType::Float32;
  Shape shape;
  std::int64_t dim = 0;
  std::uint64_t data_seed = 0;
  InputForm form = InputForm::Fresh;  // Note [Input forms]
};

void showValue(const GatherCase& c, std::ostream& out) {
  out << "group ";
  showValue(c.layout, out);
  out << ", " << dtype_name(c.dtype) << ", shape " << shape_text(c.shape) << ", gather_dim "
      << c.dim << ", data seed " << c.data_seed << ", input " << input_form_name(c.form);
}

rc::Gen<GatherCase> gen_gather_case(const World& world) {
  return rc::gen::exec([world] {
    GatherCase c;
    c.layout = *gen_layout(world.size);
    c.dtype = *gen_dtype();
    c.shape = *gen_shape(3);
    const auto dims = static_cast<std::int64_t>(c.shape.size());
    if (dims > 0) {
      c.dim = *rc::gen::inRange<std::int64_t>(-dims, dims);
    }
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    c.form = *gen_input_form();
    return c;
  });
}

void check_gather_dim(const GatherCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const Tensor gathered =
      all_gather_tensor(in_form(exact_input(c.data_seed, env.rank(), c.shape, c.dtype), c.form),
                        c.dim, c.layout.spec());
  for (std::size_t j = 0; j < members->size(); ++j) {
    const Tensor expected = exact_input(c.data_seed, (*members)[j], c.shape, c.dtype);
    const auto index = static_cast<std::int64_t>(j);
    Tensor chunk;
    if (c.shape.empty()) {
      chunk = gathered.select(0, index);  // a 0-d input gathers into [group_size]
    } else {
      const std::int64_t dim = normalized_dim(c.dim, c.shape);
      const std::int64_t size = c.shape[static_cast<std::size_t>(dim)];
      chunk = gathered.narrow(dim, index * size, size);
    }
    env.require_bitwise_equal(chunk, expected,
                              "gathered chunk " + std::to_string(j) + " (member " +
                                  std::to_string((*members)[j]) + "'s input)");
  }
  env.record(gathered);
}

// ---- all_to_all twice, with the splits swapped, is the identity

struct AllToAllCase {
  Layout layout;
  DType dtype = DType::Float32;
  Shape trailing;                               // dims after dim 0
  std::vector<std::vector<std::int64_t>> rows;  // rows[m][n]: rows group rank m sends to n
  bool equal_split = false;                     // split lists absent (every entry rows[0][0])
  std::uint64_t data_seed = 0;
};

void showValue(const AllToAllCase& c, std::ostream& out) {
  out << "group ";
  showValue(c.layout, out);
  out << ", " << dtype_name(c.dtype) << ", trailing shape " << shape_text(c.trailing)
      << (c.equal_split ? ", equal split" : ", splits [");
  if (!c.equal_split) {
    for (std::size_t m = 0; m < c.rows.size(); ++m) {
      out << (m == 0 ? "" : "; ");
      for (std::size_t n = 0; n < c.rows[m].size(); ++n) {
        out << (n == 0 ? "" : " ") << c.rows[m][n];
      }
    }
    out << "]";
  } else {
    out << " of " << c.rows[0][0];
  }
  out << ", data seed " << c.data_seed;
}

rc::Gen<AllToAllCase> gen_all_to_all_case(const World& world) {
  return rc::gen::exec([world] {
    AllToAllCase c;
    c.layout = *gen_layout(world.size);
    c.dtype = *gen_dtype();
    c.trailing = *gen_shape(2);
    const int size = c.layout.group_size();
    c.equal_split = *gen_flag();
    // Rows per block 1 or 2, or 0 one time in eight (gen_multiple), at every case size: with
    // rc::gen::inRange(0, 3) every block was empty below case size 25.
    const std::int64_t equal = *gen_multiple<std::int64_t>(1);
    c.rows.assign(static_cast<std::size_t>(size),
                  std::vector<std::int64_t>(static_cast<std::size_t>(size), equal));
    if (!c.equal_split) {
      // Each block on its own, so a member may send another nothing; every block empty only as
      // often as in a group of one (one time in eight).
      for (auto& row : c.rows) {
        for (auto& count : row) {
          count = *gen_multiple<std::int64_t>(1);
        }
      }
    }
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

Shape with_rows(std::int64_t rows, const Shape& trailing) {
  Shape shape{rows};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  return shape;
}

void check_all_to_all(const AllToAllCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const auto me = static_cast<std::size_t>(index_of(*members, env.rank()));
  const std::vector<std::int64_t>& sends = c.rows[me];
  std::vector<std::int64_t> receives;
  for (const auto& row : c.rows) {
    receives.push_back(row[me]);
  }
  const auto input_of = [&](std::size_t m) {
    const std::int64_t rows = std::accumulate(c.rows[m].begin(), c.rows[m].end(), std::int64_t{0});
    return exact_input(c.data_seed, (*members)[m], with_rows(rows, c.trailing), c.dtype);
  };
  const Tensor input = input_of(me);
  using Splits = std::optional<std::vector<std::int64_t>>;
  const Splits out_splits = c.equal_split ? Splits() : Splits(receives);
  const Splits in_splits = c.equal_split ? Splits() : Splits(sends);
  const Tensor exchanged = all_to_all_single(input, out_splits, in_splits, c.layout.spec());
  // Block m of the result is the block member m sent here.
  std::int64_t offset = 0;
  for (std::size_t m = 0; m < members->size(); ++m) {
    const std::int64_t before = std::accumulate(
        c.rows[m].begin(), c.rows[m].begin() + static_cast<std::ptrdiff_t>(me), std::int64_t{0});
    env.require_bitwise_equal(exchanged.narrow(0, offset, c.rows[m][me]),
                              input_of(m).narrow(0, before, c.rows[m][me]),
                              "all_to_all_single block from group rank " + std::to_string(m));
    offset += c.rows[m][me];
  }
  const Tensor back = all_to_all_single(exchanged, in_splits, out_splits, c.layout.spec());
  env.require_bitwise_equal(back, input, "all_to_all_single twice with swapped splits");
  env.record(exchanged);
}

// ---- permute then the inverse permutation is the identity; receivers nobody sends to get zeros

struct PermuteCase {
  Layout layout;
  DType dtype = DType::Float32;
  Shape shape;
  std::vector<int> destination;  // per group rank, of a permutation
  std::vector<bool> sends;       // false: that group rank sends nowhere (-1)
  std::uint64_t data_seed = 0;
};

void showValue(const PermuteCase& c, std::ostream& out) {
  out << "group ";
  showValue(c.layout, out);
  out << ", " << dtype_name(c.dtype) << ", shape " << shape_text(c.shape) << ", src_dst [";
  for (std::size_t m = 0; m < c.destination.size(); ++m) {
    out << (m == 0 ? "" : ", ") << (c.sends[m] ? c.destination[m] : -1);
  }
  out << "], data seed " << c.data_seed;
}

rc::Gen<PermuteCase> gen_permute_case(const World& world) {
  return rc::gen::exec([world] {
    PermuteCase c;
    c.layout = *gen_layout(world.size);
    c.dtype = *gen_dtype();
    c.shape = *gen_shape(2);
    c.destination = *gen_permutation(c.layout.group_size());
    // Everyone sends (shrinks there) unless generated otherwise.
    for (int m = 0; m < c.layout.group_size(); ++m) {
      c.sends.push_back(
          *rc::gen::weightedOneOf<bool>({{3, rc::gen::just(true)}, {1, rc::gen::just(false)}}));
    }
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

void check_permute(const PermuteCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const int me = index_of(*members, env.rank());
  std::vector<int> src_dst;
  std::vector<int> inverse(c.destination.size(), -1);
  int sender = -1;
  for (std::size_t m = 0; m < c.destination.size(); ++m) {
    src_dst.push_back(c.sends[m] ? c.destination[m] : -1);
    if (c.sends[m]) {
      inverse[static_cast<std::size_t>(c.destination[m])] = static_cast<int>(m);
      if (c.destination[m] == me) {
        sender = static_cast<int>(m);
      }
    }
  }
  const Tensor input = exact_input(c.data_seed, env.rank(), c.shape, c.dtype);
  const Tensor moved = permute_tensor(input, src_dst, c.layout.spec());
  env.require_bitwise_equal(
      moved,
      sender >= 0
          ? exact_input(c.data_seed, (*members)[static_cast<std::size_t>(sender)], c.shape, c.dtype)
          : Tensor::zeros(c.shape, c.dtype),
      sender >= 0 ? "permute_tensor result (group rank " + std::to_string(sender) + "'s input)"
                  : std::string("permute_tensor result on a rank nobody sends to (zeros)"));
  // Back along the inverse: every rank that sent gets its input back, the others zeros.
  const Tensor back = permute_tensor(moved, inverse, c.layout.spec());
  env.require_bitwise_equal(
      back, c.sends[static_cast<std::size_t>(me)] ? input : Tensor::zeros(c.shape, c.dtype),
      "permute_tensor then the inverse permutation");
  env.record(moved);
}

// ---- in-place = out-of-place

struct InplaceCase {
  ReduceCase base;
  int form = 0;          // 0 all_reduce_inplace, 1 all_gather_tensor_inplace, 2 reduce_scatter
  bool strided = false;  // all_reduce_inplace on a transposed (non-contiguous) view
};

void showValue(const InplaceCase& c, std::ostream& out) {
  static constexpr const char* kForms[] = {"all_reduce_inplace", "all_gather_tensor_inplace",
                                           "reduce_scatter_tensor_inplace"};
  out << kForms[c.form] << (c.strided ? " (strided)" : "") << ", ";
  showValue(c.base, out);
}

rc::Gen<InplaceCase> gen_inplace_case(const World& world) {
  return rc::gen::exec([world] {
    InplaceCase c;
    c.base = *gen_scatter_case(world);
    c.form = *gen_index(3);  // every form at every case size
    c.strided = c.form == 0 && c.base.shape.size() >= 2 && *gen_flag();
    return c;
  });
}

void check_inplace(const InplaceCase& c, Env& env) {
  const ReduceCase& b = c.base;
  if (b.layout.members_of(env.rank()) == nullptr) {
    return;
  }
  const GroupSpec group = b.layout.spec();
  const Tensor input = in_form(
      exact_input(b.data_seed, env.rank(), b.shape, b.op.dtype, b.op.op, b.layout.group_size()),
      b.form);
  if (c.form == 0) {
    const std::optional<Tensor> expected = unless_refused(env, b.op, [&] {
      return all_reduce(c.strided ? input.transpose(0, 1) : input, b.op.op, group);
    });
    if (!expected) {
      return;
    }
    // The target in the case's form too (a clone when fresh), so in-place writes go through its
    // offset and strides.
    Tensor target = in_form(input.clone(), b.form);
    if (c.strided) {
      target = target.transpose(0, 1);
    }
    Tensor& returned = all_reduce_inplace(target, b.op.op, group);
    env.require(&returned == &target, "all_reduce_inplace returns its argument");
    env.require(!target.is_pending(), "all_reduce_inplace returns after the result is in place");
    env.require_bitwise_equal(target, *expected, "all_reduce_inplace vs all_reduce");
    env.record(target);
  } else if (c.form == 1) {
    const Tensor expected = all_gather_tensor(input, b.dim, group);
    Tensor output = in_form(Tensor::zeros(expected.sizes(), b.op.dtype), b.form);
    Tensor& returned = all_gather_tensor_inplace(output, input, group, "", b.dim);
    env.require(&returned == &output, "all_gather_tensor_inplace returns its output argument");
    env.require(!output.is_pending(), "all_gather_tensor_inplace returns after the result");
    env.require_bitwise_equal(output, expected, "all_gather_tensor_inplace vs all_gather_tensor");
    env.record(output);
  } else {
    const std::optional<Tensor> expected = unless_refused(
        env, b.op, [&] { return reduce_scatter_tensor(input, b.op.op, b.dim, group); });
    if (!expected) {
      return;
    }
    Tensor output = in_form(Tensor::zeros(expected->sizes(), b.op.dtype), b.form);
    Tensor& returned = reduce_scatter_tensor_inplace(output, input, b.op.op, group, b.dim);
    env.require(&returned == &output, "reduce_scatter_tensor_inplace returns its output argument");
    env.require(!output.is_pending(), "reduce_scatter_tensor_inplace returns after the result");
    env.require_bitwise_equal(output, *expected,
                              "reduce_scatter_tensor_inplace vs reduce_scatter_tensor");
    env.record(output);
  }
}

}  // namespace

std::vector<Property> law_properties() {
  return {
      make_property<ReduceCase>(
          "law.reduce_scatter_then_all_gather",
          "all_gather_tensor(reduce_scatter_tensor(x, op, d), d) = all_reduce(x, op)",
          gen_scatter_case, check_scatter_gather),
      make_property<CoalescedCase>("law.coalesced_equals_separate",
                                   "each coalesced form equals its separate calls, one work",
                                   gen_coalesced_case, check_coalesced),
      make_property<GatherCase>("law.gather_dim",
                                "all_gather_tensor along d = the members' inputs concatenated "
                                "along d in group-rank order",
                                gen_gather_case, check_gather_dim),
      make_property<AllToAllCase>("law.all_to_all_roundtrip",
                                  "all_to_all_single sends the right blocks, and twice with "
                                  "swapped splits is the identity",
                                  gen_all_to_all_case, check_all_to_all),
      make_property<PermuteCase>("law.permute_inverse",
                                 "permute_tensor moves inputs (zeros where nobody sends); the "
                                 "inverse permutation brings them back",
                                 gen_permute_case, check_permute),
      make_property<InplaceCase>("law.inplace_equals_out_of_place",
                                 "the _inplace forms leave the out-of-place result in place",
                                 gen_inplace_case, check_inplace),
  };
}

}  // namespace chorus::props::families
