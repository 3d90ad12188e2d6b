// Core's device path (Note [Device memory], Note [Device copies]): Device::cuda storages from the
// rank's DeviceMemory, copies between host and device, and DESIGN 2.4's device semantics of a
// wait (the stream waits on the collective; the host does not). No GPU here: the "device" memory
// is host memory behind a recording DeviceMemory, and the transport is the fake one, which takes
// CUDA buffers when asked to and counts stream waits apart from host waits.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "detail/rank_state.hpp"
#include "detail/work_registry.hpp"
#include "support/expect_error.hpp"
#include "support/fake_transport.hpp"

namespace chorus {
namespace {

using testing::expect_error;
using testing::expect_invalid_argument;
using testing::FakeTransport;
using testing::FakeWork;

// Host memory posing as device memory; records every call and the stream it was ordered on.
class RecordingDeviceMemory final : public DeviceMemory {
 public:
  struct Copy {
    Device dst;
    Device src;
    std::size_t nbytes;
    void* stream = nullptr;
  };

  std::shared_ptr<void> allocate(Device device, std::size_t nbytes, void* stream) override {
    EXPECT_TRUE(device.is_cuda());
    EXPECT_GT(nbytes, 0u);
    void* block = std::aligned_alloc(HostAllocator::kAlignment,
                                     (nbytes + HostAllocator::kAlignment - 1) /
                                         HostAllocator::kAlignment * HostAllocator::kAlignment);
    std::memset(block, 0xA5, nbytes);  // fresh device memory is not zeroed
    std::lock_guard lock(mutex_);
    allocations_.push_back(nbytes);
    allocation_streams_.push_back(stream);
    return {block, [counts = counts_](void* p) {
              std::free(p);
              ++*counts;
            }};
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes,
            void* stream) override {
    std::memcpy(dst, src, nbytes);
    std::lock_guard lock(mutex_);
    copies_.push_back(Copy{dst_device, src_device, nbytes, stream});
  }

  void zero(void* dst, Device device, std::size_t nbytes, void* stream) override {
    EXPECT_TRUE(device.is_cuda());
    std::memset(dst, 0, nbytes);
    std::lock_guard lock(mutex_);
    zeroed_.push_back(nbytes);
    zero_streams_.push_back(stream);
  }

  std::vector<std::size_t> zeroed() const {
    std::lock_guard lock(mutex_);
    return zeroed_;
  }
  std::vector<void*> zero_streams() const {
    std::lock_guard lock(mutex_);
    return zero_streams_;
  }
  std::vector<std::size_t> allocations() const {
    std::lock_guard lock(mutex_);
    return allocations_;
  }
  std::vector<void*> allocation_streams() const {
    std::lock_guard lock(mutex_);
    return allocation_streams_;
  }
  std::vector<Copy> copies() const {
    std::lock_guard lock(mutex_);
    return copies_;
  }
  int frees() const { return *counts_; }

 private:
  mutable std::mutex mutex_;
  std::vector<std::size_t> allocations_;
  std::vector<void*> allocation_streams_;
  std::vector<Copy> copies_;
  std::vector<std::size_t> zeroed_;
  std::vector<void*> zero_streams_;
  std::shared_ptr<int> counts_ = std::make_shared<int>(0);  // frees; deleters may outlive us
};

// One rank of world 1 on the fake transport, with (or without) device memory. Waits time out
// after a short while, so a wait that blocks the host on a pending work fails the test with
// Timeout instead of hanging it.
class DeviceRank {
 public:
  explicit DeviceRank(bool with_device_memory = true)
      : memory_(with_device_memory ? std::make_shared<RecordingDeviceMemory>() : nullptr),
        transport_(std::make_shared<FakeTransport>()),
        context_(transport_, options(memory_)),
        binding_(&context_) {
    transport_->accepts_cuda_buffers = true;
  }

  RecordingDeviceMemory& memory() { return *memory_; }
  FakeTransport& transport() { return *transport_; }
  RankContext& context() { return context_; }

 private:
  static RankOptions options(std::shared_ptr<RecordingDeviceMemory> memory) {
    RankOptions rank_options;
    rank_options.timeout = std::chrono::milliseconds(200);
    rank_options.device_memory = std::move(memory);
    return rank_options;
  }

  std::shared_ptr<RecordingDeviceMemory> memory_;
  std::shared_ptr<FakeTransport> transport_;
  RankContext context_;
  ScopedRankBinding binding_;
};

const Device kGpu = Device::cuda(0);

Tensor on_gpu(const std::vector<float>& values) { return Tensor::from_vector(values).to(kGpu); }

std::vector<float> host_values(const Tensor& tensor) {
  return tensor.to(Device::cpu()).to_vector<float>();
}

TEST(DeviceMemory, WithoutOneAllocatingADeviceTensorSaysWhatIsMissing) {
  expect_invalid_argument([] { Tensor::empty({4}, DType::Float32, kGpu); },
                          {"Tensor::empty", "outside a rank", "cuda:0", "from_blob"});
  DeviceRank rank(/*with_device_memory=*/false);
  expect_invalid_argument([] { Tensor::zeros({4}, DType::Float32, kGpu); },
                          {"rank 0", "transport 'fake'", "no memory for cuda:0",
                           "RankOptions::device_memory", "from_blob"});
  expect_invalid_argument([] { Tensor::from_vector(std::vector<float>{1}).to(kGpu); },
                          {"Tensor::to", "no memory for cuda:0"});
  EXPECT_EQ(rank.transport().works().size(), 0u);
  expect_invalid_argument([] { Tensor::empty({1}, DType::Float32, Device::cuda(-1)); },
                          {"device index must be >= 0", "cuda:-1"});
}

TEST(DeviceMemory, LocalDeviceIsTheTransports) {
  {
    DeviceRank rank;
    EXPECT_EQ(local_device(), Device::cpu());
    rank.transport().local_device = Device::cuda(3);
    EXPECT_EQ(local_device(), Device::cuda(3));
  }
  sim::SimOptions options;
  options.world_size = 2;
  int seen = 0;
  sim::run(options, [&] {
    EXPECT_EQ(local_device(), Device::cpu());
    ++seen;
  });
  EXPECT_EQ(seen, 2);
}

TEST(DeviceMemory, DeviceTensorsAreAllocatedAndFreedThroughIt) {
  DeviceRank rank;
  {
    const Tensor t = Tensor::empty({2, 3}, DType::Int32, kGpu);
    EXPECT_EQ(t.device(), kGpu);
    EXPECT_EQ(t.nbytes(), 24u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.unsafe_data_ptr()) % HostAllocator::kAlignment,
              0u);
    EXPECT_EQ(rank.memory().allocations(), std::vector<std::size_t>{24});
    EXPECT_EQ(rank.memory().frees(), 0);
    const Tensor none = Tensor::empty({0}, DType::Int32, kGpu);
    EXPECT_EQ(none.unsafe_data_ptr(), nullptr);
    EXPECT_EQ(rank.memory().allocations().size(), 1u) << "no bytes, no allocation";
  }
  EXPECT_EQ(rank.memory().frees(), 1);
}

TEST(DeviceMemory, DeviceMemoryAllocatedCountsWhatChorusStillHolds) {
  expect_invalid_argument([] { (void)device_memory_allocated(); },
                          {"device_memory_allocated", "outside a rank"});
  DeviceRank rank;
  EXPECT_EQ(device_memory_allocated(), 0u);
  {
    const Tensor t = Tensor::empty({2, 3}, DType::Int32, kGpu);
    EXPECT_EQ(device_memory_allocated(), 24u);
    const Tensor u = Tensor::zeros({4}, DType::Float32, kGpu);
    EXPECT_EQ(device_memory_allocated(), 40u);
    const Tensor view = u.narrow(0, 1, 2);
    EXPECT_EQ(device_memory_allocated(), 40u) << "a view shares its base's storage";
  }
  EXPECT_EQ(device_memory_allocated(), 0u);
  EXPECT_EQ(rank.memory().frees(), 2);
  float outside[2] = {1, 2};
  {
    const Tensor wrapped =
        Tensor::from_blob(outside, {2}, DType::Float32, kGpu, [](void* /*data*/) {});
    EXPECT_EQ(device_memory_allocated(), 0u) << "wrapped memory is the caller's";
  }
  // A dropped result waited on the stream: its input (a temporary) and output stay with the
  // transport's work until the operation finishes, and are counted until then.
  { const Tensor out = all_reduce(on_gpu({1, 2}), "sum", {0}); }
  EXPECT_EQ(device_memory_allocated(), 16u);
  rank.transport().last_work()->complete();
  EXPECT_EQ(device_memory_allocated(), 0u);
  EXPECT_EQ(work_registry_size(), 0u);  // settles the released work too
}

TEST(DeviceMemory, FactoriesFillOnTheHostAndCopyZerosInStreamOrder) {
  DeviceRank rank;
  const Tensor full = Tensor::full({3}, 2.5, DType::Float32, kGpu);
  const Tensor zeros = Tensor::zeros({2}, DType::Float32, kGpu);
  const Tensor ones = Tensor::ones({2}, DType::Float32, kGpu);
  EXPECT_EQ(full.device(), kGpu);
  const auto copies = rank.memory().copies();
  ASSERT_EQ(copies.size(), 2u) << "full and ones copy from the host; zeros does not";
  EXPECT_EQ(copies[0].dst, kGpu);
  EXPECT_EQ(copies[0].src, Device::cpu());
  EXPECT_EQ(copies[0].nbytes, 12u);
  EXPECT_EQ(rank.memory().zeroed(), std::vector<std::size_t>{8});
  EXPECT_EQ(host_values(full), (std::vector<float>{2.5F, 2.5F, 2.5F}));
  EXPECT_EQ(host_values(zeros), (std::vector<float>{0.0F, 0.0F}));  // fresh blocks hold 0xA5
  EXPECT_EQ(host_values(ones), (std::vector<float>{1.0F, 1.0F}));
  const auto after = rank.memory().copies();
  ASSERT_EQ(after.size(), 5u);
  EXPECT_EQ(after[2].dst, Device::cpu());
  EXPECT_EQ(after[2].src, kGpu);
}

TEST(DeviceMemory, CopiesBetweenDevicesKeepEveryBit) {
  DeviceRank rank;
  // A NaN payload and a negative zero survive the round trip: the copies move bytes.
  std::uint32_t nan_bits = 0x7fc00123U;
  float nan_payload = 0;
  std::memcpy(&nan_payload, &nan_bits, sizeof nan_payload);
  const Tensor host = Tensor::from_vector(std::vector<float>{nan_payload, -0.0F, 3.0F});
  const Tensor device = host.to(kGpu);
  EXPECT_TRUE(device.to(Device::cpu()).bitwise_equal(host));
  EXPECT_TRUE(device.to(kGpu).shares_storage(device)) << "to() its own device is itself";
  const Tensor cloned = device.clone();
  EXPECT_FALSE(cloned.shares_storage(device));
  EXPECT_EQ(cloned.device(), kGpu);
  EXPECT_EQ(rank.memory().copies().back().src, kGpu);
  EXPECT_EQ(rank.memory().copies().back().dst, kGpu);
  EXPECT_TRUE(cloned.to(Device::cpu()).bitwise_equal(host));
  EXPECT_TRUE(device.to(DType::Float32).to(Device::cpu()).bitwise_equal(host));
  // A non-contiguous host tensor is packed on the host, then copied.
  const Tensor matrix = Tensor::arange(6, DType::Int32).view({2, 3});
  EXPECT_EQ(matrix.transpose(0, 1).to(kGpu).to(Device::cpu()).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(DeviceMemory, CopyIntoADeviceTensor) {
  DeviceRank rank;
  Tensor device = Tensor::zeros({2, 3}, DType::Int32, kGpu);
  const Tensor host = Tensor::arange(6, DType::Int32).view({3, 2}).transpose(0, 1);
  device.copy_(host);
  EXPECT_EQ(host_values(device.view({6}).to(DType::Int32).to(Device::cpu()).to(DType::Float32)),
            (std::vector<float>{0, 2, 4, 1, 3, 5}));
  Tensor back = Tensor::zeros({2, 3}, DType::Int32);
  back.copy_(device);
  EXPECT_EQ(back.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 2, 4, 1, 3, 5}));
  // Overlapping device ranges read from a private copy.
  Tensor row = device.narrow(0, 0, 1);
  row.copy_(device.narrow(0, 1, 1));
  EXPECT_EQ(device.to(Device::cpu()).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{1, 3, 5, 1, 3, 5}));
}

// One pointer valid on host and device (managed or mapped memory) wrapped twice by from_blob:
// overlapping host source and device destination read from a private copy (it aborted on a
// CHECK: the private copy was asked of a CPU-to-CPU device copy).
TEST(DeviceMemory, AHostSourceOverlappingADeviceDestinationIsReadFromACopy) {
  DeviceRank rank;
  std::vector<std::int32_t> bytes = {0, 1, 2, 3, 4};
  Tensor on_device = Tensor::from_blob(bytes.data(), {5}, DType::Int32, kGpu, [](void*) {});
  const Tensor on_host =
      Tensor::from_blob(bytes.data(), {5}, DType::Int32, Device::cpu(), [](void*) {});
  Tensor head = on_device.narrow(0, 0, 4);
  head.copy_(on_host.narrow(0, 1, 4));
  EXPECT_EQ(bytes, (std::vector<std::int32_t>{1, 2, 3, 4, 4}));
}

// Only the CUDA side must be contiguous (tensor.hpp): a strided host destination is filled from
// a host copy of the device source (it was refused as "writing non-contiguous elements").
TEST(DeviceMemory, ADeviceTensorCopiesIntoAStridedHostTensor) {
  DeviceRank rank;
  const Tensor device = Tensor::arange(6, DType::Int32).to(kGpu).view({2, 3});
  Tensor host = Tensor::zeros({3, 2}, DType::Int32).transpose(0, 1);
  host.copy_(device);
  EXPECT_EQ(host.transpose(0, 1).contiguous().to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 3, 1, 4, 2, 5}));
  Tensor converted = Tensor::zeros({3, 2}, DType::Float32).transpose(0, 1);
  expect_invalid_argument([&] { converted.copy_(device); }, {"converting the dtype"});
}

TEST(DeviceMemory, WhatNeedsADeviceKernelIsRefused) {
  DeviceRank rank;
  const Tensor device = Tensor::arange(6, DType::Int32).to(kGpu).view({2, 3});
  expect_invalid_argument([&] { device.to_vector<std::int32_t>(); },
                          {"host data access", "cuda:0", "to(Device::cpu())"});
  expect_invalid_argument([&] { device.transpose(0, 1).to(Device::cpu()); },
                          {"Tensor::to", "packing the elements", "cuda:0", "[3, 2]"});
  expect_invalid_argument([&] { device.transpose(0, 1).clone(); }, {"Tensor::clone"});
  // Not "copy it to the host with to(Device::cpu()) first": that fails the same way.
  expect_invalid_argument([&] { (void)device.transpose(0, 1).contiguous(); },
                          {"Tensor::contiguous", "packing the elements", "cuda:0"});
  expect_invalid_argument([&] { device.to(DType::Float32); }, {"Tensor::to", "cuda:0"});
  Tensor other = Tensor::zeros({2, 3}, DType::Float32, kGpu);
  expect_invalid_argument([&] { other.copy_(device); },
                          {"Tensor::copy_", "converting the dtype", "device kernel"});
  Tensor strided = Tensor::zeros({3, 2}, DType::Int32, kGpu).transpose(0, 1);
  expect_invalid_argument([&] { strided.copy_(device); },
                          {"Tensor::copy_", "writing non-contiguous elements"});
  expect_invalid_argument([&] { device.to(Device::meta()); }, {"meta tensors carry shapes only"});
}

TEST(DeviceMemory, WaitingADeviceResultOrdersTheStreamAndNeverBlocksTheHost) {
  DeviceRank rank;
  const Tensor input = on_gpu({1, 2, 3, 4});
  const Tensor out = all_reduce(input, "sum", {0});
  EXPECT_EQ(out.device(), kGpu);
  EXPECT_EQ(rank.memory().allocations().back(), 16u) << "the output is device memory";
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  ASSERT_TRUE(out.is_pending());
  // The work is still pending in the transport: a host wait would time out (200 ms) and throw.
  wait_tensor(out);
  EXPECT_EQ(work->stream_waits(), 1);
  EXPECT_EQ(work->waits(), 0) << "the host waited on a device result";
  EXPECT_FALSE(out.is_pending());
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_EQ(work->status(), transport::WorkStatus::Pending);
  // The "stream" runs the collective, then the copy to the host that follows the wait.
  work->complete();
  EXPECT_EQ(host_values(out), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(work->waits(), 0);
}

TEST(DeviceMemory, FirstUseOfADeviceResultWaitsOnTheStream) {
  DeviceRank rank;
  const Tensor out = all_gather_tensor(on_gpu({5, 6}), 0, {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  work->complete();
  EXPECT_EQ(host_values(out), (std::vector<float>{5, 6}));  // to(cpu) is the first use
  EXPECT_EQ(work->stream_waits(), 1);
  EXPECT_EQ(work->waits(), 0);
}

TEST(DeviceMemory, AFailedDeviceCollectiveIsRaisedAtItsWait) {
  DeviceRank rank;
  const Tensor out = all_reduce(on_gpu({1}), "sum", {0});
  rank.transport().last_work()->fail(
      std::make_exception_ptr(TransportError(ErrorContext{0, "all_reduce", 0, "[0]"}, "boom")));
  expect_error<TransportError>([&] { wait_tensor(out); }, {"boom"});
  expect_error<TransportError>([&] { out.to(Device::cpu()); }, {"boom"});
}

TEST(DeviceMemory, InPlaceAndCoalescedDeviceCollectives) {
  DeviceRank rank;
  Tensor tensor = on_gpu({7, 8});
  all_reduce_inplace(tensor, "sum", {0});
  const std::shared_ptr<FakeWork> in_place = rank.transport().last_work();
  EXPECT_EQ(in_place->stream_waits(), 1);
  EXPECT_EQ(in_place->waits(), 0);
  in_place->complete();  // (world 1: the values are the input's either way; the counts matter)

  const std::vector<Tensor> outs = all_reduce_coalesced({on_gpu({1}), on_gpu({2, 3})}, "sum", {0});
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[1].device(), kGpu);
  const std::shared_ptr<FakeWork> batch = rank.transport().last_work();
  wait_tensors(outs);
  EXPECT_EQ(batch->stream_waits(), 1) << "one stream wait for the batch";
  EXPECT_EQ(batch->waits(), 0);
  batch->complete();
  EXPECT_EQ(host_values(outs[1]), (std::vector<float>{2, 3}));

  // The result lands in the caller's tensor by a device copy behind the stream wait.
  rank.transport().completes_on_stream_wait = true;
  Tensor gathered = Tensor::zeros({2}, DType::Float32, kGpu);
  all_gather_tensor_inplace(gathered, on_gpu({4, 5}), {0});
  const std::shared_ptr<FakeWork> gather = rank.transport().last_work();
  EXPECT_EQ(gather->stream_waits(), 1);
  EXPECT_EQ(gather->waits(), 0);
  EXPECT_EQ(host_values(gathered), (std::vector<float>{4, 5}));
}

TEST(DeviceMemory, ADroppedDeviceResultIsFinalizedOnTheStream) {
  DeviceRank rank;
  { const Tensor out = all_reduce(on_gpu({1}), "sum", {0}); }
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  EXPECT_EQ(work->stream_waits(), 1);
  EXPECT_EQ(work->waits(), 0);
  EXPECT_EQ(work->finalizations(), 1);
  EXPECT_EQ(work_registry_size(), 0u);
  work->complete();  // else the rank's exit would wait for it, and time out
}

// Note [Stream-waited works]: after the stream wait, core keeps the transport work (and the buffers
// it keeps alive) until the transport reports it finished.
TEST(DeviceMemory, AStreamWaitedWorkIsKeptUntilItFinishes) {
  DeviceRank rank;
  detail::WorkRegistry& registry = *rank.context().state().registry();
  const Tensor out = all_reduce(on_gpu({1, 2}), "sum", {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  wait_tensor(out);
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u);
  const Tensor next = all_reduce(on_gpu({3}), "sum", {0});  // settles: the first still runs
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u);
  wait_tensor(next);
  EXPECT_EQ(registry.stream_waited_in_flight(), 2u);
  work->complete();
  wait_tensor(out);  // an explicit wait settles too: the first is released, the second runs
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u);
  rank.transport().last_work()->complete();
  wait_tensor(next);
  EXPECT_EQ(registry.stream_waited_in_flight(), 0u);
  { const Tensor dropped = all_reduce(on_gpu({4}), "sum", {0}); }
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u)
      << "a dropped result is finalized on the stream";
  rank.transport().last_work()->complete();
  wait_tensor(out);
  EXPECT_EQ(registry.stream_waited_in_flight(), 0u);
}

// Works on different communicators finish on different streams, in any order: a finished one is
// released even while one waited before it still runs.
TEST(DeviceMemory, AFinishedStreamWaitedWorkIsReleasedWhateverRunsBeforeIt) {
  DeviceRank rank;
  detail::WorkRegistry& registry = *rank.context().state().registry();
  const Tensor first = all_reduce(on_gpu({1}), "sum", {0});
  const std::shared_ptr<FakeWork> first_work = rank.transport().last_work();
  const Tensor second = all_reduce(on_gpu({2, 3}), "sum", {0}, "other");
  const std::shared_ptr<FakeWork> second_work = rank.transport().last_work();
  wait_tensors({first, second});
  EXPECT_EQ(registry.stream_waited_in_flight(), 2u);
  const long held = second_work.use_count();
  second_work->complete();
  EXPECT_EQ(work_registry_size(), 0u);  // settles
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u) << "the finished second work is kept";
  EXPECT_EQ(second_work.use_count(), held - 1);
  first_work->complete();
  EXPECT_EQ(work_registry_size(), 0u);
  EXPECT_EQ(registry.stream_waited_in_flight(), 0u);
}

TEST(DeviceMemory, CoreHoldsTheTransportWorkAfterTheStreamWait) {
  DeviceRank rank;
  const Tensor out = all_reduce(on_gpu({1}), "sum", {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  const long held = work.use_count();  // the test, the transport's list, core's pending work
  wait_tensor(out);
  EXPECT_EQ(work.use_count(), held) << "core let go of a work still running after its wait";
  work->complete();
  wait_tensor(out);  // settles: the finished work is released
  EXPECT_EQ(work.use_count(), held - 1);
}

TEST(DeviceMemory, ACoalescedBatchIsKeptOnceWhateverWaitsIt) {
  DeviceRank rank;
  detail::WorkRegistry& registry = *rank.context().state().registry();
  const std::vector<Tensor> outs =
      all_reduce_coalesced({on_gpu({1}), on_gpu({2}), on_gpu({3})}, "sum", {0});
  wait_tensors(outs);
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u);
  wait_tensors(outs);
  wait_tensor(outs[2]);
  EXPECT_EQ(registry.stream_waited_in_flight(), 1u);
  rank.transport().last_work()->complete();
  wait_tensors(outs);
  EXPECT_EQ(registry.stream_waited_in_flight(), 0u);
}

TEST(DeviceMemory, ADroppedResultFailingAfterItsStreamWaitIsReportedAsDropped) {
  DeviceRank rank;
  { const Tensor dropped = all_reduce(on_gpu({1}), "sum", {0}); }
  rank.transport().last_work()->fail(std::make_exception_ptr(
      TransportError(ErrorContext{0, "all_reduce", 0, "[0]"}, "link down")));
  expect_error<TransportError>(
      [] { wait_tensor(on_gpu({2})); },
      {"the result of all_reduce #0", "was dropped un-waited", "link down"});
  const RankContext::Summary summary = rank.context().finish();
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_NE(summary.unwaited[0].error.find("link down"), std::string::npos)
      << summary.unwaited[0].error;
}

// A result dropped on another thread whose finalization is inside its stream wait when the rank
// exits: the exit finalizes it too (the third loop of complete_all_at_exit), and it stays a drop,
// so the failure that follows reads as one and its report line carries it (the exit kept it as
// a work the program had waited: "was waited on the device stream", and an empty line).
TEST(DeviceMemory, ADropFinalizingElsewhereWhenTheRankExitsIsStillReportedAsADrop) {
  DeviceRank rank;
  Tensor out = all_reduce(on_gpu({1}), "sum", {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  std::mutex mutex;
  std::condition_variable changed;
  bool dropper_in_stream_wait = false;
  bool release_dropper = false;
  work->wait_on_hook = [&] {
    std::unique_lock lock(mutex);
    dropper_in_stream_wait = true;
    changed.notify_all();
    changed.wait(lock, [&] { return release_dropper; });
  };
  std::thread dropper([dropped = std::move(out)]() mutable { dropped = Tensor(); });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return dropper_in_stream_wait; });
  }
  // The exit's own stream wait of the work: the collective fails after it.
  work->wait_on_hook = [&work] {
    work->fail(std::make_exception_ptr(
        TransportError(ErrorContext{0, "all_reduce", 0, "[0]"}, "link down")));
  };
  const RankContext::Summary summary = rank.context().finish();
  {
    const std::lock_guard lock(mutex);
    release_dropper = true;
  }
  changed.notify_all();
  dropper.join();
  ASSERT_NE(summary.error, nullptr);
  expect_error<TransportError>(
      [&] { std::rethrow_exception(summary.error); },
      {"the result of all_reduce #0", "was dropped un-waited", "link down"});
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_FALSE(summary.unwaited[0].at_rank_exit);
  EXPECT_NE(summary.unwaited[0].error.find("link down"), std::string::npos)
      << summary.unwaited[0].error;
}

TEST(DeviceMemory, AResultStillPendingAtTheRanksExitIsWaitedOnTheStreamThenOnTheHost) {
  DeviceRank rank;
  const Tensor kept = all_reduce(on_gpu({1}), "sum", {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  work->complete_when_waited();
  const RankContext::Summary summary = rank.context().finish();
  EXPECT_EQ(work->stream_waits(), 1);
  EXPECT_EQ(work->waits(), 1);
  EXPECT_EQ(summary.error, nullptr);
  ASSERT_EQ(summary.unwaited.size(), 1u);
  EXPECT_TRUE(summary.unwaited[0].at_rank_exit);
}

TEST(DeviceMemory, ACollectiveFailingAfterItsStreamWaitFailsTheRanksNextCall) {
  DeviceRank rank;
  const Tensor out = all_reduce(on_gpu({1}), "sum", {0});
  wait_tensor(out);  // returns: the stream waits, the collective still runs
  rank.transport().last_work()->fail(std::make_exception_ptr(
      TransportError(ErrorContext{0, "all_reduce", 0, "[0]"}, "peer 3 vanished")));
  expect_error<TransportError>([] { (void)all_reduce(on_gpu({2}), "sum", {0}); },
                               {"the result of all_reduce #0", "was waited on the device stream",
                                "failed after that wait: peer 3 vanished"});
  wait_tensor(on_gpu({5}));  // settles again: the error was handed out once
}

TEST(DeviceMemory, TheRanksExitWaitsOnTheHostForStreamWaitedWorks) {
  {
    DeviceRank rank;
    wait_tensor(all_reduce(on_gpu({1}), "sum", {0}));
    const std::shared_ptr<FakeWork> work = rank.transport().last_work();
    work->complete_when_waited();
    const RankContext::Summary summary = rank.context().finish();
    EXPECT_EQ(work->waits(), 1) << "the exit waited on the host";
    EXPECT_EQ(work->status(), transport::WorkStatus::Completed);
    EXPECT_EQ(summary.error, nullptr);
  }
  {
    // Collectives that never finish: the exit waits for all of them under one deadline (the
    // rank's 200 ms timeout), not one timeout each.
    DeviceRank rank;
    for (int i = 0; i < 3; ++i) {
      wait_tensor(all_reduce(on_gpu({1}), "sum", {0}));
    }
    const RankContext::Summary summary = rank.context().finish();
    const std::vector<std::shared_ptr<FakeWork>> works = rank.transport().works();
    ASSERT_EQ(works.size(), 3u);
    for (const std::shared_ptr<FakeWork>& work : works) {
      EXPECT_EQ(work->waits(), 1);
      EXPECT_EQ(work->last_deadline().at, works[0]->last_deadline().at)
          << "the exit gave each work its own timeout";
    }
    ASSERT_NE(summary.error, nullptr);
    expect_error<Timeout>([&] { std::rethrow_exception(summary.error); },
                          {"all_reduce #0", "was waited on the device stream"});
  }
}

TEST(DeviceMemory, DeviceCallsCoreCannotRunAreRefusedBeforeAnythingStarts) {
  DeviceRank rank;
  const Tensor matrix = Tensor::arange(4).view({2, 2}).to(kGpu);
  expect_invalid_argument([&] { all_gather_tensor(matrix, 1, {0}); },
                          {"all_gather along dim 1 on cuda:0", "strided device copy"});
  expect_invalid_argument([&] { reduce_scatter_tensor(matrix, "sum", 1, {0}); },
                          {"reduce_scatter along dim 1 on cuda:0"});
  expect_invalid_argument([&] { all_reduce(matrix.transpose(0, 1), "sum", {0}); },
                          {"non-contiguous cuda:0 tensor", "[2, 2]", "device kernel"});
  expect_invalid_argument(
      [&] {
        all_reduce_coalesced({Tensor::arange(2), matrix}, "sum", {0});
      },
      {"input 1 is on cuda:0 but the inputs before it are on cpu", "one device"});
  Tensor host_out = Tensor::zeros({2, 2});
  expect_invalid_argument([&] { all_gather_tensor_inplace(host_out, matrix, {0}); },
                          {"output is on cpu but the input is on cuda:0"});
  EXPECT_TRUE(rank.transport().works().empty()) << "a refused call started something";
}

// A transport's answers hold for its life (Note [Supported calls]: a rank remembers the last
// yes), so the transport that refuses device buffers is set up so before the rank's first call.
TEST(DeviceMemory, DeviceCallsTheTransportCannotRunAreRefusedBeforeAnythingStarts) {
  DeviceRank rank;
  rank.transport().accepts_cuda_buffers = false;
  const Tensor matrix = Tensor::arange(4).view({2, 2}).to(kGpu);
  expect_invalid_argument(
      [&] { all_reduce(matrix, "sum", {0}); },
      {"transport 'fake' cannot run all_reduce", "on cuda:0", "host memory only"});
  EXPECT_TRUE(rank.transport().works().empty()) << "a refused call started something";
}

// ---- The simulator's simulated CUDA devices (SimOptions::cuda_devices, --sim-cuda)

TEST(SimulatedCuda, EachRankOwnsItsDeviceAndHostAccessIsRefused) {
  sim::SimOptions options;
  options.world_size = 3;
  options.cuda_devices = true;
  std::vector<std::string> seen(3);
  const sim::SimReport report = sim::run(options, [&] {
    const int r = rank();
    std::string& out = seen[static_cast<std::size_t>(r)];
    out += local_device().to_string();
    const Tensor mine =
        Tensor::from_vector(std::vector<float>{1.0f * static_cast<float>(r), 2}).to(local_device());
    const Tensor sum = all_reduce(mine, "sum", world());
    out += " " + sum.device().to_string();
    for (const float value : sum.to(Device::cpu()).to_vector<float>()) {
      out += " " + std::to_string(static_cast<int>(value));
    }
    out += device_memory_allocated() >= 16 ? " counted" : " not counted";
    try {
      (void)sum.to_vector<float>();
      out += " host access allowed";
    } catch (const InvalidArgument&) {
      out += " host access refused";
    }
    // Fresh device memory holds garbage (0xA5 bytes here), as on a GPU.
    const Tensor fresh = Tensor::empty({1}, DType::UInt8, local_device());
    out += " fresh " + std::to_string(fresh.to(Device::cpu()).to_vector<std::uint8_t>()[0]);
    // Another rank's device is refused before anything is numbered.
    const Device other = Device::cuda((r + 1) % 3);
    try {
      (void)all_reduce(Tensor::empty({2}, DType::Float32, other), "sum", world());
      out += " other device allowed";
    } catch (const InvalidArgument& error) {
      out += std::string(error.what())
                         .find("owns cuda:" + std::to_string(r) + ", not " + other.to_string()) !=
                     std::string::npos
                 ? " other device refused"
                 : std::string(" other device refused with: ") + error.what();
    }
    // The group still pairs up.
    out +=
        " then " + std::to_string(static_cast<int>(
                       all_reduce(mine, "max", world()).to(Device::cpu()).to_vector<float>()[0]));
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[static_cast<std::size_t>(r)],
              "cuda:" + std::to_string(r) + " cuda:" + std::to_string(r) +
                  " 3 6 counted host access refused fresh 165 other device refused then 2")
        << "rank " << r;
  }
}

// An infinite timeout (SimOptions::timeout = max) saturates: a stream wait never times out.
TEST(SimulatedCuda, AStreamWaitUnderAnInfiniteTimeoutWaits) {
  sim::SimOptions options;
  options.world_size = 2;
  options.cuda_devices = true;
  options.timeout = std::chrono::nanoseconds::max();
  std::vector<float> sums(2);
  const sim::SimReport report = sim::run(options, [&] {
    const Tensor mine = Tensor::full({1}, rank() + 1, DType::Float32, local_device());
    sums[static_cast<std::size_t>(rank())] =
        wait_tensor(all_reduce(mine, "sum", world())).to(Device::cpu()).to_vector<float>()[0];
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(sums, (std::vector<float>{3, 3}));
}

// The transport itself answers for a device: its rank's own, yes; another rank's, no, naming both
// (tensors on another rank's device are refused earlier, by the rank's device memory).
TEST(SimulatedCuda, TheTransportRefusesAnotherRanksDeviceNamingBoth) {
  sim::SimOptions options;
  options.world_size = 3;
  options.cuda_devices = true;
  std::vector<std::string> own(3);
  std::vector<std::string> other(3);
  const sim::SimReport report = sim::run(options, [&] {
    const int r = rank();
    own[static_cast<std::size_t>(r)] = unsupported_reduction(DType::Float32, "sum", local_device());
    other[static_cast<std::size_t>(r)] =
        unsupported_reduction(DType::Float32, "sum", Device::cuda((r + 1) % 3));
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(own, (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(other, (std::vector<std::string>{"simulated rank 0 owns cuda:0, not cuda:1",
                                             "simulated rank 1 owns cuda:1, not cuda:2",
                                             "simulated rank 2 owns cuda:2, not cuda:0"}));
}

TEST(SimulatedCuda, WithoutItTheSimulatorMovesHostMemoryOnly) {
  sim::SimOptions options;
  options.world_size = 2;
  std::vector<std::string> seen(2);
  const sim::SimReport report = sim::run(options, [&] {
    std::string& out = seen[static_cast<std::size_t>(rank())];
    out = local_device().to_string();
    try {
      (void)Tensor::empty({1}, DType::Float32, Device::cuda(0));
    } catch (const InvalidArgument& error) {
      out += std::string(error.what()).find("no memory for cuda:0") != std::string::npos
                 ? " no device memory"
                 : error.what();
    }
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(seen, (std::vector<std::string>{"cpu no device memory", "cpu no device memory"}));
}

// The refusal names the rank that asked, whichever rank of the world it is.
TEST(SimulatedCuda, WithoutItTheRefusalOfADeviceTensorNamesTheRankThatAskedForIt) {
  sim::SimOptions options;
  options.world_size = 3;
  std::vector<std::string> details(3);
  const sim::SimReport report = sim::run(options, [&] {
    try {
      (void)Tensor::zeros({2}, DType::Float32, Device::cuda(0));
    } catch (const InvalidArgument& error) {
      details[static_cast<std::size_t>(rank())] = error.detail();
    }
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(details[static_cast<std::size_t>(r)],
              "rank " + std::to_string(r) +
                  " on transport 'sim' has no memory for cuda:0 (RankOptions::device_memory; the "
                  "NCCL launcher installs one): wrap existing device memory with "
                  "Tensor::from_blob");
  }
}

// Note [Current stream]: stream handles are opaque to core; these stand for two user streams.
void* const kStreamA = reinterpret_cast<void*>(std::uintptr_t{0xA0});
void* const kStreamB = reinterpret_cast<void*>(std::uintptr_t{0xB0});

TEST(CurrentStream, IsTheLegacyDefaultUntilSetAndAGuardRestoresIt) {
  DeviceRank rank;
  EXPECT_EQ(current_stream(kGpu), nullptr);
  set_current_stream(kGpu, kStreamA);
  EXPECT_EQ(current_stream(kGpu), kStreamA);
  EXPECT_EQ(current_stream(Device::cuda(1)), nullptr) << "each device has its own";
  {
    const StreamGuard guard(kGpu, kStreamB);
    EXPECT_EQ(guard.previous(), kStreamA);
    EXPECT_EQ(current_stream(kGpu), kStreamB);
    {
      const StreamGuard inner(kGpu, nullptr);
      EXPECT_EQ(current_stream(kGpu), nullptr);
    }
    EXPECT_EQ(current_stream(kGpu), kStreamB);
  }
  EXPECT_EQ(current_stream(kGpu), kStreamA);
  set_current_stream(kGpu, nullptr);
  EXPECT_EQ(current_stream(kGpu), nullptr);
}

TEST(CurrentStream, IsRefusedOutsideARankAndForDevicesWithoutStreams) {
  expect_invalid_argument([] { (void)current_stream(kGpu); },
                          {"current_stream", "called outside a rank"});
  expect_invalid_argument([] { set_current_stream(kGpu, kStreamA); },
                          {"set_current_stream", "called outside a rank"});
  expect_invalid_argument([] { const StreamGuard guard(kGpu, kStreamA); },
                          {"StreamGuard", "called outside a rank"});
  DeviceRank rank;
  expect_invalid_argument([] { set_current_stream(Device::cpu(), kStreamA); },
                          {"set_current_stream", "cpu has none", "Device::cuda(i)"});
  expect_invalid_argument([] { (void)current_stream(Device::meta()); },
                          {"current_stream", "meta has none"});
  expect_invalid_argument([] { set_current_stream(Device::cuda(-1), kStreamA); },
                          {"set_current_stream", "no such device cuda:-1", "0 to 1023"});
  expect_invalid_argument([] { const StreamGuard guard(Device::cuda(1 << 30), kStreamA); },
                          {"StreamGuard", "no such device"});
}

// The streams a rank set may be gone once its function returned: what it left pending is
// completed on the legacy default stream (then on the host).
TEST(CurrentStream, TheRanksExitCompletesWhatIsPendingOnTheLegacyStream) {
  DeviceRank rank;
  rank.transport().completes_on_stream_wait = true;
  set_current_stream(kGpu, kStreamA);
  const Tensor out = all_reduce(on_gpu({1, 2}), "sum", {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  EXPECT_EQ(work->started_on_stream, kStreamA);
  const RankContext::Summary summary = rank.context().finish();
  EXPECT_EQ(summary.error, nullptr);
  EXPECT_EQ(work->stream_waits(), 1);
  EXPECT_EQ(work->last_stream_waited(), nullptr);
  EXPECT_EQ(rank.context().state().streams()->get(0), nullptr);
}

// A rank's streams start unset whatever the rank before it on the thread set (their block is
// recycled: Note [Recycled blocks]), and reset() clears a stream set through a guard as well as
// one set directly, when the rank ends without finish() too (~RankContext).
TEST(CurrentStream, ANewRankStartsOnTheLegacyStreamWhateverTheRankBeforeItSet) {
  std::shared_ptr<detail::CurrentStreams> ended;  // the streams of the rank before, kept
  for (int round = 0; round < 3; ++round) {
    if (ended != nullptr) {
      EXPECT_EQ(ended->get(0), nullptr) << "round " << round << ": reset as the rank before ended";
    }
    DeviceRank rank;
    EXPECT_EQ(current_stream(kGpu), nullptr) << "round " << round;
    EXPECT_EQ(current_stream(Device::cuda(1)), nullptr) << "round " << round;
    set_current_stream(kGpu, kStreamA);
    const StreamGuard guard(Device::cuda(1), kStreamB);
    ended = rank.context().state().streams();
    if (round == 0) {
      (void)rank.context().finish();
      EXPECT_EQ(ended->get(0), nullptr);
      EXPECT_EQ(ended->get(1), nullptr);
    }
  }
  EXPECT_EQ(ended->get(0), nullptr) << "reset as the last rank ended";
}

TEST(CurrentStream, OrdersDeviceMemoryCollectivesAndWaits) {
  DeviceRank rank;
  set_current_stream(kGpu, kStreamA);
  const Tensor input = on_gpu({1, 2, 3, 4});
  ASSERT_EQ(rank.memory().allocation_streams(), (std::vector<void*>{kStreamA}));
  ASSERT_EQ(rank.memory().copies().size(), 1u);
  EXPECT_EQ(rank.memory().copies()[0].stream, kStreamA) << "the host-to-device copy";

  const Tensor out = all_reduce(input, "sum", {0});
  const std::shared_ptr<FakeWork> work = rank.transport().last_work();
  EXPECT_EQ(work->started_on_stream, kStreamA) << "the collective starts after stream A's work";
  EXPECT_EQ(rank.memory().allocation_streams().back(), kStreamA) << "the output";

  // Waited under another stream: that one waits (the stream current when the wait runs).
  {
    const StreamGuard guard(kGpu, kStreamB);
    wait_tensor(out);
  }
  EXPECT_EQ(work->stream_waits(), 1);
  EXPECT_EQ(work->last_stream_waited(), kStreamB);
  EXPECT_EQ(work->waits(), 0);
  work->complete();

  EXPECT_EQ(host_values(out), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(rank.memory().copies().back().stream, kStreamA) << "the device-to-host copy";
  (void)Tensor::zeros({2}, DType::Float32, kGpu);
  EXPECT_EQ(rank.memory().zero_streams(), (std::vector<void*>{kStreamA}));

  // Back on the legacy default stream, which core passes as null.
  set_current_stream(kGpu, nullptr);
  const Tensor again = all_reduce(input, "sum", {0});
  EXPECT_EQ(rank.transport().last_work()->started_on_stream, nullptr);
  rank.transport().last_work()->complete();
  EXPECT_EQ(host_values(again), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(rank.transport().last_work()->last_stream_waited(), nullptr);
}

// Each device has its own current stream: a factory's fill and the copies of a tensor on cuda:1
// are ordered on cuda:1's stream, not on another device's.
TEST(CurrentStream, FactoriesAndCopiesOnADeviceUseThatDevicesStream) {
  DeviceRank rank;
  const Device second = Device::cuda(1);
  set_current_stream(kGpu, kStreamA);
  set_current_stream(second, kStreamB);
  const Tensor zeros = Tensor::zeros({2}, DType::Float32, second);
  EXPECT_EQ(rank.memory().allocation_streams(), (std::vector<void*>{kStreamB}));
  EXPECT_EQ(rank.memory().zero_streams(), (std::vector<void*>{kStreamB}));
  const Tensor copied = Tensor::from_vector(std::vector<float>{1, 2}).to(second);
  ASSERT_EQ(rank.memory().copies().size(), 1u);
  EXPECT_EQ(rank.memory().copies()[0].stream, kStreamB) << "the host-to-device copy";
  EXPECT_EQ(host_values(copied), (std::vector<float>{1, 2}));
  ASSERT_EQ(rank.memory().copies().size(), 2u);
  EXPECT_EQ(rank.memory().copies()[1].stream, kStreamB) << "the device-to-host copy";
  EXPECT_EQ(host_values(zeros), (std::vector<float>{0, 0}));
}

TEST(CurrentStream, ACoalescedBatchAndADroppedResultUseIt) {
  DeviceRank rank;
  const StreamGuard guard(kGpu, kStreamA);
  const std::vector<Tensor> outs = all_reduce_coalesced({on_gpu({1}), on_gpu({2, 3})}, "sum", {0});
  const std::shared_ptr<FakeWork> batch = rank.transport().last_work();
  EXPECT_EQ(batch->started_on_stream, kStreamA);
  {
    const Tensor dropped = all_reduce(on_gpu({5}), "sum", {0});
  }  // finalized at the drop: the stream current then waits on it
  const std::shared_ptr<FakeWork> dropped_work = rank.transport().last_work();
  EXPECT_EQ(dropped_work->stream_waits(), 1);
  EXPECT_EQ(dropped_work->last_stream_waited(), kStreamA);
  set_current_stream(kGpu, kStreamB);
  wait_tensors(outs);
  EXPECT_EQ(batch->stream_waits(), 1);
  EXPECT_EQ(batch->last_stream_waited(), kStreamB);
  EXPECT_EQ(dropped_work->stream_waits(), 1);
  batch->complete();
  dropped_work->complete();
}

TEST(CurrentStream, HostCollectivesIgnoreIt) {
  DeviceRank rank;
  const StreamGuard guard(kGpu, kStreamA);
  const Tensor out = all_reduce(Tensor::from_vector(std::vector<float>{7}), "sum", {0});
  EXPECT_EQ(rank.transport().last_work()->started_on_stream, nullptr);
  rank.transport().last_work()->complete();
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{7}));
}

// The setting is the rank's: simulated ranks share one thread, and each keeps its own across
// the switches between them. The simulator's devices accept and ignore streams.
TEST(CurrentStream, EachSimulatedRankHasItsOwn) {
  sim::SimOptions options;
  options.world_size = 2;
  options.cuda_devices = true;
  std::vector<std::string> seen(2);
  const sim::SimReport report = sim::run(options, [&] {
    const int r = rank();
    void* const mine = r == 0 ? kStreamA : nullptr;
    if (mine != nullptr) {
      set_current_stream(local_device(), mine);
    }
    const Tensor input = Tensor::full({1}, r + 1, DType::Float32, local_device());
    for (int i = 0; i < 3; ++i) {  // collectives switch between the ranks
      const Tensor sum = wait_tensor(all_reduce(input, "sum", world()));
      seen[static_cast<std::size_t>(r)] +=
          std::to_string(static_cast<int>(sum.to(Device::cpu()).to_vector<float>()[0])) +
          (current_stream(local_device()) == mine ? " kept " : " lost ");
    }
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(seen, (std::vector<std::string>{"3 kept 3 kept 3 kept ", "3 kept 3 kept 3 kept "}));
}

// A failure raised at its own wait is handed out once: the registry keeps no stream wait for it,
// and the rank's next call does not raise it again.
TEST(DeviceMemory, AFailedDeviceCollectiveRaisedAtItsWaitIsNotRaisedAgain) {
  DeviceRank rank;
  const Tensor out = all_reduce(on_gpu({1}), "sum", {0});
  rank.transport().last_work()->fail(
      std::make_exception_ptr(TransportError(ErrorContext{0, "all_reduce", 0, "[0]"}, "boom")));
  expect_error<TransportError>([&] { wait_tensor(out); }, {"boom"});
  EXPECT_EQ(rank.context().state().registry()->stream_waited_in_flight(), 0u);
  const Tensor next = all_reduce(on_gpu({2}), "sum", {0});  // must not raise "boom" again
  rank.transport().last_work()->complete();
  EXPECT_EQ(host_values(next), (std::vector<float>{2}));
  EXPECT_EQ(rank.context().finish().error, nullptr);
}

// Two waiters on one stream-waited work: the one that retired it saw its stream wait succeed; the
// other saw the failure that came after and raises it. The settle after that must not raise it a
// second time (StreamWaited::reported).
TEST(DeviceMemory, AStreamFailureRaisedToTheSecondWaiterIsNotRaisedAgain) {
  DeviceRank rank;
  const Tensor first = all_reduce(on_gpu({1}), "sum", {0});
  const std::shared_ptr<FakeWork> first_work = rank.transport().last_work();
  const Tensor second = all_reduce(on_gpu({2}), "sum", {0});
  const std::shared_ptr<FakeWork> second_work = rank.transport().last_work();
  first_work->wait_on_hook = [&] {
    // While wait_tensors is inside the first work's stream wait: another wait of `second`
    // orders the stream and retires it, then the collective fails.
    wait_tensor(second);
    second_work->fail(std::make_exception_ptr(
        TransportError(ErrorContext{0, "all_reduce", 1, "[0]"}, "link down")));
  };
  expect_error<TransportError>([&] { (void)wait_tensors({first, second}); }, {"link down"});
  first_work->complete();
  const Tensor next = all_reduce(on_gpu({3}), "sum", {0});  // must not raise "link down" again
  rank.transport().last_work()->complete();
  EXPECT_EQ(host_values(next), (std::vector<float>{3}));
  EXPECT_EQ(rank.context().finish().error, nullptr);
}
}  // namespace
}  // namespace chorus
