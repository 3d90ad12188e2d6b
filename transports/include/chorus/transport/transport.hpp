#pragma once

// The transport seam: transports move bytes, core knows tensors (DESIGN section 3).
//
// A Transport is one rank's endpoint. It creates a Comm for a group of ranks; a Comm starts
// collectives on buffers (pointer, count, dtype, device) with NCCL's count semantics and returns a
// Work. Core calls only this interface, never a concrete transport.
//
// Note [Transport contract]
// - Every started operation is identified by (comm id, seq). Core assigns `seq` per Comm, from 0,
//   one per started operation (one per begin_group/end_group batch); ranks match operations by it.
//   A sequence number names an operation's position in its communicator's order. A transport
//   call that throws (an operation method outside a batch, or end_group; std::bad_alloc included)
//   started nothing and took no position: core gives the number back (Call::register_work), so
//   the communicator's next call gets the same one, and a transport must leave no trace of the
//   operation whose call threw: no count, no slot, no open batch (an operation method that
//   throws inside a batch drops the batch: BatchAbandon, batch_abandon.hpp). The simulator
//   (SimComm, SimWorld::start) keeps to this exactly. Where a real transport cannot:
//   - MPI: --check-collectives' comparison (MpiComm::verify) is a collective on the check
//     communicator, matched by order, not by seq; every member of a mismatch throws and gives
//     the number back, so they compare the retry under the same number again. A call that throws
//     after it posted messages (a Timeout or MPI failure in the middle of start, or a mismatch
//     found after the exchange) parks what it posted (MpiProcess::park): those messages are on
//     the wire and cannot be taken back, whatever number the next call has, and its peers'
//     operation fails or times out as before. std::bad_alloc is not such a case: an operation
//     allocates everything before it posts anything, and parking allocates nothing (Note [Issue
//     without allocation] in transports/mpi/src/mpi_transport.hpp), except inside a coalesced
//     batch (a later operation allocates after the earlier ones posted) and in an operation's
//     start after its --check-collectives comparison, which the peers have already made (the
//     comparison's own rounds allocate everything before the first). Communicator set-up
//     (create_comm, no seq) allocates the communicator object before its rendezvous, and a
//     rendezvous among members only allocates nothing once its first message is posted; but a
//     std::bad_alloc after a peer received this rank's set-up message (answering a non-member's
//     message with a busy reply allocates; Note [Communicator rendezvous]) is not retried
//     cleanly: the set-up throws, cancelling its receives and parking its messages, while a peer
//     that got this rank's message (and sent its own) goes on into MPI_Comm_create_group and
//     waits there, unbounded, for this rank; the retry's new message is never taken, so it ends
//     in Timeout naming those peers, and the peers wait until the job ends.
//   - NCCL: --check-collectives' rounds (check_collective, split_plan.cpp) are keyed in the
//     store by a count of the rounds each member entered, not by seq, so a retry under the
//     number given back is a fresh round, not the failed one's keys (a timed-out round's stay,
//     marked). A member whose call threw before its check never entered that round: its retry
//     meets the round's marks once ("too late"), which counts, and its next try is in step
//     with the others' (NcclCollectiveCheck.ARetryOfATimedOutOperationIsAFreshRound). A call that
//     throws once NCCL's kernels are enqueued (or enqueueing failed) aborts the communicator first,
//     so every later call on it fails with Aborted whatever its number.
// - Buffers stay alive inside the Work until it completes: a transport keeps `keep_alive` of each
//   Buffer it was given until the operation finished touching the memory.
// - Nothing blocks forever: every wait has a deadline on the transport's clock (`now()`).
// - Failures are status codes inside the transport, turned once into an exception (a
//   chorus::Error subclass, see make_error) stored in the Work and rethrown by every wait().
// - A transport states what it supports (`supports`); core lowers or raises InvalidArgument
//   naming the transport before starting anything unsupported.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/call_site.hpp"
#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"

namespace chorus::transport {

using Duration = std::chrono::nanoseconds;

// A point on a transport's clock (nanoseconds since the transport's epoch: virtual time in the
// simulator, steady_clock time on real transports).
struct Deadline {
  Duration at = Duration::max();
  static constexpr Deadline never() noexcept { return Deadline{}; }
  // `timeout` after `now`; never() when that is past the clock's range (an infinite timeout).
  static constexpr Deadline after(Duration now, Duration timeout) noexcept {
    return timeout >= Duration::max() - now ? never() : Deadline{now + timeout};
  }
  constexpr bool is_never() const noexcept { return at == Duration::max(); }
};

enum class OpKind : std::uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Reduce,
};

constexpr std::string_view op_kind_name(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::AllReduce:
      return "all_reduce";
    case OpKind::AllGather:
      return "all_gather";
    case OpKind::ReduceScatter:
      return "reduce_scatter";
    case OpKind::AllToAll:
      return "all_to_all";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Reduce:
      return "reduce";
  }
  return "unknown";
}

// A contiguous run of `count` elements of `dtype` at `data` on `device`.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  // Owner of the memory; held by the transport until the operation completes.
  std::shared_ptr<const void> keep_alive;
  // The tensor dtype core lowered to `dtype` (Complex64 to Float32, Complex128 to Float64, Bool
  // to UInt8: Note [Lowering] in core), when it did. Transports move `dtype`; they compare this
  // too, so a rank passing n Complex64 elements where a peer passes 2n Float32 ones is a
  // mismatch although the bytes moved would agree.
  std::optional<DType> lowered_from;
  // A digest of the API-level layout core passed: the input tensor's sizes and the op's
  // gather/scatter dim (Note [Layout digest] in core). 0: not set (a transport's own buffers,
  // tests that build buffers by hand). Transports compare it like the dtype: ranks passing a
  // [2, 3] and a [3, 2] tensor, or gathering along different dims, move the same element counts
  // but disagree.
  std::uint64_t layout = 0;

  std::size_t nbytes() const noexcept { return count * element_size(dtype); }
};

// What core tells the transport about an operation beyond its buffers.
struct OpInfo {
  // The API name, e.g. "all_reduce_coalesced": a string literal, so a transport may keep the
  // view in a work for its error messages without copying it.
  std::string_view name;
  std::int64_t seq = -1;  // see Note [Transport contract]
  CallSite site;
  // The caller's current stream of the buffers' device (Note [Current stream] in
  // chorus/stream.hpp): device buffers' operation starts after the work enqueued on it. Null: the
  // legacy default stream, and always for host buffers.
  void* stream = nullptr;
};

// Whether `kind` combines values with a ReduceOp.
constexpr bool op_kind_reduces(OpKind kind) noexcept {
  return kind == OpKind::AllReduce || kind == OpKind::ReduceScatter || kind == OpKind::Reduce;
}

// all_to_all: why this rank's own two split sizes do not pair up ("this rank sends itself 2
// elements but expects 1 from itself"), or empty. Only this rank can tell; a transport refuses
// such an operation (InvalidArgument) before anything starts, unless its collective check
// compares every pair, this one included, on every member.
inline std::string self_split_problem(const std::vector<std::size_t>& send_counts,
                                      const std::vector<std::size_t>& recv_counts, int group_rank) {
  const auto me = static_cast<std::size_t>(group_rank);
  if (send_counts.at(me) == recv_counts.at(me)) {
    return {};
  }
  return "this rank sends itself " + std::to_string(send_counts[me]) + " elements but expects " +
         std::to_string(recv_counts[me]) + " from itself";
}

// The comparable shape of one operation, used to check that ranks agree.
//
// For all_to_all, send_count and recv_count are this rank's totals, which legitimately differ
// between ranks (uneven splits); agrees_with() ignores them and transports check the per-peer
// counts pairwise instead (rank i's send count for j equals rank j's receive count for i).
struct OpSignature {
  OpKind kind = OpKind::AllReduce;
  DType dtype = DType::Float32;
  std::size_t send_count = 0;
  std::size_t recv_count = 0;
  ReduceOp reduce_op = ReduceOp::Kind::Sum;  // Sum for ops without a reduction
  int root = -1;
  std::optional<DType> lowered_from;  // Buffer::lowered_from of the send buffer
  // Buffer::layout of the send buffer. Not printed by to_string(): a digest means nothing to a
  // reader, so a mismatch message that differs only here says so instead (layout_note).
  std::uint64_t layout = 0;

  // The signature of an operation on `send` and `recv`.
  static OpSignature of(OpKind kind, const Buffer& send, const Buffer& recv,
                        const ReduceOp& reduce_op, int root) {
    return OpSignature{kind,      send.dtype, send.count,        recv.count,
                       reduce_op, root,       send.lowered_from, send.layout};
  }

  // "1a2b3c4d": the low 32 bits of the layout digest, in hex (enough to tell two apart in a
  // message), or empty when it is not set.
  std::string layout_text() const {
    if (layout == 0) {
      return {};
    }
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(8, '0');
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[out.size() - 1 - i] = kDigits[(layout >> (4 * i)) & 0xFU];
    }
    return out;
  }

  // "all_reduce(Float32, send=4, recv=4, sum)"; "all_reduce(Complex64 as Float32, send=4, ...)"
  // when lowered (counts are then of the lowered dtype).
  std::string to_string() const {
    std::string out(op_kind_name(kind));
    out += '(';
    if (lowered_from) {
      out += dtype_name(*lowered_from);
      out += " as ";
    }
    out += dtype_name(dtype);
    out += ", send=" + std::to_string(send_count) + ", recv=" + std::to_string(recv_count);
    if (op_kind_reduces(kind)) {
      out += ", " + reduce_op.to_string();
    }
    if (root >= 0) {
      out += ", root=" + std::to_string(root);
    }
    out += ')';
    return out;
  }
  friend bool operator==(const OpSignature&, const OpSignature&) = default;

  // Whether two ranks' signatures of the same operation agree.
  bool agrees_with(const OpSignature& other) const noexcept {
    if (kind == OpKind::AllToAll && other.kind == OpKind::AllToAll) {
      return dtype == other.dtype && lowered_from == other.lowered_from && layout == other.layout;
    }
    return *this == other;
  }
  // Whether the two disagree only in their layout digests, so their to_string()s agree as far as
  // agrees_with() looks: a message should then say what differs.
  bool differs_only_in_layout(const OpSignature& other) const noexcept {
    if (layout == other.layout) {
      return false;
    }
    OpSignature same_layout = other;
    same_layout.layout = layout;
    return agrees_with(same_layout);
  }
};

// What a mismatch message adds when two ranks' signatures differ only in layout (their printed
// signatures then read alike).
inline constexpr char kLayoutMismatchNote[] =
    " (their tensors' shapes or gather/scatter dims differ)";

// Everything ranks must agree on for operation `seq` of communicator `comm_id`. A coalesced
// batch has several signatures.
struct Fingerprint {
  std::uint64_t comm_id = 0;
  std::int64_t seq = -1;
  std::vector<OpSignature> ops;

  // "all_reduce(Float32, send=4, recv=4, sum)", or "[op, op, ...]" for a batch.
  std::string to_string() const {
    if (ops.size() == 1) {
      return ops.front().to_string();
    }
    std::string out = "[";
    for (std::size_t i = 0; i < ops.size(); ++i) {
      out += (i > 0 ? ", " : "") + ops[i].to_string();
    }
    return out + "]";
  }
  // Agreeing op by op (OpSignature::agrees_with); comm_id/seq were fixed by the matching.
  bool same_ops(const Fingerprint& other) const noexcept {
    if (ops.size() != other.ops.size()) {
      return false;
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].agrees_with(other.ops[i])) {
        return false;
      }
    }
    return true;
  }
  // Whether the two disagree, but only in layout digests (OpSignature::differs_only_in_layout).
  bool differs_only_in_layout(const Fingerprint& other) const noexcept {
    if (ops.size() != other.ops.size()) {
      return false;
    }
    bool differs = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].differs_only_in_layout(other.ops[i])) {
        differs = true;
      } else if (!ops[i].agrees_with(other.ops[i])) {
        return false;
      }
    }
    return differs;
  }
};

enum class WorkStatus : std::uint8_t { Pending, Completed, Failed };

// One started operation, as seen by one rank. Thread-safe: any thread may query or wait.
class Work {
 public:
  virtual ~Work() = default;

  // Nonblocking. True once the operation finished (successfully or not). A scheduling point in
  // the simulator.
  virtual bool is_completed() = 0;

  // Blocks the host until the operation finished or `deadline` passed. Returns normally on
  // success; rethrows the stored error on failure; throws Timeout when the deadline passed first
  // (the operation stays pending). Idempotent.
  virtual void wait(Deadline deadline) = 0;

  // Device semantics: makes work enqueued later on `stream` (a cudaStream_t, core's current stream
  // of the buffers' device, Note [Current stream]; null: the legacy default stream) wait for this
  // operation, without blocking the host.
  // Transports without device streams throw InvalidArgument.
  virtual void wait_on(void* stream) = 0;

  virtual WorkStatus status() const = 0;
  // The stored error once status() == Failed, else null.
  virtual std::exception_ptr error() const = 0;
  virtual const Fingerprint& fingerprint() const = 0;

  // Observer hooks for core's work lifecycle (Note [Work lifecycle], core/src/detail): core calls
  // on_dropped when every result tensor of this operation died before a wait, and on_finalized
  // once core itself completed an operation nobody waited (after a drop, or when the rank ended;
  // `failed`: completing it failed). They let a transport log what happened (the simulator's
  // event log); by default they do nothing. Called on the rank's thread, on_dropped with core's
  // registry lock held: they must not block, throw or call into chorus.
  virtual void on_dropped() const noexcept {}
  virtual void on_finalized(bool /*at_rank_exit*/, bool /*failed*/) const noexcept {}
  // Asked by core right after on_dropped (same thread, lock and rules), unless core defers the
  // drop anyway (an exception is unwinding): whether to finalize this dropped operation later —
  // at the rank's next collective or explicit wait, or when the rank ends — rather than now. A
  // real runtime does not fix when a dropped result is finalized (a garbage collector's timing);
  // the simulator draws the answer from its decision stream. By default: now.
  virtual bool defer_finalization() const noexcept { return false; }
};

// A communicator: one rank's handle on a group. Not thread-safe: a rank starts operations on a
// Comm from one thread at a time.
class Comm {
 public:
  virtual ~Comm() = default;

  virtual std::uint64_t id() const noexcept = 0;
  virtual const std::string& tag() const noexcept = 0;
  virtual const std::vector<int>& ranks() const noexcept = 0;  // global ranks, group order
  virtual int group_rank() const noexcept = 0;                 // this rank's index in ranks()
  int size() const noexcept { return static_cast<int>(ranks().size()); }

  // recv.count == send.count; recv may equal send (in place).
  virtual std::shared_ptr<Work> all_reduce(const Buffer& send, const Buffer& recv,
                                           const ReduceOp& reduce_op, const OpInfo& info) = 0;
  // recv.count == send.count * size(); group rank i's data lands at recv + i * send.count.
  virtual std::shared_ptr<Work> all_gather(const Buffer& send, const Buffer& recv,
                                           const OpInfo& info) = 0;
  // send.count == recv.count * size(); this rank gets the reduction of block group_rank().
  virtual std::shared_ptr<Work> reduce_scatter(const Buffer& send, const Buffer& recv,
                                               const ReduceOp& reduce_op, const OpInfo& info) = 0;

  // Every rank sends block j of `send` (send_counts[j] elements, blocks back to back in group-rank
  // order) to group rank j, and receives block i of `recv` (recv_counts[i] elements) from group
  // rank i (MPI_Alltoallv with packed displacements). Both count lists have size() entries,
  // send.count and recv.count are their sums, and rank i's send_counts[j] must equal rank j's
  // recv_counts[i] (a transport that can check reports a CollectiveMismatch). The count lists
  // are read during this call only: core refills them for its next all_to_all (Note [Reused
  // count lists] in core), so a transport copies what it needs later.
  virtual std::shared_ptr<Work> all_to_all(const Buffer& send,
                                           const std::vector<std::size_t>& send_counts,
                                           const Buffer& recv,
                                           const std::vector<std::size_t>& recv_counts,
                                           const OpInfo& info) = 0;
  // Group rank `root`'s send is copied into every rank's recv (root's too; recv may equal send).
  // recv.count == send.count; send is read on root only.
  virtual std::shared_ptr<Work> broadcast(const Buffer& send, const Buffer& recv, int root,
                                          const OpInfo& info) = 0;
  // Group rank `root`'s recv gets the reduction of every rank's send; recv.count == send.count.
  // recv is written on root only: other ranks' recv is left untouched.
  virtual std::shared_ptr<Work> reduce(const Buffer& send, const Buffer& recv,
                                       const ReduceOp& reduce_op, int root, const OpInfo& info) = 0;

  // Between begin_group() and end_group(), started operations are batched (NCCL group
  // semantics): they return null and end_group() returns one Work for the batch. `info` of
  // end_group carries the batch's seq and name; the ops inside pass the same seq.
  virtual void begin_group() = 0;
  virtual std::shared_ptr<Work> end_group(const OpInfo& info) = 0;
};

// Note [Partitioned groups]
// Most group specs name one group, known to its members only: a rank list, a ProcessGroup, a 1-D
// mesh. Two name a partition that every world rank issues together: a list of rank lists that
// covers the world ({{0, 1}, {2, 3}} in a world of 4), and a MeshDim of a mesh over the whole
// world (its slices along the dim). Every world rank is then in exactly one part, and every rank
// reaches the set-up of its own part in the same operation, so a transport may build the parts
// together from the world (NCCL: ncclCommSplit of the world communicator) instead of one
// members-only set-up per group.
// - Core calls create_partition_comm on every world rank that reaches its first operation on a
//   given (tag, partition), in program order. Whether all ranks reach it, and in the same order
//   relative to other partitions, is up to the program: the simulator and MPI do not need it (a
//   partition used by some ranks only is fine there), so a transport whose set-up is collective
//   over the world (NCCL's split) must be opt-in and say so (Note [NCCL communicator set-up]). It
//   calls it even when this rank already has the communicator of its part from an earlier operation
//   (`existing`: a plain-list operation on the same tag and ranks, or another partition sharing
//   that part); a transport whose set-up is collective over the world must still take part, and
//   returns `existing`. Members of one part agree on whether they have it: they created it
//   together.
// - Later operations on the partition reuse core's communicator: no transport call.
// - A group named by one rank list never comes here, even when it covers the world: only its
//   members call create_comm, and non-members never learn that the group exists.

// A partition of the world [0, world_size) into parts of equal size, and the part that holds the
// calling rank.
struct Partition {
  std::vector<std::vector<int>> parts;  // global ranks, group order
  int index = -1;                       // parts[index] holds the calling rank

  const std::vector<int>& own() const { return parts.at(static_cast<std::size_t>(index)); }

  // Empty when `parts` is a partition of [0, world_size) into non-empty parts of equal size and
  // parts[index] holds `rank`; otherwise what is wrong. Never throws (but on allocation).
  std::string problem(int world_size, int rank) const {
    if (parts.empty()) {
      return "the partition has no parts";
    }
    if (index < 0 || static_cast<std::size_t>(index) >= parts.size()) {
      return "part index " + std::to_string(index) + " is out of range";
    }
    std::vector<int> seen(static_cast<std::size_t>(world_size > 0 ? world_size : 0), 0);
    std::size_t covered = 0;
    for (const std::vector<int>& part : parts) {
      if (part.empty() || part.size() != parts.front().size()) {
        return "the parts are empty or of unequal size";
      }
      for (const int member : part) {
        if (member < 0 || member >= world_size || seen[static_cast<std::size_t>(member)]++ > 0) {
          return "rank " + std::to_string(member) + " is out of range or in two parts";
        }
        ++covered;
      }
    }
    if (covered != seen.size()) {
      return "the parts cover " + std::to_string(covered) + " of " + std::to_string(world_size) +
             " ranks";
    }
    const std::vector<int>& mine = own();
    if (std::find(mine.begin(), mine.end(), rank) == mine.end()) {
      return "rank " + std::to_string(rank) + " is not in part " + std::to_string(index);
    }
    return {};
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string_view name() const noexcept = 0;  // "sim", "nccl", "mpi"
  virtual int rank() const noexcept = 0;
  virtual int world_size() const noexcept = 0;
  // Where this rank computes (chorus::local_device): the rank's GPU for a device transport
  // (NCCL), the host for the others.
  virtual Device device() const noexcept { return Device::cpu(); }

  // The communicator for `ranks` (global ranks, group order) and `tag`; this rank must be one of
  // `ranks`. Same (tag, ranks) on every member -> the same communicator.
  // Blocks until the set-up finished or the transport's timeout passed (Timeout);
  // TransportError when it failed. Called by the members of `ranks` only.
  virtual std::shared_ptr<Comm> create_comm(const std::string& tag,
                                            const std::vector<int>& ranks) = 0;

  // The communicator for (tag, partition.own()) when the group is a part of a partition of the
  // world (Note [Partitioned groups]): called on every world rank at its first operation on
  // (tag, partition), with `existing` this rank's communicator for (tag, partition.own()) when
  // it has one already (then it is returned). Blocks and throws as create_comm. By default: the
  // members-only set-up, `existing` or create_comm(tag, partition.own()).
  virtual std::shared_ptr<Comm> create_partition_comm(const std::string& tag,
                                                      const Partition& partition,
                                                      const std::shared_ptr<Comm>& existing) {
    if (existing) {
      return existing;
    }
    return create_comm(tag, partition.own());
  }

  // The transport's clock, for deadlines.
  virtual Duration now() = 0;

  // Whether `kind` on `dtype` with `reduce_op`, on buffers on `device`, runs natively. An empty
  // string means yes; otherwise the reason, for the InvalidArgument core raises. A function of
  // its arguments for the transport's life: a rank remembers the last yes and does not ask again
  // for the same arguments (Note [Supported calls], core/src/detail/rank_state.hpp).
  virtual std::string supports(OpKind kind, DType dtype, const ReduceOp& reduce_op,
                               Device device) const = 0;
};

}  // namespace chorus::transport
