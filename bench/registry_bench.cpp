// The work registry (Note [Work lifecycle], core/src/detail/work_registry.hpp): what core pays per
// collective to register its pending result, find it again from a tensor, and retire it, with
// nothing else in the way. One rank on a transport whose works complete as they are issued (a
// 1-element copy), so the figures are core's own: the collective's checks and output allocation,
// the registry's add / lookup / retire, and the pending-storage flag. Figures: docs/performance.md.
//
//   build/release/bench/bench_registry --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/transport.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using chorus::transport::Buffer;
using chorus::transport::OpInfo;
using chorus::transport::Work;

// Completed when issued: the bytes are copied at once.
class InstantWork final : public Work {
 public:
  InstantWork(const Buffer& send, const Buffer& recv, std::int64_t seq) {
    fingerprint_.comm_id = 1;
    fingerprint_.seq = seq;
    if (send.nbytes() > 0 && send.data != recv.data) {
      std::memmove(recv.data, send.data, send.nbytes());
    }
  }
  bool is_completed() override { return true; }
  void wait(chorus::transport::Deadline /*deadline*/) override {}
  void wait_on(void* /*stream*/) override {}
  chorus::transport::WorkStatus status() const override {
    return chorus::transport::WorkStatus::Completed;
  }
  std::exception_ptr error() const override { return nullptr; }
  const chorus::transport::Fingerprint& fingerprint() const override { return fingerprint_; }

 private:
  chorus::transport::Fingerprint fingerprint_;
};

class InstantComm final : public chorus::transport::Comm {
 public:
  InstantComm(std::string tag, std::vector<int> ranks)
      : tag_(std::move(tag)), ranks_(std::move(ranks)) {}
  std::uint64_t id() const noexcept override { return 1; }
  const std::string& tag() const noexcept override { return tag_; }
  const std::vector<int>& ranks() const noexcept override { return ranks_; }
  int group_rank() const noexcept override { return 0; }

  std::shared_ptr<Work> all_reduce(const Buffer& send, const Buffer& recv,
                                   const chorus::ReduceOp& /*op*/, const OpInfo& info) override {
    return std::make_shared<InstantWork>(send, recv, info.seq);
  }
  std::shared_ptr<Work> all_gather(const Buffer& send, const Buffer& recv,
                                   const OpInfo& info) override {
    return std::make_shared<InstantWork>(send, recv, info.seq);
  }
  std::shared_ptr<Work> reduce_scatter(const Buffer& send, const Buffer& recv,
                                       const chorus::ReduceOp& /*op*/,
                                       const OpInfo& info) override {
    return std::make_shared<InstantWork>(send, recv, info.seq);
  }
  std::shared_ptr<Work> all_to_all(const Buffer& send, const std::vector<std::size_t>& /*sends*/,
                                   const Buffer& recv, const std::vector<std::size_t>& /*recvs*/,
                                   const OpInfo& info) override {
    return std::make_shared<InstantWork>(send, recv, info.seq);
  }
  std::shared_ptr<Work> broadcast(const Buffer& send, const Buffer& recv, int /*root*/,
                                  const OpInfo& info) override {
    return std::make_shared<InstantWork>(send, recv, info.seq);
  }
  std::shared_ptr<Work> reduce(const Buffer& send, const Buffer& recv,
                               const chorus::ReduceOp& /*op*/, int /*root*/,
                               const OpInfo& info) override {
    return std::make_shared<InstantWork>(send, recv, info.seq);
  }
  void begin_group() override {}
  std::shared_ptr<Work> end_group(const OpInfo& info) override {
    return std::make_shared<InstantWork>(Buffer{}, Buffer{}, info.seq);
  }

 private:
  std::string tag_;
  std::vector<int> ranks_;
};

class InstantTransport final : public chorus::transport::Transport {
 public:
  std::string_view name() const noexcept override { return "instant"; }
  int rank() const noexcept override { return 0; }
  int world_size() const noexcept override { return 1; }
  std::shared_ptr<chorus::transport::Comm> create_comm(const std::string& tag,
                                                       const std::vector<int>& ranks) override {
    return std::make_shared<InstantComm>(tag, ranks);
  }
  chorus::transport::Duration now() override {
    return std::chrono::steady_clock::now().time_since_epoch();
  }
  std::string supports(chorus::transport::OpKind /*kind*/, chorus::DType /*dtype*/,
                       const chorus::ReduceOp& /*op*/, chorus::Device device) const override {
    return device.is_cpu() ? std::string() : std::string("host memory only");
  }
};

// One rank bound to the benchmark's thread.
class OneRank {
 public:
  OneRank() : context_(std::make_shared<InstantTransport>()), binding_(&context_) {}
  ~OneRank() { (void)context_.finish(); }
  OneRank(const OneRank&) = delete;
  OneRank& operator=(const OneRank&) = delete;

 private:
  chorus::RankContext context_;
  chorus::ScopedRankBinding binding_;
};

// `count` results left pending (not waited) on the registry.
std::vector<chorus::Tensor> issue_pending(const chorus::Tensor& input, std::int64_t count) {
  std::vector<chorus::Tensor> pending;
  for (std::int64_t i = 0; i < count; ++i) {
    pending.push_back(chorus::all_reduce(input, "sum", {0}));
  }
  return pending;
}

// A whole collective through core: issue (checks, output, registry add), then wait_tensor
// (registry lookup by storage, retire).
void BM_IssueAndWait(benchmark::State& state) {
  const OneRank rank;
  const chorus::Tensor input = chorus::Tensor::ones({1});
  for (auto _ : state) {
    benchmark::DoNotOptimize(chorus::wait_tensor(chorus::all_reduce(input, "sum", {0})));
  }
}
BENCHMARK(BM_IssueAndWait);

// The registry's share of that: the same with `pending` other results outstanding, so every add,
// lookup and retire works on a fuller registry.
void BM_IssueAndWaitWithOthersPending(benchmark::State& state) {
  const OneRank rank;
  const chorus::Tensor input = chorus::Tensor::ones({1});
  const std::vector<chorus::Tensor> pending = issue_pending(input, state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(chorus::wait_tensor(chorus::all_reduce(input, "sum", {0})));
  }
  state.counters["registry_size"] = static_cast<double>(chorus::work_registry_size());
  chorus::wait_tensors(pending);
}
BENCHMARK(BM_IssueAndWaitWithOthersPending)->Arg(0)->Arg(16)->Arg(1024);

// wait_tensor on a tensor with nothing pending: the registry lookup that finds nothing.
void BM_WaitTensorNothingPending(benchmark::State& state) {
  const OneRank rank;
  const chorus::Tensor tensor = chorus::Tensor::ones({64});
  for (auto _ : state) {
    benchmark::DoNotOptimize(chorus::wait_tensor(tensor));
  }
}
BENCHMARK(BM_WaitTensorNothingPending);

// The first data access on a pending result: the choke point's slow path (find the work, wait,
// retire), against BM_IssueAndWait's explicit wait_tensor.
void BM_IssueAndReadData(benchmark::State& state) {
  const OneRank rank;
  const chorus::Tensor input = chorus::Tensor::ones({1});
  for (auto _ : state) {
    const chorus::Tensor result = chorus::all_reduce(input, "sum", {0});
    benchmark::DoNotOptimize(result.data_ptr<float>());
  }
}
BENCHMARK(BM_IssueAndReadData);

// work_registry_size() with `pending` results outstanding.
void BM_RegistrySize(benchmark::State& state) {
  const OneRank rank;
  const std::vector<chorus::Tensor> pending =
      issue_pending(chorus::Tensor::ones({1}), state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(chorus::work_registry_size());
  }
  chorus::wait_tensors(pending);
}
BENCHMARK(BM_RegistrySize)->Arg(0)->Arg(1024);

}  // namespace

BENCHMARK_MAIN();
