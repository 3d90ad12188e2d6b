#pragma once

// A transport that runs as the one it wraps (SimOptions::wrap_transport's argument): a base for
// test transports that change one thing about it (a planted bug, narrower support). Partitioned
// groups take Transport's default (create_comm of the part), so an override of create_comm sees
// them too.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/transport/transport.hpp"

namespace chorus::testing {

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
