// The OS-thread rank executor (Note [Rank executor]): one thread per rank, handing a baton back
// and forth with the scheduler through a per-rank atomic (futex wait/notify).

#include "executor.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include "chorus/check.hpp"

namespace chorus::sim::detail {
namespace {

thread_local int contexts_left = -1;  // RefuseContextsAfter's count on this thread (-1: none)

class ThreadExecutor final : public RankExecutor {
 public:
  ~ThreadExecutor() override { stop(); }

  void start(int count, std::function<void(int)> body) override {
    CHORUS_CHECK(lanes_.empty() && threads_.empty());
    body_ = std::move(body);
    try {
      make_lanes(count);
    } catch (...) {
      end_made_lanes();
      throw;
    }
  }

  void resume(int rank) override {
    Lane& lane = lanes_.at(static_cast<std::size_t>(rank));
    CHORUS_CHECK_EQ(lane.state.load(std::memory_order_acquire), kParked);
    lane.state.store(kRunning, std::memory_order_release);
    lane.state.notify_one();
    lane.state.wait(kRunning, std::memory_order_acquire);  // until parked again or finished
  }

  void suspend(int rank) override {
    Lane& lane = lanes_.at(static_cast<std::size_t>(rank));
    CHORUS_CHECK_EQ(lane.state.load(std::memory_order_relaxed), kRunning);
    lane.state.store(kParked, std::memory_order_release);
    lane.state.notify_one();
    lane.state.wait(kParked, std::memory_order_acquire);  // until resumed
  }

  bool finished(int rank) const override {
    return lanes_.at(static_cast<std::size_t>(rank)).state.load(std::memory_order_acquire) ==
           kFinished;
  }

  void stop() override {
    for (std::size_t r = 0; r < threads_.size(); ++r) {
      CHORUS_CHECK(lanes_[r].state.load(std::memory_order_acquire) == kFinished);
      threads_[r].join();
    }
    threads_.clear();
    lanes_.clear();
  }

 private:
  static constexpr std::uint32_t kParked = 0;
  static constexpr std::uint32_t kRunning = 1;
  static constexpr std::uint32_t kFinished = 2;

  struct Lane {
    std::atomic<std::uint32_t> state{kParked};
  };

  void make_lanes(int count) {
    lanes_ = std::vector<Lane>(static_cast<std::size_t>(count));
    threads_.reserve(static_cast<std::size_t>(count));
    for (int rank = 0; rank < count; ++rank) {
      if (RefuseContextsAfter::refuses_next()) {
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                                "thread refused (RefuseContextsAfter)");
      }
      threads_.emplace_back([this, rank] { run_lane(rank); });
    }
  }

  // After make_lanes failed: the threads made are parked before their body, and each runs to its
  // end without it. The executor is empty again.
  void end_made_lanes() {
    cancelled_ = true;
    for (std::size_t r = 0; r < threads_.size(); ++r) {
      resume(static_cast<int>(r));
    }
    stop();
    cancelled_ = false;
  }

  void run_lane(int rank) {
    Lane& lane = lanes_[static_cast<std::size_t>(rank)];
    lane.state.wait(kParked, std::memory_order_acquire);  // until first resumed
    if (!cancelled_) {  // written before the resume that woke this thread
      body_(rank);
    }
    lane.state.store(kFinished, std::memory_order_release);
    lane.state.notify_one();
  }

  std::function<void(int)> body_;
  std::vector<Lane> lanes_;
  std::vector<std::thread> threads_;
  bool cancelled_ = false;  // start() failed: lanes end without their body
};

}  // namespace

RefuseContextsAfter::RefuseContextsAfter(int made) {
  CHORUS_CHECK(made >= 0);
  CHORUS_CHECK(contexts_left < 0);  // one at a time
  contexts_left = made;
}

RefuseContextsAfter::~RefuseContextsAfter() { contexts_left = -1; }

bool RefuseContextsAfter::refuses_next() noexcept {
  if (contexts_left < 0) {
    return false;
  }
  if (contexts_left == 0) {
    return true;
  }
  --contexts_left;
  return false;
}

std::unique_ptr<RankExecutor> make_thread_executor() { return std::make_unique<ThreadExecutor>(); }

ExecutorKind resolve_executor(ExecutorKind kind) noexcept {
  // Fibers in every build: the sanitizers follow them (Note [Fibers under TSan]).
  return kind == ExecutorKind::Auto ? ExecutorKind::Fibers : kind;
}

}  // namespace chorus::sim::detail
