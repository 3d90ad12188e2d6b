// Plan a program's communication without running it, check that the ranks agree, then run it.
//
// Every rank traces one step of a mixture-of-experts layer on meta tensors (shapes only, no
// communication): an uneven all_to_all that routes tokens to experts, an all_gather of the expert
// weights along dim 1, a reduce_scatter of the result, and a permute that hands each rank's
// output to its neighbour. The traces are compared across ranks (the desync check a 3 a.m.
// debugging session wants before touching a cluster), printed as JSON, and replayed with real
// tensors; finally each op's adjoint is checked with the dot-product test on exact integers.
//
//   trace_replay [--ranks=N] [--seed=S] [--json]

#include <chorus/chorus.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

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

// Sum over every element of a * b, in double (the inputs are small integers: exact).
double dot(const chorus::Tensor& a, const chorus::Tensor& b) {
  const std::vector<double> x = a.to(chorus::DType::Float64).to_vector<double>();
  const std::vector<double> y = b.to(chorus::DType::Float64).to_vector<double>();
  double sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sum += x[i] * y[i];
  }
  return sum;
}

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

}  // namespace

static int run_main(int argc, char** argv) {
  chorus::RunOptions options = chorus::RunOptions::from_args(argc, argv);
  bool print_json = false;
  for (const std::string& arg : options.args) {
    print_json = print_json || arg == "--json";
  }
  chorus::sim::SimOptions sim_options;
  sim_options.world_size = options.ranks;
  sim_options.seed = options.seed;

  // 1. Trace on meta tensors: no communication happens.
  std::mutex mutex;
  std::vector<std::vector<chorus::OpRecord>> traces(static_cast<std::size_t>(options.ranks));
  chorus::sim::run(sim_options, [&] {
    chorus::TraceScope trace;
    step([](chorus::Shape shape) {
      return chorus::Tensor::empty(std::move(shape), chorus::DType::Float64,
                                   chorus::Device::meta());
    });
    std::lock_guard<std::mutex> lock(mutex);
    traces[static_cast<std::size_t>(chorus::rank())] = trace.records();
  });
  if (auto divergence = chorus::compare_traces(traces)) {
    std::printf("ranks diverge: %s\n", divergence->to_string().c_str());
    return 1;
  }
  std::printf("traced %zu collectives per rank on %d ranks; the ranks agree\n", traces[0].size(),
              options.ranks);
  if (print_json) {
    std::printf("%s\n", chorus::to_json(traces[0]).c_str());
  }

  // 2. Replay for real, and check every op's adjoint: sum_r <A* y, x> == sum_r <y, A x>.
  int failures = 0;
  chorus::sim::run(sim_options, [&] {
    const std::vector<chorus::OpRecord>& mine = traces[static_cast<std::size_t>(chorus::rank())];
    chorus::replay(mine);
    for (std::size_t n = 0; n < mine.size(); ++n) {
      const chorus::OpRecord& forward = mine[n];
      const chorus::Tensor x = integers(forward.input_shapes[0], chorus::rank());
      const chorus::Tensor y = integers(forward.output_shapes[0], chorus::rank() + 17);
      const chorus::Tensor ax = chorus::execute(forward, {x})[0];
      const chorus::Tensor aty = chorus::execute(chorus::adjoint(forward), {y})[0];
      const chorus::Tensor local =
          chorus::Tensor::from_vector(std::vector<double>{dot(y, ax), dot(aty, x)});
      const std::vector<double> total =
          chorus::all_reduce(local, "sum", chorus::world()).to_vector<double>();
      if (chorus::rank() == 0) {
        std::printf("%-18s <y, A x> = %8.0f   <A* y, x> = %8.0f   %s\n", forward.op.c_str(),
                    total[0], total[1], total[0] == total[1] ? "ok" : "MISMATCH");
        failures += total[0] == total[1] ? 0 : 1;
      }
    }
  });
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& error) {  // a bad flag, or a transport this build or machine lacks
    std::fprintf(stderr, "trace_replay: %s\n", error.what());
    return 2;
  }
}
