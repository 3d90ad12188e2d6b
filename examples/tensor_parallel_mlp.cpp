// A Megatron-style tensor-parallel MLP block (column-parallel then row-parallel linear layers),
// forward and backward, in its tensor-parallel form (all_reduce) and its sequence-parallel form
// (all_gather + reduce_scatter). Every rank checks what it holds — y, dx and its shards of dW1
// and dW2 — bitwise against the single-rank reference (examples/tensor_parallel_mlp.hpp,
// docs/examples.md).
//
//   tensor_parallel_mlp [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [simulator flags]
//                       [--variant=tensor|sequence|both] [--tokens-per-rank=T] [--model=D]
//                       [--hidden-per-rank=H] [--data-seed=S] [--bug=local-dx]
//
// --bug=local-dx plants a bug to see the check fail: the backward skips dx's collective.
// Exit status 0 when every rank matches the reference; 1 on a wrong result or a failed run
// (the error names the rank, the result and its first differing element); 2 on bad arguments or
// an unavailable transport.

#include "tensor_parallel_mlp.hpp"

#include <chorus/chorus.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace {

using examples::MlpCase;
using examples::MlpVariant;

}  // namespace

constexpr std::string_view kSynopsis =
    "tensor_parallel_mlp [chorus flags] [--variant=tensor|sequence|both] "
    "[--tokens-per-rank=T] [--model=D] [--hidden-per-rank=H] [--data-seed=S] "
    "[--bug=local-dx]";

int main(int argc, char** argv) {
  chorus::RunOptions options;
  MlpCase c;
  std::vector<MlpVariant> variants = {MlpVariant::TensorParallel, MlpVariant::SequenceParallel};
  try {
    options = chorus::RunOptions::from_args(argc, argv);
    if (examples::help_asked(options.args, kSynopsis)) {
      return 0;
    }
    for (const std::string& arg :
         examples::joined_flags(options.args, {"--variant", "--tokens-per-rank", "--model",
                                               "--hidden-per-rank", "--data-seed", "--bug"})) {
      if (arg == "--variant=tensor") {
        variants = {MlpVariant::TensorParallel};
      } else if (arg == "--variant=sequence") {
        variants = {MlpVariant::SequenceParallel};
      } else if (arg == "--variant=both") {
        variants = {MlpVariant::TensorParallel, MlpVariant::SequenceParallel};
      } else if (arg.rfind("--variant=", 0) == 0) {
        throw std::invalid_argument("flag --variant='" + arg.substr(10) +
                                    "' is invalid: expected tensor, sequence or both");
      } else if (arg.rfind("--tokens-per-rank=", 0) == 0) {
        c.tokens_per_rank = examples::flag_at_least(arg, 18, 1);
      } else if (arg.rfind("--model=", 0) == 0) {
        c.model = examples::flag_at_least(arg, 8, 1);
      } else if (arg.rfind("--hidden-per-rank=", 0) == 0) {
        c.hidden_per_rank = examples::flag_at_least(arg, 18, 1);
      } else if (arg.rfind("--data-seed=", 0) == 0) {
        c.data_seed = examples::flag_unsigned(arg, 12);
      } else if (arg == "--bug=local-dx") {
        c.bug_local_dx = true;
      } else {
        throw examples::unknown_argument(arg, kSynopsis);
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tensor_parallel_mlp: %s\n", error.what());
    return 2;
  }

  // One run for both variants: a process is one rank of one run under mpirun.
  const int status = examples::run_ranks("tensor_parallel_mlp", options, [&c, &options, &variants] {
    for (const MlpVariant variant : variants) {
      if (chorus::rank() == 0) {
        std::printf(
            "tensor_parallel_mlp (%s): %s, %lld tokens/rank, model %lld, %lld hidden "
            "units/rank\n",
            examples::name(variant), examples::describe_world(options).c_str(),
            static_cast<long long>(c.tokens_per_rank), static_cast<long long>(c.model),
            static_cast<long long>(c.hidden_per_rank));
        std::fflush(stdout);  // before any report on stderr
      }
      examples::require_reference_on_every_rank(
          examples::run_mlp(c, variant),
          examples::reference_mlp(c, variant, chorus::world_size(), chorus::rank()));
      if (chorus::rank() == 0) {
        std::printf(
            "tensor_parallel_mlp (%s): every rank's y, dx, dW1 and dW2 shards equal "
            "the single-rank reference, bitwise\n",
            examples::name(variant));
        std::fflush(stdout);
      }
    }
  });
  if (status != 0) {
    std::fprintf(stderr, "tensor_parallel_mlp: FAILED\n");
  }
  return status;
}
