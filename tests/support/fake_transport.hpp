#pragma once

// A transport for core unit tests that completes nothing on its own: every started operation
// waits until the test completes (or fails) it by hand, from any thread. One rank, world size 1:
// completing an operation copies each send buffer to its receive buffer (the result of every
// collective on a group of one).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/transport/transport.hpp"

namespace chorus::testing {

// The fake transport's virtual clock (FakeTransport::use_virtual_clock): nanoseconds.
using VirtualClock = std::atomic<transport::Duration::rep>;

class FakeWork final : public transport::Work {
 public:
  FakeWork(transport::Fingerprint fingerprint,
           std::vector<std::pair<transport::Buffer, transport::Buffer>> copies)
      : fingerprint_(std::move(fingerprint)), copies_(std::move(copies)) {}

  bool is_completed() override { return status() != transport::WorkStatus::Pending; }

  void wait(transport::Deadline deadline) override {
    if (complete_when_waited_.exchange(false)) {
      complete();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ++waits_;
    last_deadline_ = deadline;
    if (virtual_clock != nullptr && !deadline.is_never() &&
        status_ == transport::WorkStatus::Pending) {
      // Nothing else can complete it meanwhile: the wait times out at once, and the clock moves
      // on to its deadline (never back), as the simulator's clock jumps when nothing can run.
      transport::Duration::rep now = virtual_clock->load();
      while (now < deadline.at.count() &&
             !virtual_clock->compare_exchange_weak(now, deadline.at.count())) {
      }
      throw Timeout(ErrorContext{0, "fake", fingerprint_.seq, ""}, "fake work timed out");
    }
    const auto until = std::chrono::steady_clock::time_point(
        deadline.is_never() ? std::chrono::hours(1000000) : deadline.at);
    if (!done_.wait_until(lock, until, [&] { return status_ != transport::WorkStatus::Pending; })) {
      throw Timeout(ErrorContext{0, "fake", fingerprint_.seq, ""}, "fake work timed out");
    }
    if (error_) {
      std::rethrow_exception(error_);
    }
  }

  // Counts the stream waits core made (Completion::Stream); the work stays as it is, as a real
  // stream wait does not complete anything on the host.
  void wait_on(void* stream) override {
    last_stream_waited_.store(stream);
    stream_waits_.fetch_add(1);
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hook = std::exchange(wait_on_hook, nullptr);
    }
    if (hook) {
      hook();  // once, on the waiting thread, inside core's stream wait (no core lock held)
    }
    if (complete_on_stream_wait_.load()) {
      complete();
    }
  }
  // A stream wait completes the work: the "stream" runs the collective before what follows the
  // wait, as a real one does (a test that proves the host does not wait leaves this off).
  void complete_on_stream_wait() { complete_on_stream_wait_.store(true); }
  int stream_waits() const { return stream_waits_.load(); }
  // The stream of the last stream wait (Note [Current stream]; null: the legacy default).
  void* last_stream_waited() const { return last_stream_waited_.load(); }
  // OpInfo::stream of the operation (or batch) that started the work.
  void* started_on_stream = nullptr;
  // The transport's virtual clock, if it has one (FakeTransport::use_virtual_clock); set before
  // the work is shared.
  std::shared_ptr<VirtualClock> virtual_clock;

  transport::WorkStatus status() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  std::exception_ptr error() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  const transport::Fingerprint& fingerprint() const override { return fingerprint_; }

  // Moves the bytes, marks the work completed and lets go of the buffers, as a real transport
  // does once its operation completed (Note [Pending storage]): their memory may then return to
  // the rank's pool, so a test sees the address reuse a real run sees.
  void complete() {
    std::vector<std::pair<transport::Buffer, transport::Buffer>> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [send, recv] : copies_) {
        if (send.nbytes() > 0) {
          std::memmove(recv.data, send.data, send.nbytes());
        }
      }
      released.swap(copies_);  // a second complete() moves nothing
      status_ = transport::WorkStatus::Completed;
      done_.notify_all();
    }
  }

  void fail(std::exception_ptr error) {
    std::vector<std::pair<transport::Buffer, transport::Buffer>> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released.swap(copies_);
      error_ = std::move(error);
      status_ = transport::WorkStatus::Failed;
      done_.notify_all();
    }
  }

  // The first wait completes the work itself: proof that an access really reached the
  // transport's wait, without a race against another thread.
  void complete_when_waited() { complete_when_waited_.store(true); }

  int waits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waits_;
  }
  // The deadline of the last host wait.
  transport::Deadline last_deadline() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_deadline_;
  }

  // The lifecycle hooks core called (Note [Work lifecycle]): how often, and the last arguments.
  void on_dropped() const noexcept override { drops_.fetch_add(1); }
  void on_finalized(bool at_rank_exit, bool failed) const noexcept override {
    finalized_at_rank_exit_.store(at_rank_exit);
    finalized_failed_.store(failed);
    finalizations_.fetch_add(1);
    if (on_finalized_hook) {
      on_finalized_hook();  // e.g. hold a finalizing thread here, between completion and record
    }
  }
  // Runs inside on_finalized (set it before the work can be finalized; it must not throw).
  std::function<void()> on_finalized_hook;
  // Runs once inside the next wait_on (set it before the work is waited).
  std::function<void()> wait_on_hook;
  // Whether core should defer finalizing this work when dropped (transport::Work's hook), and
  // how often core asked.
  bool defer_finalization() const noexcept override {
    defer_asked_.fetch_add(1);
    return defer_when_dropped_.load();
  }
  void defer_finalization_when_dropped() { defer_when_dropped_.store(true); }
  int defer_asked() const { return defer_asked_.load(); }
  int drops() const { return drops_.load(); }
  int finalizations() const { return finalizations_.load(); }
  bool finalized_at_rank_exit() const { return finalized_at_rank_exit_.load(); }
  bool finalized_failed() const { return finalized_failed_.load(); }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_;
  transport::WorkStatus status_ = transport::WorkStatus::Pending;
  std::exception_ptr error_;
  int waits_ = 0;
  transport::Deadline last_deadline_;
  std::atomic<bool> complete_when_waited_{false};
  std::atomic<int> stream_waits_{0};
  std::atomic<void*> last_stream_waited_{nullptr};
  std::atomic<bool> complete_on_stream_wait_{false};
  std::atomic<bool> defer_when_dropped_{false};
  mutable std::atomic<int> defer_asked_{0};
  mutable std::atomic<int> drops_{0};
  mutable std::atomic<int> finalizations_{0};
  mutable std::atomic<bool> finalized_at_rank_exit_{false};
  mutable std::atomic<bool> finalized_failed_{false};
  transport::Fingerprint fingerprint_;
  std::vector<std::pair<transport::Buffer, transport::Buffer>> copies_;
};

class FakeTransport;

class FakeComm final : public transport::Comm {
 public:
  FakeComm(FakeTransport& owner, std::string tag, std::vector<int> ranks)
      : owner_(owner), tag_(std::move(tag)), ranks_(std::move(ranks)) {}

  std::uint64_t id() const noexcept override { return 1; }
  const std::string& tag() const noexcept override { return tag_; }
  const std::vector<int>& ranks() const noexcept override { return ranks_; }
  int group_rank() const noexcept override { return 0; }

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv, const ReduceOp&,
                                              const transport::OpInfo& info) override {
    return add(send, recv, info);
  }
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override {
    return add(send, recv, info);
  }
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv, const ReduceOp&,
                                                  const transport::OpInfo& info) override {
    return add(send, recv, info);
  }
  // One rank: every op copies send to recv.
  std::shared_ptr<transport::Work> all_to_all(const transport::Buffer& send,
                                              const std::vector<std::size_t>&,
                                              const transport::Buffer& recv,
                                              const std::vector<std::size_t>&,
                                              const transport::OpInfo& info) override {
    return add(send, recv, info);
  }
  std::shared_ptr<transport::Work> broadcast(const transport::Buffer& send,
                                             const transport::Buffer& recv, int,
                                             const transport::OpInfo& info) override {
    return add(send, recv, info);
  }
  std::shared_ptr<transport::Work> reduce(const transport::Buffer& send,
                                          const transport::Buffer& recv, const ReduceOp&, int,
                                          const transport::OpInfo& info) override {
    return add(send, recv, info);
  }
  void begin_group() override { batching_ = true; }
  std::shared_ptr<transport::Work> end_group(const transport::OpInfo& info) override;

 private:
  std::shared_ptr<transport::Work> add(const transport::Buffer& send, const transport::Buffer& recv,
                                       const transport::OpInfo& info);

  FakeTransport& owner_;
  std::string tag_;
  std::vector<int> ranks_;
  bool batching_ = false;
  std::vector<std::pair<transport::Buffer, transport::Buffer>> batch_;
};

// By default rank 0 of a world of 1; a test of group set-up may place it elsewhere (its works
// still complete as on a group of one: send copied to receive).
class FakeTransport final : public transport::Transport {
 public:
  explicit FakeTransport(int rank = 0, int world_size = 1) : rank_(rank), world_size_(world_size) {}

  std::string_view name() const noexcept override { return "fake"; }
  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override {
    ++comms_created;
    return std::make_shared<FakeComm>(*this, tag, ranks);
  }
  // Records the call (Note [Partitioned groups]), then the default behaviour.
  std::shared_ptr<transport::Comm> create_partition_comm(
      const std::string& tag, const transport::Partition& partition,
      const std::shared_ptr<transport::Comm>& existing) override {
    partition_calls.push_back(PartitionCall{tag, partition, existing != nullptr});
    std::shared_ptr<transport::Comm> comm =
        Transport::create_partition_comm(tag, partition, existing);
    ++partitions_created;
    return comm;
  }
  struct PartitionCall {
    std::string tag;
    transport::Partition partition;
    bool had_existing = false;
  };
  transport::Duration now() override {
    if (virtual_clock_ != nullptr) {
      return transport::Duration(virtual_clock_->load());
    }
    return std::chrono::steady_clock::now().time_since_epoch();
  }
  // From now on now() reads a virtual clock starting at 0, and a host wait (with a deadline) on a
  // work recorded from then on that is still pending times out at once, moving the clock to its
  // deadline: a test of deadlines reads the time they cost without sleeping. Call before the
  // works are started.
  void use_virtual_clock() { virtual_clock_ = std::make_shared<VirtualClock>(0); }
  std::string supports(transport::OpKind, DType, const ReduceOp&, Device device) const override {
    return device.is_cpu() || (device.is_cuda() && accepts_cuda_buffers)
               ? std::string()
               : std::string("host memory only");
  }

  // What device() reports (chorus::local_device).
  Device local_device = Device::cpu();
  Device device() const noexcept override { return local_device; }

  // Whether the works started from now on complete at their first stream wait
  // (FakeWork::complete_on_stream_wait).
  bool completes_on_stream_wait = false;
  // Whether CUDA buffers are accepted (tests of core's device path, whose "device" memory is host
  // memory: completing a work still copies the bytes on the host). Set it before the rank's first
  // collective: supports() must answer the same for its life, as a rank remembers its last yes
  // (Note [Supported calls]).
  bool accepts_cuda_buffers = false;

  // Every work started so far, in order.
  std::vector<std::shared_ptr<FakeWork>> works() {
    std::lock_guard<std::mutex> lock(mutex);
    return works_;
  }
  std::shared_ptr<FakeWork> last_work() {
    std::lock_guard<std::mutex> lock(mutex);
    return works_.back();
  }
  void record(std::shared_ptr<FakeWork> work) {
    if (completes_on_stream_wait) {
      work->complete_on_stream_wait();
    }
    work->virtual_clock = virtual_clock_;
    {
      std::lock_guard<std::mutex> lock(mutex);
      works_.push_back(std::move(work));
    }
    if (on_started) {
      on_started();  // the operation has started: what core does from here on must not fail
    }
  }
  // Runs once each work is started (recorded), before the transport's call returns it.
  std::function<void()> on_started;
  // Runs first in each call that starts operations or adds one to a batch (core has handed the
  // operation over).
  std::function<void()> on_call;

  int comms_created = 0;  // create_comm calls, the partition default's included
  std::vector<PartitionCall> partition_calls;
  int partitions_created = 0;  // create_partition_comm calls that returned a communicator
  std::mutex mutex;

 private:
  int rank_;
  int world_size_;
  std::vector<std::shared_ptr<FakeWork>> works_;
  std::shared_ptr<VirtualClock> virtual_clock_;  // null: the steady clock
};

inline std::shared_ptr<transport::Work> FakeComm::add(const transport::Buffer& send,
                                                      const transport::Buffer& recv,
                                                      const transport::OpInfo& info) {
  if (owner_.on_call) {
    owner_.on_call();
  }
  if (batching_) {
    batch_.emplace_back(send, recv);
    return nullptr;
  }
  auto work = std::make_shared<FakeWork>(
      transport::Fingerprint{1, info.seq, {}},
      std::vector<std::pair<transport::Buffer, transport::Buffer>>{{send, recv}});
  work->started_on_stream = info.stream;
  owner_.record(work);
  return work;
}

inline std::shared_ptr<transport::Work> FakeComm::end_group(const transport::OpInfo& info) {
  if (owner_.on_call) {
    owner_.on_call();
  }
  batching_ = false;
  auto work =
      std::make_shared<FakeWork>(transport::Fingerprint{1, info.seq, {}}, std::move(batch_));
  batch_.clear();
  work->started_on_stream = info.stream;
  owner_.record(work);
  return work;
}

}  // namespace chorus::testing
