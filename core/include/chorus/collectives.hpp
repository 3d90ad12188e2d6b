#pragma once

// Functional collectives (PyTorch's torch.distributed._functional_collectives, in C++).
//
// Every collective returns at once. Its result is a Tensor whose storage is *pending* until the
// collective completes and is waited: views of it never wait, every data access waits first
// (Note [Pending storage], core/src/detail/storage.hpp). wait_tensor finds the work through the
// calling rank's work registry, so it works on the result or on any view of it.
//
// Common to all collectives:
// - Result shapes follow chorus/meta.hpp (the same functions compute them on every path).
// - Complex tensors travel as pairs of reals and Bool as UInt8 (Note [Lowering] in
//   core/src/collectives.cpp): complex takes sum, avg and premul_sum only; Bool takes min, max,
//   band, bor and bxor only (band and bor travel as min and max, which every transport has).
// - Inside a TraceScope (chorus/trace.hpp) every collective waits before it returns and is
//   recorded; meta inputs are accepted there (and only there) and give meta outputs without
//   communication.
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
#include <optional>
#include <string>
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

// Sends block j of `input` along dim 0 (input_split_sizes[j] rows) to group rank j, and returns
// the blocks received from each group rank i (output_split_sizes[i] rows) concatenated in group
// rank order. Both lists absent = the equal split (dim 0 divisible by the group size). Exactly
// one absent, a list without one entry per group rank, a negative entry, or input splits that do
// not sum to size(0) -> InvalidArgument. Rank i's input_split_sizes[j] must equal rank j's
// output_split_sizes[i] (else CollectiveMismatch where waited).
Tensor all_to_all_single(const Tensor& input,
                         std::optional<std::vector<std::int64_t>> output_split_sizes,
                         std::optional<std::vector<std::int64_t>> input_split_sizes,
                         const GroupSpec& group, std::string_view tag = "",
                         CallSite site = CallSite::current());

// Every member gets group rank `src`'s input (`src` indexes the group's ranks, as in
// permute_tensor). Every member passes a tensor of the same shape and dtype; only src's is read.
Tensor broadcast(const Tensor& input, int src, const GroupSpec& group, std::string_view tag = "",
                 CallSite site = CallSite::current());

// Group rank `dst` gets the reduction of every member's input; the other members get zeros of
// the input's shape (so reduce is the exact adjoint of broadcast). Not in PyTorch's functional
// API (torch.distributed.reduce leaves non-destination outputs unspecified); chorus adds it as
// broadcast's adjoint, with ncclReduce's semantics.
Tensor reduce(const Tensor& input, ReduceOp reduce_op, int dst, const GroupSpec& group,
              std::string_view tag = "", CallSite site = CallSite::current());

// Group rank m sends its input to group rank src_dst[m] (-1: sends nowhere). Destinations must be
// distinct group ranks (else InvalidArgument). A rank nobody sends to gets zeros of the input's
// shape (JAX's ppermute semantics). PyTorch's permute_tensor is an all_to_all_single whose split
// sizes are the input's numel: a rank nobody sends to gets an empty tensor of 0 rows there, and
// only inputs whose numel is their size(0) (1-d ones) go through; chorus moves a whole input of
// any shape. Every member passes the same src_dst and inputs of the same shape and dtype.
Tensor permute_tensor(const Tensor& input, const std::vector<int>& src_dst, const GroupSpec& group,
                      std::string_view tag = "", CallSite site = CallSite::current());

// In-place forms: they return after the caller's tensor holds the result (they wait).
// They wait only for collectives that write the destination: an earlier collective still
// reading it as its input (issued, not yet waited) races with the write, as a write on the
// compute stream races with an NCCL kernel reading the tensor. Wait for that collective first;
// the simulator reports the race as InputModified on the schedules where it happens.
// all_reduce_inplace reduces a contiguous tensor truly in place (one buffer is send and
// receive, as NCCL allows) when the calling rank made its storage; a strided one, or one whose
// storage another rank (or code outside the ranks) made, is staged and copied back.
Tensor& all_reduce_inplace(Tensor& tensor, ReduceOp reduce_op, const GroupSpec& group,
                           std::string_view tag = "", CallSite site = CallSite::current());
// `output` must have exactly the all_gather_tensor result shape and the input's dtype
// (InvalidArgument otherwise).
Tensor& all_gather_tensor_inplace(Tensor& output, const Tensor& input, const GroupSpec& group,
                                  std::string_view tag = "", std::int64_t gather_dim = 0,
                                  CallSite site = CallSite::current());
// `output` must have exactly the reduce_scatter_tensor result shape and the input's dtype.
Tensor& reduce_scatter_tensor_inplace(Tensor& output, const Tensor& input, ReduceOp reduce_op,
                                      const GroupSpec& group, std::int64_t scatter_dim = 0,
                                      std::string_view tag = "",
                                      CallSite site = CallSite::current());

// Waits for every collective pending on `tensor`'s storage (blocking the host for CPU tensors),
// removes them from the registry, and returns `tensor`. Idempotent: a second wait has no
// collective to wait for. Rethrows the collective's error. Then, on a rank, settles the rank's
// dropped results (finalizing deferred drops, which may block) and raises the first failure
// among them (Note [Work lifecycle]): only after `tensor` is ready. Thread-safe; callable from
// any thread.
Tensor wait_tensor(const Tensor& tensor);

// Waits for every distinct work pending on any of `tensors` once (a coalesced work shared by
// several outputs is waited once), then returns `tensors`. The host waits share one deadline, the
// rank's timeout (RankOptions::timeout) from the first of them: K collectives a stuck peer never
// completes raise Timeout after one timeout, not K, and each of their tensors keeps its own error.
// (Results of several ranks' collectives, passed between ranks of one process, get one deadline
// per rank, on that rank's transport's clock.)
// Rethrows the first error after waiting every work; then settles the rank's dropped results as
// wait_tensor does.
std::vector<Tensor> wait_tensors(const std::vector<Tensor>& tensors);

// Distinct pending works registered for the calling rank (a coalesced call counts 1). Exact at
// every point: it settles the rank's dropped results first, as wait_tensor does, so it may raise
// a dropped result's failure. Throws InvalidArgument outside a rank.
std::size_t work_registry_size();

// Why a reduction (all_reduce, reduce_scatter_tensor, reduce, and their coalesced and in-place
// forms) with `reduce_op` on `dtype` tensors on `device` would be refused on the calling rank:
// the reason its InvalidArgument would carry (ReduceOp::check_dtype's rules, then the
// transport's own), or empty when it runs. The simulator and MPI run every pair check_dtype
// allows; NCCL has no bitwise reductions on integers (Bool's band and bor run there, as min and
// max). Portable code, and the property battery on a real transport, use it to take another
// path. Throws InvalidArgument outside a rank.
std::string unsupported_reduction(DType dtype, const ReduceOp& reduce_op,
                                  Device device = Device::cpu());

}  // namespace chorus
