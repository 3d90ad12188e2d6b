// The functional collectives: validation, desugaring, staging, and registration of the pending
// work (Note [Work lifecycle]). Transports see only contiguous buffers.

#include "chorus/collectives.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/runtime.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/errors.hpp"
#include "detail/group_internal.hpp"
#include "detail/rank_state.hpp"
#include "detail/storage.hpp"
#include "detail/strided_copy.hpp"
#include "detail/tensor_access.hpp"
#include "detail/work_registry.hpp"

namespace chorus {
namespace {

using detail::TensorAccess;
using transport::Buffer;
using transport::OpKind;

// One collective call on the calling rank, from validation to registration.
class Call {
 public:
  Call(std::string_view op, const GroupSpec& group, std::string_view tag, CallSite site)
      : op_(op), site_(site) {
    RankContext* context = RankContext::current();
    if (context == nullptr) {
      throw InvalidArgument(detail::make_context(op),
                            "called outside a rank: call collectives from the rank function "
                            "given to chorus::run or chorus::sim::run");
    }
    state_ = &context->state();
    state_->settle_unwaited();
    ExpandedGroup expanded = detail::expand_group_for(group, tag, op);
    members_ = expanded.members_of(state_->rank());
    if (members_.empty()) {
      throw InvalidArgument(
          detail::make_context(op, -1, expanded.to_string()),
          "rank " + std::to_string(state_->rank()) + " is not a member of the group");
    }
    tag_ = std::move(expanded.tag);
    slot_ = &state_->comm_slot(tag_, members_);
  }

  int group_size() const noexcept { return static_cast<int>(members_.size()); }

  // The context of errors raised before the op starts: the sequence number it would have had.
  ErrorContext context() const {
    return ErrorContext{state_->rank(), std::string(op_), slot_->next_seq, slot_->label};
  }
  [[noreturn]] void invalid(const std::string& detail) const {
    throw InvalidArgument(context(), detail);
  }

  // Checks an input tensor, the reduction (null for ops that do not reduce) and that the
  // transport can run `kind` on it.
  void check_input(const Tensor& input, OpKind kind, const ReduceOp* reduce_op,
                   const std::string& which = "input") const {
    if (!input.defined()) {
      invalid(which + " is an undefined tensor");
    }
    if (input.device().is_meta()) {
      invalid(which + " is a meta tensor: meta tensors carry no data to communicate");
    }
    if (reduce_op != nullptr) {
      if (std::string reason = reduce_op->check_dtype(input.dtype()); !reason.empty()) {
        invalid(reason);
      }
    }
    std::string reason = state_->transport().supports(
        kind, input.dtype(), reduce_op != nullptr ? *reduce_op : ReduceOp(ReduceOp::Kind::Sum),
        input.device());
    if (!reason.empty()) {
      invalid("transport '" + std::string(state_->transport().name()) + "' cannot run " +
              std::string(transport::op_kind_name(kind)) + " on " + which + " (" +
              std::string(dtype_name(input.dtype())) + " on " + input.device().to_string() +
              "): " + reason);
    }
  }

  std::int64_t normalize_dim(std::int64_t dim, std::int64_t ndim, const char* name) const {
    if (dim < -ndim || dim >= ndim) {
      invalid(std::string(name) + " " + std::to_string(dim) + " is out of range for a " +
              std::to_string(ndim) + "-d input (expected [" + std::to_string(-ndim) + ", " +
              std::to_string(ndim - 1) + "])");
    }
    return dim < 0 ? dim + ndim : dim;
  }

  // Everything validated: take the sequence number and the communicator.
  transport::Comm& start() {
    transport::Comm& comm = state_->ensure_comm(*slot_, tag_, members_);
    seq_ = slot_->next_seq++;
    return comm;
  }
  transport::OpInfo info() const { return transport::OpInfo{op_, seq_, site_}; }

  // Registers `work` as pending under the storages of `outputs`.
  void register_work(std::shared_ptr<transport::Work> work, const std::vector<Tensor>& outputs,
                     std::function<void()> fixup = {}) {
    CHORUS_CHECK(seq_ >= 0);
    auto pending = std::make_shared<detail::PendingWork>(
        std::move(work),
        detail::WorkInfo{state_->rank(), std::string(op_), seq_, slot_->label, site_},
        std::move(fixup), state_->transport_ptr(), state_->options().timeout);
    std::vector<detail::Storage*> storages;
    storages.reserve(outputs.size());
    for (const Tensor& output : outputs) {
      storages.push_back(TensorAccess::storage(output).get());
    }
    state_->registry()->add(pending, storages);
  }

 private:
  std::string_view op_;
  CallSite site_;
  detail::RankState* state_ = nullptr;
  std::vector<int> members_;
  std::string tag_;
  detail::CommSlot* slot_ = nullptr;
  std::int64_t seq_ = -1;
};

// A contiguous tensor's elements as a transport buffer that keeps their memory alive.
Buffer buffer_of(const Tensor& contiguous) {
  const auto& storage = TensorAccess::storage(contiguous);
  return Buffer{contiguous.unsafe_data_ptr(), static_cast<std::size_t>(contiguous.numel()),
                contiguous.dtype(), contiguous.device(),
                storage ? std::shared_ptr<const void>(storage->memory()) : nullptr};
}

// A contiguous buffer holding `input`'s elements (the input itself when already contiguous).
// Reads the input, so it waits for work pending on it first.
Buffer input_buffer(const Tensor& input) { return buffer_of(input.contiguous()); }

// A fresh output of `shape` (pending once registered), and its buffer.
std::pair<Tensor, Buffer> new_output(const Shape& shape, DType dtype) {
  Tensor output = Tensor::empty(shape, dtype);
  Buffer buffer = buffer_of(output);
  return {std::move(output), std::move(buffer)};
}

// The operations of one coalesced call: staged one by one, then started as one NCCL-style group
// that yields one work, registered under every output.
class Batch {
 public:
  void add(Buffer send, const Shape& output_shape, DType dtype) {
    auto [output, recv] = new_output(output_shape, dtype);
    sends_.push_back(std::move(send));
    outputs_.push_back(std::move(output));
    recvs_.push_back(std::move(recv));
  }

  // `start_one(comm, send, recv)` starts one staged operation inside the group.
  template <class StartOne>
  std::vector<Tensor> issue(Call& call, StartOne start_one) {
    transport::Comm& comm = call.start();
    comm.begin_group();
    for (std::size_t i = 0; i < sends_.size(); ++i) {
      CHORUS_CHECK(start_one(comm, sends_[i], recvs_[i]) == nullptr);  // batched: no work yet
    }
    call.register_work(comm.end_group(call.info()), outputs_);
    return std::move(outputs_);
  }

 private:
  std::vector<Buffer> sends_;
  std::vector<Tensor> outputs_;
  std::vector<Buffer> recvs_;
};

// ---- Shape rules (one implementation each; DESIGN 2.3).

Shape all_gather_shape(const Shape& input, std::int64_t gather_dim, int group_size) {
  if (input.empty()) {
    return Shape{group_size};
  }
  Shape out = input;
  out[static_cast<std::size_t>(gather_dim)] *= group_size;
  return out;
}

Shape reduce_scatter_shape(const Shape& input, std::int64_t scatter_dim, int group_size) {
  Shape out = input;
  out[static_cast<std::size_t>(scatter_dim)] /= group_size;
  return out;
}

// ---- all_gather along a dim other than 0: the transport gathers rank blocks into a staging
// tensor [W, *input_shape]; completion rearranges them into the output (the seed's
// cat(chunk(res, W, 0), dim=gather_dim)), so no wait happens before first use.

std::function<void()> gather_fixup(const Tensor& staging, const Tensor& output,
                                   std::int64_t gather_dim, int group_size) {
  const Shape& in_shape = staging.sizes();  // [W, s0, ..., s(n-1)]
  const Shape out_strides = detail::contiguous_strides(output.sizes());
  const auto d = static_cast<std::size_t>(gather_dim);
  // The output's dim d (size W * s_d, stride c_d) split into (W, s_d), W moved to the front.
  Shape dst_strides;
  dst_strides.push_back(in_shape[d + 1] * out_strides[d]);
  dst_strides.insert(dst_strides.end(), out_strides.begin(), out_strides.end());
  CHORUS_CHECK_EQ(static_cast<int>(in_shape[0]), group_size);
  // The closure holds the output's *memory*, not its storage: holding the storage would keep
  // the output alive forever (Note [Work lifecycle]: a drop must be able to happen).
  std::shared_ptr<void> out_memory = TensorAccess::storage(output)->memory();
  return [staging, out_memory, dst_strides, in_shape]() {
    detail::strided_copy(out_memory.get(), dst_strides, staging.unsafe_data_ptr(),
                         detail::contiguous_strides(in_shape), in_shape, staging.element_size());
  };
}

// reduce_scatter along a dim other than 0: a contiguous copy of the input with the W chunks along
// `scatter_dim` moved to the front (the seed's cat(chunk(input, W, dim))), so chunk r is block r.
Tensor scatter_staging(const Tensor& input, std::int64_t scatter_dim, int group_size) {
  const auto d = static_cast<std::size_t>(scatter_dim);
  Shape sizes = {group_size};
  sizes.insert(sizes.end(), input.sizes().begin(), input.sizes().end());
  sizes[d + 1] /= group_size;
  Shape src_strides = {input.strides()[d] * sizes[d + 1]};
  src_strides.insert(src_strides.end(), input.strides().begin(), input.strides().end());
  Tensor staging = Tensor::empty(input.sizes(), input.dtype());
  wait_tensor(input);
  detail::strided_copy(staging.unsafe_data_ptr(), detail::contiguous_strides(sizes),
                       input.unsafe_data_ptr(), src_strides, sizes, input.element_size());
  return staging;
}

}  // namespace

Tensor all_reduce(const Tensor& input, ReduceOp reduce_op, const GroupSpec& group,
                  std::string_view tag, CallSite site) {
  Call call("all_reduce", group, tag, site);
  call.check_input(input, OpKind::AllReduce, &reduce_op);
  Buffer send = input_buffer(input);
  auto [output, recv] = new_output(input.sizes(), input.dtype());
  transport::Comm& comm = call.start();
  call.register_work(comm.all_reduce(send, recv, reduce_op, call.info()), {output});
  return output;
}

Tensor all_gather_tensor(const Tensor& input, std::int64_t gather_dim, const GroupSpec& group,
                         std::string_view tag, CallSite site) {
  Call call("all_gather_tensor", group, tag, site);
  call.check_input(input, OpKind::AllGather, nullptr);
  const std::int64_t dim =
      call.normalize_dim(gather_dim, std::max<std::int64_t>(input.dim(), 1), "gather_dim");
  const int size = call.group_size();
  Buffer send = input_buffer(input);
  auto [output, recv] = new_output(all_gather_shape(input.sizes(), dim, size), input.dtype());
  if (dim == 0 || input.dim() == 0) {
    transport::Comm& comm = call.start();
    call.register_work(comm.all_gather(send, recv, call.info()), {output});
    return output;
  }
  Shape staging_shape = {size};
  staging_shape.insert(staging_shape.end(), input.sizes().begin(), input.sizes().end());
  auto [staging, staging_buffer] = new_output(staging_shape, input.dtype());
  transport::Comm& comm = call.start();
  call.register_work(comm.all_gather(send, staging_buffer, call.info()), {output},
                     gather_fixup(staging, output, dim, size));
  return output;
}

Tensor reduce_scatter_tensor(const Tensor& input, ReduceOp reduce_op, std::int64_t scatter_dim,
                             const GroupSpec& group, std::string_view tag, CallSite site) {
  Call call("reduce_scatter_tensor", group, tag, site);
  call.check_input(input, OpKind::ReduceScatter, &reduce_op);
  if (input.dim() == 0) {
    call.invalid("input is 0-d: reduce_scatter needs a dimension to scatter");
  }
  const std::int64_t dim = call.normalize_dim(scatter_dim, input.dim(), "scatter_dim");
  const int size = call.group_size();
  if (input.size(dim) % size != 0) {
    call.invalid("input size " + std::to_string(input.size(dim)) + " along scatter_dim " +
                 std::to_string(dim) + " is not divisible by the group size " +
                 std::to_string(size));
  }
  Buffer send = input_buffer(dim == 0 ? input : scatter_staging(input, dim, size));
  auto [output, recv] = new_output(reduce_scatter_shape(input.sizes(), dim, size), input.dtype());
  transport::Comm& comm = call.start();
  call.register_work(comm.reduce_scatter(send, recv, reduce_op, call.info()), {output});
  return output;
}

std::vector<Tensor> all_reduce_coalesced(const std::vector<Tensor>& inputs, ReduceOp reduce_op,
                                         const GroupSpec& group, std::string_view tag,
                                         CallSite site) {
  Call call("all_reduce_coalesced", group, tag, site);
  if (inputs.empty()) {
    return {};  // nothing to communicate; the group was still validated
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    call.check_input(inputs[i], OpKind::AllReduce, &reduce_op, "input " + std::to_string(i));
  }
  Batch batch;
  for (const Tensor& input : inputs) {
    batch.add(input_buffer(input), input.sizes(), input.dtype());
  }
  return batch.issue(call, [&](transport::Comm& comm, const Buffer& send, const Buffer& recv) {
    return comm.all_reduce(send, recv, reduce_op, call.info());
  });
}

std::vector<Tensor> all_gather_into_tensor_coalesced(const std::vector<Tensor>& inputs,
                                                     const GroupSpec& group, std::string_view tag,
                                                     CallSite site) {
  Call call("all_gather_into_tensor_coalesced", group, tag, site);
  if (inputs.empty()) {
    return {};
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    call.check_input(inputs[i], OpKind::AllGather, nullptr, "input " + std::to_string(i));
  }
  const int size = call.group_size();
  Batch batch;
  for (const Tensor& input : inputs) {
    batch.add(input_buffer(input), all_gather_shape(input.sizes(), 0, size), input.dtype());
  }
  return batch.issue(call, [&](transport::Comm& comm, const Buffer& send, const Buffer& recv) {
    return comm.all_gather(send, recv, call.info());
  });
}

std::vector<Tensor> reduce_scatter_tensor_coalesced(const std::vector<Tensor>& inputs,
                                                    ReduceOp reduce_op,
                                                    const std::vector<std::int64_t>& scatter_dims,
                                                    const GroupSpec& group, std::string_view tag,
                                                    CallSite site) {
  Call call("reduce_scatter_tensor_coalesced", group, tag, site);
  if (scatter_dims.size() != inputs.size()) {
    call.invalid("scatter_dims has " + std::to_string(scatter_dims.size()) + " entries for " +
                 std::to_string(inputs.size()) + " inputs: expected one per input");
  }
  if (inputs.empty()) {
    return {};
  }
  const int size = call.group_size();
  std::vector<std::int64_t> dims(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string which = "input " + std::to_string(i);
    call.check_input(inputs[i], OpKind::ReduceScatter, &reduce_op, which);
    if (inputs[i].dim() == 0) {
      call.invalid(which + " is 0-d: reduce_scatter needs a dimension to scatter");
    }
    dims[i] = call.normalize_dim(scatter_dims[i], inputs[i].dim(), "scatter_dim");
    if (inputs[i].size(dims[i]) % size != 0) {
      call.invalid(which + " size " + std::to_string(inputs[i].size(dims[i])) +
                   " along scatter_dim " + std::to_string(dims[i]) +
                   " is not divisible by the group size " + std::to_string(size));
    }
  }
  Batch batch;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    batch.add(input_buffer(dims[i] == 0 ? input : scatter_staging(input, dims[i], size)),
              reduce_scatter_shape(input.sizes(), dims[i], size), input.dtype());
  }
  return batch.issue(call, [&](transport::Comm& comm, const Buffer& send, const Buffer& recv) {
    return comm.reduce_scatter(send, recv, reduce_op, call.info());
  });
}

// The rank's deferred errors (Note [Work lifecycle], step 3), raised at explicit waits too.
void settle_calling_rank() {
  if (RankContext* context = RankContext::current()) {
    context->state().settle_unwaited();
  }
}

Tensor wait_tensor(const Tensor& tensor) {
  settle_calling_rank();
  if (const auto& storage = TensorAccess::storage(tensor)) {
    storage->wait_ready();
  }
  return tensor;
}

std::vector<Tensor> wait_tensors(const std::vector<Tensor>& tensors) {
  settle_calling_rank();
  // Group the pending storages by registry (normally all the calling rank's), so each distinct
  // work is waited once.
  std::map<detail::WorkRegistry*,
           std::pair<std::shared_ptr<detail::WorkRegistry>, std::vector<const detail::Storage*>>>
      by_registry;
  for (const Tensor& tensor : tensors) {
    const auto& storage = TensorAccess::storage(tensor);
    if (storage && storage->is_pending()) {
      if (std::shared_ptr<detail::WorkRegistry> registry = storage->registry()) {
        auto& [owner, storages] = by_registry[registry.get()];
        owner = registry;
        storages.push_back(storage.get());
      }
    }
  }
  std::exception_ptr first_error;
  for (auto& [key, group] : by_registry) {
    try {
      group.first->wait_storages(group.second);
    } catch (...) {
      if (!first_error) {
        first_error = std::current_exception();
      }
    }
  }
  if (!first_error) {
    for (const Tensor& tensor : tensors) {
      try {
        wait_tensor(tensor);  // failures of works waited earlier
      } catch (...) {
        first_error = std::current_exception();
        break;
      }
    }
  }
  if (first_error) {
    std::rethrow_exception(first_error);
  }
  return tensors;
}

std::size_t work_registry_size() {
  RankContext* context = RankContext::current();
  if (context == nullptr) {
    detail::throw_invalid("work_registry_size", "called outside a rank");
  }
  context->state().settle_unwaited();
  return context->state().registry()->size();
}

}  // namespace chorus
