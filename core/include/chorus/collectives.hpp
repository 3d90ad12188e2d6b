#pragma once

// Functional collectives (PyTorch's torch.distributed._functional_collectives, in C++).
//
// Every collective returns at once. Its result is a Tensor whose storage is *pending* until the
// collective completes and is waited: views of it never wait, every data access waits first
// (Note [Pending storage], core/src/detail/storage.hpp). wait_tensor finds the work through the
// calling rank's work registry, so it works on the result or on any view of it.
//
// Common to all collectives:
// - Called from inside a rank (chorus::run / sim::run); outside one they throw InvalidArgument.
// - The input is never modified; a pending input is waited first (it is read). Non-contiguous
//   inputs are accepted (copied to contiguous internally).
// - Invalid arguments throw InvalidArgument naming rank, op, sequence number and group, and
//   consume no sequence number, so later collectives still pair up.
// - Errors of the collective itself (CollectiveMismatch, Deadlock, RankFailure, Timeout,
//   TransportError, Aborted) are raised where it is waited.
// - `site` records the caller for error messages and the unwaited-work report; leave it
//   defaulted.
// - Thread-safety: a rank issues its collectives from one thread at a time (the order of issue
//   is the order of matching). Waiting and dropping results are thread-safe from any thread.

#include <cstdint>
#include <string_view>
#include <vector>

#include "chorus/call_site.hpp"
#include "chorus/group.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/tensor.hpp"

namespace chorus {

// Reduces `input` elementwise across the group; every member gets the result (same shape and
// dtype). Reduction order is fixed: group-rank order, so results are bitwise identical on all
// ranks and independent of the schedule.
Tensor all_reduce(const Tensor& input, ReduceOp reduce_op, const GroupSpec& group,
                  std::string_view tag = "", CallSite site = CallSite::current());

// Concatenates every member's `input` along `gather_dim` (negative counts from the end) in
// group-rank order: the result has size(gather_dim) * group_size there. A 0-d input gives
// shape [group_size]. Any gather_dim; never waits early.
Tensor all_gather_tensor(const Tensor& input, std::int64_t gather_dim, const GroupSpec& group,
                         std::string_view tag = "", CallSite site = CallSite::current());

// Reduces `input` across the group and gives group rank i the i-th of group_size equal chunks
// along `scatter_dim`. size(scatter_dim) must be divisible by group_size (InvalidArgument
// otherwise; never floored).
Tensor reduce_scatter_tensor(const Tensor& input, ReduceOp reduce_op, std::int64_t scatter_dim,
                             const GroupSpec& group, std::string_view tag = "",
                             CallSite site = CallSite::current());

// Coalesced forms: one communication for the whole list (NCCL group semantics), one work
// registered under every output (work_registry_size() grows by 1). Outputs as the single forms.
std::vector<Tensor> all_reduce_coalesced(const std::vector<Tensor>& inputs, ReduceOp reduce_op,
                                         const GroupSpec& group, std::string_view tag = "",
                                         CallSite site = CallSite::current());
// Gathers each input along dim 0.
std::vector<Tensor> all_gather_into_tensor_coalesced(const std::vector<Tensor>& inputs,
                                                     const GroupSpec& group,
                                                     std::string_view tag = "",
                                                     CallSite site = CallSite::current());
// `scatter_dims` has one entry per input (InvalidArgument otherwise).
std::vector<Tensor> reduce_scatter_tensor_coalesced(const std::vector<Tensor>& inputs,
                                                    ReduceOp reduce_op,
                                                    const std::vector<std::int64_t>& scatter_dims,
                                                    const GroupSpec& group,
                                                    std::string_view tag = "",
                                                    CallSite site = CallSite::current());

// Waits for every collective pending on `tensor`'s storage (blocking the host for CPU tensors),
// removes them from the registry, and returns `tensor`. Idempotent: a tensor with nothing
// pending returns at once. Rethrows the collective's error. Thread-safe; callable from any
// thread.
Tensor wait_tensor(const Tensor& tensor);

// Waits for every distinct work pending on any of `tensors` once (a coalesced work shared by
// several outputs is waited once), then returns `tensors`. Rethrows the first error after
// waiting every work.
std::vector<Tensor> wait_tensors(const std::vector<Tensor>& tensors);

// Distinct pending works registered for the calling rank (a coalesced call counts 1). Exact at
// every point. Throws InvalidArgument outside a rank.
std::size_t work_registry_size();

}  // namespace chorus
