// The simulator's speed: complete schedules per second of a small program (and of the same
// schedule on the transport seam alone, without core), scheduling decisions per second of the
// bare scheduler, and the bare cost of switching between ranks, on fibers and on threads (Note
// [Rank executor]). Figures and history: docs/performance.md.
//
// The threads variants are timed in real (wall) time, `/real_time` in their names: their ranks
// run on threads of their own while the benchmark thread waits, so its CPU time (Google
// Benchmark's default clock) leaves the ranks' work out. Their items/s are per wall second. A
// failed run is never counted: sim::run rethrows a rank's error, and the bare scheduler's
// SimWorld::run, which does not, reports it as the benchmark's error.
//
//   build/release/bench/bench_sim --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>
#include <sys/single_threaded.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/transport.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor.hpp"
#include "world.hpp"

namespace {

using chorus::sim::ExecutorKind;

// Marks the benchmark failed with the run's first rank error; false if the run was fine.
bool failed(benchmark::State& state, const chorus::sim::SimReport& report) {
  if (report.ok()) {
    return false;
  }
  std::string error = "a simulated run failed";
  for (const std::string& rank_error : report.rank_errors) {
    if (!rank_error.empty()) {
      error += ": " + rank_error;
      break;
    }
  }
  state.SkipWithError(error.c_str());
  return true;
}

// 4 ranks x 8 all_reduces of 64 floats, each waited: the schedule size of issue 4's target.
void BM_Schedule4Ranks8Collectives(benchmark::State& state) {
  const auto executor = static_cast<ExecutorKind>(state.range(0));
  chorus::sim::SimOptions options;
  options.world_size = 4;
  options.executor = executor;
  options.seed_from_environment = false;
  std::uint64_t seed = 0;
  std::uint64_t decisions = 0;
  // Whether every rank ran while glibc counted one thread, so that FutexMutex and shared_ptr
  // took their plain paths (Note [Single-threaded processes]): 1 on fibers, 0 on threads. A
  // regression there shows in the timing only; this counter names it.
  bool one_thread = true;
  for (auto _ : state) {
    options.seed = seed++;
    const chorus::sim::SimReport report = chorus::sim::run(options, [&one_thread] {
      one_thread = one_thread && __libc_single_threaded != 0;
      const chorus::Tensor input = chorus::Tensor::ones({64});
      for (int i = 0; i < 8; ++i) {
        benchmark::DoNotOptimize(
            chorus::all_reduce(input, "sum", chorus::world()).data_ptr<float>());
      }
    });
    decisions += report.steps;
  }
  state.SetItemsProcessed(state.iterations());  // items = complete schedules
  state.counters["decisions_per_schedule"] =
      static_cast<double>(decisions) / static_cast<double>(state.iterations());
  state.counters["one_thread"] = one_thread ? 1 : 0;
}
BENCHMARK(BM_Schedule4Ranks8Collectives)
    ->Arg(static_cast<int>(ExecutorKind::Fibers))
    ->ArgName("executor(1=fibers,2=threads)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Schedule4Ranks8Collectives)
    ->Arg(static_cast<int>(ExecutorKind::Threads))
    ->ArgName("executor(1=fibers,2=threads)")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The same schedule straight on the transport seam: each rank creates the world's communicator
// and runs 8 all_reduces of 64 floats through it, waiting each, with no chorus tensors, no output
// allocation, no work registry. What the simulator itself costs per schedule (its scheduling,
// rendezvous, checks, reduction and completion), so that the complete schedule's time splits into
// the simulator's and core's shares (docs/performance.md).
void BM_Schedule4Ranks8CollectivesOnTheSeam(benchmark::State& state) {
  chorus::sim::SimOptions options;
  options.world_size = 4;
  options.executor = ExecutorKind::Fibers;
  options.seed_from_environment = false;
  std::uint64_t seed = 0;
  for (auto _ : state) {
    options.seed = seed++;
    const chorus::sim::SimReport report = chorus::sim::run(options, [] {
      chorus::transport::Transport& transport = chorus::RankContext::current()->transport();
      const std::shared_ptr<chorus::transport::Comm> comm = transport.create_comm("", {0, 1, 2, 3});
      std::vector<float> send(64, 1.0F);
      std::vector<float> recv(64, 0.0F);
      chorus::transport::Buffer send_buffer;
      send_buffer.data = send.data();
      send_buffer.count = send.size();
      chorus::transport::Buffer recv_buffer;
      recv_buffer.data = recv.data();
      recv_buffer.count = recv.size();
      chorus::transport::OpInfo info;
      info.name = "all_reduce";
      for (info.seq = 0; info.seq < 8; ++info.seq) {
        comm->all_reduce(send_buffer, recv_buffer, chorus::ReduceOp::Kind::Sum, info)
            ->wait(chorus::transport::Deadline::never());
      }
      benchmark::DoNotOptimize(recv.data());
    });
    benchmark::DoNotOptimize(report.steps);
  }
  state.SetItemsProcessed(state.iterations());  // items = complete schedules
}
BENCHMARK(BM_Schedule4Ranks8CollectivesOnTheSeam)->Unit(benchmark::kMicrosecond);

// The bare scheduler: `ranks` ranks that do nothing but reach scheduling points, so every
// decision is the scheduler's own work (collect the candidates, draw one, hash and record it,
// advance virtual time) plus one switch into the chosen rank and back. Items = decisions.
void BM_BareScheduler(benchmark::State& state) {
  constexpr int kPointsPerRank = 4096;
  chorus::sim::SimOptions options;
  options.world_size = static_cast<int>(state.range(0));
  options.executor = static_cast<ExecutorKind>(state.range(1));
  std::uint64_t seed = 0;
  std::uint64_t decisions = 0;
  for (auto _ : state) {
    options.seed = seed++;
    auto world = std::make_shared<chorus::sim::detail::SimWorld>(options);
    chorus::sim::detail::SimWorld* raw = world.get();
    const chorus::sim::SimReport report = world->run([raw] {
      const int rank = raw->current_rank();
      for (int i = 0; i < kPointsPerRank; ++i) {
        raw->scheduling_point(rank);
      }
    });
    if (failed(state, report)) {
      break;
    }
    decisions += report.steps;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(decisions));
  state.counters["decisions_per_run"] =
      static_cast<double>(decisions) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_BareScheduler)
    ->Args({4, static_cast<int>(ExecutorKind::Fibers)})
    ->Args({64, static_cast<int>(ExecutorKind::Fibers)})
    ->ArgNames({"ranks", "executor(1=fibers,2=threads)"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BareScheduler)
    ->Args({4, static_cast<int>(ExecutorKind::Threads)})
    ->ArgNames({"ranks", "executor(1=fibers,2=threads)"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One resume + suspend round trip between the scheduler and a rank.
void BM_ExecutorRoundTrip(benchmark::State& state) {
  const auto kind = static_cast<ExecutorKind>(state.range(0));
  std::unique_ptr<chorus::sim::detail::RankExecutor> executor =
      kind == ExecutorKind::Fibers ? chorus::sim::detail::make_fiber_executor()
                                   : chorus::sim::detail::make_thread_executor();
  bool stop = false;
  executor->start(1, [&](int rank) {
    while (!stop) {
      executor->suspend(rank);
    }
  });
  for (auto _ : state) {
    executor->resume(0);
  }
  stop = true;
  executor->resume(0);
  executor->stop();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ExecutorRoundTrip)
    ->Arg(static_cast<int>(ExecutorKind::Fibers))
    ->ArgName("executor(1=fibers,2=threads)");
BENCHMARK(BM_ExecutorRoundTrip)
    ->Arg(static_cast<int>(ExecutorKind::Threads))
    ->ArgName("executor(1=fibers,2=threads)")
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
