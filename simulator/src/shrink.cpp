#include "shrink.hpp"

#include <algorithm>
#include <utility>

namespace chorus::sim::detail {

ShrinkOutcome shrink_choices(std::vector<std::uint64_t> failing,
                             const std::function<bool(const std::vector<std::uint64_t>&)>& fails,
                             std::size_t max_attempts) {
  ShrinkOutcome out;
  out.choices = std::move(failing);
  // Every loop below stops building candidates once the budget is spent: a long list would
  // otherwise cost quadratic copying for attempts that never run.
  const auto spent = [&] { return out.attempts >= max_attempts; };
  const auto attempt = [&](const std::vector<std::uint64_t>& candidate) {
    if (spent()) {
      return false;
    }
    ++out.attempts;
    if (fails(candidate)) {
      out.choices = candidate;
      return true;
    }
    return false;
  };

  bool progress = true;
  while (progress && !spent()) {
    progress = false;
    // 1. Drop chunks, largest first; the tail first within a size (it is the cheapest to drop:
    //    past the end every choice is 0).
    for (std::size_t chunk = std::max<std::size_t>(out.choices.size() / 2, 1);
         chunk >= 1 && !spent(); chunk /= 2) {
      bool dropped = true;
      while (dropped && !out.choices.empty() && !spent()) {
        dropped = false;
        for (std::size_t end = out.choices.size(); end >= chunk && end > 0 && !spent();) {
          const std::size_t begin = end - chunk;
          std::vector<std::uint64_t> candidate;
          candidate.reserve(out.choices.size() - chunk);
          candidate.insert(candidate.end(), out.choices.begin(),
                           out.choices.begin() + static_cast<std::ptrdiff_t>(begin));
          candidate.insert(candidate.end(), out.choices.begin() + static_cast<std::ptrdiff_t>(end),
                           out.choices.end());
          if (attempt(candidate)) {
            dropped = true;
            progress = true;
            end = std::min(begin, out.choices.size());
          } else {
            end = begin;
          }
        }
      }
      if (chunk == 1) {
        break;
      }
    }
    // 2. Lower each index: to 0 if that still fails, else binary search for a smaller failing
    //    value between 0 (passes) and the current one (fails).
    for (std::size_t i = 0; i < out.choices.size() && !spent(); ++i) {
      if (out.choices[i] == 0) {
        continue;
      }
      std::vector<std::uint64_t> candidate = out.choices;
      candidate[i] = 0;
      if (attempt(candidate)) {
        progress = true;
        continue;
      }
      std::uint64_t passes = 0;
      std::uint64_t fails_at = out.choices[i];
      while (fails_at - passes > 1 && !spent()) {
        const std::uint64_t middle = passes + (fails_at - passes) / 2;
        candidate = out.choices;
        candidate[i] = middle;
        if (attempt(candidate)) {
          fails_at = middle;
          progress = true;
        } else {
          passes = middle;
        }
      }
    }
    // Trailing zeros mean the same as the end of the list.
    while (!out.choices.empty() && out.choices.back() == 0) {
      out.choices.pop_back();
    }
  }
  return out;
}

}  // namespace chorus::sim::detail
