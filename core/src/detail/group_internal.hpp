#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/group.hpp"

namespace chorus::detail {

// expand_group, with errors attributed to `op` (the collective that was given the group).
ExpandedGroup expand_group_for(const GroupSpec& group, std::string_view tag, std::string_view op);
// The same into `out`, whose rank list and tag keep their heap blocks (RankState recycles one
// per collective). `out` holds garbage when it throws.
void expand_group_into(const GroupSpec& group, std::string_view tag, std::string_view op,
                       ExpandedGroup& out);

// The parts of a partition of the world that `group` names (Note [Partitioned groups],
// transport.hpp), back to back in `parts`, each `part_size` ranks long: a list of rank lists
// whose flattened ranks number `world_size`, or a MeshDim of a mesh of `world_size` ranks (its
// slices along the dim, in the order of their first rank in the mesh). False for every other
// spec. `expanded` is `group` expanded (validated: distinct ranks in [0, world_size)); for a list
// of rank lists `parts` views it, for a MeshDim `storage` holds the parts.
bool world_partition(const GroupSpec& group, const ExpandedGroup& expanded, int world_size,
                     std::span<const int>& parts, int& part_size, std::vector<int>& storage);

// "[0, 1, 2]".
std::string ranks_to_string(const std::vector<int>& ranks);

}  // namespace chorus::detail
