// The user guide's first program (docs/guide/getting-started.md): every rank contributes its rank
// number, the ranks sum with one all_reduce, and every rank checks the sum against the closed
// form 0 + 1 + ... + (W - 1). --bug=skip plants a bug to read: the last rank skips the all_reduce.
//
//   first_program [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [--bug=skip]   (kUsage; --help)
//
// Exit status 0 when every rank got the sum; 1 when a rank failed; 2 on bad arguments (an
// unknown one too) or an unavailable transport.

#include <chorus/chorus.hpp>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

static const char* const kUsage =
    "first_program [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [simulator flags: "
    "docs/simulator.md] [--bug=skip]";

static int run_main(int argc, char** argv) {
  chorus::RunOptions options = chorus::RunOptions::from_args(argc, argv);
  bool skip = false;
  for (std::size_t i = 0; i < options.args.size(); ++i) {
    std::string arg = options.args[i];
    if (arg == "--bug" && i + 1 < options.args.size()) {
      arg += "=" + options.args[++i];  // "--bug skip", as from_args reads "--ranks 4"
    }
    if (arg == "--bug=skip") {
      skip = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s\n", kUsage);
      return 0;
    } else {
      throw std::invalid_argument("unknown argument " + arg + " (usage: " + kUsage + ")");
    }
  }
  return chorus::run(options, [skip] {
    const int rank = chorus::rank();
    const int world = chorus::world_size();
    if (skip && rank == world - 1) {
      return;  // the planted bug: this rank never joins the all_reduce
    }
    chorus::Tensor x = chorus::Tensor::full({4}, rank);
    chorus::Tensor sum = chorus::all_reduce(x, "sum", chorus::world());  // returns at once
    chorus::Tensor row = sum.view({2, 2}).select(0, 1);                  // views never wait
    const std::vector<float> values = row.to_vector<float>();            // waits here
    const float expected = static_cast<float>(world * (world - 1) / 2);
    for (const float value : values) {
      if (value != expected) {
        throw std::runtime_error("rank " + std::to_string(rank) + ": got " + std::to_string(value) +
                                 ", expected " + std::to_string(expected));
      }
    }
    if (rank == 0) {
      std::printf("first_program: %d ranks agree, the sum is %g\n", world,
                  static_cast<double>(expected));
    }
  });
}

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& error) {  // a bad flag, or a transport this build lacks
    std::fprintf(stderr, "first_program: %s\n", error.what());
    return 2;
  }
}
