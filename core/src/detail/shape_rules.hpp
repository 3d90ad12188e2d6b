#pragma once

// The shape rules, returning an error text instead of throwing, so that each caller raises it
// with its own context (a collective names rank, op, sequence number and group; chorus::meta
// names only the op). Note [One rule, three paths]: eager, meta and traced calls all come here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chorus/tensor.hpp"

namespace chorus::detail {

// A result shape, or why there is none.
struct ShapeRule {
  Shape shape;
  std::string error;      // empty when the arguments are valid
  std::int64_t dim = -1;  // the normalised gather/scatter dim, where one applies

  bool ok() const noexcept { return error.empty(); }
};

// `dim` in [-ndim, ndim) normalised to [0, ndim), or an error naming `name`.
ShapeRule dim_rule(std::int64_t dim, std::int64_t ndim, const char* name);

ShapeRule all_gather_rule(const Shape& input, std::int64_t gather_dim, int group_size);
// `which` names the input in errors ("input", "input 2").
ShapeRule reduce_scatter_rule(const Shape& input, std::int64_t scatter_dim, int group_size,
                              const std::string& which = "input");
ShapeRule all_to_all_rule(const Shape& input,
                          const std::optional<std::vector<std::int64_t>>& output_split_sizes,
                          const std::optional<std::vector<std::int64_t>>& input_split_sizes,
                          int group_size);
// broadcast's src / reduce's dst: a group rank. `name` is "src" or "dst".
ShapeRule rooted_rule(const Shape& input, int root, int group_size, const char* name);
ShapeRule permute_rule(const Shape& input, const std::vector<int>& src_dst, int group_size);

}  // namespace chorus::detail
