#pragma once

// Programs with planted scheduling bugs whose minimal failing schedules are known by hand, for
// the suites that find and shrink failing schedules (delta debugging, RapidCheck).

#include <chorus/chorus.hpp>
#include <functional>
#include <stdexcept>
#include <vector>

namespace chorus::testing {

// A scheduling point that needs no peer: a collective on the rank's own singleton group.
inline void tick() { (void)all_reduce(Tensor::ones({1}), "sum", {rank()}).item<float>(); }

// A planted bug whose hand-minimal schedule is one choice: rank 1 must make its first tick
// before rank 0 makes any. Choosing rank 1 at the first decision (index 1 of the runnable ranks
// {0, 1}) is enough; every later choice may be 0. The state lives across runs (shrinking reruns
// the program), so each rank counts its runs and reads a peer's ticks only from the same run.
// Two ranks.
struct FirstTickBug {
  std::vector<int> runs = {0, 0};
  std::vector<int> ticks = {0, 0};

  std::function<void()> program() {
    return [this] {
      const auto me = static_cast<std::size_t>(rank());
      const int run = ++runs[me];
      ticks[me] = 0;
      for (int i = 0; i < 4; ++i) {
        tick();
        ticks[me] += 1;
        const int rank0_ticks = runs[0] == run ? ticks[0] : 0;
        if (me == 1 && i == 0 && rank0_ticks == 0) {
          throw std::runtime_error("planted bug: rank 1 ticked first");
        }
      }
    };
  }
};

}  // namespace chorus::testing
