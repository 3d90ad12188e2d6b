#pragma once

// The MPI transport behind the transport seam (docs/mpi.md): MpiTransport is this process's
// rank, MpiComm an MPI communicator per group, MpiWork one or more nonblocking MPI requests.
//
// Note [MPI locking]
// chorus asks for MPI_THREAD_SERIALIZED and makes every MPI call while holding
// MpiProcess::mutex, so any thread may start, test or wait on operations (core allows waits from
// any thread) without MPI_THREAD_MULTIPLE. Waits poll (MPI_Testall under the lock, then release
// it) so a waiting thread never blocks others for longer than one MPI_Testall, and the deadline
// is checked between polls: a wait can end in Timeout; MPI_Wait could not.
//
// Between polls a wait spins or yields (Note [Wait backoff]).
//
// Note [Wait backoff]
// Yielding the CPU after every unsuccessful poll (sched_yield) costs a system call and, on a
// loaded machine, the rest of a time slice; a small all_reduce completes within a few polls, so
// yielding each time made an 8-byte all_reduce ~3 us slower than MPI_Allreduce, which spins in
// MPI's progress engine (bench_mpi, docs/performance.md). So a wait spins, as MPI_Wait does when
// the node is not oversubscribed, yielding once per 100 us of spinning (so another thread waiting
// for the MPI lock or for this CPU gets a turn, while a small op, done in a few us, never yields:
// on a loaded machine a yield can give the CPU away for a whole time slice).
// When this node runs more ranks than it has CPUs, a peer may need this CPU to make progress,
// and a wait yields after every poll (what Open MPI's mpi_yield_when_idle does when
// oversubscribed).
//
// Note [Lean polls]
// A spinning wait polls several times per small operation (3-7 for an 8-byte all_gather on 2
// ranks on an idle machine, dozens on a loaded one), so what a poll does besides MPI_Testall is
// paid on each. A poll that finds the requests pending, and no ring of its own or of the process
// to advance, therefore only takes the MPI lock, calls MPI_Testall and releases the lock
// (MpiWork::poll); everything else (errors, received sizes, rings, the after-steps) is in
// MpiWork::conclude_poll, and the statuses are sized once, when the work takes its Started
// (MpiWork::adopt; every start reserves room for them). A wait's loop and poll, MPI_Testall left
// out, went from ~133 to ~68 instructions per poll (callgrind, 2026-12-05). The ring check is
// what keeps Note [Ring all_reduce]'s progress: a wait on an operation without a ring still
// advances the rings in flight (mpi.job.rings.*: rank 0 waits on an all_gather its peer issues
// only once a ring finished).

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/mpi/mpi.hpp"
#include "chorus/transport/batch_abandon.hpp"
#include "chorus/transport/futex_mutex.hpp"
#include "chorus/transport/group_label.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "mapping.hpp"
#include "mpi_errors.hpp"
#include "ring_all_reduce.hpp"

namespace chorus::mpi::detail {

// A group's id: FNV-1a over the tag and ranks, the same on every member without communicating.
std::uint64_t comm_id_of(const std::string& tag, const std::vector<int>& ranks);
// Tags are taken modulo the least MPI_TAG_UB the standard allows.
inline constexpr std::uint64_t kTagCount = 32767;
// The tag MPI_Comm_create_group gets for the group with id `id` (on MpiProcess::comm_parent(),
// never on the control communicator: Note [Communicator rendezvous], "Creation").
int create_group_tag(std::uint64_t id) noexcept;
// The tag of every communicator set-up message on the control communicator (Note [Communicator
// rendezvous]).
inline constexpr int kRendezvousTag = 1;
// The tag of a busy rank's reply to a set-up message (Note [Communicator rendezvous], "Busy
// peers").
inline constexpr int kBusyTag = 2;

// A busy rank's reply: which of the asker's set-up messages to it (counted from 1) it answers,
// and the label of the group it is setting up instead. A message of another size on kBusyTag is
// a TransportError.
struct BusyReply {
  std::uint64_t answers = 0;
  char group[120] = {};  // NUL-terminated, cut to fit
};
static_assert(std::is_trivially_copyable_v<BusyReply>);

// Note [Issue without allocation]
// A started operation's requests read and write its buffers until MPI completes them, and MPI
// cannot cancel a collective, so the Started that holds those buffers (keep_alive) must never be
// freed while a request is in flight: not when a work is dropped pending (MpiWork's destructor
// parks it: MpiProcess::park), not when issuing throws halfway (an MPI failure, a ring that
// fails to start: the Started is parked), and not when memory runs out. So:
// - Issuing allocates everything before it posts anything: MpiComm::launch and end_group make
//   the MpiWork (MpiComm::make_work) and take the Started (MpiProcess::take_started, a heap
//   node: see below) first; each start reserves room in the Started's vectors (post_exchange,
//   the request slot every collective posts into, the process's ring list) and adds its
//   after-steps before its first MPI call; and the started work takes the Started without
//   allocating (MpiWork::adopt). A std::bad_alloc in a call therefore leaves nothing started,
//   no tag taken and nothing to park (MpiProcess::retire recycles what posted nothing), which
//   is what Note [Transport contract] asks: core gives the sequence number back and a retry is
//   the same operation for the peers (mpi.out_of_memory_test.*). Until 2026-12-04 the work was
//   made after the posting, and a refusal there freed buffers MPI was still using.
// - Parking never allocates, so it cannot throw where it is needed (a destructor, a catch
//   block): every Started lives in a heap node allocated before it posts anything, and parked
//   nodes form an intrusive list (Started::next_parked). Finished nodes are recycled (Note
//   [Recycled Started]), so an operation allocates none in the steady state.
// - The collective check (MpiComm::verify) allocates what all its rounds need before its first
//   posting, and launch and end_group make the work and the Started before it.
// What still allocates after a posting: in a coalesced batch (end_group) each operation's start
// allocates after the batch's earlier operations posted, so a refusal there parks the posted
// part (their buffers stay) and the peers' batch fails or times out; and under
// --check-collectives an operation's start allocates after its comparison (Note [Collective
// check]) with the peers, where it allocates at all, so a refusal there leaves the peers one
// comparison ahead (docs/mpi.md, "Memory exhaustion"). The communicator set-up
// (MpiTransport::create_comm) makes its MpiComm before the rendezvous (Note [Communicator
// rendezvous]) and hands it the communicators without allocating (MpiComm::attach); a
// rendezvous among members only allocates nothing after its first posting, but answering a
// non-member with a busy reply does: a std::bad_alloc during the rendezvous cancels its receives
// and parks its messages, as an MPI failure does, and one after a peer took this rank's message
// leaves that peer waiting in MPI_Comm_create_group (Note [Transport contract]).

// Requests and the steps around them of one started operation (or a coalesced batch). Lives in
// a heap node (std::unique_ptr) so that parking it allocates nothing (Note [Issue without
// allocation]).
struct Started {
  std::vector<MPI_Request> requests;
  // Run once, in order, after every request completed successfully (avg's division, ...).
  std::vector<std::function<void()>> after;
  // Buffers and scratch memory the requests use, released at completion.
  std::vector<std::shared_ptr<const void>> keep_alive;
  std::vector<transport::OpSignature> signatures;
  // chorus's own schedules (Note [Ring all_reduce]), advanced by every poll.
  std::vector<std::shared_ptr<RingAllReduce>> rings;
  // The receives of direct exchanges, whose arrived sizes the completing poll checks (Note
  // [Direct exchanges], "Short messages"): requests[request] expects `count` of `datatype`
  // from world rank `peer`.
  struct Receive {
    std::size_t request;
    MPI_Datatype datatype;
    int count;
    int peer;
  };
  std::vector<Receive> receives;
  // The sends of direct exchanges: requests[request] sends to world rank `peer`. With the
  // receives' peers, a failed request's error names the rank it exchanged with.
  struct Send {
    std::size_t request;
    int peer;
  };
  std::vector<Send> sends;
  std::vector<MPI_Status> statuses;  // MPI_Testall's, when receives are checked
  // The next Started in MpiProcess's parked list (Note [Issue without allocation]).
  std::unique_ptr<Started> next_parked;

  // Whether MPI may still use the buffers: a request not yet MPI_REQUEST_NULL, or a ring that
  // has not finished (running, not started, or failed with its requests in an unknown state).
  bool in_flight() const noexcept;
  // Empties every field, keeping the vectors' capacity (Note [Recycled Started]).
  void clear() noexcept {
    requests.clear();
    after.clear();
    keep_alive.clear();
    signatures.clear();
    rings.clear();
    receives.clear();
    sends.clear();
  }
};

// What one process shares between its transport, communicators and works: MPI itself.
// Initialises MPI in the constructor unless the program already did, and finalises in the
// destructor what it initialised. Outlived by nothing that calls MPI (comms and works hold it).
class MpiProcess {
 public:
  // `node_cpus`: the node's CPUs for Note [Wait backoff]; 0 counts them. `int_count_max`: the
  // largest count chorus passes MPI as an int (Note [MPI int counts]); tests lower it.
  // `recycles`: whether finished Starteds are kept for the next operation (Note [Recycled
  // Started]); tests turn it off (the test seam CHORUS_MPI_RECYCLE_STARTED=0), so that every
  // operation allocates its node and vectors afresh and an out-of-memory sweep refuses those
  // allocations too (mpi.out_of_memory_test.*.fresh).
  explicit MpiProcess(int node_cpus = 0, int int_count_max = std::numeric_limits<int>::max(),
                      bool recycles = true);
  ~MpiProcess();
  MpiProcess(const MpiProcess&) = delete;
  MpiProcess& operator=(const MpiProcess&) = delete;

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  transport::FutexMutex& mutex() noexcept { return mutex_; }  // Note [MPI locking]
  UserOps& user_ops() noexcept { return *user_ops_; }
  // Keeps the requests and buffers of a work destroyed while pending (after a Timeout: MPI
  // cannot cancel a collective) until the process ends. Takes the MPI lock; allocates nothing
  // and never throws (Note [Issue without allocation]). Null: nothing to keep.
  void park(std::unique_ptr<Started> started) noexcept;
  // How many Starteds park() keeps (tests: a work that MPI is done with is not parked). Takes
  // the MPI lock.
  std::size_t parked_count();
  // Note [Recycled Started]: a finished work's Started, emptied, is kept for the next
  // operation, which starts from it, so its vectors keep their heap blocks instead of
  // allocating three per operation (nor its node: Note [Issue without allocation]). The spare
  // Starteds are kept per thread (transport::RecycledObjects, Note [Recycled blocks]): at most
  // kSpareStartedMax on each thread that drops works, taken by the next operation issued on that
  // thread, so neither call takes a lock (until 2026-12-05 one list per process, under a mutex
  // of its own: a lock and an unlock per call). The cost: a thread that issues operations whose
  // works another thread drops reuses none, and allocates as with recycling off. A thread's
  // spares are freed when it exits; an emptied Started holds nothing of MPI's or of this
  // process's, so they may outlive it.
  // Thread-safe (works die on any thread). take_started allocates a node when this thread keeps
  // none, and then may throw std::bad_alloc; recycle_started never allocates or throws (null:
  // nothing; a full or closed list: it frees the node), and frees the node when this process
  // does not recycle (the test seam). Only CHORUS_MPI_RECYCLE_STARTED decides, not Note
  // [Recycled blocks]'s rules (nothing recycled under AddressSanitizer or while
  // transport::testing::recycle_blocks_enabled is off): mpi.out_of_memory_test.*.checked, run
  // under asan-ubsan too, needs recycled Starteds (a start that allocates after the collective
  // check's comparison leaves the peers a comparison ahead: Note [Issue without allocation]),
  // and mpi.out_of_memory_test.* runs with them, .fresh without.
  std::unique_ptr<Started> take_started();
  void recycle_started(std::unique_ptr<Started> started) noexcept;
  // park() if MPI may still use `started`'s buffers (Started::in_flight), else
  // recycle_started(). Never throws; null: nothing.
  void retire(std::unique_ptr<Started> started) noexcept;
  std::chrono::steady_clock::time_point epoch() const noexcept { return epoch_; }
  // Note [Ring all_reduce], "Progress": every ring in flight in this process, advanced by every
  // poll of the transport. Call all three with the MPI lock held. add_ring allocates nothing
  // after reserve_ring (Note [Issue without allocation]), which may throw std::bad_alloc.
  void reserve_ring();
  void add_ring(std::shared_ptr<RingAllReduce> ring) noexcept;
  void progress_rings();
  // Whether progress_rings has anything to advance (Note [Lean polls]). Call with mutex() held:
  // reserve_ring may reallocate the list.
  bool rings_in_flight() const noexcept { return !rings_.empty(); }
  // A private duplicate of MPI_COMM_WORLD, with MPI_ERRORS_RETURN, for chorus's own
  // point-to-point messages only (Note [Communicator rendezvous]).
  MPI_Comm control() const noexcept { return control_; }
  // Another private duplicate of MPI_COMM_WORLD, with MPI_ERRORS_RETURN, that only creates
  // communicators (MPI_Comm_create_group, the node split) and carries no point-to-point message
  // of chorus's (Note [Communicator rendezvous], "Creation").
  MPI_Comm comm_parent() const noexcept { return comm_parent_; }
  // Whether waits spin between polls (Note [Wait backoff]): this node runs no more ranks than
  // it has CPUs.
  bool spin_waits() const noexcept { return spin_waits_; }
  // The largest element count, per buffer and per peer, that MPI takes (Note [MPI int counts]).
  int int_count_max() const noexcept { return int_count_max_; }

 private:
  transport::FutexMutex mutex_;  // Note [Futex mutex]
  bool initialized_here_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  MPI_Comm control_ = MPI_COMM_NULL;
  MPI_Comm comm_parent_ = MPI_COMM_NULL;
  bool spin_waits_ = false;
  int int_count_max_ = std::numeric_limits<int>::max();
  bool recycles_ = true;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::unique_ptr<UserOps> user_ops_;  // freed before MPI_Finalize
  // Parked Starteds, newest first, linked through Started::next_parked; guarded by mutex_.
  // Unlinked one by one at the end (a long chain must not free itself recursively).
  struct ParkedList {
    std::unique_ptr<Started> head;
    std::size_t count = 0;
    ParkedList() = default;
    ParkedList(const ParkedList&) = delete;
    ParkedList& operator=(const ParkedList&) = delete;
    ~ParkedList();
  };
  ParkedList parked_;
  // Note [Recycled Started]: emptied Starteds, at most kSpareStartedMax per thread.
  static constexpr std::size_t kSpareStartedMax = 16;
  using SpareStarteds = transport::RecycledObjects<std::unique_ptr<Started>, kSpareStartedMax>;
  std::vector<std::shared_ptr<RingAllReduce>> rings_;  // in flight; guarded by mutex_
};

// What a work's errors name, kept cheaply: the ErrorContext (two strings) is built only for an
// error. `op` is OpInfo::name, a string literal; `group` the communicator's label, copied inline
// or shared (Note [Shared group labels]).
struct WorkContext {
  int rank = -1;
  std::string_view op;
  std::int64_t seq = -1;
  transport::GroupLabel group;

  ErrorContext error_context() const {
    return ErrorContext{rank, std::string(op), seq, group.str()};
  }
};

class MpiWork final : public transport::Work {
 public:
  // A work without its Started yet, made before the operation posts anything; adopt() hands it
  // the Started (Note [Issue without allocation]). `fingerprint.ops` comes with the Started.
  MpiWork(std::shared_ptr<MpiProcess> process, transport::Fingerprint fingerprint,
          WorkContext context);
  ~MpiWork() override;

  // Takes `started` (not null) and its signatures as the fingerprint's ops. Allocates nothing.
  void adopt(std::unique_ptr<Started> started) noexcept;

  bool is_completed() override;
  void wait(transport::Deadline deadline) override;
  void wait_on(void* stream) override;
  transport::WorkStatus status() const override;
  std::exception_ptr error() const override;
  const transport::Fingerprint& fingerprint() const override { return fingerprint_; }

 private:
  // Tests the requests once (Note [MPI locking]); finishes the work when they completed.
  void poll();
  // The rest of a poll whose MPI_Testall (returning `code`, `done`) found something to do
  // (Note [Lean polls]). Called with the MPI lock held, which it releases.
  void conclude_poll(int code, int done);
  // Note [Direct exchanges], "Short messages": the first completed receive that got other than
  // its posted count, and what it got (`arrived`), or none when all match. Call with the MPI lock
  // held, after MPI_Testall. size_mismatch_message describes it, outside the lock (a string is
  // built only for a failure).
  std::optional<Started::Receive> first_short_receive(int& arrived) const;
  // The first receive whose message was longer than it posted for, when MPI_Testall failed with
  // `code`: MPI's truncation error, reported as the mismatch it is. Call with the MPI lock held.
  std::optional<Started::Receive> first_truncated_receive(int code) const;
  // `arrived` as first_short_receive gives it, or kLongerMessage.
  static std::string size_mismatch_message(const Started::Receive& receive, int arrived);

  std::shared_ptr<MpiProcess> process_;
  std::unique_ptr<Started> started_;  // null until adopt()
  transport::Fingerprint fingerprint_;
  WorkContext context_;
  transport::FutexMutex mutex_;  // serialises poll(), which alone writes what follows
  // Pending until poll() sets error_ (Failed) and then stores the final status (release), so a
  // reader that loads a final status (acquire) reads error_ without the lock.
  std::atomic<transport::WorkStatus> status_ = transport::WorkStatus::Pending;
  std::exception_ptr error_;
};

// Note [Direct exchanges]
// Under chorus's schedule (MpiSchedule) reduce_scatter, all_gather and all_to_all post every
// message at once, an MPI_Irecv and an MPI_Isend per peer on the group's communicator, under one
// tag of the communicator's point-to-point sequence (Note [Ring all_reduce], "Messages"). MPI's
// progress engine moves point-to-point messages from any MPI call, so they need nothing more
// than the work's MPI_Testall. reduce_scatter receives every peer's block of this rank's chunk
// into scratch memory and, once all arrived, reduces the n blocks in group-rank order
// (chorus::kernels with the caller's op, avg and premul_sum included: the fold the simulator's
// fixed order uses, bit for bit): each block is computed once, at its owner. On 2 ranks this
// measured 0.98-2.15 of blocking MPI_Reduce_scatter_block's busbw from 64 KiB to 16 MiB, where
// MPI_Ireduce_scatter_block gave 0.47-0.98 (docs/performance.md). all_to_all takes chorus's
// schedule whatever its sizes, because ranks' totals differ and every rank must choose alike.
//
// Small operations: under Auto, below kChorusScheduleMinBytes on groups of 2 to
// kSmallDirectMaxRanks ranks, all_gather and reduce_scatter take the same direct exchange, and
// all_reduce one too: its whole input to every peer and every peer's into scratch, reduced in
// group-rank order at every rank (each rank folds the same n blocks in the same order, so every
// rank gets the same bits). One round of n - 1 messages each way replaces the schedule Open
// MPI's coll/libnbc builds and progresses for each nonblocking collective: at 8 B on 2 ranks
// chorus's added time fell by 0.3-0.55 us per op (docs/performance.md, "Small operations as
// direct exchanges"). Larger groups keep MPI's log2(n)-round algorithms there; Chorus (forced)
// keeps the ring for all_reduce at every size, so the tests can run it on small, uneven cases.
//
// Short messages: MPI completes a receive that got fewer elements than it posted for, and
// reports a longer one as truncated. Without --check-collectives a peer that issued another
// operation, or other all_to_all split sizes, can so send less than this rank expects, and the
// rest of the output would be whatever the memory held. So the poll that completes a direct
// exchange compares every receive's MPI_Get_count with its posted count and fails the work
// with CollectiveMismatch naming the peer and both counts (MpiWork::poll; Started::receives); a
// receive that MPI found truncated (MPI_ERR_TRUNCATE in its status) fails it the same way, as
// a longer message than posted for, rather than as MPI's TransportError. Signed messages are
// bytes, and their counts are said in bytes.
//
// Signed messages: a small all_reduce or reduce_scatter folds every rank's block at every
// rank with that rank's own op, so without --check-collectives two ranks that passed different
// ops, premul_sum factors, dtypes or operations of one size would each complete, with
// different results. Below kChorusScheduleMinBytes each message therefore carries the sender's
// OpSignature after its block (the block and signature copied into one scratch message, sent
// as bytes), and every rank compares its peers' signatures with its own before the fold: a
// disagreement fails the work with CollectiveMismatch naming both operations on every rank
// that received one. The copy is at most 4 KiB per op; larger exchanges stay unsigned (their
// size check still applies), as NCCL and MPI leave unchecked mismatches undefined.
//
// Own block last: all_gather and all_to_all copy this rank's own block into the output after
// posting the messages, so the peers' transfers start before the copy rather than after it (no
// message reads or writes that block, as long as the output does not partly overlap the input:
// core's outputs are fresh storages, and an in-place all_gather skips the copy). On 2 ranks, four
// interleaved rounds against copying first, busbw ratio to blocking MPI (medians): all_gather 0.916
// -> 0.924 at 64 KiB and 0.952 -> 0.963 at 128 KiB, all_to_all 0.904 -> 0.926 and 0.937 -> 0.952
// (docs/performance.md, 2026-12-05).
//
// Note [MPI int counts]
// MPI counts and displacements are int (MPI 4's large-count calls are not in Open MPI 4.1), so
// every count chorus hands MPI is checked against int (MpiComm::to_int_count): a buffer, or an
// all_to_all's slice for one peer, of more than 2^31-1 elements is refused with InvalidArgument
// at issue. An all_to_all's totals are not limited: its direct exchange addresses each peer's
// slice by pointer, and on MPI's schedule MPI_Ialltoallw takes per-peer byte displacements, with
// a peer whose offset passes int given a datatype that carries the offset (an MPI_Aint) instead.
// Until 2026-12-03 the totals had to fit too, and the check failed only on the rank whose total
// passed 2^31-1, while its peers waited for it until their deadline. A slice's count, unlike a
// total, is known at both ends (the sender's send count is the receiver's receive count), so
// both refuse it; other members still wait (docs/mpi.md, "Counts"). The test seam
// CHORUS_MPI_INT_COUNT_MAX (MpiProcess::int_count_max) lowers the limit, so tests reach it with
// small buffers (mpi.job.big_all_to_all.*).
class MpiComm final : public transport::Comm {
 public:
  // Made before its communicators exist (MpiTransport::create_comm: everything that allocates
  // comes before the collective calls that create them), and handed them by attach().
  // `ranks`: world ranks, this one among them. `timeout` bounds the collective check's
  // exchanges (Note [Collective check], on when `check_collectives`). `schedule`: who schedules
  // its collectives (MpiSchedule, already agreed by the ranks).
  MpiComm(std::shared_ptr<MpiProcess> process, std::string tag, std::vector<int> ranks,
          std::uint64_t id, std::chrono::nanoseconds timeout, MpiSchedule schedule,
          bool check_collectives);
  // Frees the communicators attached, if any.
  ~MpiComm() override;
  // Takes ownership of `comm`, the group's communicator, and `check_comm`, its twin for Note
  // [Collective check] (MPI_COMM_NULL without the check). Once, before any operation. Takes the
  // MPI lock; allocates nothing and never throws.
  void attach(MPI_Comm comm, MPI_Comm check_comm) noexcept;

  std::uint64_t id() const noexcept override { return id_; }
  const std::string& tag() const noexcept override { return tag_; }
  const std::vector<int>& ranks() const noexcept override { return ranks_; }
  int group_rank() const noexcept override { return group_rank_; }

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op,
                                                  const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> all_to_all(const transport::Buffer& send,
                                              const std::vector<std::size_t>& send_counts,
                                              const transport::Buffer& recv,
                                              const std::vector<std::size_t>& recv_counts,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> broadcast(const transport::Buffer& send,
                                             const transport::Buffer& recv, int root,
                                             const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> reduce(const transport::Buffer& send,
                                          const transport::Buffer& recv, const ReduceOp& reduce_op,
                                          int root, const transport::OpInfo& info) override;
  // Operations between begin_group and end_group start together at end_group (after one check
  // of the whole batch), NCCL's group semantics.
  void begin_group() override;
  std::shared_ptr<transport::Work> end_group(const transport::OpInfo& info) override;

 private:
  using BatchAbandon = transport::BatchAbandon<MpiComm>;
  friend BatchAbandon;
  // Drops the open batch, if any (an operation method threw inside it).
  void abandon_batch() noexcept;
  // The guard an operation method holds: a BatchAbandon inside a batch, else none, so that an
  // operation outside a batch does not read std::uncaught_exceptions() (a library call) twice.
  std::optional<BatchAbandon> batch_abandon() noexcept;

  // Starts one operation now (after its check), or defers it into the open batch. `start`
  // issues its MPI requests into a Started. all_to_all passes its per-peer counts for the check.
  // `start` is a callable (kept as a std::function only when batched).
  template <class Start>
  // `op_signature` is moved into the Started (or the batch).
  std::shared_ptr<transport::Work> launch(transport::OpSignature&& op_signature,
                                          const transport::OpInfo& info, Start&& start,
                                          const std::vector<std::size_t>* send_counts = nullptr,
                                          const std::vector<std::size_t>* recv_counts = nullptr);
  // The work of the operation `info` names, before it starts: Note [Issue without allocation].
  std::shared_ptr<MpiWork> make_work(const transport::OpInfo& info);
  // Note [Collective check]: throws CollectiveMismatch, Timeout or TransportError.
  void verify(const std::vector<transport::OpSignature>& signatures, const transport::OpInfo& info,
              const std::vector<std::size_t>* send_counts,
              const std::vector<std::size_t>* recv_counts);
  // Polls `pending` until done or `deadline`, the whole check's (then parks it and throws
  // Timeout); parks it too when anything else throws (Note [Issue without allocation]).
  void await_requests(std::unique_ptr<Started>& pending, const transport::OpInfo& info,
                      const char* what, transport::Deadline deadline);
  // What a work and an error name: this rank, the operation, the group.
  WorkContext work_context(const transport::OpInfo& info) const;
  ErrorContext context_of(const transport::OpInfo& info) const;
  // Throws TransportError for an MPI failure while starting an operation.
  void check(int code, const char* call, const transport::OpInfo& info) const;
  // Throws InvalidArgument for a count MPI cannot express (int; Note [MPI int counts]).
  int to_int_count(std::size_t count, const transport::OpInfo& info) const;
  // The MPI datatype and op of a reduction, creating chorus user ops on first use (call with
  // the MPI lock held); and a scaled copy of `send` for premul_sum.
  void reduction(const transport::Buffer& send, const ReduceOp& reduce_op, Plan& plan,
                 MPI_Datatype& datatype, MPI_Op& op);
  const void* scaled_input(const transport::Buffer& send, const ReduceOp& reduce_op,
                           Started& started);
  // The buffers a reduction's MPI call or ring runs on, and the after-step that finishes the
  // result in `recv` where the rank has one (`writes_recv`; reduce: the root only): `send` and
  // `recv` themselves (a scaled copy of `send` for premul_sum; avg divides afterwards), or for
  // a widened plan float32 copies (Note [Widened 16-bit reductions]).
  struct Operands {
    const void* input = nullptr;
    void* output = nullptr;
    DType dtype = DType::Float32;  // of input and output
  };
  Operands reduction_operands(const transport::Buffer& send, const transport::Buffer& recv,
                              const ReduceOp& reduce_op, const Plan& plan, bool writes_recv,
                              Started& started);
  // Whether this communicator may run chorus's schedules at all (MpiSchedule; Note [Ring
  // all_reduce], Note [Direct exchanges]), and whether an operation of `nbytes` per rank (the
  // larger buffer) does.
  // Both fixed per communicator (its size and schedule), so answered from members the
  // constructor sets.
  bool chorus_schedule_allowed() const noexcept { return chorus_schedule_allowed_; }
  bool use_chorus_schedule(std::size_t nbytes) const noexcept;
  // Whether Auto runs an operation of `nbytes` per rank, below chorus's range, as one direct
  // exchange (Note [Direct exchanges], "Small operations").
  bool use_small_direct_exchange(std::size_t nbytes) const noexcept {
    return small_direct_allowed_ && nbytes < kChorusScheduleMinBytes;
  }
  // Whether all_gather and reduce_scatter of `nbytes` per rank run as a direct exchange (either
  // of the two above).
  bool use_direct_exchange(std::size_t nbytes) const noexcept {
    return use_chorus_schedule(nbytes) || use_small_direct_exchange(nbytes);
  }
  // The next tag of this communicator's point-to-point sequence (Note [Ring all_reduce],
  // "Messages"); every member takes tags in the same (issue) order.
  int take_p2p_tag();
  // One peer's part of a direct exchange: what this rank sends it and where its data lands.
  struct Message {
    int peer;
    const void* send;
    int send_count;
    void* receive;
    int receive_count;
  };
  // message_scratch_, emptied for the next exchange's messages.
  std::vector<Message>& fresh_messages();
  // Posts every message's MPI_Irecv and MPI_Isend under one new tag into `started`, having
  // reserved room for their requests first (Note [Issue without allocation]): a std::bad_alloc
  // leaves nothing posted and no tag taken.
  void post_exchange(Started& started, const std::vector<Message>& messages, MPI_Datatype datatype,
                     const transport::OpInfo& info);
  // A reduction as one direct exchange (Note [Direct exchanges]): peer p gets `input` + p *
  // `input_stride` (recv.count elements); every peer's block for this rank lands in scratch, and
  // once all arrived `recv` = the n blocks reduced by `reduce_op` (avg and premul_sum included:
  // chorus::kernels) in group-rank order. reduce_scatter passes its block size as the stride,
  // all_reduce 0 (its whole input to every peer).
  // `signed_as`: the operation's signature, sent with every message and compared with the
  // peers' before the fold (Note [Direct exchanges], "Signed messages"); null for unsigned
  // messages of the element type.
  void post_reduction_exchange(Started& started, const void* input, std::size_t input_stride,
                               const transport::Buffer& recv, const ReduceOp& reduce_op,
                               const transport::OpInfo& info,
                               const transport::OpSignature* signed_as);

  std::shared_ptr<MpiProcess> process_;
  // The messages of the exchange being posted, kept for their capacity (one rank's thread
  // starts this communicator's operations, one at a time).
  std::vector<Message> message_scratch_;
  // The per-peer element counts and packed offsets of the all_to_all being issued, [send...,
  // recv...] by group rank (Note [MPI int counts]), kept for their capacity like the messages.
  std::vector<int> split_counts_;
  std::vector<std::size_t> split_offsets_;
  MPI_Comm comm_ = MPI_COMM_NULL;        // attach()
  MPI_Comm check_comm_ = MPI_COMM_NULL;  // attach()
  bool check_collectives_;
  std::string tag_;
  std::vector<int> ranks_;
  transport::GroupLabel label_;  // copied into the works' contexts
  std::uint64_t id_;
  std::chrono::nanoseconds timeout_;
  int group_rank_ = -1;
  MpiSchedule schedule_;
  bool chorus_schedule_allowed_ = false;  // two ranks or more, and a schedule other than Mpi
  bool small_direct_allowed_ = false;     // Auto, on 2 to kSmallDirectMaxRanks ranks
  int next_p2p_tag_ = 0;                  // Note [Ring all_reduce]
  bool batching_ = false;
  std::vector<transport::OpSignature> batch_signatures_;
  std::vector<std::function<void(Started&)>> batch_starts_;
};

// Note [Communicator rendezvous]
// Creating an MPI communicator blocks until every member calls it, and nothing bounds the wait:
// a member that never issues an operation on the group (it returned, it diverged, it is stuck)
// would hang the others inside MPI_Comm_create_group forever. So before creating one, every
// member sends every other member the group's id on the control communicator, always with the
// same tag, and polls for theirs under the rank's timeout. Between two ranks, set-ups pair up in
// the order each rank starts them: a member that never arrives becomes a Timeout naming it
// ("ranks [1] of group [0, 1] did not reach it"), and a member setting up another group first
// (the two ranks first use their shared groups in different orders, which would deadlock MPI)
// becomes a CollectiveMismatch. Only then is MPI_Comm_create_group called, which returns
// promptly since every member is there.
//
// Creation: MPI_Comm_create_group runs on MpiProcess::comm_parent(), a duplicate of
// MPI_COMM_WORLD that does nothing else. Not on MPI_COMM_WORLD, whose handler may be the
// program's MPI_ERRORS_ARE_FATAL: comm_parent's errors return, so a failure is a TransportError
// (mpi.create_group_test). Not on the control communicator either: Open MPI 4.1 agrees on the
// new communicator's context id with ordinary point-to-point messages on the parent, tagged
// with create_group's tag (comm_cid.c), so on control_ a group whose tag came out as
// kRendezvousTag or kBusyTag had Open MPI take chorus's leftover set-up messages or unread busy
// replies, or chorus take Open MPI's message as a set-up message (from 2026-12-03's 7f6db43 to
// its fix; mpi.create_group_tag_test).
//
// Busy peers: pairwise order is not enough. With a = {0, 1}, b = {1, 2}, c = {0, 2}, rank 0
// setting up a, rank 1 b and rank 2 c each wait for a rank busy with the next (a cycle of first
// uses) and never exchange a message, so each would time out blaming a peer that "has not
// issued any operation". So while a rank waits it takes every set-up message a non-member sent
// it (MPI_Improbe and MPI_Mrecv on the rendezvous tag), keeps them in order (early_messages_,
// where its own later set-ups with that rank take them before posting a receive), and answers
// the latest with the label of the group it is setting up instead (kBusyTag, a BusyReply), and
// takes the replies to its own messages: the Timeout then names what each missing member is
// doing. A reply carries which of the asker's set-up messages it answers (setups_sent_ and
// setups_received_ count them per pair, as MPI orders them), so a late reply to an earlier
// set-up is recognised and dropped. Taking the messages, rather than probing the first, lets a
// stale one ("Stale messages") be dropped there and then, before the asker's real one: until
// 2026-12-03 the one reply per asker answered a stale leftover that came first, the asker
// dropped it as answering another message, and its Timeout lost "rank N is still setting up
// ..." (mpi.job.busy_leftover). Each set-up answers an asker whose latest message it holds
// once (again if a newer one arrives), so a rank busy with one set-up after another tells a
// waiting asker about each.
//
// Leftovers: on a Timeout or an MPI failure the set-up's receives that did not match are
// cancelled (MPI_Cancel, then MPI_Wait), or the next set-up with that peer would pair with the
// wrong message; the sends cannot be (docs/mpi.md). The rest is parked (MpiProcess::park).
//
// Stale messages: a set-up message carries, besides the group's id, how many set-ups its sender
// has paired with the receiver so far (pairings_). A Timeout leaves its message at the late
// peer, and a caught Timeout's retry of the same group sends another: the peer pairs with the
// first and the second would be taken as the peer's next set-up message (a false
// CollectiveMismatch there, and this rank alone in MPI_Comm_create_group, holding the MPI lock,
// forever). A message whose count is below the receiver's own count with its sender was sent
// for a set-up the receiver has since paired, so it is dropped and the receive posted again; so
// is only a message of the group last paired (a leftover is always its sender's retry of the
// set-up the pair completed). A Timeout counts the pairs it did exchange, as a completed set-up
// does, so two ranks' counts stay equal whichever of them gave up; a message that arrives as its
// receive is cancelled at the deadline is an arrival.
// A rank whose set-up timed out with a peer still owes that peer the message it left there:
// until it pairs a set-up of the same group with that peer (a retry), a set-up of another group
// with it would pair with the leftover on the peer's side, so it is refused (abandoned_).
// A peer that reaches a set-up its partner abandoned for good still pairs with the leftover
// and waits in MPI_Comm_create_group (docs/mpi.md).
//
// Partial set-ups: in a group of three or more, a set-up can time out after pairing with some
// members. Those members cannot tell: with g = {0, 1, 2} and rank 2 late, rank 0 times out
// having paired with rank 1; rank 2 then arrives, pairs with rank 1 and with rank 0's message,
// and ranks 1 and 2 wait in MPI_Comm_create_group for rank 0. Rank 1 sends no second message,
// so a retry on rank 0 that waited for one from every member would wait for rank 1 until its
// deadline, blaming it, while ranks 1 and 2 wait for rank 0 for ever. So a set-up that ends
// without a communicator (Timeout, CollectiveMismatch) remembers, per peer, the group whose
// matching messages it exchanged with that peer (partial_), and a retry of the same group
// neither sends to nor waits for those peers: it waits only for the members still missing,
// and its Timeout names only them. A pair exchanged in time is recorded on both sides, so two
// members that both time out and both retry skip each other; where one side's deadline passed
// first, that side holds the pair as abandoned_ instead, resends, and the peer drops the resent
// message as stale. A set-up that completes, or a set-up of another group with that peer,
// forgets it. A skipped peer that sends this rank a set-up message meanwhile has moved on to
// another group (it would never join this one in MPI_Comm_create_group): the message is kept
// and answered as a non-member's ("Busy peers"), and the retry ends in a CollectiveMismatch
// naming the peer, checked on every poll and once more when nobody is missing; one that
// arrives after that is not seen (docs/mpi.md).
class MpiTransport final : public transport::Transport {
 public:
  // `timeout` bounds communicator set-up (Note [Communicator rendezvous]) and the collective
  // check's exchanges (Note [Collective check], on when `check_collectives`).
  // `schedule`: who schedules the collectives of every communicator (MpiSchedule).
  MpiTransport(std::shared_ptr<MpiProcess> process, std::chrono::nanoseconds timeout,
               bool check_collectives, MpiSchedule schedule);

  std::string_view name() const noexcept override { return "mpi"; }
  int rank() const noexcept override { return process_->rank(); }
  int world_size() const noexcept override { return process_->world_size(); }
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override;
  transport::Duration now() override;
  std::string supports(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                       Device device) const override;

 private:
  // The schedule every rank runs (Note [Ring all_reduce]): the same `requested` on every rank,
  // else InvalidArgument; Auto becomes Mpi unless every node has a CPU per rank. Collective.
  MpiSchedule agree_on_schedule(MpiSchedule requested);
  // Throws Timeout or CollectiveMismatch (Note [Communicator rendezvous]).
  void rendezvous(const std::vector<int>& ranks, std::uint64_t id, const ErrorContext& context);

  std::shared_ptr<MpiProcess> process_;
  std::chrono::nanoseconds timeout_;
  bool check_collectives_;
  MpiSchedule schedule_;
  // Per world rank: set-up messages sent to it and received from it (Note [Communicator
  // rendezvous], "Busy peers"). One thread issues a rank's operations, so set-ups never overlap.
  std::vector<std::uint64_t> setups_sent_;
  std::vector<std::uint64_t> setups_received_;
  // Per world rank: set-ups paired with it (both messages consumed), and the id and group label
  // of a set-up that timed out waiting for it, whose message it may still take (label empty:
  // none); "Stale messages".
  std::vector<std::uint64_t> pairings_;
  std::vector<std::uint64_t> last_paired_;  // the id its last paired message carried
  std::vector<std::uint64_t> abandoned_;
  std::vector<std::string> abandoned_group_;
  // Per world rank: the id of a set-up that ended without a communicator (Timeout or
  // CollectiveMismatch) after this rank and that peer exchanged matching messages for it; a
  // retry of that group skips the peer ("Partial set-ups").
  std::vector<std::optional<std::uint64_t>> partial_;
  // Per world rank: its set-up messages (id, pairings) that a busy set-up took to answer them
  // ("Busy peers"), oldest first, for this rank's next set-ups with it.
  std::vector<std::deque<std::array<std::uint64_t, 2>>> early_messages_;
};

// Note [Aborting under the lock]
// MPI_THREAD_SERIALIZED (Note [MPI locking]) wants no two threads in MPI at once, so a failed
// rank's MPI_Abort takes the MPI lock first. But another thread of the rank may hold the lock
// inside an MPI call that never returns: MPI_Comm_create_group, blocking without a deadline for
// a member that will never join it (docs/mpi.md, "What is not bounded"). Waiting for that thread
// kept the job from ending at all, the one thing the abort is for (until 2026-12-06
// abort_job took the lock unconditionally). So the abort waits for the lock kAbortLockWait at
// most (a thread between two polls holds it for one MPI_Testall), then calls MPI_Abort without
// it. That call beside another thread's is erroneous under MPI_THREAD_SERIALIZED, and a reviewer
// proposed std::abort() instead. Both end this process; they differ in who ends the rest of the
// job. MPI_Abort asks the MPI runtime to end every rank, whatever started them; std::abort leaves
// that to the launcher noticing a rank killed by a signal: mpirun (Open MPI's, Hydra's) does,
// srun only with --kill-on-bad-exit, and the other ranks may sit in a call with no deadline of
// their own (MPI_Comm_create_group waiting for this one) for ever. So MPI_Abort stays, with what
// the thread level no longer guarantees bounded: its outcomes beside the other thread are that it
// ends the job (Open MPI 4.1 here: mpi.abort_test), crashes (this process ends: the launcher's
// case), returns (std::abort follows) or never returns. For the last a watchdog thread, started
// just before the unlocked call, std::abort()s the process kAbortCallWait later
// (mpi.abort_hang_test, whose MPI_Abort, interposed through the profiling interface, never
// returns); where no thread can be started, std::abort at once. kAbortCallWait is 10 s, not 1:
// an MPI_Abort that works ends the process from the runtime's side (orted's kill), which took
// over a second under ThreadSanitizer here (the watchdog fired in mpi.abort_test), as it may
// for a launcher tearing down a large job; the watchdog is for the call that never returns. Until
// 2026-12-07 nothing bounded it, and an unlocked MPI_Abort that hung kept the job from ending as
// the lock had.
inline constexpr std::chrono::milliseconds kAbortLockWait{1000};
inline constexpr std::chrono::milliseconds kAbortCallWait{10'000};

// Prints "chorus: rank R of N failed: <what>" and the abort notice to stderr, then
// MPI_Abort(MPI_COMM_WORLD, 1) (chorus::mpi::run's end for a failed rank): Note [Aborting under
// the lock]. Does not return.
[[noreturn]] void abort_job(MpiProcess& process, const std::string& what);

}  // namespace chorus::mpi::detail
