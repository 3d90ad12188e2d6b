// FSDP/ZeRO-style sharded training: each step all_gathers the parameter shards, computes the
// gradient on the rank's batch, reduce_scatters it and updates only the rank's own shard with
// SGD. After the last step every rank checks its shard, its last gradient shard and the
// all_gathered full parameters bitwise against a single-rank reference that trains the whole
// model on every rank's batch (examples/sharded_optimizer.hpp, docs/examples.md).
//
//   sharded_optimizer [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [simulator flags]
//                     [--steps=K] [--inputs=I] [--outputs=O] [--batch-per-rank=B]
//                     [--data-seed=S] [--bug=local-gradient]
//
// --bug=local-gradient plants a bug to see the check fail: each rank updates its shard with its
// own gradient instead of the reduce_scatter result.
// Exit status 0 when every rank matches the reference; 1 on a wrong result or a failed run
// (the error names the rank, the result and its first differing element); 2 on bad arguments or
// an unavailable transport.

#include "sharded_optimizer.hpp"

#include <chorus/chorus.hpp>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

constexpr std::string_view kSynopsis =
    "sharded_optimizer [chorus flags] [--steps=K] [--inputs=I] [--outputs=O] "
    "[--batch-per-rank=B] [--data-seed=S] [--bug=local-gradient]";

int main(int argc, char** argv) {
  chorus::RunOptions options;
  examples::ShardedCase c;
  try {
    options = chorus::RunOptions::from_args(argc, argv);
    if (examples::help_asked(options.args, kSynopsis)) {
      return 0;
    }
    for (const std::string& arg : examples::joined_flags(
             options.args,
             {"--steps", "--inputs", "--outputs", "--batch-per-rank", "--data-seed", "--bug"})) {
      if (arg.rfind("--steps=", 0) == 0) {
        c.steps = examples::flag_at_least(arg, 8, 0);
      } else if (arg.rfind("--inputs=", 0) == 0) {
        c.inputs = examples::flag_at_least(arg, 9, 1);
      } else if (arg.rfind("--outputs=", 0) == 0) {
        c.outputs = examples::flag_at_least(arg, 10, 1);
      } else if (arg.rfind("--batch-per-rank=", 0) == 0) {
        c.batch_per_rank = examples::flag_at_least(arg, 17, 1);
      } else if (arg.rfind("--data-seed=", 0) == 0) {
        c.data_seed = examples::flag_unsigned(arg, 12);
      } else if (arg == "--bug=local-gradient") {
        c.bug_local_gradient = true;
      } else {
        throw examples::unknown_argument(arg, kSynopsis);
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sharded_optimizer: %s\n", error.what());
    return 2;
  }

  const int status = examples::run_ranks("sharded_optimizer", options, [&c, &options] {
    if (chorus::rank() == 0) {
      std::printf(
          "sharded_optimizer: %s, %lld x %lld linear layer (+ bias), %lld samples per "
          "rank, %lld steps\n",
          examples::describe_world(options).c_str(), static_cast<long long>(c.inputs),
          static_cast<long long>(c.outputs), static_cast<long long>(c.batch_per_rank),
          static_cast<long long>(c.steps));
      std::fflush(stdout);  // before any report on stderr
    }
    examples::require_reference_on_every_rank(
        examples::run_sharded_optimizer(c),
        examples::reference_sharded_optimizer(c, chorus::world_size(), chorus::rank()));
    if (chorus::rank() == 0) {
      std::printf(
          "sharded_optimizer: every rank's parameter shard, gradient shard and gathered "
          "parameters equal the single-rank reference, bitwise\n");
    }
  });
  if (status != 0) {
    std::fprintf(stderr, "sharded_optimizer: FAILED\n");
  }
  return status;
}
