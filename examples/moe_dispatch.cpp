// Mixture-of-experts routing: each rank routes its tokens to top-k experts spread over the
// ranks, exchanges counts, dispatches the token rows and expert ids with uneven
// all_to_all_single (split sizes differ per rank and per peer, zeros included), runs its local
// experts and combines with the reverse exchange. Every rank checks the rows and ids it received
// and its tokens' combined outputs bitwise against a single-rank reference
// (examples/moe_dispatch.hpp, docs/examples.md).
//
//   moe_dispatch [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [simulator flags]
//                [--max-tokens=T] [--features=F] [--experts-per-rank=E] [--top-k=K]
//                [--data-seed=S] [--bug=unpermuted]
//
// --bug=unpermuted plants a bug to see the check fail: the combined rows are attached to tokens
// in dispatch order, the inverse permutation forgotten.
// Exit status 0 when every rank matches the reference; 1 on a wrong result or a failed run
// (the error names the rank, the result and its first differing element); 2 on bad arguments or
// an unavailable transport.

#include "moe_dispatch.hpp"

#include <chorus/chorus.hpp>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int kPrintRanksMax = 16;  // larger worlds skip printing the split matrix

}  // namespace

constexpr std::string_view kSynopsis =
    "moe_dispatch [chorus flags] [--max-tokens=T] [--features=F] "
    "[--experts-per-rank=E] [--top-k=K] [--data-seed=S] [--bug=unpermuted]";

int main(int argc, char** argv) {
  chorus::RunOptions options;
  examples::MoeCase c;
  try {
    options = chorus::RunOptions::from_args(argc, argv);
    if (examples::help_asked(options.args, kSynopsis)) {
      return 0;
    }
    for (const std::string& arg :
         examples::joined_flags(options.args, {"--max-tokens", "--features", "--experts-per-rank",
                                               "--top-k", "--data-seed", "--bug"})) {
      if (arg.rfind("--max-tokens=", 0) == 0) {
        c.max_tokens = examples::flag_at_least(arg, 13, 0);
      } else if (arg.rfind("--features=", 0) == 0) {
        c.features = examples::flag_at_least(arg, 11, 1);
      } else if (arg.rfind("--experts-per-rank=", 0) == 0) {
        c.experts_per_rank = examples::flag_at_least(arg, 19, 1);
      } else if (arg.rfind("--top-k=", 0) == 0) {
        c.top_k = examples::flag_at_least(arg, 8, 1);
      } else if (arg.rfind("--data-seed=", 0) == 0) {
        c.data_seed = examples::flag_unsigned(arg, 12);
      } else if (arg == "--bug=unpermuted") {
        c.bug_unpermuted_combine = true;
      } else {
        throw examples::unknown_argument(arg, kSynopsis);
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "moe_dispatch: %s\n", error.what());
    return 2;
  }

  const int status = examples::run_ranks("moe_dispatch", options, [&c, &options] {
    if (chorus::rank() == 0) {
      std::printf(
          "moe_dispatch: %s, up to %lld tokens per rank of %lld features, %lld experts "
          "per rank, top-%lld routing\n",
          examples::describe_world(options).c_str(), static_cast<long long>(c.max_tokens),
          static_cast<long long>(c.features), static_cast<long long>(c.experts_per_rank),
          static_cast<long long>(c.top_k));
      if (chorus::world_size() <= kPrintRanksMax) {
        std::printf("  rows dispatched, source rank (row) to destination rank (column):\n");
        for (const std::vector<std::int64_t>& row :
             examples::routing_counts(c, chorus::world_size())) {
          std::printf("   ");
          for (const std::int64_t count : row) {
            std::printf(" %2lld", static_cast<long long>(count));
          }
          std::printf("\n");
        }
      }
      std::fflush(stdout);  // before any report on stderr
    }
    examples::require_reference_on_every_rank(
        examples::run_moe_dispatch(c),
        examples::reference_moe_dispatch(c, chorus::world_size(), chorus::rank()));
    if (chorus::rank() == 0) {
      std::printf(
          "moe_dispatch: every rank's received tokens, expert ids and combined outputs "
          "equal the single-rank reference, bitwise\n");
    }
  });
  if (status != 0) {
    std::fprintf(stderr, "moe_dispatch: FAILED\n");
  }
  return status;
}
