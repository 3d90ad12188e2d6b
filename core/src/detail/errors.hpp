#pragma once

// Helpers that raise chorus::Error with the calling rank filled in.

#include <cstdint>
#include <string>
#include <string_view>

#include "chorus/error.hpp"

namespace chorus::detail {

// An ErrorContext whose rank is the calling rank (-1 outside a rank).
ErrorContext make_context(std::string_view op, std::int64_t seq = -1, std::string group = {});

// Throws InvalidArgument for `op` with the calling rank, no sequence number and no group: for
// tensor and group misuse outside any collective.
[[noreturn]] void throw_invalid(std::string_view op, std::string detail);

}  // namespace chorus::detail
