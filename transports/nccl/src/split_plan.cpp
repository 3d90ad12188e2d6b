// split_plan (Note [NCCL communicator set-up]): the ncclCommSplit arguments of a partition's
// part, without CUDA or NCCL, so the unit tests check them on any machine.

#include <algorithm>
#include <string>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/nccl/nccl.hpp"

namespace chorus::nccl {

SplitPlan split_plan(const transport::Partition& partition, int world_size, int rank,
                     bool has_existing) {
  if (std::string problem = partition.problem(world_size, rank); !problem.empty()) {
    throw InvalidArgument(ErrorContext{rank, "create_comm", -1, ""},
                          "nccl: not a partition of the world of " + std::to_string(world_size) +
                              " ranks: " + problem);
  }
  const std::vector<int>& part = partition.own();
  const auto position = std::find(part.begin(), part.end(), rank) - part.begin();
  CHORUS_CHECK_GE(position, 0);
  CHORUS_CHECK_LT(static_cast<std::size_t>(position), part.size());
  if (has_existing) {
    return SplitPlan{kNoColor, static_cast<int>(position)};
  }
  // The part's smallest rank: the same on every member, however each listed the parts.
  return SplitPlan{*std::min_element(part.begin(), part.end()), static_cast<int>(position)};
}

}  // namespace chorus::nccl
