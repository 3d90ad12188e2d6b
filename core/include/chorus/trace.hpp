#pragma once

// Tracing mode (DESIGN 2.4): a plain-data record of every collective a rank issues.
//
// Inside a TraceScope every collective of the calling rank waits before it returns and appends
// an OpRecord: the seed's "plain-old-data schema" of the call. Meta inputs are traced without
// communication (the record carries the shapes; the output is a meta tensor of the right shape).
// Records serialise to JSON, records of all ranks can be compared (a desync check that names the
// first divergence), a recorded trace can be replayed on any transport, and every linear
// collective has an adjoint (`adjoint`, below).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/call_site.hpp"
#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/tensor.hpp"

namespace chorus {

namespace detail {
class RankState;
}

// One collective call as one rank issued it. Plain data: copyable, comparable, serialisable.
struct OpRecord {
  // The API name: "all_reduce", "all_gather_tensor", "reduce_scatter_tensor",
  // "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
  // "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast", "reduce",
  // "permute_tensor", "all_reduce_inplace", "all_gather_tensor_inplace",
  // "reduce_scatter_tensor_inplace".
  std::string op;
  std::optional<ReduceOp> reduce_op;  // absent for ops that do not reduce
  std::string tag;                    // the expanded group's tag
  std::vector<int> ranks;             // the expanded group's ranks (flattened for MPMD lists)
  int group_size = 0;                 // the size of the group the collective ran in
  std::vector<Shape> input_shapes;    // one per input (several for the coalesced forms)
  DType dtype = DType::Float32;       // the (first) input's dtype
  // One per input when a coalesced call mixes dtypes; empty when every input has `dtype` (always
  // so for the single-tensor ops). Read it through input_dtype(i).
  std::vector<DType> input_dtypes;
  // gather_dim / scatter_dim, normalised to be non-negative: one per input for the gather and
  // scatter ops (reduce_scatter_tensor_coalesced: its scatter_dims), empty otherwise.
  std::vector<std::int64_t> dims;
  std::optional<std::vector<std::int64_t>> output_split_sizes;  // all_to_all_single, as passed
  std::optional<std::vector<std::int64_t>> input_split_sizes;   // all_to_all_single, as passed
  int src = -1;              // broadcast: the source group rank; reduce: the destination
  std::vector<int> src_dst;  // permute_tensor: src_dst[m] = destination group rank of m, or -1

  // Not part of the call, recorded for reports and comparisons:
  int rank = -1;  // the global rank that issued it
  // Its sequence number on its communicator; -1 when nothing was communicated (meta inputs, or
  // a coalesced call with an empty list).
  std::int64_t seq = -1;
  std::vector<Shape> output_shapes;  // one per output
  bool meta = false;                 // traced on meta tensors (no communication happened)
  CallSite site;                     // where it was issued (not serialised)

  // The dtype of input `i`.
  DType input_dtype(std::size_t i) const noexcept {
    return i < input_dtypes.size() ? input_dtypes[i] : dtype;
  }

  // "all_gather_tensor(Float32 [2, 3], gather_dim=0) on [0, 1]".
  std::string to_string() const;

  // Every field except `site` (call sites differ between a run and its replay).
  friend bool operator==(const OpRecord& a, const OpRecord& b);
};

// Records the calling rank's collectives while alive (RAII, per rank; scopes nest, the innermost
// records). Construct and destroy it on the rank; outside a rank the constructor throws
// InvalidArgument.
class TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  const std::vector<OpRecord>& records() const noexcept { return records_; }

  // Called by the collectives (not for users).
  void append(OpRecord record) { records_.push_back(std::move(record)); }

 private:
  std::vector<OpRecord> records_;
  detail::RankState* state_ = nullptr;
  TraceScope* previous_ = nullptr;
};

// The innermost TraceScope of the calling rank, or null when not tracing.
TraceScope* current_trace() noexcept;

// ---- Serialisation. A JSON array of objects, one record per line, with the field names above
// ("op", "reduce_op", "premul_factor", "tag", "ranks", "group_size", "input_shapes", "dtype",
// "input_dtypes", "dims", "output_split_sizes", "input_split_sizes", "src", "src_dst", "rank",
// "seq", "output_shapes", "meta"). reduce_op is its name ("sum", ..., "premul_sum") or null;
// premul_factor is present for premul_sum only and round-trips exactly (shortest exact decimal;
// non-finite factors as the strings "inf", "-inf", "nan", "-nan" or "nan(0x<bits>)"); dtypes are
// names ("Float32"); input_dtypes is written only when non-empty. reduce_op, input_dtypes and
// the split lists may be absent or null; every other field is required, and an unknown key is
// an error. from_json(to_json(r)) == r.
std::string to_json(const std::vector<OpRecord>& records);
// Throws InvalidArgument naming the offset and what was expected for malformed input, an
// unknown op, reduce_op or dtype, or a missing field.
std::vector<OpRecord> from_json(std::string_view json);

// ---- Desync check.
// The first place where ranks' traces disagree.
struct TraceDivergence {
  int rank = -1;          // the rank whose record disagrees
  std::size_t index = 0;  // the index of that record in its rank's trace
  std::string field;      // "op", "reduce_op", "dtype", "input_shapes", "dims", "src",
                          // "src_dst", "group", "splits", or "missing" (a rank has no record
                          // where its peers have one)
  std::string expected;   // the value on the reference rank
  std::string actual;     // the value on `rank`
  // The peer it was compared with and the index of its record; -1 when there is no peer to
  // name (a split list of the wrong length, a record whose group lacks its own rank). For
  // "missing", index is one past the rank's last record and expected is the peer's record. For
  // "splits", expected/actual read "input_split_sizes[2]=6" / "output_split_sizes[1]=7", and
  // the pair is reported on its higher rank.
  int reference_rank = -1;
  std::size_t reference_index = 0;

  // "rank 2, record 5: reduce_op is 'max', rank 0 record 5 has 'sum'".
  std::string to_string() const;
};

// `traces[r]` is rank r's trace. Records are matched per communicator (tag and the issuing
// rank's group), in issue order; meta records are matched among themselves, apart from real
// ones (a meta record never stands in for a peer's real call), and coalesced calls of no tensors
// are left out (they start nothing); within a match every member must agree with the group's
// lowest member on op, reduce_op, dtype, input shapes (all_to_all_single: all but dim 0), dims,
// src, src_dst and group; all_to_all_single splits must be consistent (rank i's input split j
// equals rank j's output split i). Returns the divergence with the smallest (rank, index) (at
// one (rank, index), the first field in the order TraceDivergence::field lists), or nothing when
// the traces agree. A member of a communicator without a trace lacks every record.
std::optional<TraceDivergence> compare_traces(const std::vector<std::vector<OpRecord>>& traces);

// ---- Execution and replay.
// Issues the collective `record` describes on the calling rank, with `inputs` (one per recorded
// input shape, of the recorded dtype; meta inputs allowed under tracing), over the group
// (record.tag, record.ranks, record.group_size). Returns the outputs as the collective returns
// them (pending until waited; the in-place forms return their outputs already waited, and
// all_reduce_inplace writes into inputs[0]). Throws InvalidArgument for a record that names no
// known op or does not fit `inputs` (count, shapes, dtypes).
std::vector<Tensor> execute(const OpRecord& record, const std::vector<Tensor>& inputs,
                            CallSite site = CallSite::current());

// Replays a recorded trace (normally rank()'s own record list) on the calling rank, on whatever
// transport it runs: each record is executed on inputs of its recorded shapes and dtype filled
// with `fill(record, input_index)` when given, else with deterministic values (element i of
// input k of record n on rank r holds (r + 1) * 1000 + n * 10 + k + i, in the dtype; Bool holds
// i % 2). Waits every output and returns them, record by record.
std::vector<std::vector<Tensor>> replay(
    const std::vector<OpRecord>& records,
    const std::function<Tensor(const OpRecord&, std::size_t)>& fill = {});

// ---- Adjoints.
// The backward collective of `forward`: the linear map A* with <A* y, x> == <y, A x> summed over
// ranks. all_reduce sum/avg/premul_sum(f) -> itself; all_gather_tensor (dim d) ->
// reduce_scatter_tensor sum (dim d) and back; all_to_all_single -> all_to_all_single with the
// split lists swapped; permute_tensor -> permute_tensor with the inverse permutation; broadcast
// (src) -> reduce sum (dst = src) and back; the coalesced forms -> their counterparts; the
// in-place forms -> the adjoint of their functional form. The adjoint's input shapes are the
// forward's output shapes. Throws InvalidArgument for an op with no linear adjoint (product, min,
// max, band, bor, bxor) and for reduce_scatter with avg or premul_sum (its adjoint is an
// all_gather followed by a scale, not one collective).
OpRecord adjoint(const OpRecord& forward);

}  // namespace chorus
