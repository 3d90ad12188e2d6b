// The cost of the pending-storage choke point (Note [Pending storage]) on a tensor with nothing
// pending, against the raw pointer that skips it.

#include <benchmark/benchmark.h>

#include <chorus/chorus.hpp>

namespace {

void BM_DataPtrCompleted(benchmark::State& state) {
  chorus::Tensor tensor = chorus::Tensor::ones({64});
  for (auto _ : state) {
    benchmark::DoNotOptimize(tensor.data_ptr<float>());
  }
}
BENCHMARK(BM_DataPtrCompleted);

void BM_UnsafeDataPtr(benchmark::State& state) {
  chorus::Tensor tensor = chorus::Tensor::ones({64});
  for (auto _ : state) {
    benchmark::DoNotOptimize(tensor.unsafe_data_ptr());
  }
}
BENCHMARK(BM_UnsafeDataPtr);

void BM_IsPending(benchmark::State& state) {
  chorus::Tensor tensor = chorus::Tensor::ones({64});
  for (auto _ : state) {
    benchmark::DoNotOptimize(tensor.is_pending());
  }
}
BENCHMARK(BM_IsPending);

}  // namespace

BENCHMARK_MAIN();
