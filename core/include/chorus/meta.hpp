#pragma once

// The shape rules of the collectives (DESIGN 2.3), public so that code planning a program can
// compute result shapes without running anything. The eager, meta and traced paths all use
// these same functions: one implementation of each rule.
//
// Dims may be negative (counted from the end); invalid arguments throw InvalidArgument naming
// the op and what was expected, with the same text the collective itself raises.

#include <cstdint>
#include <optional>
#include <vector>

#include "chorus/tensor.hpp"

namespace chorus::meta {

// The input's shape.
Shape all_reduce_shape(const Shape& input);

// `gather_dim` multiplied by the group size; a 0-d input gives {group_size}.
Shape all_gather_shape(const Shape& input, std::int64_t gather_dim, int group_size);

// `scatter_dim` divided by the group size; not divisible (or a 0-d input) is an error.
Shape reduce_scatter_shape(const Shape& input, std::int64_t scatter_dim, int group_size);

// Dim 0 becomes the sum of `output_split_sizes`; both lists absent means the equal split (dim 0
// must then be divisible by the group size). Exactly one list absent, a list without one entry
// per group rank, a negative split, input splits that do not sum to dim 0, or a 0-d input is an
// error.
Shape all_to_all_single_shape(const Shape& input,
                              const std::optional<std::vector<std::int64_t>>& output_split_sizes,
                              const std::optional<std::vector<std::int64_t>>& input_split_sizes,
                              int group_size);

// The input's shape; `src` must be a group rank.
Shape broadcast_shape(const Shape& input, int src, int group_size);

// The input's shape (zeros on ranks nobody sends to); `src_dst` needs one entry per group rank,
// each a group rank or -1, destinations distinct.
Shape permute_tensor_shape(const Shape& input, const std::vector<int>& src_dst, int group_size);

// The input's shape (zeros on ranks other than `dst`); `dst` must be a group rank.
Shape reduce_shape(const Shape& input, int dst, int group_size);

}  // namespace chorus::meta
