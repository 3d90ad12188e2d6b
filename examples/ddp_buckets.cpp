// Data-parallel training with DDP-style gradient buckets: backward issues one
// all_reduce_coalesced per bucket the moment the bucket's last gradient is ready and goes on with
// the earlier layers; the optimizer waits for each bucket only when it consumes it. Every rank
// checks that (every bucket still pending after backward, one registry entry per bucket, each
// consumed bucket removing one) and, after the last step, its parameters and summed gradients
// bitwise against a single-rank reference (examples/ddp_buckets.hpp, docs/examples.md).
//
//   ddp_buckets [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [simulator flags]
//               [--steps=K] [--layers=L] [--width=W] [--batch-per-rank=B]
//               [--bucket-elements=E] [--data-seed=S] [--bug=wait-in-backward]
//
// --bug=wait-in-backward plants a bug to see the check fail: backward waits for each bucket as
// soon as it is issued, so nothing overlaps (the values are still right).
// Exit status 0 when every rank matches the reference; 1 on a wrong result or a failed run
// (the error names the rank, the result and its first differing element); 2 on bad arguments or
// an unavailable transport.

#include "ddp_buckets.hpp"

#include <chorus/chorus.hpp>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

constexpr std::string_view kSynopsis =
    "ddp_buckets [chorus flags] [--steps=K] [--layers=L] [--width=W] "
    "[--batch-per-rank=B] [--bucket-elements=E] [--data-seed=S] "
    "[--bug=wait-in-backward]";

int main(int argc, char** argv) {
  chorus::RunOptions options;
  examples::DdpCase c;
  try {
    options = chorus::RunOptions::from_args(argc, argv);
    if (examples::help_asked(options.args, kSynopsis)) {
      return 0;
    }
    for (const std::string& arg :
         examples::joined_flags(options.args, {"--steps", "--layers", "--width", "--batch-per-rank",
                                               "--bucket-elements", "--data-seed", "--bug"})) {
      if (arg.rfind("--steps=", 0) == 0) {
        c.steps = examples::flag_at_least(arg, 8, 0);
      } else if (arg.rfind("--layers=", 0) == 0) {
        c.layers = examples::flag_at_least(arg, 9, 1);
      } else if (arg.rfind("--width=", 0) == 0) {
        c.width = examples::flag_at_least(arg, 8, 1);
      } else if (arg.rfind("--batch-per-rank=", 0) == 0) {
        c.batch_per_rank = examples::flag_at_least(arg, 17, 1);
      } else if (arg.rfind("--bucket-elements=", 0) == 0) {
        c.bucket_elements = examples::flag_at_least(arg, 18, 1);
      } else if (arg.rfind("--data-seed=", 0) == 0) {
        c.data_seed = examples::flag_unsigned(arg, 12);
      } else if (arg == "--bug=wait-in-backward") {
        c.bug_wait_in_backward = true;
      } else {
        throw examples::unknown_argument(arg, kSynopsis);
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ddp_buckets: %s\n", error.what());
    return 2;
  }

  const int status = examples::run_ranks("ddp_buckets", options, [&c, &options] {
    if (chorus::rank() == 0) {
      std::printf(
          "ddp_buckets: %s, %lld layers of width %lld, %lld samples per rank, %lld steps, "
          "buckets of at most %lld elements:",
          examples::describe_world(options).c_str(), static_cast<long long>(c.layers),
          static_cast<long long>(c.width), static_cast<long long>(c.batch_per_rank),
          static_cast<long long>(c.steps), static_cast<long long>(c.bucket_elements));
      for (const std::vector<std::size_t>& bucket : examples::ddp_detail::assign_buckets(c)) {
        std::printf(" [");
        for (std::size_t i = 0; i < bucket.size(); ++i) {
          std::printf("%s%s", i == 0 ? "" : " ",
                      examples::ddp_detail::parameter_name(bucket[i]).c_str());
        }
        std::printf("]");
      }
      std::printf("\n");
      std::fflush(stdout);  // before any report on stderr
    }
    examples::require_reference_on_every_rank(
        examples::run_ddp_buckets(c), examples::reference_ddp_buckets(c, chorus::world_size()));
    if (chorus::rank() == 0) {
      std::printf(
          "ddp_buckets: every bucket overlapped backward and was waited only when "
          "consumed; every rank's parameters and summed gradients equal the single-rank "
          "reference, bitwise\n");
    }
  });
  if (status != 0) {
    std::fprintf(stderr, "ddp_buckets: FAILED\n");
  }
  return status;
}
