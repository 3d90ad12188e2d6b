#pragma once

// "[2, 3]": how props' messages and case descriptions print a shape. Internal to chorus::props
// (core's own formatter is private to core).

#include <string>

#include "chorus/tensor.hpp"

namespace chorus::props {

std::string shape_text(const Shape& shape);

}  // namespace chorus::props
