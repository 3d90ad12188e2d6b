#pragma once

// The property battery: chorus's own collectives checked by properties (docs/properties.md has
// the list with what each checks). `chorus check` runs it; `chorus list` prints it.

#include <vector>

#include "chorus/props/property.hpp"

namespace chorus::props {

// Every property of the battery, in family order: reduce.*, law.*, shape.*, async.*, errors.*,
// schedule.*. Builds the list on each call.
std::vector<Property> battery();

}  // namespace chorus::props
