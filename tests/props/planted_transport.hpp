#pragma once

// Transports with planted bugs, wrapped around the simulator's (SimOptions::wrap_transport), to
// prove that the property battery fails when the transport underneath is wrong.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/transport/transport.hpp"
#include "support/forwarding_transport.hpp"

namespace chorus::testing {

enum class PlantedBug {
  // On one rank, an all_reduce result of at least kLargeResult elements has the lowest bit of its
  // last element flipped when the work completes: what a different reduction order gives on
  // inexact inputs, for large enough buffers only (so the minimal counterexample has to be found
  // by shrinking).
  LastBitOnOneRank,
  // On one rank, each all_reduce reports completion at once: wait() returns before the data is
  // written (the reader sees the simulator's poison).
  CompletesBeforeData,
  // On one rank, each Float32 all_reduce of at least kLargeResult elements contributes a copy of
  // its input whose last element has the top mantissa bit flipped (2 becomes 3): every rank's
  // result is wrong in that element, whatever the schedule.
  WrongLastContribution,
  // On one rank, each reduce of which it is not the root has the lowest bit of its output's last
  // element flipped when the work completes: the output off the root, which must stay zeros, is
  // written.
  ReduceWritesOffRoot,
  // On one rank, each all_reduce has the lowest bit of its input's last element flipped when the
  // work completes: after the simulator's checksum of the input at completion (Note [Buffer
  // checks]), so only the property's own comparison of the input sees it.
  WritesInputOnCompletion,
};

inline constexpr std::size_t kLargeResult = 4;

class PlantedWork final : public transport::Work {
 public:
  PlantedWork(std::shared_ptr<transport::Work> inner, PlantedBug bug, transport::Buffer recv,
              std::shared_ptr<std::vector<float>> contribution = nullptr)
      : inner_(std::move(inner)),
        bug_(bug),
        recv_(std::move(recv)),
        contribution_(std::move(contribution)) {}

  bool is_completed() override {
    if (bug_ == PlantedBug::CompletesBeforeData) {
      return true;
    }
    const bool completed = inner_->is_completed();
    if (completed) {
      corrupt_once();
    }
    return completed;
  }
  void wait(transport::Deadline deadline) override {
    if (bug_ == PlantedBug::CompletesBeforeData) {
      return;
    }
    inner_->wait(deadline);
    corrupt_once();
  }
  void wait_on(void* stream) override { inner_->wait_on(stream); }
  transport::WorkStatus status() const override {
    return bug_ == PlantedBug::CompletesBeforeData ? transport::WorkStatus::Completed
                                                   : inner_->status();
  }
  std::exception_ptr error() const override { return inner_->error(); }
  const transport::Fingerprint& fingerprint() const override { return inner_->fingerprint(); }
  void on_dropped() const noexcept override { inner_->on_dropped(); }
  void on_finalized(bool at_rank_exit, bool failed) const noexcept override {
    inner_->on_finalized(at_rank_exit, failed);
  }
  bool defer_finalization() const noexcept override { return inner_->defer_finalization(); }

 private:
  void corrupt_once() {
    const bool flips = bug_ == PlantedBug::ReduceWritesOffRoot ||
                       bug_ == PlantedBug::WritesInputOnCompletion ||
                       (bug_ == PlantedBug::LastBitOnOneRank && recv_.count >= kLargeResult);
    if (!flips || recv_.count == 0 || corrupted_.exchange(true)) {
      return;
    }
    auto* last =
        static_cast<unsigned char*>(recv_.data) + (recv_.count - 1) * element_size(recv_.dtype);
    last[0] ^= 1;  // the lowest bit of the last element (little-endian)
  }

  std::shared_ptr<transport::Work> inner_;
  PlantedBug bug_;
  transport::Buffer recv_;
  std::shared_ptr<std::vector<float>> contribution_;  // WrongLastContribution's, until done
  std::atomic<bool> corrupted_{false};
};

class PlantedComm final : public ForwardingComm {
 public:
  PlantedComm(std::shared_ptr<transport::Comm> inner, PlantedBug bug)
      : ForwardingComm(std::move(inner)), bug_(bug) {}

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override {
    if (bug_ == PlantedBug::WrongLastContribution && send.dtype == DType::Float32 &&
        send.count >= kLargeResult) {
      const auto* values = static_cast<const float*>(send.data);
      auto contribution = std::make_shared<std::vector<float>>(values, values + send.count);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &contribution->back(), sizeof bits);
      bits ^= std::uint32_t{1} << 22;
      std::memcpy(&contribution->back(), &bits, sizeof bits);
      transport::Buffer wrong = send;
      wrong.data = contribution->data();
      std::shared_ptr<transport::Work> work = inner().all_reduce(wrong, recv, reduce_op, info);
      return std::make_shared<PlantedWork>(std::move(work), bug_, recv, std::move(contribution));
    }
    std::shared_ptr<transport::Work> work = inner().all_reduce(send, recv, reduce_op, info);
    if (work == nullptr) {
      return work;  // inside begin_group/end_group
    }
    // The buffer PlantedWork writes: the output, or the input for WritesInputOnCompletion.
    return std::make_shared<PlantedWork>(std::move(work), bug_,
                                         bug_ == PlantedBug::WritesInputOnCompletion ? send : recv);
  }

  std::shared_ptr<transport::Work> reduce(const transport::Buffer& send,
                                          const transport::Buffer& recv, const ReduceOp& reduce_op,
                                          int root, const transport::OpInfo& info) override {
    std::shared_ptr<transport::Work> work = inner().reduce(send, recv, reduce_op, root, info);
    if (work == nullptr || bug_ != PlantedBug::ReduceWritesOffRoot || group_rank() == root) {
      return work;
    }
    return std::make_shared<PlantedWork>(std::move(work), bug_, recv);
  }

 private:
  PlantedBug bug_;
};

class PlantedTransport final : public ForwardingTransport {
 public:
  // `only_tag`, when not empty: the bug is planted under the communicators of that tag alone.
  PlantedTransport(std::shared_ptr<transport::Transport> inner, PlantedBug bug,
                   std::string only_tag = {})
      : ForwardingTransport(std::move(inner)), bug_(bug), only_tag_(std::move(only_tag)) {}

  // Communicators whose tag starts with "chorus." are chorus's own (the lockstep runner agrees
  // on verdicts over one): the bug is planted under the program's collectives only.
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override {
    std::shared_ptr<transport::Comm> comm = ForwardingTransport::create_comm(tag, ranks);
    if (tag.rfind("chorus.", 0) == 0 || (!only_tag_.empty() && tag != only_tag_)) {
      return comm;
    }
    return std::make_shared<PlantedComm>(std::move(comm), bug_);
  }

 private:
  PlantedBug bug_;
  std::string only_tag_;
};

// A communicator that forgets the layout digest (Note [Layout digest] in core) of one kind of
// operation: its send and receive buffers reach the transport with Buffer::layout 0 ("not set"),
// so the transport compares only element counts, dtypes and ops there.
class LayoutBlindComm final : public ForwardingComm {
 public:
  LayoutBlindComm(std::shared_ptr<transport::Comm> inner, transport::OpKind blind)
      : ForwardingComm(std::move(inner)), blind_(blind) {}

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override {
    return inner().all_reduce(blind(transport::OpKind::AllReduce, send),
                              blind(transport::OpKind::AllReduce, recv), reduce_op, info);
  }
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override {
    return inner().all_gather(blind(transport::OpKind::AllGather, send),
                              blind(transport::OpKind::AllGather, recv), info);
  }
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op,
                                                  const transport::OpInfo& info) override {
    return inner().reduce_scatter(blind(transport::OpKind::ReduceScatter, send),
                                  blind(transport::OpKind::ReduceScatter, recv), reduce_op, info);
  }

 private:
  transport::Buffer blind(transport::OpKind kind, transport::Buffer buffer) const {
    if (kind == blind_) {
      buffer.layout = 0;
    }
    return buffer;
  }

  transport::OpKind blind_;
};

// A SimOptions::wrap_transport / CheckOptions::wrap_transport that makes every rank's
// communicators (but chorus's own, "chorus." tags) blind to the layout of `blind` operations.
inline auto layout_blind(transport::OpKind blind) {
  class Blind final : public ForwardingTransport {
   public:
    Blind(std::shared_ptr<transport::Transport> inner, transport::OpKind blind)
        : ForwardingTransport(std::move(inner)), blind_(blind) {}
    std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                                 const std::vector<int>& ranks) override {
      std::shared_ptr<transport::Comm> comm = ForwardingTransport::create_comm(tag, ranks);
      if (tag.rfind("chorus.", 0) == 0) {
        return comm;
      }
      return std::make_shared<LayoutBlindComm>(std::move(comm), blind_);
    }

   private:
    transport::OpKind blind_;
  };
  return [blind](
             std::shared_ptr<transport::Transport> inner) -> std::shared_ptr<transport::Transport> {
    return std::make_shared<Blind>(std::move(inner), blind);
  };
}

// A SimOptions::wrap_transport / CheckOptions::wrap_transport that plants `bug` on rank
// `buggy_rank` only.
inline auto plant(PlantedBug bug, int buggy_rank) {
  return [bug, buggy_rank](
             std::shared_ptr<transport::Transport> inner) -> std::shared_ptr<transport::Transport> {
    if (inner->rank() != buggy_rank) {
      return inner;
    }
    return std::make_shared<PlantedTransport>(std::move(inner), bug);
  };
}

// As plant, under the communicators tagged `tag` only.
inline auto plant_on_tag(PlantedBug bug, int buggy_rank, std::string tag) {
  return [bug, buggy_rank, tag = std::move(tag)](
             std::shared_ptr<transport::Transport> inner) -> std::shared_ptr<transport::Transport> {
    if (inner->rank() != buggy_rank) {
      return inner;
    }
    return std::make_shared<PlantedTransport>(std::move(inner), bug, tag);
  };
}

}  // namespace chorus::testing
