// The shape rules of DESIGN 2.3, and chorus::meta on top of them.
//
// Note [One rule, three paths]
// Eager collectives, meta collectives (under tracing) and chorus::meta compute result shapes
// with the functions here and nothing else, so the three can never disagree. The rules report
// errors as text; each caller raises InvalidArgument with its own context.

#include "detail/shape_rules.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

#include "chorus/meta.hpp"
#include "detail/errors.hpp"
#include "detail/format.hpp"

namespace chorus::detail {
namespace {

ShapeRule fail(std::string error) {
  ShapeRule rule;
  rule.error = std::move(error);
  return rule;
}

ShapeRule pass(Shape shape, std::int64_t dim = -1) {
  ShapeRule rule;
  rule.shape = std::move(shape);
  rule.dim = dim;
  return rule;
}

std::string list_text(const std::vector<std::int64_t>& values) { return bracketed(values); }

}  // namespace

ShapeRule dim_rule(std::int64_t dim, std::int64_t ndim, const char* name) {
  if (dim < -ndim || dim >= ndim) {
    return fail(std::string(name) + " " + std::to_string(dim) + " is out of range for a " +
                std::to_string(ndim) + "-d input (expected [" + std::to_string(-ndim) + ", " +
                std::to_string(ndim - 1) + "])");
  }
  return pass({}, dim < 0 ? dim + ndim : dim);
}

ShapeRule all_gather_rule(const Shape& input, std::int64_t gather_dim, int group_size) {
  const auto ndim = static_cast<std::int64_t>(input.size());
  if (input.empty() && gather_dim != 0 && gather_dim != -1) {
    // A 0-d input gathers as a 1-d one of one element.
    return fail("gather_dim " + std::to_string(gather_dim) +
                " is out of range for a 0-d input (gathered as one element along dim 0: "
                "expected 0 or -1)");
  }
  ShapeRule dim = dim_rule(gather_dim, std::max<std::int64_t>(ndim, 1), "gather_dim");
  if (!dim.ok()) {
    return dim;
  }
  if (input.empty()) {
    return pass(Shape{group_size}, 0);
  }
  Shape out = input;
  std::int64_t& size = out[static_cast<std::size_t>(dim.dim)];
  if (__builtin_mul_overflow(size, std::int64_t{group_size}, &size)) {
    return fail("input size " + std::to_string(input[static_cast<std::size_t>(dim.dim)]) +
                " along gather_dim " + std::to_string(dim.dim) + " times the group size " +
                std::to_string(group_size) + " overflows int64");
  }
  return pass(std::move(out), dim.dim);
}

ShapeRule reduce_scatter_rule(const Shape& input, std::int64_t scatter_dim, int group_size,
                              const std::string& which) {
  if (input.empty()) {
    return fail(which + " is 0-d: reduce_scatter needs a dimension to scatter");
  }
  ShapeRule dim = dim_rule(scatter_dim, static_cast<std::int64_t>(input.size()), "scatter_dim");
  if (!dim.ok()) {
    return dim;
  }
  const auto d = static_cast<std::size_t>(dim.dim);
  if (input[d] % group_size != 0) {
    return fail(which + " size " + std::to_string(input[d]) + " along scatter_dim " +
                std::to_string(dim.dim) + " is not divisible by the group size " +
                std::to_string(group_size));
  }
  Shape out = input;
  out[d] /= group_size;
  return pass(std::move(out), dim.dim);
}

ShapeRule all_to_all_rule(const Shape& input,
                          const std::optional<std::vector<std::int64_t>>& output_split_sizes,
                          const std::optional<std::vector<std::int64_t>>& input_split_sizes,
                          int group_size) {
  if (input.empty()) {
    return fail("input is 0-d: all_to_all_single splits dimension 0");
  }
  if (output_split_sizes.has_value() != input_split_sizes.has_value()) {
    return fail(std::string("only ") +
                (output_split_sizes ? "output_split_sizes" : "input_split_sizes") +
                " was given: pass both split lists, or neither for the equal split");
  }
  Shape out = input;
  if (!output_split_sizes) {
    if (input[0] % group_size != 0) {
      return fail("input size " + std::to_string(input[0]) +
                  " along dim 0 is not divisible by the group size " + std::to_string(group_size) +
                  " (no split sizes given, so the split is equal)");
    }
    return pass(std::move(out));
  }
  const auto check_list = [&](const std::vector<std::int64_t>& splits,
                              const char* name) -> std::string {
    if (splits.size() != static_cast<std::size_t>(group_size)) {
      return std::string(name) + " " + list_text(splits) + " has " + std::to_string(splits.size()) +
             " entries: expected one per group rank (" + std::to_string(group_size) + ")";
    }
    for (std::size_t i = 0; i < splits.size(); ++i) {
      if (splits[i] < 0) {
        return std::string(name) + " " + list_text(splits) + " has a negative entry at " +
               std::to_string(i);
      }
    }
    return {};
  };
  if (std::string error = check_list(*output_split_sizes, "output_split_sizes"); !error.empty()) {
    return fail(std::move(error));
  }
  if (std::string error = check_list(*input_split_sizes, "input_split_sizes"); !error.empty()) {
    return fail(std::move(error));
  }
  // Sums that overflow are refused (they would wrap to a plausible row count).
  const auto sum = [](const std::vector<std::int64_t>& splits, std::int64_t& total) {
    total = 0;
    for (std::int64_t split : splits) {
      if (__builtin_add_overflow(total, split, &total)) {
        return false;
      }
    }
    return true;
  };
  std::int64_t in_rows = 0;
  if (!sum(*input_split_sizes, in_rows)) {
    return fail("input_split_sizes " + list_text(*input_split_sizes) +
                " overflow int64 when summed");
  }
  if (in_rows != input[0]) {
    return fail("input_split_sizes " + list_text(*input_split_sizes) + " sum to " +
                std::to_string(in_rows) + ", but the input has " + std::to_string(input[0]) +
                " rows along dim 0");
  }
  std::int64_t out_rows = 0;
  if (!sum(*output_split_sizes, out_rows)) {
    return fail("output_split_sizes " + list_text(*output_split_sizes) +
                " overflow int64 when summed");
  }
  out[0] = out_rows;
  return pass(std::move(out));
}

ShapeRule rooted_rule(const Shape& input, int root, int group_size, const char* name) {
  if (root < 0 || root >= group_size) {
    return fail(std::string(name) + " " + std::to_string(root) +
                " is not a group rank: expected [0, " + std::to_string(group_size - 1) +
                "] (an index into the group's ranks, not a global rank)");
  }
  return pass(input);
}

ShapeRule permute_rule(const Shape& input, const std::vector<int>& src_dst, int group_size) {
  if (src_dst.size() != static_cast<std::size_t>(group_size)) {
    return fail("src_dst " + bracketed(src_dst) + " has " + std::to_string(src_dst.size()) +
                " entries: expected one per group rank (" + std::to_string(group_size) + ")");
  }
  std::vector<int> source_of(static_cast<std::size_t>(group_size), -1);
  for (std::size_t m = 0; m < src_dst.size(); ++m) {
    const int dst = src_dst[m];
    if (dst == -1) {
      continue;
    }
    if (dst < -1 || dst >= group_size) {
      return fail("src_dst " + bracketed(src_dst) + ": group rank " + std::to_string(m) +
                  " sends to " + std::to_string(dst) + ", which is not a group rank (expected " +
                  "[0, " + std::to_string(group_size - 1) + "] or -1 for nowhere)");
    }
    int& source = source_of[static_cast<std::size_t>(dst)];
    if (source >= 0) {
      return fail("src_dst " + bracketed(src_dst) + ": group ranks " + std::to_string(source) +
                  " and " + std::to_string(m) + " both send to " + std::to_string(dst) +
                  " (destinations must be distinct)");
    }
    source = static_cast<int>(m);
  }
  return pass(input);
}

}  // namespace chorus::detail

namespace chorus::meta {
namespace {

Shape shape_or_throw(detail::ShapeRule rule, const char* op) {
  if (!rule.ok()) {
    detail::throw_invalid(op, std::move(rule.error));
  }
  return std::move(rule.shape);
}

void check_group_size(int group_size, const char* op) {
  if (group_size < 1) {
    detail::throw_invalid(op, "group_size " + std::to_string(group_size) +
                                  " is not positive: a group has at least one rank");
  }
}

}  // namespace

Shape all_reduce_shape(const Shape& input) { return input; }

Shape all_gather_shape(const Shape& input, std::int64_t gather_dim, int group_size) {
  check_group_size(group_size, "all_gather_shape");
  return shape_or_throw(detail::all_gather_rule(input, gather_dim, group_size), "all_gather_shape");
}

Shape reduce_scatter_shape(const Shape& input, std::int64_t scatter_dim, int group_size) {
  check_group_size(group_size, "reduce_scatter_shape");
  return shape_or_throw(detail::reduce_scatter_rule(input, scatter_dim, group_size),
                        "reduce_scatter_shape");
}

Shape all_to_all_single_shape(const Shape& input,
                              const std::optional<std::vector<std::int64_t>>& output_split_sizes,
                              const std::optional<std::vector<std::int64_t>>& input_split_sizes,
                              int group_size) {
  check_group_size(group_size, "all_to_all_single_shape");
  return shape_or_throw(
      detail::all_to_all_rule(input, output_split_sizes, input_split_sizes, group_size),
      "all_to_all_single_shape");
}

Shape broadcast_shape(const Shape& input, int src, int group_size) {
  check_group_size(group_size, "broadcast_shape");
  return shape_or_throw(detail::rooted_rule(input, src, group_size, "src"), "broadcast_shape");
}

Shape permute_tensor_shape(const Shape& input, const std::vector<int>& src_dst, int group_size) {
  check_group_size(group_size, "permute_tensor_shape");
  return shape_or_throw(detail::permute_rule(input, src_dst, group_size), "permute_tensor_shape");
}

Shape reduce_shape(const Shape& input, int dst, int group_size) {
  check_group_size(group_size, "reduce_shape");
  return shape_or_throw(detail::rooted_rule(input, dst, group_size, "dst"), "reduce_shape");
}

}  // namespace chorus::meta
