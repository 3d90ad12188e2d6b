// Plan a program's communication without running it, check that the ranks agree, then run it.
//
// Every rank traces one step of a mixture-of-experts layer on meta tensors (shapes only, no
// communication): an uneven all_to_all that routes tokens to experts, an all_gather of the expert
// weights along dim 1, a reduce_scatter of the result, and a permute that hands each rank's
// output to its neighbour. The ranks exchange their traces (as JSON, with two all_gathers) and
// compare them (the desync check a 3 a.m. debugging session wants before touching a cluster);
// rank 0 prints its trace as JSON; every rank replays its trace with real tensors; finally each
// op's adjoint is checked with the dot-product test on exact integers. All of it in one
// chorus::run, so it runs on any transport and takes every simulator flag.
//
// The tensors stay on the host, on every transport (NCCL stages host buffers through the device):
// an all_gather along dim 1 rearranges blocks with a host copy, which device tensors refuse
// (core does not yet order a strided device copy after the transport), so --sim-cuda changes
// nothing here.
//
//   trace_replay [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [simulator flags] [--json]
//                                                           (kSynopsis; --help)
//
// Exit status 0 when the ranks agree and every adjoint holds; 1 when the traces diverge or an
// adjoint does not hold (every rank fails, naming what differed); 2 on bad arguments or an
// unavailable transport.

#include <algorithm>
#include <chorus/chorus.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "example_support.hpp"

namespace {

// Rank r sends (r + j) % 3 + 1 tokens to expert rank j; the receiver's splits mirror that.
std::vector<std::int64_t> tokens_from(int sender, int world) {
  std::vector<std::int64_t> splits;
  for (int j = 0; j < world; ++j) {
    splits.push_back((sender + j) % 3 + 1);
  }
  return splits;
}

// One step, on `make(shape)` inputs (meta or real).
void step(const std::function<chorus::Tensor(chorus::Shape)>& make) {
  const int me = chorus::rank();
  const int world = chorus::world_size();
  const chorus::ProcessGroup group = chorus::world();
  std::vector<std::int64_t> input_splits = tokens_from(me, world);
  std::vector<std::int64_t> output_splits;
  std::int64_t tokens = 0;
  for (int i = 0; i < world; ++i) {
    output_splits.push_back(tokens_from(i, world)[static_cast<std::size_t>(me)]);
  }
  for (std::int64_t split : input_splits) {
    tokens += split;
  }
  chorus::Tensor routed =
      chorus::all_to_all_single(make({tokens, 4}), output_splits, input_splits, group);
  chorus::Tensor weights = chorus::all_gather_tensor(make({4, 2}), 1, group);
  chorus::Tensor partial = chorus::reduce_scatter_tensor(make({world * 2, 3}), "sum", 0, group);
  std::vector<int> shift;
  for (int m = 0; m < world; ++m) {
    shift.push_back((m + 1) % world);
  }
  chorus::Tensor handed = chorus::permute_tensor(make({2, 3}), shift, group);
  (void)routed, (void)weights, (void)partial, (void)handed;
}

// Sum over every element of a * b, in double (the inputs are small integers: exact). Waits.
double dot(const chorus::Tensor& a, const chorus::Tensor& b) {
  const std::vector<double> x = a.to(chorus::DType::Float64).to_vector<double>();
  const std::vector<double> y = b.to(chorus::DType::Float64).to_vector<double>();
  double sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sum += x[i] * y[i];
  }
  return sum;
}

// Small integers of `shape`.
chorus::Tensor integers(const chorus::Shape& shape, int salt) {
  std::int64_t numel = 1;
  for (std::int64_t size : shape) {
    numel *= size;
  }
  std::vector<double> values;
  for (std::int64_t i = 0; i < numel; ++i) {
    values.push_back(static_cast<double>((i * 7 + salt * 5) % 13 - 6));
  }
  return chorus::Tensor::from_vector(values, shape);
}

// Every rank's trace, on every rank: each rank's JSON, padded to the longest, all_gathered.
std::vector<std::vector<chorus::OpRecord>> gather_traces(
    const std::vector<chorus::OpRecord>& mine) {
  const chorus::ProcessGroup group = chorus::world();
  const std::string json = chorus::to_json(mine);
  const std::vector<std::int64_t> lengths =
      chorus::all_gather_tensor(chorus::Tensor::from_vector(std::vector<std::int64_t>{
                                    static_cast<std::int64_t>(json.size())}),
                                0, group)
          .to_vector<std::int64_t>();
  std::int64_t longest = 0;
  for (const std::int64_t length : lengths) {
    longest = std::max(longest, length);
  }
  std::vector<std::uint8_t> padded(static_cast<std::size_t>(longest), 0);
  std::copy(json.begin(), json.end(), padded.begin());
  const std::vector<std::uint8_t> bytes =
      chorus::all_gather_tensor(chorus::Tensor::from_vector(padded), 0, group)
          .to_vector<std::uint8_t>();
  std::vector<std::vector<chorus::OpRecord>> traces;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const char* text = reinterpret_cast<const char*>(bytes.data()) + r * padded.size();
    traces.push_back(
        chorus::from_json(std::string_view(text, static_cast<std::size_t>(lengths[r]))));
  }
  return traces;
}

void rank_main(const chorus::RunOptions& options, bool print_json) {
  const int me = chorus::rank();
  if (me == 0) {
    std::printf("trace_replay: %s\n", examples::describe_world(options).c_str());
  }

  // 1. Trace on meta tensors: no communication happens. Then compare every rank's trace.
  std::vector<chorus::OpRecord> mine;
  {
    chorus::TraceScope trace;
    step([](chorus::Shape shape) {
      return chorus::Tensor::empty(std::move(shape), chorus::DType::Float64,
                                   chorus::Device::meta());
    });
    mine = trace.records();
  }
  const std::vector<std::vector<chorus::OpRecord>> traces = gather_traces(mine);
  if (auto divergence = chorus::compare_traces(traces)) {
    throw std::runtime_error("rank " + std::to_string(me) +
                             ": the ranks' traces diverge: " + divergence->to_string());
  }
  if (me == 0) {
    std::printf("traced %zu collectives per rank; the %d ranks agree\n", mine.size(),
                chorus::world_size());
    if (print_json) {
      std::printf("%s\n", chorus::to_json(mine).c_str());
    }
  }

  // 2. Replay for real, and check every op's adjoint:
  // sum_r <A* y, x> == sum_r <y, A x>.
  const std::vector<std::vector<chorus::Tensor>> replayed =
      chorus::replay(mine, [me](const chorus::OpRecord& record, std::size_t input) {
        return integers(record.input_shapes[input], me + static_cast<int>(input));
      });
  if (me == 0) {
    std::printf("replayed %zu collectives\n", replayed.size());
  }
  int mismatches = 0;
  for (const chorus::OpRecord& forward : mine) {
    const chorus::Tensor x = integers(forward.input_shapes[0], me);
    const chorus::Tensor y = integers(forward.output_shapes[0], me + 17);
    const chorus::Tensor ax = chorus::execute(forward, {x})[0];
    const chorus::Tensor aty = chorus::execute(chorus::adjoint(forward), {y})[0];
    const chorus::Tensor local =
        chorus::Tensor::from_vector(std::vector<double>{dot(y, ax), dot(aty, x)});
    const std::vector<double> total =
        chorus::all_reduce(local, "sum", chorus::world()).to_vector<double>();
    mismatches += total[0] == total[1] ? 0 : 1;
    if (me == 0) {
      std::printf("%-22s <y, A x> = %8.0f   <A* y, x> = %8.0f   %s\n", forward.op.c_str(), total[0],
                  total[1], total[0] == total[1] ? "ok" : "MISMATCH");
    }
  }
  // Every rank saw the same sums: every rank fails alike.
  if (mismatches != 0) {
    throw std::runtime_error("rank " + std::to_string(me) + ": " + std::to_string(mismatches) +
                             " adjoint(s) do not hold");
  }
  if (me == 0) {
    std::printf("trace_replay: every adjoint holds\n");
  }
}

}  // namespace

constexpr std::string_view kSynopsis = "trace_replay [chorus flags] [--json]";

static int run_main(int argc, char** argv) {
  const chorus::RunOptions options = chorus::RunOptions::from_args(argc, argv);
  if (examples::help_asked(options.args, kSynopsis)) {
    return 0;
  }
  bool print_json = false;
  for (const std::string& arg : options.args) {
    if (arg != "--json") {
      throw examples::unknown_argument(arg, kSynopsis);
    }
    print_json = true;
  }
  return examples::run_ranks("trace_replay", options,
                             [&options, print_json] { rank_main(options, print_json); });
}

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& error) {  // a bad flag
    std::fprintf(stderr, "trace_replay: %s\n", error.what());
    return 2;
  }
}
