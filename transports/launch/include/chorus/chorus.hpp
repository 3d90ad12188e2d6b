#pragma once

// The umbrella header: everything a chorus program needs.
//
//   #include <chorus/chorus.hpp>
//
//   int main(int argc, char** argv) {
//     return chorus::run(chorus::RunOptions::from_args(argc, argv), [] {
//       chorus::Tensor x = chorus::Tensor::full({4}, chorus::rank());
//       chorus::Tensor sum = chorus::all_reduce(x, "sum", chorus::world());  // pending
//       std::vector<float> values = sum.to_vector<float>();                 // waits here
//     });
//   }

#include "chorus/call_site.hpp"
#include "chorus/collectives.hpp"
#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/group.hpp"
#include "chorus/half.hpp"
#include "chorus/launch_environment.hpp"
#include "chorus/meta.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/run.hpp"
#include "chorus/runtime.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/stream.hpp"
#include "chorus/tensor.hpp"
#include "chorus/trace.hpp"
