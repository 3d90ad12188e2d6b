#pragma once

// The battery's families, one function per file (chorus/props/battery.hpp lists them all).

#include <vector>

#include "chorus/props/property.hpp"

namespace chorus::props::families {

std::vector<Property> reduction_properties();  // reduce.*: semantics per op x dtype
std::vector<Property> law_properties();        // law.*: algebraic laws between collectives
std::vector<Property> shape_properties();      // shape.*: eager = meta = traced
std::vector<Property> async_properties();      // async.*: waits, views, registry, address reuse
std::vector<Property> error_properties();      // errors.*: bad inputs, mismatches
std::vector<Property> schedule_properties();   // schedule.*: results independent of schedules

}  // namespace chorus::props::families
