#pragma once

// Note [Schedule shrinking]
// A failing run is a list of choice indices (Note [Decision stream]). Shrinking looks for a
// shorter, simpler list that still fails, by delta debugging over the list (Zeller's ddmin,
// adapted): first drop chunks (halves, quarters, ... single entries; a recorded source answers 0
// past the end, so dropping the tail is always meaningful), then lower each remaining index (to
// 0, else by binary search), keeping every change after which the predicate still reports the
// failure. Deterministic, and bounded by `max_attempts` predicate calls.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace chorus::sim::detail {

struct ShrinkOutcome {
  std::vector<std::uint64_t> choices;  // the smallest failing list found
  std::size_t attempts = 0;            // predicate calls made
};

// `fails(list)` runs the program on `list` and says whether it still fails the same way.
// `failing` must fail.
ShrinkOutcome shrink_choices(std::vector<std::uint64_t> failing,
                             const std::function<bool(const std::vector<std::uint64_t>&)>& fails,
                             std::size_t max_attempts = 2000);

}  // namespace chorus::sim::detail
