#pragma once

// The simulated world: N ranks, their communicators' rendezvous tables, and the scheduler.
//
// Note [Simulator scheduling]
// Ranks run one at a time on executor contexts (Note [Rank executor]). Every chorus transport
// call of a rank that starts an operation, polls one, or waits on one still pending is a
// scheduling point: the rank records what it did and suspends. A wait on a work that already
// finished (completed or failed) returns at once without one (core does not even reach the
// transport for a completed one): ranks interleave where they communicate, and such a wait
// communicates with no one. A decision there would only reorder the ranks' own code, which on a
// cluster (a process per rank) no other rank observes, at the cost of one more decision to every
// run (SimScheduler.AWaitOnAFinishedWorkTakesNoDecision). The scheduler
// then collects the candidates — runnable ranks, and the head operation of each communicator once
// every member arrived at it — and lets the seeded RNG pick one: resume that rank, or complete
// that operation (move the bytes for every member at once, reductions in the order of Note
// [Reduction order modes]). Each decision advances virtual time by kStepDuration. Every choice is
// a pure function of the seed and the program, so a seed replays an interleaving exactly.
//
// Note [Reduction order modes]
// A completing reduction combines the members' contributions once, into one buffer that is then
// copied to every member (reduce_scatter: once per output block), so every rank gets the same
// bits in every mode. SimOptions::reduction_order picks the order:
// - Fixed: kernels::reduce in group-rank order (Note [Reduction order] in chorus/kernels.hpp).
// - Ring: the buffer is cut into one chunk per member (all_reduce, reduce) and chunk c is folded
//   left to right starting at member (seq + c + 1) mod n and going round: NCCL's ring reduces
//   chunk c starting after rank c; the sequence number turns the ring per operation. A
//   reduce_scatter block d is chunk d.
// - Tree: kernels::reduce_program with the pairwise tree over group-rank order: the left subtree
//   holds the largest power of two below the member count, ((x0 + x1) + (x2 + x3)) + x4.
// - Adversarial: per reduction op, a permutation of the members (each pick an index among the
//   members left, in group-rank order) and a tree shape (each split: 1 + choose(n - 1) members
//   on the right) from the decision stream, n - 1 + n - 1 choices for n members. All choices 0
//   give the Fixed order, so shrinking a failing list converges on it.
// Partial results stay in the kernels' accumulation type; avg divides once, premul_sum scales
// each contribution once. Each reduction op leaves the mark "reduction.<mode>".
//
// Note [Simulator failures]
// - Mismatch: when a rank arrives at operation `seq` of a communicator with a fingerprint that
//   differs from an earlier arrival, the operation fails on every member with CollectiveMismatch
//   naming both sides (signature and call site); later operations of that communicator fail with
//   Aborted.
// - A rank whose function ended (returned or threw) will never arrive again: every operation it
//   has not joined fails at once — RankFailure if it threw, Deadlock ("returned without
//   joining") if it returned.
// - Deadlock: no candidate but an unfinished rank: every outstanding operation fails with
//   Deadlock, carrying a table of every rank's state, pending op and call site.
// - Group disagreement: when nothing can run and two ranks are blocked on different
//   communicators that each contain the other, they disagree on the group (or tag) of their next
//   collective: those operations fail with CollectiveMismatch naming both.
// - Timeout: when a blocked rank's deadline (virtual time) passes, the operation fails with
//   Timeout on every member and its communicator is aborted (a real transport's watchdog): the
//   earlier operations still outstanding fail with Timeout too (the waited one names the first
//   an injected fault hung), the later ones with Aborted.
// - Input modified: each send buffer is copied (or, when large, checksummed) at issue and
//   compared at completion (Note [Input snapshots]); a change fails the operation with
//   InputModified on every member (on NCCL it would be a data race).
// - Livelock: past SimOptions::max_steps decisions, outstanding operations fail with Deadlock and
//   new ones with Aborted.
//
// Note [Fault injection]
// Faults (SimOptions::faults, random_faults) fire in start(), when a rank starts its k-th
// operation (RankSlot::ops_started), and each leaves a mark ("fault.<kind>", plus
// "fault.random" for a drawn one):
// - Delay: the rank goes Delayed until virtual time passes wake_at (a deadline of its own in
//   Note [Deadline scan]), then starts the operation.
// - Crash: the rank is `crashed`: start() throws RankFailure on it (now and at any later call),
//   every outstanding operation of its communicators fails with RankFailure, and absence()
//   reports it to peers arriving later, as for a rank that ended with an error.
// - TransportError, Hang: the rank's arrival marks its slot (Slot::fault). complete_operation
//   fails a TransportError slot instead of moving bytes and aborts the communicator; a Hang
//   slot is never a candidate, so its members' waits reach their deadlines (Timeout, abort).
// At one operation a Delay acts first, a Crash preempts a TransportError or Hang, and a Hang a
// TransportError; a preempted fault is neither marked nor in faults_fired (fire_faults). The
// same holds between the members of one collective (mark_slot_fault): a Hang that a later
// member brings replaces an earlier member's TransportError, which is withdrawn (unmarked and
// taken out of faults_fired; a random one still counts against max_faults, so a closed window
// never reopens); of two of one kind the first stays. A TransportError or Hang is reported only
// if it acts: it is recorded when it marks its slot, not for an operation that fails on arrival
// (a communicator already aborted, a step budget spent), and withdrawn by fail_slot when the
// operation fails for another reason first (a mismatch, a crashed or absent member, an abort):
// a TransportError acts only as the operation's TransportError, a Hang as its Timeout or
// Deadlock. Either way the choice a random one took stays taken.
// Random faults take one choice per operation started while their window is open and no
// explicit fault fires there (choice 0 is "no fault"), and nothing else does: without faults the
// choice list is unchanged. The window covers the operations started while decisions
// 0 .. until_step - 1 run (steps_ is already one ahead while a decision runs).
//
// Note [Virtual time skip]
// When no rank can run and no operation can complete because of a fault (a Delayed rank, a Hang
// slot), virtual time jumps to the earliest wake-up or wait deadline instead of declaring a
// deadlock ("fault.time_skip"): a slow rank then arrives, a watchdog fires. Without such a fault
// the world is genuinely stuck and Deadlock is declared as before. A skip is not a decision.
//
// Note [Liveness phase]
// With SimOptions::liveness_steps, the phase begins at the first decision after which no fault
// can fire any more and none is still in effect: no rank is Delayed and no operation hangs by a
// fault that no wait has timed out yet ("liveness.phase"). If some rank has not finished
// liveness_steps decisions later, the run is over: the ranks not finished are the stuck ones
// ("liveness.violation", SimReport::stuck_ranks), every outstanding operation fails with Deadlock
// naming them with the rank table (what each is blocked on), and every operation started after
// fails the same way, so a rank retrying forever (catching Aborted, say) ends too.

// Note [Finalization choice]
// When core finalizes a result dropped un-waited is not fixed on a real runtime, so with
// SimOptions::choose_finalization it is a choice: core asks transport::Work::defer_finalization
// at each drop (not while an exception unwinds: that drop is deferred anyway), and the world
// answers with stream_.choose(2) — 0: finalize now ("finalize.now"), 1: defer to the rank's next
// collective, explicit wait or exit ("finalize.deferred"), where core's settle_unwaited
// completes it (Note [Work lifecycle], step 3). A drop off the simulated ranks (a thread that is
// not a rank) takes no choice and is finalized now. Without the option nothing is drawn, so the
// choice lists of default runs are unchanged.

// Note [All-reduce blocks]
// An all_reduce is reduced into one output (rank 0's, or scratch when that overlaps an input)
// and copied to the others. Done for the whole buffer at once, the copies read the result back
// from memory once per other rank once it is larger than the caches; done a block of
// kAllReduceBlockBytes (world.cpp) at a time, they read it from cache, and the operation moves
// about what the least any all_reduce in one memory moves (every input read once, every output
// written once: the memory probe of `chorus bench`). Every order but Ring is elementwise, so blocks
// change no result bit; Ring's segments depend on the whole count, so it is reduced whole, and so
// is an operation where an output overlaps another member's input (a block copied early would
// overwrite input not yet read; SimWorld::cross_aliased). When the outputs together reach
// kStreamingOutputBytes (16 MiB, about what the caches hold), the copies use non-temporal stores
// (copy_streaming, as glibc's memcpy does for copies that large): the outputs' lines are not
// read before being written, which otherwise costs a read per written byte (mark
// "allreduce.streaming").

// Note [Buffer checks]
// A pending output holds poison (quiet NaN, 0xA5 bytes) from issue to completion, so a read that
// skipped the wait sees garbage; every input is recorded at issue and compared at completion
// (Note [Input snapshots]), so a write to it in between is InputModified. Together they read the
// inputs twice and write the outputs once more than the collective itself, about tripling an
// all_reduce's memory traffic. SimOptions::check_buffers turns both off for throughput
// measurements (`chorus bench`, Note [chorus bench]); the bugs they catch then go unnoticed.
//
// Note [Input snapshots]
// An input of at most kInputSnapshotBytesMax bytes is copied at issue into its arrival's
// `inputs` and compared byte for byte (memcmp) at completion; a larger one is checksummed
// (checksum_bytes) at issue and again at completion. For the small inputs of a typical schedule a
// copy and a compare cost a fraction of two checksums (a 256-byte input: about 40 instructions
// each against about 360), and the room comes back with the slot's arrivals (SimGroup::
// recycle_slot), so it allocates only for a new high of snapshot bytes, made before the
// operation counts (Note [Operation positions]). A copy catches every change; a checksum misses
// one with probability 2^-64, so the two report the same. Past the threshold, a copy would hold
// a second buffer of every pending input in memory, and the checksum's eight lanes run near
// memory speed anyway.
//
// Note [Likely writers]
// InputModified is found at the completion of the operation whose input changed (the victim),
// which is all a snapshot can say: the bytes differ. Its error names the victim (each member's
// context: rank, op, seq, group; the detail: whose input, and where it was issued), and, where it
// can, the likely writer: a collective that completed after the victim's member arrived and
// whose output overlaps the changed input, such as an in-place collective on another
// communicator (the in-place forms wait only for collectives that write their tensor, not for
// those that read it). With check_buffers, each arrival notes completed_ when it arrives, and
// complete_operation records the outputs each completed operation wrote in a ring per rank of its
// last kRecentWritesMax (remember_writes: a few stores per output, no allocation; per rank, so
// that one collective of many ranks does not push the others' out), but only while some other
// operation has arrived and not completed (arrivals_unfinished_; a failed one is never taken off,
// which only records more): without one no pending input exists to overwrite, so a program that
// waits for each collective before the next records nothing. modified_inputs looks through
// the input's rank's ring, newest first, then the other ranks', only when an input changed. Not
// named: a write by the rank's own code (copy_, a raw pointer; the simulator sees no such write,
// and the detail then names no writer), a writer that completed more than kRecentWritesMax of
// its rank's recorded outputs ago, and the poison an operation still outstanding wrote into its
// output at issue (its output overlapping another operation's pending input): finding those would
// take a scan of every outstanding operation of every communicator, or a record per issue.

// Note [Event log]
// With SimOptions::record_events the world logs what each rank did (SimReport::events) in the
// order it happened: issue and arrive in start(), wait begin and end in wait_on_rank (only when
// the rank really blocked), complete in complete_operation, fail in fail_work, and drop and
// finalize from core through transport::Work's hooks (only core knows when a result tensor
// died). Each event is appended by the context holding the scheduler's turn, so the log needs no
// lock, and logging draws no choice: a run with the log makes exactly the decisions of one
// without. The log is drawn by simulator/src/timeline.cpp (Perfetto JSON, SVG).

#include <array>
#include <atomic>
#include <boost/container/small_vector.hpp>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/runtime.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "decision_stream.hpp"
#include "executor.hpp"
#include "rng.hpp"
#include "seq_table.hpp"
#include "sim_allocator.hpp"

namespace chorus::sim::detail {

class SimWorld;

// One operation of a batch, as one rank started it.
struct SimOp {
  SimOp() = default;
  // Note [Ops built in place] (sim_transport.cpp): each member written once, not zeroed first.
  SimOp(transport::OpKind op_kind, const transport::Buffer& send_buffer,
        const transport::Buffer& recv_buffer, const ReduceOp& op)
      : kind(op_kind), send(send_buffer), recv(recv_buffer), reduce_op(op) {}

  transport::OpKind kind = transport::OpKind::AllReduce;
  transport::Buffer send;
  transport::Buffer recv;
  ReduceOp reduce_op = ReduceOp::Kind::Sum;
  int root = -1;                         // broadcast, reduce: the group rank of the root
  std::vector<std::size_t> send_counts;  // all_to_all: elements sent to each group rank
  std::vector<std::size_t> recv_counts;  // all_to_all: elements received from each group rank
  // Of `send` at issue when it is larger than kInputSnapshotBytesMax, checked at completion
  // (InputModified; Note [Input snapshots]).
  std::uint64_t input_hash = 0;
};

// Note [Input snapshots]: inputs up to this size are copied at issue and compared at completion;
// larger ones are checksummed.
inline constexpr std::size_t kInputSnapshotBytesMax = std::size_t{4} << 10;

// One rank's handle on one started operation (a single op or a batch).
class SimWork final : public transport::Work {
 public:
  // Operation info.seq of group `comm_id`, as `ops` (its signature list is made here, in place:
  // Note [Recycled signature lists] in world.cpp). Its op is info.name (a string literal), `group`
  // its group's label (SimGroup::label, shared): a work copies no string, and makes its
  // ErrorContext only for an error. Throws std::bad_alloc.
  // Inlined into start, its one caller (world.cpp only): GCC's own choice flipped with unrelated
  // changes elsewhere in the program, and each flip cost ~17 instructions a start (Note [Inlined
  // hot helpers]).
  [[gnu::always_inline]] inline SimWork(SimWorld& world, int rank, std::uint64_t comm_id,
                                        std::span<const SimOp> ops, const transport::OpInfo& info,
                                        const std::shared_ptr<const std::string>& group);
  // Gives the fingerprint's list of signatures back for the next start (Note [Recycled signature
  // lists] in world.cpp).
  ~SimWork() override;
  SimWork(const SimWork&) = delete;
  SimWork& operator=(const SimWork&) = delete;

  bool is_completed() override;
  void wait(transport::Deadline deadline) override;
  void wait_on(void* stream) override;
  transport::WorkStatus status() const override { return status_.load(std::memory_order_acquire); }
  std::exception_ptr error() const override;
  const transport::Fingerprint& fingerprint() const override { return fingerprint_; }
  // Core's drops and finalizations go to the event log (SimWorld::on_work_dropped).
  void on_dropped() const noexcept override;
  void on_finalized(bool at_rank_exit, bool failed) const noexcept override;
  // Note [Finalization choice] (SimWorld::choose_deferred_finalization).
  bool defer_finalization() const noexcept override;

  int rank() const noexcept { return rank_; }
  std::string_view op() const noexcept { return op_; }
  std::int64_t seq() const noexcept { return seq_; }
  const std::string& group() const noexcept { return *group_; }
  // What its errors name. Copies the op and the group: throws std::bad_alloc out of memory.
  ErrorContext context() const { return ErrorContext{rank_, std::string(op_), seq_, *group_}; }
  const CallSite& site() const noexcept { return site_; }

  // ---- World side (scheduler).
  void mark_completed() noexcept;
  void mark_failed(std::exception_ptr error) noexcept;
  // Ranks of this world blocked on this work (any rank may wait on any rank's tensor).
  void add_waiter(int rank) { waiters_.push_back(rank); }
  std::span<const int> waiters() const noexcept { return {waiters_.data(), waiters_.size()}; }
  void clear_waiters() noexcept { waiters_.clear(); }
  // Rethrows the stored error when failed (raised_error).
  void rethrow_if_failed() const;

 private:
  // error_, or, where it is a fixed text made without context (out of memory), the same text
  // made again under this work's context (Note [Operation positions]).
  std::exception_ptr raised_error() const noexcept;

  // Note [Waits without a lock] (world.cpp): the world through its weak_ptr where it may have
  // ended, through its address where it cannot have.
  std::weak_ptr<SimWorld> world_;
  SimWorld* world_address_;
  int rank_;
  transport::Fingerprint fingerprint_;
  std::string_view op_;
  std::int64_t seq_;
  std::shared_ptr<const std::string> group_;  // never null
  CallSite site_;
  std::exception_ptr error_;  // written before status_ becomes Failed
  // Touched only by the context that holds the scheduler's turn. Usually one rank (the owner)
  // waits: inline storage spares a work an allocation.
  boost::container::small_vector<int, 2> waiters_;
  std::atomic<transport::WorkStatus> status_{transport::WorkStatus::Pending};
};

// A communicator's shared rendezvous table.
struct SimGroup {
  std::uint64_t id = 0;
  // decision_code of completing one of its operations, all but the operation's seq (Note
  // [Decision codes] in world.cpp): set with id.
  std::uint64_t complete_code = 0;
  std::string tag;
  std::vector<int> ranks;
  // "[0, 1]": shared with the group's works (SimWork::group), never null once the group is made.
  std::shared_ptr<const std::string> label;

  struct Arrival {
    bool arrived = false;
    std::vector<SimOp> ops;
    std::shared_ptr<SimWork> work;
    // Note [Input snapshots]: the bytes at issue of each op's input of at most
    // kInputSnapshotBytesMax bytes, one after another in op order.
    std::vector<unsigned char> inputs;
    // Note [Likely writers]: SimWorld::completed_ when it arrived. Set at every arrival with
    // check_buffers, read only then: recycle_slot need not reset it.
    std::uint64_t completed_at_issue = 0;

    // "all_reduce": the name the operation was issued under (its work's context, not a copy).
    // Only for an arrival that arrived: one that has not has no work.
    std::string_view op_name() const noexcept { return work->op(); }
    // Where it was issued: its work's site, made from the same OpInfo in start. A copy kept here
    // cost a store at every arrival and a reset at every completion. Only for an arrival that
    // arrived, as op_name.
    const CallSite& site() const noexcept { return work->site(); }
  };
  // A field added to Slot or Arrival must be reset in recycle_slot_of (world.cpp), which
  // recycle_slot wraps, or it carries over into the next operation that takes the slot.
  struct Slot {
    std::vector<Arrival> arrivals;  // by group rank
    int arrived = 0;
    // The lowest group rank that arrived, or -1: judge_arrival's reference for the next arrival
    // (the first other member that arrived, in group-rank order), without a scan of the members.
    int lowest_arrived = -1;
    // An injected TransportError or Hang on this operation (Note [Fault injection]): which
    // member's fault it is, as reported in faults_fired, and its description for the members'
    // errors.
    std::optional<Fault> fault;
    bool fault_random = false;  // drawn from random_faults
    std::string fault_detail;   // "it hung (injected fault: hang at rank 3's operation 0)"

    bool hangs() const noexcept { return fault && fault->kind == Fault::Kind::Hang; }
  };
  struct Failure {
    ErrorCode code = ErrorCode::Aborted;
    std::string detail;  // empty: the simulator ran out of memory recording it
  };
  using Failures = std::map<std::int64_t, Failure>;

  // Outstanding operations by seq (Note [Flat slot table] in seq_table.hpp).
  SeqTable<Slot> slots;
  Failures failures;  // failed operations by seq
  // Note [Operation positions]: nodes for `failures` made in advance, at least one per
  // outstanding operation (start makes one as it makes a slot, before its operation counts),
  // which fail_slot uses when making one is refused. Keys 0 .. size - 1: fail_slot takes the last.
  Failures spare_failures;
  // Slots of completed operations, emptied but keeping their arrivals (and each arrival's room
  // for ops): start takes one before making a slot, so a communicator allocates slots only for a
  // new high of outstanding operations (failed slots are erased, not recycled). A stack of the
  // table's node handles (start takes the last; the key is set as it goes back into `slots`). Its
  // capacity covers every slot the group has (slots.size() + spare_slots.size()), reserved by start
  // before it makes one, so that recycle_slot allocates nothing; inline for up to 4. A stale Slot*
  // or Arrival* now reads a recycled slot instead of freed memory, which ASan would have reported:
  // hold none across a scheduling point.
  using SlotNode = SeqTable<Slot>::node_type;
  boost::container::small_vector<SlotNode, 4> spare_slots;
  std::int64_t next_to_complete = 0;
  // Its head operation can be completed now: kept by SimWorld::update_completable (Note
  // [Completable groups] in world.cpp).
  bool completable = false;
  std::int64_t aborted_from = -1;  // operations from this seq on fail with Aborted
  std::string abort_reason;        // room for kOutOfMemoryAbortReason made at creation
  // Per group rank: operations started. Inline for up to 8 members (Note [Small per-run vectors]).
  boost::container::small_vector<std::int64_t, 8> issued;
  // Per group rank: where its last operation here was issued (if it issued one), for the error
  // of a member that ended without joining (SimWorld::absence).
  boost::container::small_vector<CallSite, 8> last_sites;

  // Provided, so that making one (group_for: every communicator of every run, through
  // allocate_shared, which value-initialises) sets the members above without first zeroing all of
  // the group (~0.7 KiB, most of it the inline vectors' room), as value-initialising an implicit
  // one does.
  SimGroup() {}  // NOLINT(modernize-use-equals-default)
  // Gives its spare slots to the next groups on this thread (Note [Recycled slots] in world.cpp).
  ~SimGroup();
  SimGroup(const SimGroup&) = delete;
  SimGroup& operator=(const SimGroup&) = delete;

  int group_rank_of(int rank) const noexcept;
  // Empties the slot of a completed operation, taken out of `slots`, into spare_slots. Allocates
  // nothing; the works its arrivals held are released here. By reference: a node handle by value
  // was one more move and destruction per completion.
  void recycle_slot(SlotNode&& node) noexcept;
  // "1, 3": the members that have not joined outstanding operation `seq` yet (empty if none or
  // if `seq` is not outstanding).
  std::string missing_members(std::int64_t seq) const;
};

class SimWorld : public std::enable_shared_from_this<SimWorld> {
 public:
  // Copies `options` (once: sim::simulate keeps its own).
  explicit SimWorld(const SimOptions& options);
  ~SimWorld();

  // Runs the world to its end; see sim::simulate.
  SimReport run(std::function<void()> rank_main);
  // Note [Interrupt report]: the rank running now (-1: none) and the virtual time in
  // nanoseconds, read by the SIGINT handler on any thread.
  const std::atomic<int>& running_rank() const noexcept { return running_rank_; }
  const std::atomic<std::int64_t>& virtual_now() const noexcept { return now_ns_; }
  // The run's replay line ("  replay: ...\n"), for what ends the process before the run's
  // report: a guard-page fault (Note [Guard pages]) and an interrupt (Note [Interrupt report]).
  // Set before run(), and only when one of them is on; empty otherwise.
  void set_replay_line(std::string line) { replay_line_ = std::move(line); }
  const std::string& replay_line() const noexcept { return replay_line_; }

  // ---- Called by a rank through its transport. `rank` is the calling rank.
  std::shared_ptr<SimGroup> group_for(const std::string& tag, const std::vector<int>& ranks);
  // Starts `ops` (one, or a coalesced batch) as operation info.seq of `group`. Once the
  // operation counts and joins a slot, the list is swapped with its arrival's empty one: `ops`
  // comes back empty, with the arrival's room (Note [Ops built in place] in sim_transport.cpp);
  // an operation that fails at once leaves them in place. Throws what a Crash or the step budget
  // throws, or std::bad_alloc; then the operation took no position and left no trace but the
  // fault bookkeeping (Note [Operation positions]), and `ops` are untouched. `group_rank` is
  // `rank`'s index in group.ranks (its comm keeps it: no search per operation).
  std::shared_ptr<SimWork> start(int rank, SimGroup& group, int group_rank, std::vector<SimOp>& ops,
                                 const transport::OpInfo& info);
  // Blocks simulated rank `rank` (the caller; not necessarily the work's owner) until `work`
  // finished, yielding to the scheduler. When `deadline` passes first, the operation fails with
  // Timeout on every member and its communicator is aborted, as a real transport's watchdog does.
  // Inlined into SimWork::wait, world.cpp only (Note [Inlined hot helpers]).
  [[gnu::always_inline]] inline void wait_on_rank(SimWork& work, transport::Deadline deadline,
                                                  int rank);
  // A scheduling point for rank `rank`; then whether `work` finished.
  bool poll_on_rank(SimWork& work, int rank);
  // Blocks a thread that is not a simulated rank until `work` finished.
  void wait_off_rank(SimWork& work);
  // A scheduling point for rank `rank` (the caller) that does nothing else: the bare
  // scheduler's cost (bench/sim_bench.cpp).
  // Out of line: yield is inlined into world.cpp's callers only (Note [Inlined hot helpers]).
  void scheduling_point(int rank);

  transport::Duration now() const noexcept {
    return transport::Duration(now_ns_.load(std::memory_order_relaxed));
  }
  int world_size() const noexcept { return options_.world_size; }
  bool cuda_devices() const noexcept { return options_.cuda_devices; }
  std::chrono::nanoseconds timeout() const noexcept { return options_.timeout; }
  // Records that the simulator passed the named mark (SimReport::marks). `name` is a literal.
  // Builds the key string only the first time a name fires.
  void mark(std::string_view name) {
    if (auto it = marks_.find(name); it != marks_.end()) {
      ++it->second;
    } else {
      marks_.emplace(name, 1);
    }
  }
  // Takes back one mark(name); a name whose count falls to 0 was never reached.
  void unmark(std::string_view name) {
    const auto it = marks_.find(name);
    CHORUS_CHECK(it != marks_.end());
    if (--it->second == 0) {
      marks_.erase(it);
    }
  }
  // Core dropped / finalized `work` (transport::Work's hooks): marks "timeline.drop" /
  // "timeline.finalize" and logs the event. Acts only on the simulated rank holding the turn
  // (the only context that touches the world's state); never throws.
  void on_work_dropped(const SimWork& work) noexcept;
  void on_work_finalized(const SimWork& work, bool at_rank_exit, bool failed) noexcept;
  // Note [Finalization choice]: whether core should defer finalizing a result just dropped on
  // the calling rank (a choice of the stream when SimOptions::choose_finalization). Never throws.
  bool choose_deferred_finalization() noexcept;
  // The simulated rank of this world running on the calling thread, or -1.
  int current_rank() const noexcept;

 private:
  // Delayed: stalled by a Delay fault until virtual time wake_at (Note [Fault injection]).
  enum class Phase : std::uint8_t { Runnable, Blocked, Delayed, Finished };

  // Each run makes a RankContext per rank: its block is recycled (Note [Recycled blocks]).
  struct RecycledContextDelete {
    void operator()(RankContext* context) const noexcept {
      context->~RankContext();
      transport::RecyclingAllocator<RankContext>{}.deallocate(context, 1);
    }
  };
  using RankContextPtr = std::unique_ptr<RankContext, RecycledContextDelete>;
  static RankContextPtr make_rank_context(std::shared_ptr<transport::Transport> transport,
                                          RankOptions options);

  // Note [Likely writers]: an output a completed operation wrote, in its rank's ring.
  struct RecentWrite {
    // Where its output is: an address and a size only, never the buffer (its keep_alive would
    // hold the memory, and copying it costs two atomic operations).
    const void* output = nullptr;
    std::size_t output_bytes = 0;
    int rank = -1;
    std::string_view op;  // OpInfo::name, a string literal
    std::int64_t seq = -1;
    const std::string* group = nullptr;  // SimGroup::label, alive as long as the world
    CallSite site;
    std::uint64_t completed = 0;  // completed_ once it completed
  };
  static constexpr std::size_t kRecentWritesMax = 16;  // per rank
  // A ring entry's room: unset until remember_writes writes it (every rank of every run makes a
  // slot, and setting 16 entries was ~180 stores a rank), read only below the ring's count.
  // Written over by placement new without a destructor call: RecentWrite must stay trivially
  // destructible (asserted below).
  union RecentWriteRoom {
    RecentWriteRoom() noexcept {}  // NOLINT(modernize-use-equals-default)
    RecentWrite write;
  };
  static_assert(std::is_trivially_destructible_v<RecentWrite>);

  struct RankSlot {
    // Provided, so that making one (start_ranks, every rank of every run) sets the members below
    // without first zeroing all ~1.5 KiB of the slot, as value-initialising an implicit one does.
    RankSlot() noexcept {}  // NOLINT(modernize-use-equals-default)

    Phase phase = Phase::Runnable;  // changed only through set_phase (Note [Runnable set])
    RankContextPtr context;
    SimWork* blocked_on = nullptr;
    transport::Deadline deadline;
    bool timed_out = false;
    bool exited = false;  // its rank function ended: it never starts another operation
    // It ended with an error: its rank function threw, or its end raised the failure of a
    // result it dropped (RankContext::finish).
    bool failed = false;
    // Its rank function threw. Decided at its exit, unlike `failed`, so that every peer missing
    // it hears the same (absence()), however the schedule orders them around its end.
    bool threw = false;
    std::string failure;  // what() of its error; empty where describing it ran out of memory
    std::exception_ptr error;
    std::vector<UnwaitedWork> unwaited;
    // Faults (Note [Fault injection]).
    std::uint64_t ops_started = 0;   // operations started: the index faults count in
    transport::Duration wake_at{0};  // Delayed: until when
    bool crashed = false;            // a Crash fault killed it: it never arrives again
    std::string crash;               // what killed it, for its own and its peers' errors
    // Note [Likely writers]: the outputs its last kRecentWritesMax completed operations wrote: a
    // ring whose recent_writes_count entries before recent_writes_next are written.
    std::array<RecentWriteRoom, kRecentWritesMax> recent_writes;
    std::size_t recent_writes_next = 0;   // where the next one goes
    std::size_t recent_writes_count = 0;  // entries written, at most kRecentWritesMax

    // Whether it can still join an operation it has not joined (absence() names the others).
    bool may_still_arrive() const noexcept { return !crashed && !exited; }
  };

  void rank_body(int rank);
  // yield, bind, take_step, run_rank, execute, set_phase, kth_runnable, update_completable,
  // judge_arrival, switch_into, switch_out: Note [Inlined hot helpers] (world.cpp only).
  [[gnu::always_inline]] inline void yield(int rank);
  // The executor's resume(rank) and suspend(rank), by name on fibers (Note [Fiber switches called
  // directly]): the scheduler switches into a rank, the rank switches out.
  [[gnu::always_inline]] inline void switch_into(int rank);
  [[gnu::always_inline]] inline void switch_out(int rank);
  [[gnu::always_inline]] inline void bind(int rank) noexcept;
  // run()'s set-up: each rank's context and transport, the runnable set, the executor started.
  // Throws what they throw (std::bad_alloc, std::system_error); then no rank ran.
  void start_ranks();
  // What a run lends itself goes back: the schedule buffer to the thread (Note [Recycled schedule
  // buffer]), and the rank contexts, which go before the world (their transports point at it).
  void release_run_resources() noexcept;
  void schedule();
  // A decision's hash, record, step and virtual time; a rank step's resume (Note [Uniform rank
  // steps]).
  [[gnu::always_inline]] inline void take_step(std::uint64_t code, const Decision& decision);
  [[gnu::always_inline]] inline void run_rank(int rank);
  [[gnu::always_inline]] inline void execute(const Decision& decision);
  void complete_operation(SimGroup& group);
  // Note [Reduction order modes]: readies the order of one reduction op over `size` members
  // (Tree, Adversarial: into reduction_program_, drawing Adversarial's choices now). Inlined
  // (Note [Inlined hot helpers]): Fixed and Ring, the usual orders, plan nothing; the others are
  // planned out of line (plan_reduction_program).
  [[gnu::always_inline]] inline void plan_reduction(std::size_t size);
  void plan_reduction_program(std::size_t size);
  // Reduces `count` elements of `size` contributions (group-rank order) into `dst` in the planned
  // order. Ring: the elements are `ring_chunks` chunks, the first one chunk `ring_first_chunk`.
  // Inlined (Note [Inlined hot helpers]): Fixed, the usual order, calls the kernel directly; the
  // others reduce out of line (reduce_in_order).
  [[gnu::always_inline]] inline void reduce_contributions(void* dst, const void* const* sources,
                                                          std::size_t size, std::size_t count,
                                                          DType dtype, const ReduceOp& reduce_op,
                                                          std::int64_t seq, std::size_t ring_chunks,
                                                          std::size_t ring_first_chunk);
  void reduce_in_order(void* dst, const void* const* sources, std::size_t size, std::size_t count,
                       DType dtype, const ReduceOp& reduce_op, std::int64_t seq,
                       std::size_t ring_chunks, std::size_t ring_first_chunk);
  // Wakes the Delayed ranks whose wake_at passed and the Blocked ones whose deadline passed.
  void wake_due_ranks();
  // Fails every outstanding operation with Deadlock (`why` and the rank table) and aborts their
  // communicators. Never throws.
  void declare_deadlock(std::string_view why) noexcept;
  std::string rank_table() const;

  // Failure plumbing (Note [Simulator failures]).
  // Fails operation `seq` of `group` with `code` on every member that arrived and records the
  // failure for those arriving later. Never throws: what running out of memory changes is in
  // Note [Operation positions].
  void fail_slot(SimGroup& group, std::int64_t seq, ErrorCode code,
                 std::string_view detail) noexcept;
  // Fails `work` with `error`, made beforehand, and logs a Fail event with detail `event`: cannot
  // throw.
  void fail_work(SimWork& work, std::exception_ptr error, std::string event) noexcept;
  // The Fail event's detail for an error of `code`: empty when events are not recorded.
  std::string fail_event(ErrorCode code, std::string_view detail) const;
  void wake_waiters(SimWork& work);
  void time_out(SimWork& work, transport::Deadline deadline, int waiter);
  // Note [Operation positions]: time_out ran out of memory; fails what it left with fixed texts.
  void time_out_out_of_memory(const SimWork& work) noexcept;
  // Operations of a communicator complete in order; failed ones are skipped.
  void advance_completion(SimGroup& group);
  // Note [Completable groups]: called wherever a group's slots, their arrivals or faults, or its
  // next_to_complete change. Inlined (Note [Inlined hot helpers]): start calls it at every
  // arrival that fills its slot.
  [[gnu::always_inline]] inline void update_completable(SimGroup& group) noexcept;
  // The k-th completable group's head operation, in group order, as a uniform choice sees the
  // candidate completions (Note [Completable groups]; k < completable_groups_).
  Decision kth_completable(std::size_t k) const;
  // The operation `seq` of `group` an input of which changed since issue, or an empty string.
  // Note [All-reduce blocks]: whether some member's output of operation `op` overlaps an input
  // other than its own in-place one, so the result must be reduced whole before any copy.
  static bool cross_aliased(const SimGroup::Slot& slot, std::size_t op);
  std::string modified_inputs(const SimGroup& group, const SimGroup::Slot& slot) const;
  // Note [Likely writers]: records the outputs `slot`'s operation just wrote.
  void remember_writes(const SimGroup& group, std::int64_t seq,
                       const SimGroup::Slot& slot) noexcept;
  // Note [Likely writers]: ", likely through rank R's op #seq ..." for an input `input` of an
  // operation that arrived when completed_ was `completed_at_issue`, or an empty string.
  std::string likely_writer(const transport::Buffer& input, int rank,
                            std::uint64_t completed_at_issue) const;
  // Appends to modified_inputs' text that world rank `rank`'s input `op` of `arrival` (its
  // buffer `send`) changed, with its likely writer. Out of line: the check's loop runs on every
  // completion, the text almost never.
  [[gnu::cold, gnu::noinline]] void append_modified_input(std::string& detail, int rank,
                                                          std::size_t op,
                                                          const SimGroup::Arrival& arrival,
                                                          const transport::Buffer& send) const;
  // Ranks blocked on different communicators that contain each other disagree on the group:
  // fails those operations with CollectiveMismatch; returns whether it found any.
  bool fail_group_mismatches();
  // Fails the outstanding operations from `from_seq` on with Aborted, and every later one as it
  // starts. Throws std::bad_alloc only before it changed anything.
  void abort_group(SimGroup& group, std::int64_t from_seq, const std::string& reason);
  // abort_group with a fixed reason, allocating nothing (Note [Operation positions]).
  void abort_group_out_of_memory(SimGroup& group, std::int64_t from_seq) noexcept;
  // abort_group with the reason `before` seq `after` ("operation #3 timed out"), or where making
  // it runs out of memory, abort_group_out_of_memory: what every caller that failed an operation
  // uses to abort its communicator after it. Never throws.
  void abort_group_or_out_of_memory(SimGroup& group, std::int64_t from_seq, std::string_view before,
                                    std::int64_t seq, std::string_view after) noexcept;
  // Fails the outstanding operations from `from_seq` on with Aborted and `detail`.
  void fail_slots_from(SimGroup& group, std::int64_t from_seq, std::string_view detail) noexcept;
  // Fails the outstanding operations `rank` (whose function ended) will never join. Never throws.
  void on_rank_exit(int rank) noexcept;
  // Why `group`'s member `member` (a group rank) will never arrive at another operation, or
  // empty if it still may; it names where the member last issued an operation on `group`.
  std::pair<ErrorCode, std::string> absence(const SimGroup& group, std::size_t member) const;
  // What `slot`'s error says: RankSlot::failure, or, where describing the error ran out of memory
  // when the rank ended (describe_failure), its description made now (may throw std::bad_alloc).
  static std::string failure_text(const RankSlot& slot);
  // Fails operation `seq` of `group` (when outstanding) if a member that has not joined it never
  // will (out of memory describing it, with a fixed text). The second form is given its slot,
  // `slot`, which fail_slot may erase: read it no more.
  void check_absent_members(SimGroup& group, std::int64_t seq);
  void check_absent_members(SimGroup& group, std::int64_t seq, const SimGroup::Slot& slot);
  // For all_to_all: the first disagreement between `group_rank`'s per-peer counts and those of
  // the members that arrived before it, described; empty if they agree (and for ops other than
  // all_to_all, which judge_arrival does not ask about: has_all_to_all).
  std::string split_disagreement(const SimGroup& group, const SimGroup::Slot& slot,
                                 int group_rank) const;
  // judge_arrival, for an arrival with an all_to_all: fails operation `seq` (CollectiveMismatch)
  // and aborts the communicator after it if split_disagreement finds a disagreement; returns
  // whether it did. Out of line: the arrivals without an all_to_all make no string for it.
  bool fail_split(SimGroup& group, const SimGroup::Slot& slot, int group_rank, std::int64_t seq);
  void notify_off_rank_waiters();
  // Guard pages (Note [Guard pages]): protects the outputs `start` poisoned, or unprotects a
  // work's outputs before the simulator touches them. Do nothing without guard mode.
  void guard_outputs(const SimWork& work, const std::vector<transport::Buffer>& outputs,
                     const std::string& what);
  // What guard_outputs names the outputs of `work`, issued by `rank` at `site`.
  static std::string guard_description(const SimWork& work, const SimGroup& group, int rank,
                                       const CallSite& site);
  void unguard_outputs(const SimWork& work) noexcept {
    if (options_.guard_pending_outputs) {
      allocator_->unprotect(&work);
    }
  }

  // Faults (Note [Fault injection]): the faults that fire as `rank` starts its operation
  // `op_index` (explicit ones, then one drawn from the stream). A Delay or Crash is recorded
  // and marked here; a TransportError or Hang only by mark_slot_fault, once it marks the slot.
  struct FiredFault {
    Fault fault;
    bool random = false;
  };
  std::vector<FiredFault> fire_faults(int rank, std::uint64_t op_index);
  void record_fault(const Fault& fault, bool random);
  // Undoes record_fault for a fault that another one preempted after it was recorded.
  void withdraw_fault(const Fault& fault, bool random);
  // start's faults, once its work is made: a Delay stalls, a Crash throws, and the TransportError
  // or Hang to mark on the operation's slot is left in slot_fault_ (judge_arrival marks it).
  // Out of line: a run without faults never calls it, and start's frame holds no fault.
  [[gnu::noinline]] void fire_start_faults(int rank, SimGroup& group, const transport::OpInfo& info,
                                           std::uint64_t op_index);
  // Puts a member's TransportError or Hang on the operation's slot, by precedence. Out of line:
  // judge_arrival, inlined into start, calls it only in a run with faults.
  [[gnu::noinline]] void mark_slot_fault(SimGroup::Slot& slot, const FiredFault& fired);
  // What an operation that fails at once (start: it was failed or aborted before it started, or
  // the run is over its step budget or found a liveness violation) fails with: its error, made
  // with `work`'s context, and the Fail event's detail. Throws std::bad_alloc when the error
  // cannot be made (before the operation counts). Out of line, cold: start's usual path then
  // makes none of its strings.
  struct EarlyFailure {
    std::exception_ptr error;
    std::string event;
  };
  [[gnu::cold, gnu::noinline]] EarlyFailure early_failure(const SimGroup& group,
                                                          const SimWork& work, std::int64_t seq);
  // start, once `rank` arrived at operation info.seq of `group`: compares its arrival with the
  // others' (CollectiveMismatch), marks its fault, fails it if a member can never arrive.
  // Inlined into start (Note [Inlined hot helpers]).
  // `reference_member` is the lowest group rank that arrived before it, or -1 (the first).
  [[gnu::always_inline]] inline void judge_arrival(SimGroup& group, SimGroup::Slot& slot,
                                                   int group_rank, int reference_member, int rank,
                                                   const transport::OpInfo& info,
                                                   const transport::Fingerprint& fingerprint);
  // start, for an operation `seq` of `group` that has no slot yet: makes one (a spare of the
  // group's or of an earlier run's, else a new one) and sets `from_spare` to whether it was a
  // spare. Throws std::bad_alloc before anything changed. Out of line: most starts find their
  // slot.
  [[gnu::noinline]] SeqTable<SimGroup::Slot>::iterator make_slot(SimGroup& group, std::int64_t seq,
                                                                 bool& from_spare);
  // judge_arrival, for an arrival whose ops or name disagree with those of `reference` (world
  // rank `reference_rank`): fails operation info.seq with CollectiveMismatch naming both, and
  // aborts the communicator after it. Out of line, cold: start's usual path then holds none of
  // its text's making (a stream and its strings).
  [[gnu::cold, gnu::noinline]] void fail_mismatch(SimGroup& group,
                                                  const SimGroup::Arrival& reference,
                                                  int reference_rank, int rank,
                                                  const transport::OpInfo& info,
                                                  const transport::Fingerprint& fingerprint);
  // Note [Operation positions]: judge_arrival ran out of memory; fails the operation and aborts
  // the communicator after it. Allocates nothing it cannot do without: never throws.
  void fail_out_of_memory(SimGroup& group, std::int64_t seq) noexcept;
  // Stalls the calling rank `rank` for `steps` steps of virtual time.
  void stall(int rank, std::uint64_t steps);
  // Kills the calling rank `rank` as it starts `info` on `group`; throws its RankFailure.
  [[noreturn]] void crash(int rank, const SimGroup& group, const transport::OpInfo& info,
                          std::uint64_t op_index);
  // Unwinds a rank that still issues operations long after the step budget ran out.
  [[noreturn]] void stop_rank(int rank, const SimGroup& group, const transport::OpInfo& info);
  [[noreturn]] void throw_crashed(int rank, const SimGroup& group,
                                  const transport::OpInfo& info) const;
  // Note [Virtual time skip]: whether virtual time jumped.
  bool skip_virtual_time();
  // Note [Liveness phase]: whether a violation was declared now.
  bool check_liveness();
  // No fault can fire any more, and none is in effect (a Delayed rank, a Hang slot).
  bool faults_over() const;
  // Random faults may still be drawn at decision `decision` (counted from 0): enabled, under
  // max_faults, decision < until_step.
  bool random_window_open(std::uint64_t decision) const;
  // Note [Event log]: appends an event about `work` that happened on `rank` now, when
  // SimOptions::record_events; costs a branch otherwise.
  void record(SimEvent::Kind kind, int rank, const SimWork& work, std::string detail) {
    if (options_.record_events) {
      record_event(kind, rank, work, std::move(detail));
    }
  }
  // Without a detail: the caller makes no empty string when nothing is recorded (a default
  // argument was made and destroyed at every call).
  void record(SimEvent::Kind kind, int rank, const SimWork& work) {
    if (options_.record_events) {
      record_event(kind, rank, work, {});
    }
  }
  // An End event (SimOptions::record_events): rank `rank`'s function ended, and how (its slot
  // says: crashed, threw, or returned).
  void record_rank_end(int rank) noexcept;
  // Appends an event filled by `fill(SimEvent&)`; past events_record_max or out of memory, the
  // event is not recorded, only counted.
  template <typename Fill>
  void append_event(Fill&& fill) noexcept;
  // Out of memory, the event is not recorded (counted as past events_record_max).
  void record_event(SimEvent::Kind kind, int rank, const SimWork& work,
                    std::string detail) noexcept;
  void fill_event(SimEvent& event, SimEvent::Kind kind, int rank, const SimWork& work,
                  std::string detail);
  SimGroup& group_of(const SimWork& work) { return *groups_[work.fingerprint().comm_id - 1]; }

  // Sets rank r's phase, keeping the runnable set (Note [Runnable set]).
  [[gnu::always_inline]] inline void set_phase(std::size_t r, Phase phase) noexcept;
  // The rank of the k-th runnable rank in increasing rank order (k < runnable_count_).
  [[gnu::always_inline]] inline int kth_runnable(std::size_t k) const noexcept;

  SimOptions options_;
  DecisionStream stream_;
  // Every rank's host allocator, or null for core's pool (Note [Simulator allocator]).
  std::shared_ptr<SimAllocator> allocator_;
  std::vector<transport::Buffer> guarded_;  // start's outputs to guard (kept: no allocation)
  std::string guard_what_;                  // and what guard_outputs names them (guard mode)
  // An operation that fails at once: its error and event, made by start before it counts and
  // used (moved out) once it counted, with no scheduling point between. A member, not a local:
  // the usual start makes no std::optional of it to set up and tear down.
  EarlyFailure early_;
  // The fault start marks on its operation's slot, set by every start's fire_start_faults while
  // faults are planned (never otherwise) and read by its judge_arrival, with no scheduling point
  // between: a member for the reason early_ is one.
  std::optional<FiredFault> slot_fault_;
  std::string replay_line_;  // set_replay_line
  std::uint64_t data_hash_ = 0;
  std::map<std::string, std::uint64_t, std::less<>> marks_;
  std::unique_ptr<RankExecutor> executor_;
  // executor_ is make_fiber_executor's: Note [Fiber switches called directly].
  bool on_fibers_ = false;
  std::function<void()> rank_main_;
  // Inline for up to kSmallWorld (below) ranks: Note [Small per-run vectors].
  boost::container::small_vector<RankSlot, 8> ranks_;
  // Creation order (deterministic). Inline for a few (Note [Small per-run vectors]).
  boost::container::small_vector<std::shared_ptr<SimGroup>, 4> groups_;
  // Nodes recycled (Note [Recycled blocks]): each run makes its groups anew.
  std::map<std::tuple<std::string, std::vector<int>>, std::size_t, std::less<>,
           transport::RecyclingAllocator<
               std::pair<const std::tuple<std::string, std::vector<int>>, std::size_t>>>
      group_index_;
  // Note [Small per-run vectors]
  // A world and its groups live for one run, so every vector they keep allocated at least once a
  // run, and about thirty allocations a run were the simulator's own. Those sized by the world or
  // a group (candidates, run codes, ops issued, reduction sources, a group's issued counts) hold a
  // small world's elements inline instead: kSmallWorld ranks, and more spill to the heap as
  // before; likewise the first few groups.
  static constexpr std::size_t kSmallWorld = 8;
  static_assert(decltype(ranks_)::static_capacity == kSmallWorld);
  template <class T>
  using PerRank = boost::container::small_vector<T, kSmallWorld>;
  PerRank<Decision> candidates_;
  // Note [Runnable set]
  // The runnable ranks as a bitset (bit r % 64 of word r / 64) and their count, kept by
  // set_phase, the only writer of a rank's phase. A decision's candidates are the runnable ranks
  // in rank order, then the completable operations in group order; a uniform choice (random walk,
  // and portfolio runs that drew it) needs only their number, and the chosen rank is the k-th set
  // bit, so a decision no longer visits every rank. PCT weighs each candidate, so for it the
  // list is still built, from the bitset. Either way the same index picks the same candidate as
  // before, so every seed's schedule is unchanged.
  boost::container::small_vector<std::uint64_t, 1> runnable_words_;  // Note [Small per-run...]
  std::size_t runnable_count_ = 0;
  std::size_t completable_groups_ = 0;  // groups with completable set (Note [Completable groups])
  PerRank<std::uint64_t> run_codes_;    // decision_code of "run rank r", by r
  // Note [Absent members]
  // A member that has not joined an operation fails it for good only once it can never arrive:
  // its rank function ended or a Crash killed it (RankSlot::may_still_arrive). ranks_gone_ counts
  // those ranks (rank_body and crash, the only writers of exited and crashed), so until one is
  // gone judge_arrival skips check_absent_members, which would find every missing member may
  // still arrive: one comparison per arrival instead of a call that scans the members.
  int ranks_gone_ = 0;
  // Note [Deadline scan]: a lower bound on every blocked rank's deadline (virtual time), so the
  // scheduler scans for timed-out ranks only once one may have passed (with the default timeout
  // of minutes, never in a typical run). A Delayed rank's wake_at counts as a deadline.
  transport::Duration earliest_deadline_ = transport::Duration::max();
  std::atomic<int> running_rank_{-1};    // running_rank()
  std::atomic<std::int64_t> now_ns_{0};  // read by any thread (deadlines), written by the scheduler
  std::uint64_t steps_ = 0;
  std::uint64_t schedule_hash_ = 0;
  std::vector<Decision> schedule_;
  std::uint64_t completed_ = 0;
  std::uint64_t arrivals_unfinished_ = 0;  // Note [Likely writers]
  bool livelocked_ = false;
  bool stopping_ranks_ = false;  // steps_after_budget decisions after livelocked_: start() unwinds
  // Faults (Note [Fault injection], Note [Liveness phase]).
  bool faults_planned_ = false;    // any explicit fault, or random ones enabled
  std::vector<bool> fault_spent_;  // by index in options_.faults: fired
  std::uint64_t random_faults_fired_ = 0;
  std::vector<Fault> faults_fired_;
  std::optional<std::uint64_t> liveness_from_;  // the decision the liveness phase began at
  std::string liveness_violation_;              // why the run was ended, once it was
  std::vector<int> stuck_ranks_;
  std::exception_ptr first_error_;
  int first_error_rank_ = -1;  // whose first_error_ is
  // Note [Operation positions]: fail_slot's errors and Fail event texts, made for every member
  // before the slot is taken (room for world_size made at construction; a member whose own error
  // was refused gets its code's fixed one, out_of_memory_errors in world.cpp).
  // Sized by the world: inline for a small one (Note [Small per-run vectors]).
  PerRank<std::exception_ptr> failing_errors_;
  PerRank<std::string> failing_events_;
  std::vector<unsigned char> scratch_;
  PerRank<const void*> sources_;  // complete_operation's reduction sources
  // Note [Reduction order modes]: the planned program (Tree, Adversarial), the ring's rotated
  // sources, and the reduction ops completed (for the mark of the mode).
  std::vector<int> reduction_program_;
  std::vector<const void*> ring_sources_;
  std::vector<const void*> block_sources_;  // Note [All-reduce blocks]
  std::uint64_t reductions_ = 0;
  PerRank<std::uint64_t> ops_issued_;  // by rank
  std::vector<SimEvent> events_;       // Note [Event log]
  std::uint64_t events_not_recorded_ = 0;

  // Threads that are not ranks wait here (Note [Rank executor]: ranks never block on it).
  std::mutex off_rank_mutex_;
  std::condition_variable off_rank_cv_;
  std::atomic<int> off_rank_waiters_{0};  // Note [Off-rank waiters] in world.cpp
};

}  // namespace chorus::sim::detail
