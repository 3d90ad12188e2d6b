#pragma once

// The reduction kernels' process-wide instruction set in tests (Note [Kernel instruction sets]).

#include <chorus/kernels.hpp>
#include <vector>

namespace chorus::testing {

// Puts the process-wide instruction set back as it was, even when an assertion returns early.
class IsaRestorer {
 public:
  IsaRestorer() = default;
  IsaRestorer(const IsaRestorer&) = delete;
  IsaRestorer& operator=(const IsaRestorer&) = delete;
  ~IsaRestorer() { kernels::set_isa(initial_); }

 private:
  kernels::Isa initial_ = kernels::active_isa();
};

// The instruction sets this CPU and build run, baseline first.
inline std::vector<kernels::Isa> supported_isas() {
  std::vector<kernels::Isa> out = {kernels::Isa::Baseline};
  if (kernels::isa_supported(kernels::Isa::Avx2)) {
    out.push_back(kernels::Isa::Avx2);
  }
  return out;
}

}  // namespace chorus::testing
