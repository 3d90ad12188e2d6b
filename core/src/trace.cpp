// Tracing mode: TraceScope, and what a record can be turned into again: execute, replay,
// adjoint. (Records as plain data — text, equality, JSON, compare_traces — are in
// trace_data.cpp.)

#include "chorus/trace.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/collectives.hpp"
#include "chorus/runtime.hpp"
#include "detail/errors.hpp"
#include "detail/format.hpp"
#include "detail/rank_state.hpp"
#include "detail/shape_rules.hpp"

namespace chorus {

// ---- TraceScope

TraceScope::TraceScope() {
  RankContext* context = RankContext::current();
  if (context == nullptr) {
    detail::throw_invalid("TraceScope",
                          "constructed outside a rank: a trace records one rank's collectives, "
                          "so create it inside the rank function");
  }
  state_ = &context->state();
  previous_ = state_->trace;
  state_->trace = this;
}

TraceScope::~TraceScope() {
  // Scopes are RAII objects of one rank and nest, so this one is the innermost.
  state_->trace = previous_;
}

TraceScope* current_trace() noexcept {
  RankContext* context = RankContext::current();
  return context != nullptr ? context->state().trace : nullptr;
}

namespace {

[[noreturn]] void invalid_record(const char* op, const OpRecord& record, const std::string& why) {
  detail::throw_invalid(op, "record " + record.to_string() + ": " + why);
}

// The group a record ran in, as a GroupSpec: the rank list, or the MPMD sub-lists.
GroupSpec group_of(const OpRecord& record) {
  if (record.group_size <= 0 ||
      record.ranks.size() % static_cast<std::size_t>(record.group_size) != 0) {
    invalid_record("execute", record,
                   "group_size " + std::to_string(record.group_size) + " does not divide the " +
                       std::to_string(record.ranks.size()) + " ranks");
  }
  if (record.ranks.size() == static_cast<std::size_t>(record.group_size)) {
    return GroupSpec(record.ranks);
  }
  std::vector<std::vector<int>> lists;
  const auto size = static_cast<std::size_t>(record.group_size);
  for (std::size_t i = 0; i < record.ranks.size(); i += size) {
    lists.emplace_back(record.ranks.begin() + static_cast<std::ptrdiff_t>(i),
                       record.ranks.begin() + static_cast<std::ptrdiff_t>(i + size));
  }
  return GroupSpec(std::move(lists));
}

const ReduceOp& reduce_op_of(const OpRecord& record, const char* op) {
  if (!record.reduce_op) {
    invalid_record(op, record, "it has no reduce_op, which " + record.op + " needs");
  }
  return *record.reduce_op;
}

std::int64_t dim_of(const OpRecord& record, std::size_t i, const char* op) {
  if (record.dims.size() <= i) {
    invalid_record(op, record,
                   "it has " + std::to_string(record.dims.size()) + " dims; " + record.op +
                       " needs one per input");
  }
  return record.dims[i];
}

// The shapes `record`'s collective returns (one per input), by the shape rules every collective
// uses (Note [One rule, three paths]).
std::vector<Shape> result_shapes(const OpRecord& record, const char* op) {
  std::vector<Shape> shapes;
  const int size = record.group_size;
  if (size < 1) {  // the shape rules divide by it
    invalid_record(op, record, "group_size " + std::to_string(size) + " is not positive");
  }
  for (std::size_t i = 0; i < record.input_shapes.size(); ++i) {
    const Shape& input = record.input_shapes[i];
    detail::ShapeRule rule;
    if (record.op == "all_gather_tensor" || record.op == "all_gather_tensor_inplace" ||
        record.op == "all_gather_into_tensor_coalesced") {
      rule = detail::all_gather_rule(input, dim_of(record, i, op), size);
    } else if (record.op == "reduce_scatter_tensor" ||
               record.op == "reduce_scatter_tensor_inplace" ||
               record.op == "reduce_scatter_tensor_coalesced") {
      rule = detail::reduce_scatter_rule(input, dim_of(record, i, op), size);
    } else if (record.op == "all_to_all_single") {
      rule =
          detail::all_to_all_rule(input, record.output_split_sizes, record.input_split_sizes, size);
    } else {
      rule.shape = input;  // all_reduce*, broadcast, reduce, permute_tensor
    }
    if (!rule.ok()) {
      invalid_record(op, record, rule.error);
    }
    shapes.push_back(std::move(rule.shape));
  }
  return shapes;
}

}  // namespace

// ---- execute

std::vector<Tensor> execute(const OpRecord& record, const std::vector<Tensor>& inputs,
                            CallSite site) {
  constexpr const char* kOp = "execute";
  const bool coalesced = record.op.ends_with("_coalesced");
  if (inputs.size() != record.input_shapes.size()) {
    invalid_record(kOp, record,
                   "got " + std::to_string(inputs.size()) + " inputs for " +
                       std::to_string(record.input_shapes.size()) + " recorded input shapes");
  }
  if (!coalesced && inputs.size() != 1) {
    invalid_record(kOp, record,
                   record.op + " takes one input, and the record lists " +
                       std::to_string(record.input_shapes.size()) + " input shapes");
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || inputs[i].sizes() != record.input_shapes[i] ||
        inputs[i].dtype() != record.input_dtype(i)) {
      invalid_record(kOp, record,
                     "input " + std::to_string(i) + " is " +
                         (inputs[i].defined() ? std::string(dtype_name(inputs[i].dtype())) + " " +
                                                    detail::bracketed(inputs[i].sizes())
                                              : std::string("undefined")) +
                         ", the record expects " + std::string(dtype_name(record.input_dtype(i))) +
                         " " + detail::bracketed(record.input_shapes[i]));
    }
  }
  const GroupSpec group = group_of(record);
  const std::string& tag = record.tag;
  const std::string& op = record.op;
  if (op == "all_reduce") {
    return {all_reduce(inputs[0], reduce_op_of(record, kOp), group, tag, site)};
  }
  if (op == "all_gather_tensor") {
    return {all_gather_tensor(inputs[0], dim_of(record, 0, kOp), group, tag, site)};
  }
  if (op == "reduce_scatter_tensor") {
    return {reduce_scatter_tensor(inputs[0], reduce_op_of(record, kOp), dim_of(record, 0, kOp),
                                  group, tag, site)};
  }
  if (op == "all_reduce_coalesced") {
    return all_reduce_coalesced(inputs, reduce_op_of(record, kOp), group, tag, site);
  }
  if (op == "all_gather_into_tensor_coalesced") {
    return all_gather_into_tensor_coalesced(inputs, group, tag, site);
  }
  if (op == "reduce_scatter_tensor_coalesced") {
    return reduce_scatter_tensor_coalesced(inputs, reduce_op_of(record, kOp), record.dims, group,
                                           tag, site);
  }
  if (op == "all_to_all_single") {
    return {all_to_all_single(inputs[0], record.output_split_sizes, record.input_split_sizes, group,
                              tag, site)};
  }
  if (op == "broadcast") {
    return {broadcast(inputs[0], record.src, group, tag, site)};
  }
  if (op == "reduce") {
    return {reduce(inputs[0], reduce_op_of(record, kOp), record.src, group, tag, site)};
  }
  if (op == "permute_tensor") {
    return {permute_tensor(inputs[0], record.src_dst, group, tag, site)};
  }
  if (op == "all_reduce_inplace") {
    Tensor tensor = inputs[0];
    all_reduce_inplace(tensor, reduce_op_of(record, kOp), group, tag, site);
    return {tensor};
  }
  if (op == "all_gather_tensor_inplace" || op == "reduce_scatter_tensor_inplace") {
    Tensor output =
        Tensor::empty(result_shapes(record, kOp).front(), record.dtype, inputs[0].device());
    if (op == "all_gather_tensor_inplace") {
      all_gather_tensor_inplace(output, inputs[0], group, tag, dim_of(record, 0, kOp), site);
    } else {
      reduce_scatter_tensor_inplace(output, inputs[0], reduce_op_of(record, kOp), group,
                                    dim_of(record, 0, kOp), tag, site);
    }
    return {output};
  }
  invalid_record(kOp, record, "'" + op + "' is not a collective chorus knows");
}

// ---- replay

namespace {

// Element i of input k of record n on rank r: (r + 1) * 1000 + n * 10 + k + i (Bool: i % 2).
Tensor default_input(const OpRecord& record, std::size_t n, std::size_t k, int rank) {
  // Tensor::empty checks the shape (a negative size, a count that overflows) before anything
  // is counted here.
  Tensor values = Tensor::empty(record.input_shapes[k], DType::Int64);
  const auto base =
      static_cast<std::int64_t>((rank + 1) * 1000) + static_cast<std::int64_t>(n * 10 + k);
  std::int64_t* const data = values.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < values.numel(); ++i) {
    data[i] = record.input_dtype(k) == DType::Bool ? i % 2 : base + i;
  }
  return values.to(record.input_dtype(k));
}

}  // namespace

std::vector<std::vector<Tensor>> replay(
    const std::vector<OpRecord>& records,
    const std::function<Tensor(const OpRecord&, std::size_t)>& fill) {
  const int me = rank();
  std::vector<std::vector<Tensor>> results;
  results.reserve(records.size());
  for (std::size_t n = 0; n < records.size(); ++n) {
    const OpRecord& record = records[n];
    std::vector<Tensor> inputs;
    for (std::size_t k = 0; k < record.input_shapes.size(); ++k) {
      inputs.push_back(fill ? fill(record, k) : default_input(record, n, k, me));
    }
    results.push_back(wait_tensors(execute(record, inputs, record.site)));
  }
  return results;
}

// ---- adjoint

namespace {

bool is_linear_sum(const ReduceOp& op) {
  return op.kind() == ReduceOp::Kind::Sum || op.kind() == ReduceOp::Kind::Avg ||
         op.kind() == ReduceOp::Kind::PremulSum;
}

[[noreturn]] void no_adjoint(const OpRecord& forward, const std::string& why) {
  invalid_record("adjoint", forward, "has no adjoint collective: " + why);
}

}  // namespace

OpRecord adjoint(const OpRecord& forward) {
  OpRecord backward;
  backward.tag = forward.tag;
  backward.ranks = forward.ranks;
  backward.group_size = forward.group_size;
  backward.dtype = forward.dtype;
  backward.input_dtypes = forward.input_dtypes;  // every op's outputs keep its inputs' dtypes
  backward.rank = forward.rank;
  backward.meta = forward.meta;
  backward.site = forward.site;
  backward.input_shapes = result_shapes(forward, "adjoint");
  const std::string& op = forward.op;
  const auto require_sum = [&](const char* why) {
    const ReduceOp& reduce_op = reduce_op_of(forward, "adjoint");
    if (reduce_op.kind() != ReduceOp::Kind::Sum) {
      no_adjoint(forward, reduce_op.to_string() + " " + why);
    }
  };
  if (op == "all_reduce" || op == "all_reduce_inplace" || op == "all_reduce_coalesced") {
    const ReduceOp& reduce_op = reduce_op_of(forward, "adjoint");
    if (!is_linear_sum(reduce_op)) {
      no_adjoint(forward,
                 reduce_op.to_string() + " is not linear (only sum, avg and premul_sum are)");
    }
    // y = c * sum_r x_r on every rank is self-adjoint: x_bar_r = c * sum_i y_i.
    backward.op = op == "all_reduce_coalesced" ? "all_reduce_coalesced" : "all_reduce";
    backward.reduce_op = reduce_op;
  } else if (op == "all_gather_tensor" || op == "all_gather_tensor_inplace") {
    backward.op = "reduce_scatter_tensor";
    backward.reduce_op = ReduceOp(ReduceOp::Kind::Sum);
    backward.dims = forward.dims;
  } else if (op == "all_gather_into_tensor_coalesced") {
    backward.op = "reduce_scatter_tensor_coalesced";
    backward.reduce_op = ReduceOp(ReduceOp::Kind::Sum);
    backward.dims.assign(forward.input_shapes.size(), 0);
  } else if (op == "reduce_scatter_tensor" || op == "reduce_scatter_tensor_inplace") {
    require_sum(
        "scales the sum, so its adjoint is an all_gather followed by that scale, not one "
        "collective; use sum and scale separately");
    backward.op = "all_gather_tensor";
    backward.dims = forward.dims;
  } else if (op == "reduce_scatter_tensor_coalesced") {
    require_sum(
        "scales the sum, so its adjoint is an all_gather followed by that scale, not one "
        "collective; use sum and scale separately");
    for (std::int64_t dim : forward.dims) {
      if (dim != 0) {
        no_adjoint(forward, "its adjoint gathers along scatter dim " + std::to_string(dim) +
                                ", but all_gather_into_tensor_coalesced gathers along dim 0 only; "
                                "use reduce_scatter_tensor per tensor");
      }
    }
    backward.op = "all_gather_into_tensor_coalesced";
    backward.dims = forward.dims;
  } else if (op == "all_to_all_single") {
    backward.op = "all_to_all_single";
    backward.output_split_sizes = forward.input_split_sizes;
    backward.input_split_sizes = forward.output_split_sizes;
  } else if (op == "permute_tensor") {
    backward.op = "permute_tensor";
    backward.src_dst.assign(forward.src_dst.size(), -1);
    for (std::size_t m = 0; m < forward.src_dst.size(); ++m) {
      const int dst = forward.src_dst[m];
      if (dst >= 0 && static_cast<std::size_t>(dst) < forward.src_dst.size()) {
        backward.src_dst[static_cast<std::size_t>(dst)] = static_cast<int>(m);
      }
    }
  } else if (op == "broadcast") {
    backward.op = "reduce";
    backward.reduce_op = ReduceOp(ReduceOp::Kind::Sum);
    backward.src = forward.src;
  } else if (op == "reduce") {
    require_sum("is not linear, or scales the sum (only a sum reduce is broadcast's adjoint)");
    backward.op = "broadcast";
    backward.src = forward.src;
  } else {
    invalid_record("adjoint", forward, "'" + op + "' is not a collective chorus knows");
  }
  // By the shape rules, not copied from the forward's inputs: they differ where the forward
  // input was 0-d (all_gather of [] gives [W]; its adjoint reduce_scatter gives [1]).
  backward.output_shapes = result_shapes(backward, "adjoint");
  return backward;
}

}  // namespace chorus
