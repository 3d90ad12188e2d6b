// schedule.*: a program of mixed collectives on exact inputs gives every rank the same bytes
// under every schedule, strategy, seed and reduction order (the simulator runner reruns each case
// under other schedules and compares each rank's result digest: Needs::schedule_independent).

#include "battery/cases.hpp"
#include "battery/families.hpp"

namespace chorus::props::families {
namespace {

constexpr const char* kStepOps[] = {
    "all_reduce",        "all_gather_tensor", "reduce_scatter_tensor",
    "all_to_all_single", "broadcast",         "permute_tensor"};
constexpr int kStepOpCount = static_cast<int>(std::size(kStepOps));

struct Step {
  int op = 0;
  OpDType reduction;  // reductions use its op; the others only its dtype
  Layout layout;
  Shape shape;  // dim 0 a multiple of the group size
};

struct ProgramCase {
  std::vector<Step> steps;
  std::vector<int> wait_order;
  std::uint64_t data_seed = 0;
  std::vector<InputForm> forms;  // per step (Note [Input forms])
};

void showValue(const ProgramCase& c, std::ostream& out) {
  for (std::size_t i = 0; i < c.steps.size(); ++i) {
    const Step& step = c.steps[i];
    out << (i == 0 ? "" : "; ") << kStepOps[step.op] << " ";
    showValue(step.reduction, out);
    out << " " << shape_text(step.shape) << " on ";
    showValue(step.layout, out);
    out << ", input " << input_form_name(c.forms[i]);
  }
  out << "; waited in order";
  for (const int i : c.wait_order) {
    out << " " << i;
  }
  out << "; data seed " << c.data_seed;
}

rc::Gen<ProgramCase> gen_program_case(const World& world) {
  return rc::gen::exec([world] {
    ProgramCase c;
    const int count = *rc::gen::inRange(1, 7);
    for (int i = 0; i < count; ++i) {
      Step step;
      step.op = *gen_index(kStepOpCount);  // every op at every case size
      step.reduction = *gen_op_dtype();
      step.layout = *gen_covering_layout(world.size);
      step.shape = *gen_shape(2);
      step.shape.insert(step.shape.begin(),
                        *rc::gen::inRange<std::int64_t>(1, 3) * step.layout.group_size());
      c.steps.push_back(std::move(step));
    }
    c.wait_order = *gen_permutation(count);
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    for (int i = 0; i < count; ++i) {
      c.forms.push_back(*gen_input_form());
    }
    return c;
  });
}

Tensor issue(const Step& step, const Tensor& input) {
  const GroupSpec group = step.layout.spec();
  const int size = step.layout.group_size();
  switch (step.op) {
    case 0:
      return all_reduce(input, step.reduction.op, group);
    case 1:
      return all_gather_tensor(input, static_cast<std::int64_t>(step.shape.size()) - 1, group);
    case 2:
      return reduce_scatter_tensor(input, step.reduction.op, 0, group);
    case 3:
      return all_to_all_single(input, std::nullopt, std::nullopt, group);
    case 4:
      return broadcast(input, size - 1, group);
    default: {
      std::vector<int> reverse;
      for (int m = 0; m < size; ++m) {
        reverse.push_back(size - 1 - m);
      }
      return permute_tensor(input, reverse, group);
    }
  }
}

void check_program(const ProgramCase& c, Env& env) {
  std::vector<Tensor> results;
  for (std::size_t i = 0; i < c.steps.size(); ++i) {
    const Step& step = c.steps[i];
    results.push_back(issue(
        step, in_form(exact_input(c.data_seed + i, env.rank(), step.shape, step.reduction.dtype,
                                  step.reduction.op, step.layout.group_size()),
                      c.forms[i])));
  }
  for (const int i : c.wait_order) {
    (void)wait_tensor(results[static_cast<std::size_t>(i)]);
  }
  // The digest is in issue order, whatever the wait order.
  for (const Tensor& result : results) {
    env.record(result);
  }
  // Spot-check the first all_reduce against the reference (the rest are covered by reduce.*).
  for (std::size_t i = 0; i < c.steps.size(); ++i) {
    const Step& step = c.steps[i];
    if (step.op == 0) {
      env.require_bitwise_equal(
          results[i],
          reference_reduce(c.data_seed + i, *step.layout.members_of(env.rank()), step.shape,
                           step.reduction.dtype, step.reduction.op),
          "all_reduce step " + std::to_string(i));
      break;
    }
  }
}

}  // namespace

std::vector<Property> schedule_properties() {
  Needs needs;
  needs.simulator_only = true;
  needs.schedule_independent = true;
  return {make_property<ProgramCase>(
      "schedule.independence",
      "a mixed program's results are the same bytes under every schedule, strategy, seed and "
      "reduction order",
      gen_program_case, check_program, needs)};
}

}  // namespace chorus::props::families
