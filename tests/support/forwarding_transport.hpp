#pragma once

// A transport that runs as the one it wraps (SimOptions::wrap_transport's argument): a base for
// test transports that change one thing about it (a planted bug, narrower support). Partitioned
// groups take Transport's default (create_comm of the part), so an override of create_comm sees
// them too.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/transport/transport.hpp"

namespace chorus::testing {

// A communicator that runs as the one it wraps: a base for test communicators that change or
// watch one operation (override it and call the base, or inner()).
class ForwardingComm : public transport::Comm {
 public:
  explicit ForwardingComm(std::shared_ptr<transport::Comm> inner) : inner_(std::move(inner)) {}

  std::uint64_t id() const noexcept override { return inner_->id(); }
  const std::string& tag() const noexcept override { return inner_->tag(); }
  const std::vector<int>& ranks() const noexcept override { return inner_->ranks(); }
  int group_rank() const noexcept override { return inner_->group_rank(); }
  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override {
    return inner_->all_reduce(send, recv, reduce_op, info);
  }
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override {
    return inner_->all_gather(send, recv, info);
  }
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op,
                                                  const transport::OpInfo& info) override {
    return inner_->reduce_scatter(send, recv, reduce_op, info);
  }
  std::shared_ptr<transport::Work> all_to_all(const transport::Buffer& send,
                                              const std::vector<std::size_t>& send_counts,
                                              const transport::Buffer& recv,
                                              const std::vector<std::size_t>& recv_counts,
                                              const transport::OpInfo& info) override {
    return inner_->all_to_all(send, send_counts, recv, recv_counts, info);
  }
  std::shared_ptr<transport::Work> broadcast(const transport::Buffer& send,
                                             const transport::Buffer& recv, int root,
                                             const transport::OpInfo& info) override {
    return inner_->broadcast(send, recv, root, info);
  }
  std::shared_ptr<transport::Work> reduce(const transport::Buffer& send,
                                          const transport::Buffer& recv, const ReduceOp& reduce_op,
                                          int root, const transport::OpInfo& info) override {
    return inner_->reduce(send, recv, reduce_op, root, info);
  }
  void begin_group() override { inner_->begin_group(); }
  std::shared_ptr<transport::Work> end_group(const transport::OpInfo& info) override {
    return inner_->end_group(info);
  }

 protected:
  transport::Comm& inner() { return *inner_; }

 private:
  std::shared_ptr<transport::Comm> inner_;
};

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::shared_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}

  std::string_view name() const noexcept override { return inner_->name(); }
  int rank() const noexcept override { return inner_->rank(); }
  int world_size() const noexcept override { return inner_->world_size(); }
  Device device() const noexcept override { return inner_->device(); }
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override {
    return inner_->create_comm(tag, ranks);
  }
  transport::Duration now() override { return inner_->now(); }
  std::string supports(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                       Device device) const override {
    return inner_->supports(kind, dtype, reduce_op, device);
  }

 private:
  std::shared_ptr<transport::Transport> inner_;
};

}  // namespace chorus::testing
