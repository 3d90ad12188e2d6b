// reduce.*: every collective that reduces or copies, per op x dtype x layout x shape x input
// form, against the reference model of Note [Exact inputs] (inputs in the forms of Note [Input
// forms]: fresh, at a storage offset, strided).

#include "battery/cases.hpp"
#include "battery/families.hpp"

namespace chorus::props::families {
namespace {

void check_all_reduce(const ReduceCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const int size = c.layout.group_size();
  const Tensor input =
      in_form(exact_input(c.data_seed, env.rank(), c.shape, c.op.dtype, c.op.op, size), c.form);
  const std::optional<Tensor> reduced =
      unless_refused(env, c.op, [&] { return all_reduce(input, c.op.op, c.layout.spec()); });
  if (!reduced) {
    return;
  }
  const Tensor& result = *reduced;
  env.require_bitwise_equal(result,
                            reference_reduce(c.data_seed, *members, c.shape, c.op.dtype, c.op.op),
                            "all_reduce result");
  // The input is untouched.
  env.require_bitwise_equal(
      input, exact_input(c.data_seed, env.rank(), c.shape, c.op.dtype, c.op.op, size),
      "all_reduce input after the collective");
  env.record(result);
}

void check_reduce_scatter(const ReduceCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const int size = c.layout.group_size();
  const Tensor input =
      in_form(exact_input(c.data_seed, env.rank(), c.shape, c.op.dtype, c.op.op, size), c.form);
  const std::optional<Tensor> scattered = unless_refused(
      env, c.op, [&] { return reduce_scatter_tensor(input, c.op.op, c.dim, c.layout.spec()); });
  if (!scattered) {
    return;
  }
  const Tensor& result = *scattered;
  const Tensor full = reference_reduce(c.data_seed, *members, c.shape, c.op.dtype, c.op.op);
  const std::int64_t dim = normalized_dim(c.dim, c.shape);
  const std::int64_t chunk = c.shape[static_cast<std::size_t>(dim)] / size;
  env.require_bitwise_equal(result, full.narrow(dim, index_of(*members, env.rank()) * chunk, chunk),
                            "reduce_scatter_tensor result (this rank's chunk of the reduction)");
  env.record(result);
}

void check_reduce(const ReduceCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const int size = c.layout.group_size();
  const int dst = static_cast<int>(c.dim);
  const Tensor input =
      in_form(exact_input(c.data_seed, env.rank(), c.shape, c.op.dtype, c.op.op, size), c.form);
  const std::optional<Tensor> reduced =
      unless_refused(env, c.op, [&] { return reduce(input, c.op.op, dst, c.layout.spec()); });
  if (!reduced) {
    return;
  }
  const Tensor& result = *reduced;
  const bool is_dst = index_of(*members, env.rank()) == dst;
  env.require_bitwise_equal(
      result,
      is_dst ? reference_reduce(c.data_seed, *members, c.shape, c.op.dtype, c.op.op)
             : Tensor::zeros(c.shape, c.op.dtype),
      is_dst ? "reduce result on the destination" : "reduce result off the destination (zeros)");
  env.record(result);
}

void check_broadcast(const ReduceCase& c, Env& env) {
  const std::vector<int>* members = c.layout.members_of(env.rank());
  if (members == nullptr) {
    return;
  }
  const int src = static_cast<int>(c.dim);
  const Tensor result =
      broadcast(in_form(exact_input(c.data_seed, env.rank(), c.shape, c.op.dtype), c.form), src,
                c.layout.spec());
  env.require_bitwise_equal(
      result,
      exact_input(c.data_seed, (*members)[static_cast<std::size_t>(src)], c.shape, c.op.dtype),
      "broadcast result (the source's input)");
  env.record(result);
}

}  // namespace

std::vector<Property> reduction_properties() {
  return {
      make_property<ReduceCase>(
          "reduce.all_reduce",
          "all_reduce equals the reference fold of every member's input, per op x dtype",
          [](const World& world) { return gen_reduce_case(world, false); }, check_all_reduce),
      make_property<ReduceCase>(
          "reduce.reduce_scatter",
          "reduce_scatter_tensor gives each member its chunk of the reference reduction",
          gen_scatter_case, check_reduce_scatter),
      make_property<ReduceCase>(
          "reduce.reduce",
          "reduce gives the destination the reference reduction and the others zeros",
          [](const World& world) { return gen_reduce_case(world, false); }, check_reduce),
      make_property<ReduceCase>(
          "reduce.broadcast", "broadcast gives every member the source's input, any dtype",
          [](const World& world) { return gen_reduce_case(world, true); }, check_broadcast),
  };
}

}  // namespace chorus::props::families
