#pragma once

#include <string_view>

#include "chorus/group.hpp"

namespace chorus::detail {

// expand_group, with errors attributed to `op` (the collective that was given the group).
ExpandedGroup expand_group_for(const GroupSpec& group, std::string_view tag, std::string_view op);

// "[0, 1, 2]".
std::string ranks_to_string(const std::vector<int>& ranks);

// The group as error messages name it: "[0, 1]" or "'tag' [0, 1]".
std::string group_label(const std::string& tag, const std::vector<int>& members);

}  // namespace chorus::detail
