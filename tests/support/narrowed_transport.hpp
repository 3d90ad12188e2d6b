#pragma once

// A transport that runs as the one it wraps but supports less: a stand-in, on the simulator, for
// a real transport's narrower support (NCCL has no bitwise reductions), for SimOptions::
// wrap_transport.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/transport/transport.hpp"
#include "support/forwarding_transport.hpp"

namespace chorus::testing {

// Why the narrower transport refuses (kind, wire dtype, reduce op, device); empty: it does not.
using Refusal = std::function<std::string(transport::OpKind, DType, const ReduceOp&, Device)>;

class NarrowedTransport final : public ForwardingTransport {
 public:
  NarrowedTransport(std::shared_ptr<transport::Transport> inner, Refusal refusal,
                    std::shared_ptr<std::atomic<int>> refusals)
      : ForwardingTransport(std::move(inner)),
        refusal_(std::move(refusal)),
        refusals_(std::move(refusals)) {}

  std::string supports(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                       Device device) const override {
    std::string reason = refusal_(kind, dtype, reduce_op, device);
    if (!reason.empty()) {
      refusals_->fetch_add(1, std::memory_order_relaxed);
      return reason;
    }
    return ForwardingTransport::supports(kind, dtype, reduce_op, device);
  }

 private:
  Refusal refusal_;
  std::shared_ptr<std::atomic<int>> refusals_;
};

// A SimOptions::wrap_transport that narrows every rank's transport by `refusal`, counting the
// refusals (of every rank) in `refusals`.
inline auto narrow(Refusal refusal, std::shared_ptr<std::atomic<int>> refusals) {
  return [refusal = std::move(refusal), refusals = std::move(refusals)](
             std::shared_ptr<transport::Transport> inner) -> std::shared_ptr<transport::Transport> {
    return std::make_shared<NarrowedTransport>(std::move(inner), refusal, refusals);
  };
}

// NCCL's gap, for tests that cannot link the NCCL transport: no bitwise reductions.
inline std::string refuse_bitwise(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                                  Device /*device*/) {
  const ReduceOp::Kind op = reduce_op.kind();
  if (transport::op_kind_reduces(kind) &&
      (op == ReduceOp::Kind::BAnd || op == ReduceOp::Kind::BOr || op == ReduceOp::Kind::BXor)) {
    return "narrowed: reduce_op " + reduce_op.to_string() + " on " +
           std::string(dtype_name(dtype)) + " is not supported (no bitwise reductions)";
  }
  return {};
}

}  // namespace chorus::testing
