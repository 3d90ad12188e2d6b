#pragma once

// Helpers that raise chorus::Error with the calling rank filled in.

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "chorus/error.hpp"

namespace chorus::detail {

// An ErrorContext whose rank is the calling rank (-1 outside a rank).
ErrorContext make_context(std::string_view op, std::int64_t seq = -1, std::string group = {});

// `error` as the calling rank raises it from a wait. [rank R] names the rank that raised an error
// (docs/errors.md), but a collective's error names the rank that issued it, and a rank may wait
// on a result another rank issued (the simulator's ranks share a process: design.md, "Who may
// wait"): then the calling rank raises a copy under its own rank, op, seq and group kept, whose
// detail names the issuer. `error` itself is left as it is (the issuer's own waits and deferred
// errors raise it). Outside a rank, for an error of the calling rank or not a chorus::Error, and
// out of memory: `error`.
std::exception_ptr raised_by_calling_rank(const std::exception_ptr& error) noexcept;

// Throws InvalidArgument for `op` with the calling rank, no sequence number and no group: for
// tensor and group misuse outside any collective.
[[noreturn]] void throw_invalid(std::string_view op, std::string detail);

}  // namespace chorus::detail
