#include "mpi_transport.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/kernels.hpp"
#include "chorus/transport/fnv1a.hpp"
#include "chorus/transport/recycled_blocks.hpp"

namespace chorus::mpi::detail {

// FNV-1a over the tag and ranks: the same id on every member, without communicating.
std::uint64_t comm_id_of(const std::string& tag, const std::vector<int>& ranks) {
  transport::Fnv1a hash;
  for (const char c : tag) {
    hash.byte(static_cast<unsigned char>(c));
  }
  hash.byte(0);
  for (const int rank : ranks) {
    hash.integer(static_cast<unsigned>(rank), 4);
  }
  return hash.value();
}

int create_group_tag(std::uint64_t id) noexcept { return static_cast<int>(id % kTagCount); }

namespace {

using transport::Buffer;
using transport::OpInfo;
using transport::OpKind;
using transport::OpSignature;

// The Timeout text of a set-up that `missing` (world ranks) did not reach; busy[r]: the group
// rank r answered it is setting up, or "" (Note [Communicator rendezvous], "Busy peers").
std::string unreached_set_up_message(const std::vector<int>& missing,
                                     const std::vector<std::string>& busy,
                                     const std::string& group) {
  std::string list;
  std::string busy_ranks;
  bool silent = false;
  for (const int rank : missing) {
    list += (list.empty() ? "" : ", ") + std::to_string(rank);
    const std::string& other = busy[static_cast<std::size_t>(rank)];
    if (other.empty()) {
      silent = true;
    } else {
      busy_ranks += (busy_ranks.empty() ? "" : ", ") + ("rank " + std::to_string(rank)) +
                    " is still setting up group " + other;
    }
  }
  std::string text =
      "ranks [" + list + "] of group " + group + " did not reach its set-up within the timeout: ";
  if (!busy_ranks.empty()) {
    text += busy_ranks +
            " (if that set-up waits, directly or through further groups, for this rank, the "
            "ranks' first uses of groups form a cycle across groups, which deadlocks: "
            "docs/mpi.md)";
  }
  if (silent) {
    text += std::string(busy_ranks.empty() ? "" : "; the others") +
            (busy_ranks.empty() ? "they" : "") +
            " have not issued any operation on this group (returned, stuck, or running "
            "different code)";
  }
  return text;
}

// MPI_Ialltoallw's per-peer arguments (Note [MPI int counts]), each [send, recv] by group rank,
// kept alive with the work (MPI reads them until the operation completes).
struct AllToAllLayout {
  std::vector<int> wire_counts;    // the split's counts[i], or 1 of a placed datatype
  std::vector<int> displacements;  // bytes
  std::vector<MPI_Datatype> types;
};

std::shared_ptr<void> scratch(std::size_t nbytes) {
  void* block = std::malloc(nbytes == 0 ? 1 : nbytes);
  if (block == nullptr) {
    throw std::bad_alloc();
  }
  return {block, &std::free};
}

// Room for `size_min` elements in `values` without reallocating. Grows the capacity at least
// twofold, as push_back does: reserving exactly what one operation needs made each operation of
// a coalesced batch on a fresh Started reallocate its vectors (quadratic in the batch's size).
template <class T>
void reserve_at_least(std::vector<T>& values, std::size_t size_min) {
  if (size_min > values.capacity()) {
    values.reserve(std::max(size_min, 2 * values.capacity()));
  }
}

// Adds an operation's buffers to what `started` keeps alive: a coalesced batch starts several
// operations into one Started, and each must keep its own (the ring reads its input until its
// last reduce-scatter step). The operations' start callables move their Buffers' keep_alive in
// (each runs once): a copy costs an atomic increment and decrement per buffer once MPI has
// started its threads. They capture the Buffers with an init-capture (`send = send`): a plain
// by-copy capture of a `const Buffer&` is a const member, whose std::move is a copy (until
// 2026-12-05 every operation copied both here and released both with its callable); the
// static_assert refuses a const rvalue.
template <class... KeepAlive>
void keep(Started& started, KeepAlive&&... buffers) {
  static_assert(((std::is_lvalue_reference_v<KeepAlive> ||
                  !std::is_const_v<std::remove_reference_t<KeepAlive>>)&&...),
                "a const keep_alive moved in is copied: capture the Buffer non-const");
  reserve_at_least(started.keep_alive, started.keep_alive.size() + sizeof...(buffers));
  (started.keep_alive.emplace_back(std::forward<KeepAlive>(buffers)), ...);
}

// The request an operation's one MPI call posts into, made (MPI_REQUEST_NULL) before the call so
// that nothing allocates after it (Note [Issue without allocation]), with room for its status in
// the poll. May throw std::bad_alloc.
MPI_Request* request_slot(Started& started) {
  reserve_at_least(started.statuses, started.requests.size() + 1);
  return &started.requests.emplace_back(MPI_REQUEST_NULL);
}

// Runs `on_unwind` (which must not throw) when the scope it guards is left by an exception.
template <class F>
class OnUnwind {
 public:
  explicit OnUnwind(F on_unwind) : on_unwind_(std::move(on_unwind)) {}
  OnUnwind(const OnUnwind&) = delete;
  OnUnwind& operator=(const OnUnwind&) = delete;
  ~OnUnwind() {
    if (std::uncaught_exceptions() > uncaught_) {
      on_unwind_();
    }
  }

 private:
  F on_unwind_;
  int uncaught_ = std::uncaught_exceptions();
};

// One OpSignature as bytes on the wire: the collective check's descriptions (Note [Collective
// check]) and signed messages (Note [Direct exchanges], "Signed messages") carry it. The ranks of
// a job run one binary, so both ends share the layout.
struct WireOp {
  std::uint64_t send_count = 0;
  std::uint64_t recv_count = 0;
  std::uint64_t factor_bits = 0;
  std::uint64_t layout = 0;  // OpSignature::layout (Note [Layout digest] in core)
  std::int32_t root = -1;
  std::uint8_t kind = 0;
  std::uint8_t dtype = 0;
  std::uint8_t reduce_kind = 0;
  std::uint8_t lowered_from = 0;  // 0: not lowered; else the DType + 1

  static WireOp of(const OpSignature& op) noexcept {
    return WireOp{op.send_count,
                  op.recv_count,
                  std::bit_cast<std::uint64_t>(op.reduce_op.premul_factor()),
                  op.layout,
                  op.root,
                  static_cast<std::uint8_t>(op.kind),
                  static_cast<std::uint8_t>(op.dtype),
                  static_cast<std::uint8_t>(op.reduce_op.kind()),
                  op.lowered_from
                      ? static_cast<std::uint8_t>(static_cast<std::uint8_t>(*op.lowered_from) + 1)
                      : std::uint8_t{0}};
  }
  OpSignature signature() const noexcept {
    const auto reduce = static_cast<ReduceOp::Kind>(reduce_kind);
    return OpSignature{static_cast<OpKind>(kind),
                       static_cast<DType>(dtype),
                       send_count,
                       recv_count,
                       reduce == ReduceOp::Kind::PremulSum
                           ? ReduceOp::premul_sum(std::bit_cast<double>(factor_bits))
                           : ReduceOp(reduce),
                       root,
                       lowered_from == 0
                           ? std::nullopt
                           : std::optional<DType>(static_cast<DType>(lowered_from - 1)),
                       layout};
  }
};
static_assert(std::is_trivially_copyable_v<WireOp>);
static_assert(sizeof(WireOp) == 40);

// What a signed message carries after its block: the operation and who sent it (world rank).
struct MessageSignature {
  WireOp op;
  std::int32_t sender = -1;
};
static_assert(std::is_trivially_copyable_v<MessageSignature>);

// The reduction of one step of chorus's schedules (Note [Ring all_reduce], Note [Direct
// exchanges]): avg and premul_sum are sums there (divided afterwards, or of a scaled input).
ReduceOp step_op(const Plan& plan, const ReduceOp& reduce_op) {
  return plan.divide_after || plan.scale_input ? ReduceOp(ReduceOp::Kind::Sum) : reduce_op;
}

// Time since the process's epoch, the clock of transport::Deadline here (MpiTransport::now).
transport::Duration since_epoch(const MpiProcess& process) {
  return std::chrono::duration_cast<transport::Duration>(std::chrono::steady_clock::now() -
                                                         process.epoch());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MpiProcess

MpiProcess::MpiProcess(int node_cpus, int int_count_max, bool recycles)
    : int_count_max_(int_count_max), recycles_(recycles), user_ops_(std::make_unique<UserOps>()) {
  CHORUS_CHECK(int_count_max > 0);
  const ErrorContext context{-1, "chorus::mpi::run", -1, ""};
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) {
    // MPI cannot start twice in a process: a second chorus::run on MPI, or after the program's
    // own MPI_Finalize.
    throw TransportError(context,
                         "MPI was already finalised in this process; the mpi transport "
                         "runs once per process");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized == 0) {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      throw TransportError(context, "MPI failed to start (MPI_Init_thread)");
    }
    initialized_here_ = true;
    // chorus's own communicators return their errors; MPI_COMM_WORLD too, since MPI is ours.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&provided);  // the program's MPI: leave its error handler alone
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    if (initialized_here_) {
      MPI_Finalize();
    }
    throw TransportError(context, "this MPI runs at thread level " + std::to_string(provided) +
                                      "; chorus needs MPI_THREAD_SERIALIZED (Note [MPI locking]): "
                                      "initialise MPI with MPI_Init_thread, or let chorus do it");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  // Every rank starts here together (chorus::mpi::run), so this collective cannot strand one.
  if (const int code = MPI_Comm_dup(MPI_COMM_WORLD, &control_); code != MPI_SUCCESS) {
    throw TransportError(ErrorContext{rank_, "MPI_Comm_dup", -1, ""},
                         "creating chorus's control communicator failed: " + mpi_error_text(code));
  }
  MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
  // The parent of every communicator chorus creates, kept apart from control_'s point-to-point
  // messages (Note [Communicator rendezvous], "Creation"). Collective too, as above.
  if (const int code = MPI_Comm_dup(MPI_COMM_WORLD, &comm_parent_); code != MPI_SUCCESS) {
    MPI_Comm_free(&control_);
    throw TransportError(ErrorContext{rank_, "MPI_Comm_dup", -1, ""},
                         "creating chorus's communicator parent failed: " + mpi_error_text(code));
  }
  MPI_Comm_set_errhandler(comm_parent_, MPI_ERRORS_RETURN);
  // Ranks sharing this node (collective too, as above; on comm_parent_, whose errors return):
  // Note [Wait backoff].
  MPI_Comm node = MPI_COMM_NULL;
  int node_size = world_size_;
  if (MPI_Comm_split_type(comm_parent_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
  }
  // All CPUs of the node, not this process's affinity mask: mpirun may bind each rank to one.
  const unsigned cpus =
      node_cpus > 0 ? static_cast<unsigned>(node_cpus) : std::thread::hardware_concurrency();
  spin_waits_ = cpus > 0 && static_cast<unsigned>(node_size) <= cpus;
}

MpiProcess::~MpiProcess() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) {
    // The program finalised MPI itself: its objects went with it; do not free them again.
    (void)user_ops_.release();  // NOLINT(bugprone-unused-return-value): owned by MPI's teardown
    return;
  }
  user_ops_.reset();
  MPI_Comm_free(&comm_parent_);
  MPI_Comm_free(&control_);
  if (initialized_here_) {
    // Works parked after a caught Timeout may still be pending; MPI_Finalize with pending
    // requests is erroneous, so they are left to the process's end (docs/mpi.md).
    MPI_Finalize();
  }
}

void MpiProcess::reserve_ring() { reserve_at_least(rings_, rings_.size() + 1); }

void MpiProcess::add_ring(std::shared_ptr<RingAllReduce> ring) noexcept {
  CHORUS_CHECK_LT(rings_.size(), rings_.capacity());  // reserve_ring made room
  rings_.push_back(std::move(ring));
}

void MpiProcess::progress_rings() {
  for (std::size_t i = 0; i < rings_.size();) {
    if (rings_[i]->progress()) {
      rings_[i] = std::move(rings_.back());  // done (finished or failed): no longer in flight
      rings_.pop_back();
    } else {
      ++i;
    }
  }
}

std::unique_ptr<Started> MpiProcess::take_started() {
  std::unique_ptr<Started> started;
  if (recycles_ && SpareStarteds::take(started)) {
    CHORUS_CHECK(started != nullptr);  // recycle_started keeps only nodes, emptied
    return started;
  }
  return std::make_unique<Started>();
}

void MpiProcess::recycle_started(std::unique_ptr<Started> started) noexcept {
  if (started == nullptr) {
    return;
  }
  // Emptied before it is kept: keep_alive's buffers and after's captures go now, as they would
  // have with the work.
  started->clear();
  CHORUS_CHECK(started->next_parked == nullptr);
  if (!recycles_) {
    return;  // freed here (the test seam CHORUS_MPI_RECYCLE_STARTED=0)
  }
  // This thread's list (Note [Recycled Started]): no lock, and no operator new (fixed
  // per-thread storage; a thread's first use registers the list's emptying at thread exit, once,
  // as an MpiWork's recycled block does: Note [Recycled blocks]). When the list is full or
  // closed (this thread is exiting) `started` stays here and is freed.
  (void)SpareStarteds::give(started);
}

void MpiProcess::park(std::unique_ptr<Started> started) noexcept {
  if (started == nullptr) {
    return;
  }
  // Callers hold no MPI lock (the MPI lock orders after a work's own lock). Linking the node
  // allocates nothing (Note [Issue without allocation]).
  const std::lock_guard lock(mutex_);
  CHORUS_CHECK(started->next_parked == nullptr);
  started->next_parked = std::move(parked_.head);
  parked_.head = std::move(started);
  ++parked_.count;
}

void MpiProcess::retire(std::unique_ptr<Started> started) noexcept {
  if (started != nullptr && started->in_flight()) {
    park(std::move(started));
  } else {
    recycle_started(std::move(started));
  }
}

MpiProcess::ParkedList::~ParkedList() {
  while (head != nullptr) {
    head = std::move(head->next_parked);  // frees one node; its successor is held here
  }
}

std::size_t MpiProcess::parked_count() {
  const std::lock_guard lock(mutex_);
  return parked_.count;
}

bool Started::in_flight() const noexcept {
  // A work that failed after MPI completed its requests (a short message, a signature mismatch,
  // a throwing after-step) holds only MPI_REQUEST_NULL: nothing of it is MPI's any more.
  const bool requests_pending = std::ranges::any_of(
      requests, [](MPI_Request request) { return request != MPI_REQUEST_NULL; });
  // A failed ring's own requests are in an unknown state, like a running ring's.
  const bool rings_pending = std::ranges::any_of(
      rings, [](const std::shared_ptr<RingAllReduce>& ring) { return !ring->finished(); });
  return requests_pending || rings_pending;
}

// ---------------------------------------------------------------------------------------------
// MpiWork

MpiWork::MpiWork(std::shared_ptr<MpiProcess> process, transport::Fingerprint fingerprint,
                 WorkContext context)
    : process_(std::move(process)),
      fingerprint_(std::move(fingerprint)),
      context_(std::move(context)) {}

void MpiWork::adopt(std::unique_ptr<Started> started) noexcept {
  CHORUS_CHECK(started != nullptr);
  CHORUS_CHECK(started_ == nullptr);
  // One status per request, sized here rather than by every poll (Note [Lean polls]); within
  // the capacity every start reserved for them (request_slot, post_exchange), so no allocation.
  CHORUS_CHECK_LE(started->requests.size(), started->statuses.capacity());
  started->statuses.resize(started->requests.size());
  fingerprint_.ops = std::move(started->signatures);
  started_ = std::move(started);
}

MpiWork::~MpiWork() {
  if (started_ == nullptr) {
    return;  // made for an operation whose start threw (MpiComm::launch): it never had one
  }
  // The list the fingerprint took goes back with the Started, for its capacity.
  started_->signatures = std::move(fingerprint_.ops);
  // MPI cannot cancel a collective: a pending work's buffers must outlive it, so they stay with
  // the process (a work is dropped pending only after a Timeout, on the way to ending the job; a
  // failed test leaves its requests in an unknown state, so those stay too). Parking allocates
  // nothing, so this destructor cannot throw (Note [Issue without allocation]). A completed
  // work's requests all completed and its rings finished: nothing of it is MPI's, so it skips
  // retire's scan of them.
  if (status_.load(std::memory_order_acquire) == transport::WorkStatus::Completed) {
    process_->recycle_started(std::move(started_));
  } else {
    process_->retire(std::move(started_));
  }
}

void MpiWork::poll() {
  if (status_.load(std::memory_order_relaxed) != transport::WorkStatus::Pending) {
    return;
  }
  int done = 0;
  // Locked by hand: the lean return below unlocks, and otherwise conclude_poll adopts the lock.
  // Nothing from here to either may throw (MPI_Testall is C, and the communicators return
  // errors), or the lock would stay held.
  process_->mutex().lock();
  // Statuses always: a failed request's own error is only there (MPI_ERR_IN_STATUS). adopt()
  // sized them.
  const int code = MPI_Testall(static_cast<int>(started_->requests.size()),
                               started_->requests.data(), &done, started_->statuses.data());
  if (code == MPI_SUCCESS && done == 0 && started_->rings.empty() && !process_->rings_in_flight()) {
    process_->mutex().unlock();  // Note [Lean polls]: nothing else to do on this poll
    return;
  }
  conclude_poll(code, done);
}

void MpiWork::conclude_poll(int code, int done) {
  std::string failure;
  ErrorCode failure_code = ErrorCode::TransportError;
  // A receive that got another size than it posted for: its message is built outside the lock.
  std::optional<Started::Receive> mismatched;
  int mismatched_arrived = 0;
  {
    const std::lock_guard mpi_lock(process_->mutex(), std::adopt_lock);  // poll() took it
    if (code != MPI_SUCCESS) {
      mismatched = first_truncated_receive(code);
      mismatched_arrived = kLongerMessage;
      if (!mismatched.has_value()) {
        // The peers of direct exchanges' receives and sends are known; a collective's request
        // has none.
        std::vector<int> peers(started_->requests.size(), -1);
        for (const Started::Receive& receive : started_->receives) {
          peers[receive.request] = receive.peer;
        }
        for (const Started::Send& send : started_->sends) {
          peers[send.request] = send.peer;
        }
        failure = mpi_requests_failure("MPI_Testall", code, started_->statuses, peers);
      }
    } else if (done != 0 && !started_->receives.empty()) {
      // Once: the requests are freed now, and a later poll (for a ring of the batch) would
      // find only empty statuses.
      mismatched = first_short_receive(mismatched_arrived);
      started_->receives.clear();
      started_->sends.clear();  // their requests are freed too
    }
    if (process_->rings_in_flight()) {
      process_->progress_rings();  // this work's and everyone else's (Note [Ring all_reduce])
    }
    for (const std::shared_ptr<RingAllReduce>& ring : started_->rings) {
      if (ring->failed()) {
        failure = ring->failure();
        failure_code =
            ring->mismatched() ? ErrorCode::CollectiveMismatch : ErrorCode::TransportError;
      } else if (!ring->finished()) {
        done = 0;
      }
    }
  }
  if (!failure.empty() || mismatched.has_value()) {
    error_ = failure.empty() ? make_error(ErrorCode::CollectiveMismatch, context_.error_context(),
                                          size_mismatch_message(*mismatched, mismatched_arrived))
                             : make_error(failure_code, context_.error_context(), failure);
    status_.store(transport::WorkStatus::Failed, std::memory_order_release);
    return;
  }
  if (done == 0) {
    return;
  }
  try {
    for (const std::function<void()>& step : started_->after) {
      step();
    }
    status_.store(transport::WorkStatus::Completed, std::memory_order_release);
  } catch (...) {
    error_ = std::current_exception();
    status_.store(transport::WorkStatus::Failed, std::memory_order_release);
  }
  started_->after.clear();
  started_->rings.clear();
  started_->keep_alive.clear();
}

std::optional<Started::Receive> MpiWork::first_short_receive(int& arrived) const {
  for (const Started::Receive& receive : started_->receives) {
    MPI_Get_count(&started_->statuses[receive.request], receive.datatype, &arrived);
    if (arrived != receive.count) {
      return receive;
    }
  }
  return std::nullopt;
}

std::optional<Started::Receive> MpiWork::first_truncated_receive(int code) const {
  for (const Started::Receive& receive : started_->receives) {
    if (truncated(code, started_->statuses, receive.request)) {
      return receive;
    }
  }
  return std::nullopt;
}

std::string MpiWork::size_mismatch_message(const Started::Receive& receive, int arrived) {
  // Signed messages travel as bytes, a block and its signature (Note [Direct exchanges]).
  return message_size_mismatch(receive.peer, arrived, receive.count,
                               receive.datatype == MPI_BYTE ? "bytes" : "elements", "");
}

bool MpiWork::is_completed() {
  if (status() != transport::WorkStatus::Pending) {
    return true;
  }
  const std::lock_guard lock(mutex_);
  poll();
  return status_.load(std::memory_order_relaxed) != transport::WorkStatus::Pending;
}

void MpiWork::wait(transport::Deadline deadline) {
  // Note [Wait backoff]: spin, yielding once per kSpinBetweenYields, unless oversubscribed.
  constexpr auto kSpinBetweenYields = std::chrono::microseconds(100);
  // Reading the clock cost as much as a poll (perf: clock_gettime took 15% of an 8-byte
  // all_gather loop), so a spinning wait reads it once per kPollsPerClockRead polls: the
  // deadline and the yield are checked a few microseconds late at most.
  constexpr unsigned kPollsPerClockRead = 16;
  const bool spin = process_->spin_waits();
  std::chrono::steady_clock::time_point last_yield;  // set at the first clock read
  for (unsigned polls = 1;; ++polls) {
    transport::WorkStatus status = status_.load(std::memory_order_acquire);  // as status()
    if (status == transport::WorkStatus::Pending) {
      const std::lock_guard lock(mutex_);
      poll();
      status = status_.load(std::memory_order_relaxed);
    }
    if (status == transport::WorkStatus::Failed) {
      std::rethrow_exception(error_);
    }
    if (status == transport::WorkStatus::Completed) {
      return;
    }
    if (spin && polls % kPollsPerClockRead != 0) {
      continue;
    }
    const auto clock_now = std::chrono::steady_clock::now();
    if (clock_now - process_->epoch() >= deadline.at) {
      throw Timeout(context_.error_context(),
                    "not completed by its deadline; the operation stays pending. A peer of the "
                    "group has not issued it (or issued something else: MPI cannot tell which), "
                    "or is stuck");
    }
    if (last_yield == std::chrono::steady_clock::time_point{}) {
      last_yield = clock_now;
    }
    // Note [MPI locking]: never hold the MPI lock while waiting.
    if (!spin || clock_now - last_yield >= kSpinBetweenYields) {
      std::this_thread::yield();
      last_yield = clock_now;
    }
  }
}

void MpiWork::wait_on(void* /*stream*/) {
  throw InvalidArgument(context_.error_context(),
                        "the mpi transport has no device streams (host memory only)");
}

transport::WorkStatus MpiWork::status() const { return status_.load(std::memory_order_acquire); }

std::exception_ptr MpiWork::error() const {
  // error_ is written once, before the status that says Failed.
  return status() == transport::WorkStatus::Failed ? error_ : nullptr;
}

// ---------------------------------------------------------------------------------------------
// MpiComm

MpiComm::MpiComm(std::shared_ptr<MpiProcess> process, std::string tag, std::vector<int> ranks,
                 std::uint64_t id, std::chrono::nanoseconds timeout, MpiSchedule schedule,
                 bool check_collectives)
    : process_(std::move(process)),
      check_collectives_(check_collectives),
      tag_(std::move(tag)),
      ranks_(std::move(ranks)),
      label_(transport::group_label(tag_, ranks_)),
      id_(id),
      timeout_(timeout),
      schedule_(schedule) {
  // The group is created from comm_parent's (world's) group with the ranks in this order
  // (MpiTransport::create_comm), so this rank's group rank is its place here; attach() checks.
  const auto mine = std::ranges::find(ranks_, process_->rank());
  CHORUS_CHECK(mine != ranks_.end());
  group_rank_ = static_cast<int>(mine - ranks_.begin());
  // Auto was already turned into Mpi on oversubscribed jobs (MpiTransport::agree_on_schedule),
  // so Auto survives only where every node has a CPU per rank.
  const std::size_t n = ranks_.size();
  chorus_schedule_allowed_ = n >= 2 && schedule_ != MpiSchedule::Mpi;
  small_direct_allowed_ = schedule_ == MpiSchedule::Auto && n >= 2 &&
                          n <= static_cast<std::size_t>(kSmallDirectMaxRanks);
}

void MpiComm::attach(MPI_Comm comm, MPI_Comm check_comm) noexcept {
  CHORUS_CHECK(comm != MPI_COMM_NULL);
  CHORUS_CHECK(comm_ == MPI_COMM_NULL);
  CHORUS_CHECK_EQ(check_comm != MPI_COMM_NULL, check_collectives_);
  comm_ = comm;
  check_comm_ = check_comm;
  int group_rank = -1;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Comm_rank(comm_, &group_rank);
  }
  CHORUS_CHECK_EQ(group_rank, group_rank_);
}

MpiComm::~MpiComm() {
  if (comm_ == MPI_COMM_NULL) {
    return;  // its set-up failed before the communicators existed (create_comm)
  }
  const std::lock_guard mpi_lock(process_->mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) {
    MPI_Comm_free(&comm_);
    if (check_comm_ != MPI_COMM_NULL) {
      MPI_Comm_free(&check_comm_);
    }
  }
}

WorkContext MpiComm::work_context(const OpInfo& info) const {
  return WorkContext{process_->rank(), info.name, info.seq, label_};
}

ErrorContext MpiComm::context_of(const OpInfo& info) const {
  return work_context(info).error_context();
}

void MpiComm::check(int code, const char* call, const OpInfo& info) const {
  if (code != MPI_SUCCESS) {
    throw TransportError(context_of(info), std::string(call) + " failed: " + mpi_error_text(code));
  }
}

int MpiComm::to_int_count(std::size_t count, const OpInfo& info) const {
  const int count_max = process_->int_count_max();
  if (count > static_cast<std::size_t>(count_max)) {
    const bool lowered = count_max != std::numeric_limits<int>::max();
    throw InvalidArgument(
        context_of(info),
        "the mpi transport takes at most 2^31-1 elements per buffer and peer "
        "(MPI counts are int)" +
            (lowered ? " (lowered to " + std::to_string(count_max) + " by CHORUS_MPI_INT_COUNT_MAX)"
                     : std::string()) +
            "; got " + std::to_string(count));
  }
  return static_cast<int>(count);
}

void MpiComm::reduction(const Buffer& send, const ReduceOp& reduce_op, Plan& plan,
                        MPI_Datatype& datatype, MPI_Op& op) {
  plan = plan_reduction(send.dtype, reduce_op);
  datatype = mpi_datatype(plan.element);
  op = plan.op == OpChoice::User ? process_->user_ops().get(send.dtype, plan.user_kind)
                                 : builtin_op(plan.op);
}

const void* MpiComm::scaled_input(const Buffer& send, const ReduceOp& reduce_op, Started& started) {
  // f * x once per element, rounded to the dtype (kernels' premul step on one source).
  std::shared_ptr<void> copy = scratch(send.nbytes());
  const void* sources[1] = {send.data};
  kernels::reduce(copy.get(), sources, 1, send.count, send.dtype, reduce_op);
  const void* scaled = copy.get();
  started.keep_alive.push_back(std::move(copy));
  return scaled;
}

// Note [Widened 16-bit reductions]
// Float16 and BFloat16 sums, averages, premul_sums and products travel as float32 (Plan::widen):
// each rank widens its input (exactly; for premul_sum f * x is taken in float, the kernels'
// prepare step), MPI's collective or chorus's ring reduces the floats, and one after-step divides
// (avg) and rounds each element to the dtype once, as chorus::kernels do on the simulator.
// Reducing the 16-bit values themselves rounded at every step: an avg of 60000s overflowed to
// inf where every rank's average is 60000, and premul_sum rounded f * x to the dtype (often a
// subnormal) before summing. The result is the simulator's bit for bit whenever the float32 sum
// is exact whatever its order (the simulator adds in group-rank order, MPI in its own); it costs
// twice the bytes on the wire. The small direct exchange (Note [Direct exchanges]) reduces with
// the kernels themselves and needs none of this.
MpiComm::Operands MpiComm::reduction_operands(const Buffer& send, const Buffer& recv,
                                              const ReduceOp& reduce_op, const Plan& plan,
                                              bool writes_recv, Started& started) {
  if (!plan.widen) {
    if (plan.divide_after && writes_recv) {
      started.after.emplace_back([data = recv.data, dtype = recv.dtype, n = recv.count,
                                  size = size()] { divide_in_place(data, dtype, n, size); });
    }
    return {plan.scale_input ? scaled_input(send, reduce_op, started) : send.data, recv.data,
            send.dtype};
  }
  std::shared_ptr<void> floats = scratch((send.count + recv.count) * sizeof(float));
  auto* input = static_cast<float*>(floats.get());
  started.keep_alive.push_back(std::move(floats));
  float* output = input + send.count;
  kernels::convert(input, DType::Float32, send.data, send.dtype, send.count);
  if (plan.scale_input) {
    const auto factor = static_cast<float>(reduce_op.premul_factor());
    for (std::size_t i = 0; i < send.count; ++i) {
      input[i] = factor * input[i];
    }
  }
  if (writes_recv) {
    started.after.emplace_back([output, data = recv.data, dtype = recv.dtype, n = recv.count,
                                divisor = plan.divide_after ? size() : 0] {
      if (divisor != 0) {
        const auto by = static_cast<float>(divisor);
        for (std::size_t i = 0; i < n; ++i) {
          output[i] = output[i] / by;
        }
      }
      kernels::convert(data, dtype, output, DType::Float32, n);  // rounds once, to nearest even
    });
  }
  return {input, output, DType::Float32};
}

bool MpiComm::use_chorus_schedule(std::size_t nbytes) const noexcept {
  // Auto: the same answer on every rank, since the group's members issued the same byte count.
  return chorus_schedule_allowed_ &&
         (schedule_ == MpiSchedule::Chorus ||
          (kChorusScheduleMinBytes <= nbytes && nbytes <= kChorusScheduleMaxBytes));
}

std::vector<MpiComm::Message>& MpiComm::fresh_messages() {
  message_scratch_.clear();
  return message_scratch_;
}

int MpiComm::take_p2p_tag() {
  const int tag = next_p2p_tag_;
  next_p2p_tag_ = (next_p2p_tag_ + 1) % kP2pTags;
  return tag;
}

void MpiComm::post_exchange(Started& started, const std::vector<Message>& messages,
                            MPI_Datatype datatype, const OpInfo& info) {
  // Note [Issue without allocation]: room for every request, its status and its peer before the
  // tag is taken and the first message posted, so the loop allocates nothing.
  const std::size_t requests = started.requests.size() + 2 * messages.size();
  reserve_at_least(started.requests, requests);
  reserve_at_least(started.statuses, requests);
  reserve_at_least(started.receives, started.receives.size() + messages.size());
  reserve_at_least(started.sends, started.sends.size() + messages.size());
  const int tag = take_p2p_tag();
  const std::lock_guard mpi_lock(process_->mutex());
  for (const Message& message : messages) {
    MPI_Request receive = MPI_REQUEST_NULL;
    check(MPI_Irecv(message.receive, message.receive_count, datatype, message.peer, tag, comm_,
                    &receive),
          "MPI_Irecv", info);
    // Note [Direct exchanges], "Short messages".
    const int world_peer = ranks_[static_cast<std::size_t>(message.peer)];
    started.receives.push_back(
        {started.requests.size(), datatype, message.receive_count, world_peer});
    started.requests.push_back(receive);
    MPI_Request send = MPI_REQUEST_NULL;
    check(MPI_Isend(message.send, message.send_count, datatype, message.peer, tag, comm_, &send),
          "MPI_Isend", info);
    started.sends.push_back({started.requests.size(), world_peer});
    started.requests.push_back(send);
  }
}

void MpiComm::post_reduction_exchange(Started& started, const void* input, std::size_t input_stride,
                                      const Buffer& recv, const ReduceOp& reduce_op,
                                      const OpInfo& info, const OpSignature* signed_as) {
  const std::size_t block = recv.nbytes();
  const int count = static_cast<int>(recv.count);  // to_int_count'ed by the caller
  const int n = size();
  const int me = group_rank_;
  // Signed (Note [Direct exchanges], "Signed messages"): each message is its block followed by
  // the sender's signature, sent as bytes from a packed copy; a slot keeps the next block
  // aligned for any element type.
  constexpr std::size_t kSlotAlignment = 64;
  const std::size_t message_bytes = signed_as != nullptr ? block + sizeof(MessageSignature) : block;
  const std::size_t slot =
      signed_as != nullptr ? (message_bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment
                           : block;
  // One scratch block: the n - 1 received slots, then (signed) the packed messages.
  const std::size_t messages_packed =
      signed_as == nullptr ? 0 : (input_stride == 0 ? 1 : static_cast<std::size_t>(n));
  std::shared_ptr<void> scratch_block =
      scratch((static_cast<std::size_t>(n - 1) + messages_packed) * slot);
  char* const received = static_cast<char*>(scratch_block.get());
  started.keep_alive.push_back(std::move(scratch_block));
  // Peer p's block of this rank's result lands in slot p (p < me) or p - 1 (p > me).
  const auto block_of = [=](int peer) {
    return received + static_cast<std::size_t>(peer < me ? peer : peer - 1) * slot;
  };
  const auto own_block_for = [=](int peer) {
    return static_cast<const char*>(input) + static_cast<std::size_t>(peer) * input_stride;
  };
  const char* packed = nullptr;  // signed: peer p's message at packed + p * slot (p * 0: one)
  if (signed_as != nullptr) {
    char* copy = received + static_cast<std::size_t>(n - 1) * slot;
    const MessageSignature wire{WireOp::of(*signed_as), process_->rank()};
    for (std::size_t p = 0; p < messages_packed; ++p) {
      if (messages_packed == 1 || p != static_cast<std::size_t>(me)) {
        char* message = copy + p * slot;
        if (block > 0) {
          std::memcpy(message, own_block_for(static_cast<int>(p)), block);
        }
        std::memcpy(message + block, &wire, sizeof(wire));
      }
    }
    packed = copy;
  }
  std::vector<Message>& messages = fresh_messages();
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me) {
      continue;
    }
    if (signed_as != nullptr) {
      const int bytes = static_cast<int>(message_bytes);
      messages.push_back({peer,
                          packed + (input_stride == 0 ? 0 : static_cast<std::size_t>(peer) * slot),
                          bytes, block_of(peer), bytes});
    } else {
      messages.push_back({peer, own_block_for(peer), count, block_of(peer), count});
    }
  }
  // Added before the posting (Note [Issue without allocation]); runs after every request
  // completed, sends included: an in-place all_reduce's input is its output, overwritten only
  // once no send reads it any more. avg and premul_sum are the kernels' own, so the result is
  // the simulator's fixed-order one, bit for bit.
  const bool check_signatures = signed_as != nullptr;
  started.after.emplace_back([=, mine = check_signatures ? *signed_as : OpSignature{},
                              context = work_context(info), data = recv.data, elements = recv.count,
                              dtype = recv.dtype] {
    if (check_signatures) {
      // A peer that issued another operation fails the work here (and on the peer, which
      // compares this rank's signature), before the fold would use its block.
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) {
          continue;
        }
        MessageSignature wire;
        std::memcpy(&wire, block_of(peer) + block, sizeof(wire));
        const OpSignature theirs = wire.op.signature();
        if (!theirs.agrees_with(mine)) {
          throw CollectiveMismatch(
              context.error_context(),
              "ranks disagree on operation #" + std::to_string(context.seq) + ": rank " +
                  std::to_string(wire.sender) + " issued " + theirs.to_string() + ", this rank " +
                  mine.to_string() +
                  (theirs.differs_only_in_layout(mine) ? transport::kLayoutMismatchNote : "") +
                  " (found by the small direct exchange; --check-collectives compares every "
                  "operation before anything is sent)");
        }
      }
    }
    const void* local[kSmallDirectMaxRanks];
    std::vector<const void*> spilled;
    const void** sources = local;
    if (n > kSmallDirectMaxRanks) {
      spilled.resize(static_cast<std::size_t>(n));
      sources = spilled.data();
    }
    for (int peer = 0; peer < n; ++peer) {
      sources[peer] = peer == me ? static_cast<const void*>(own_block_for(peer)) : block_of(peer);
    }
    kernels::reduce(data, sources, static_cast<std::size_t>(n), elements, dtype, reduce_op);
  });
  post_exchange(started, messages,
                signed_as != nullptr ? MPI_BYTE : mpi_datatype(movement_element(recv.dtype)), info);
}

template <class Start>
std::shared_ptr<transport::Work> MpiComm::launch(OpSignature&& op_signature, const OpInfo& info,
                                                 Start&& start,
                                                 const std::vector<std::size_t>* send_counts,
                                                 const std::vector<std::size_t>* recv_counts) {
  if (batching_) {
    // NCCL group semantics: the batch starts at end_group, after its check.
    CHORUS_CHECK(send_counts == nullptr);
    batch_signatures_.push_back(std::move(op_signature));
    batch_starts_.emplace_back(std::forward<Start>(start));
    return nullptr;
  }
  // Note [Issue without allocation]: the work and the Started first, before the collective
  // check's exchanges too, then start, which posts only once it allocated what it needs; the
  // work takes the Started without allocating.
  std::shared_ptr<MpiWork> work = make_work(info);
  std::unique_ptr<Started> started = process_->take_started();
  try {
    started->signatures.push_back(std::move(op_signature));
    if (check_collectives_) {
      verify(started->signatures, info, send_counts, recv_counts);
    }
    start(*started);
  } catch (...) {
    // What start posted keeps its buffers until the end (parked); if it posted nothing (a
    // std::bad_alloc, a refusal before the first MPI call), the Started is recycled.
    process_->retire(std::move(started));
    throw;
  }
  work->adopt(std::move(started));
  return work;
}

std::shared_ptr<MpiWork> MpiComm::make_work(const OpInfo& info) {
  return std::allocate_shared<MpiWork>(transport::RecyclingAllocator<MpiWork>{}, process_,
                                       transport::Fingerprint{id_, info.seq, {}},
                                       work_context(info));  // Note [Recycled blocks]
}

std::shared_ptr<transport::Work> MpiComm::all_reduce(const Buffer& send, const Buffer& recv,
                                                     const ReduceOp& reduce_op,
                                                     const OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(send.dtype == recv.dtype);
  const int count = to_int_count(send.count, info);
  OpSignature op_signature = OpSignature::of(OpKind::AllReduce, send, recv, reduce_op, -1);
  auto start = [=, this, send = send, recv = recv](Started& started) mutable {
    keep(started, std::move(send.keep_alive), std::move(recv.keep_alive));
    if (use_small_direct_exchange(send.nbytes())) {
      // Note [Direct exchanges], "Small operations": the whole input to every peer.
      post_reduction_exchange(started, send.data, 0, recv, reduce_op, info, &op_signature);
      return;
    }
    Plan plan;
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Datatype datatype = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    reduction(send, reduce_op, plan, datatype, op);
    const Operands operands =
        reduction_operands(send, recv, reduce_op, plan, /*writes_recv=*/true, started);
    const void* input = operands.input;
    if (use_chorus_schedule(send.nbytes()) && RingAllReduce::keeps_order(send.dtype, reduce_op) &&
        RingAllReduce::fits(send.count, operands.dtype, size())) {
      // Note [Issue without allocation]: room in the process's ring list, the ring and its
      // place in `started` first; the tag is taken once nothing before the posting can throw.
      process_->reserve_ring();
      const int tag = next_p2p_tag_;
      auto ring = std::make_shared<RingAllReduce>(input, operands.output, send.count,
                                                  operands.dtype, step_op(plan, reduce_op), comm_,
                                                  group_rank_, size(), tag);
      started.rings.push_back(ring);  // kept (parked) with its buffers even if start fails
      CHORUS_CHECK_EQ(take_p2p_tag(), tag);
      ring->start();
      if (ring->failed()) {
        throw TransportError(context_of(info), ring->failure());
      }
      process_->add_ring(std::move(ring));
    } else {
      MPI_Request* request = request_slot(started);
      check(MPI_Iallreduce(input == operands.output ? MPI_IN_PLACE : input, operands.output, count,
                           datatype, op, comm_, request),
            "MPI_Iallreduce", info);
    }
  };
  return launch(std::move(op_signature), info, std::move(start));
}

std::shared_ptr<transport::Work> MpiComm::all_gather(const Buffer& send, const Buffer& recv,
                                                     const OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(recv.count, send.count * ranks_.size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  const int count = to_int_count(send.count, info);
  to_int_count(recv.count, info);
  OpSignature op_signature =
      OpSignature::of(OpKind::AllGather, send, recv, ReduceOp::Kind::Sum, -1);
  auto start = [=, this, send = send, recv = recv](Started& started) mutable {
    keep(started, std::move(send.keep_alive), std::move(recv.keep_alive));
    const MPI_Datatype datatype = mpi_datatype(movement_element(send.dtype));
    // In place when send is this rank's own block of recv.
    const bool in_place = send.data == static_cast<const char*>(recv.data) +
                                           static_cast<std::size_t>(group_rank_) * send.nbytes();
    if (use_direct_exchange(recv.nbytes())) {
      // Note [Direct exchanges]: this rank's block to every peer, every peer's into its place,
      // and its own block by copy once the messages are posted ("Own block last").
      std::vector<Message>& messages = fresh_messages();
      for (int peer = 0; peer < size(); ++peer) {
        if (peer != group_rank_) {
          messages.push_back(
              {peer, send.data, count,
               static_cast<char*>(recv.data) + static_cast<std::size_t>(peer) * send.nbytes(),
               count});
        }
      }
      post_exchange(started, messages, datatype, info);
      if (!in_place && send.nbytes() > 0) {
        std::memcpy(
            static_cast<char*>(recv.data) + static_cast<std::size_t>(group_rank_) * send.nbytes(),
            send.data, send.nbytes());
      }
      return;
    }
    MPI_Request* request = request_slot(started);
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send.data, count, datatype, recv.data, count,
                         datatype, comm_, request),
          "MPI_Iallgather", info);
  };
  return launch(std::move(op_signature), info, std::move(start));
}

std::shared_ptr<transport::Work> MpiComm::reduce_scatter(const Buffer& send, const Buffer& recv,
                                                         const ReduceOp& reduce_op,
                                                         const OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count * ranks_.size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  const int count = to_int_count(recv.count, info);
  to_int_count(send.count, info);
  OpSignature op_signature = OpSignature::of(OpKind::ReduceScatter, send, recv, reduce_op, -1);
  auto start = [=, this, send = send, recv = recv](Started& started) mutable {
    keep(started, std::move(send.keep_alive), std::move(recv.keep_alive));
    if (use_direct_exchange(send.nbytes())) {
      // Note [Direct exchanges]: block p of the input to rank p.
      post_reduction_exchange(started, send.data, recv.nbytes(), recv, reduce_op, info,
                              use_small_direct_exchange(send.nbytes()) ? &op_signature : nullptr);
      return;
    }
    Plan plan;
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Datatype datatype = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    reduction(send, reduce_op, plan, datatype, op);
    const Operands operands = reduction_operands(send, recv, reduce_op, plan,
                                                 /*writes_recv=*/true, started);
    MPI_Request* request = request_slot(started);
    check(MPI_Ireduce_scatter_block(operands.input, operands.output, count, datatype, op, comm_,
                                    request),
          "MPI_Ireduce_scatter_block", info);
  };
  return launch(std::move(op_signature), info, std::move(start));
}

std::shared_ptr<transport::Work> MpiComm::all_to_all(const Buffer& send,
                                                     const std::vector<std::size_t>& send_counts,
                                                     const Buffer& recv,
                                                     const std::vector<std::size_t>& recv_counts,
                                                     const OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send_counts.size(), ranks_.size());
  CHORUS_CHECK_EQ(recv_counts.size(), ranks_.size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  // Note [MPI int counts]: each per-peer count is an MPI int; the totals and offsets are not.
  // In the communicator's split scratch: all_to_all never joins a batch (launch starts it at
  // once), and one thread issues a communicator's operations, one at a time. The scratch
  // allocates only on the group's first all_to_all, before anything is posted (MPI's own
  // alltoallw path below still allocates its layout block per operation).
  const std::size_t n = ranks_.size();
  std::vector<int>& counts = split_counts_;
  std::vector<std::size_t>& offsets = split_offsets_;
  counts.resize(2 * n);
  offsets.resize(2 * n);
  std::size_t send_offset = 0;
  std::size_t recv_offset = 0;
  for (std::size_t peer = 0; peer < n; ++peer) {
    counts[peer] = to_int_count(send_counts[peer], info);
    offsets[peer] = send_offset;
    counts[n + peer] = to_int_count(recv_counts[peer], info);
    offsets[n + peer] = recv_offset;
    send_offset += send_counts[peer];
    recv_offset += recv_counts[peer];
  }
  CHORUS_CHECK_EQ(send_offset, send.count);
  CHORUS_CHECK_EQ(recv_offset, recv.count);
  if (std::string problem = transport::self_split_problem(send_counts, recv_counts, group_rank_);
      !check_collectives_ && !problem.empty()) {
    // Checked before anything is posted, on either schedule. Only this rank knows: its peers
    // wait for its messages until their deadline (or until this rank's failure ends the job).
    // With --check-collectives verify's pairwise comparison, which includes this rank with
    // itself, reports it on every member instead.
    throw InvalidArgument(context_of(info), problem);
  }
  OpSignature op_signature = OpSignature::of(OpKind::AllToAll, send, recv, ReduceOp::Kind::Sum, -1);
  return launch(
      std::move(op_signature), info,
      // By reference: launch runs it before it returns (all_to_all is never batched), so
      // the Buffers' keep_alive is copied once, into `started`, and not into the callable too.
      [&, this](Started& started) {
        keep(started, send.keep_alive, recv.keep_alive);
        const void* input = send.data;
        if (send.data == recv.data && send.count > 0) {
          // MPI's in-place alltoallv has other semantics: exchange from a copy.
          std::shared_ptr<void> copy = scratch(send.nbytes());
          std::memcpy(copy.get(), send.data, send.nbytes());
          input = copy.get();
          started.keep_alive.push_back(std::move(copy));
        }
        const MPI_Datatype datatype = mpi_datatype(movement_element(send.dtype));
        const std::size_t element = element_size(send.dtype);
        // Not by size: ranks' totals differ in an uneven all_to_all, and every rank must choose
        // the same schedule.
        if (chorus_schedule_allowed()) {
          // Note [Direct exchanges]: each peer's slice straight to it; this rank's own by copy,
          // once the messages are posted ("Own block last").
          const auto me = static_cast<std::size_t>(group_rank_);
          std::vector<Message>& messages = fresh_messages();
          for (std::size_t peer = 0; peer < n; ++peer) {
            if (peer != me) {
              messages.push_back(
                  {static_cast<int>(peer),
                   static_cast<const char*>(input) + offsets[peer] * element, counts[peer],
                   static_cast<char*>(recv.data) + offsets[n + peer] * element, counts[n + peer]});
            }
          }
          post_exchange(started, messages, datatype, info);
          if (counts[me] > 0) {
            std::memcpy(static_cast<char*>(recv.data) + offsets[n + me] * element,
                        static_cast<const char*>(input) + offsets[me] * element,
                        static_cast<std::size_t>(counts[me]) * element);
          }
          return;
        }
        auto layout = std::make_shared<AllToAllLayout>();
        keep(started, layout);  // MPI_Ialltoallw's arrays: read until the operation completes
        MPI_Request* request = request_slot(started);
        {
          const std::lock_guard mpi_lock(process_->mutex());
          // Note [MPI int counts]: MPI_Ialltoallw's displacements are int bytes; a peer whose
          // offset does not fit gets a datatype that carries it (an MPI_Aint), sent once.
          std::vector<MPI_Datatype> placed;
          placed.reserve(2 * n);  // no std::bad_alloc between creating a type and keeping it
          const auto free_placed = [&placed] {
            for (MPI_Datatype& type : placed) {
              // Pending operations that use a freed datatype complete normally (MPI 3.1, 4.1.9).
              MPI_Type_free(&type);
            }
          };
          layout->wire_counts.resize(2 * n);
          layout->displacements.resize(2 * n);
          layout->types.resize(2 * n);
          for (std::size_t i = 0; i < 2 * n; ++i) {
            const std::size_t bytes = offsets[i] * element;
            if (counts[i] == 0 || bytes <= static_cast<std::size_t>(process_->int_count_max())) {
              layout->wire_counts[i] = counts[i];
              layout->displacements[i] = counts[i] == 0 ? 0 : static_cast<int>(bytes);
              layout->types[i] = datatype;
              continue;
            }
            MPI_Datatype type = MPI_DATATYPE_NULL;
            const auto at = static_cast<MPI_Aint>(bytes);
            const char* call = "MPI_Type_create_hindexed";
            int code = MPI_Type_create_hindexed(1, &counts[i], &at, datatype, &type);
            if (code == MPI_SUCCESS) {
              placed.push_back(type);
              call = "MPI_Type_commit";
              code = MPI_Type_commit(&placed.back());
            }
            if (code != MPI_SUCCESS) {
              free_placed();
              check(code, call, info);
            }
            layout->wire_counts[i] = 1;
            layout->displacements[i] = 0;
            layout->types[i] = placed.back();
          }
          const int code = MPI_Ialltoallw(
              input, layout->wire_counts.data(), layout->displacements.data(), layout->types.data(),
              recv.data, layout->wire_counts.data() + n, layout->displacements.data() + n,
              layout->types.data() + n, comm_, request);
          free_placed();
          check(code, "MPI_Ialltoallw", info);
        }
      },
      &send_counts, &recv_counts);
}

std::shared_ptr<transport::Work> MpiComm::broadcast(const Buffer& send, const Buffer& recv,
                                                    int root, const OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(root >= 0 && root < size());
  const int count = to_int_count(recv.count, info);
  OpSignature op_signature =
      OpSignature::of(OpKind::Broadcast, send, recv, ReduceOp::Kind::Sum, root);
  auto start = [=, this, send = send, recv = recv](Started& started) mutable {
    keep(started, std::move(send.keep_alive), std::move(recv.keep_alive));
    if (group_rank_ == root && send.data != recv.data && recv.count > 0) {
      std::memcpy(recv.data, send.data, recv.nbytes());
    }
    const MPI_Datatype datatype = mpi_datatype(movement_element(recv.dtype));
    MPI_Request* request = request_slot(started);
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Ibcast(recv.data, count, datatype, root, comm_, request), "MPI_Ibcast", info);
  };
  return launch(std::move(op_signature), info, std::move(start));
}

std::shared_ptr<transport::Work> MpiComm::reduce(const Buffer& send, const Buffer& recv,
                                                 const ReduceOp& reduce_op, int root,
                                                 const OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(root >= 0 && root < size());
  const int count = to_int_count(send.count, info);
  OpSignature op_signature = OpSignature::of(OpKind::Reduce, send, recv, reduce_op, root);
  auto start = [=, this, send = send, recv = recv](Started& started) mutable {
    keep(started, std::move(send.keep_alive), std::move(recv.keep_alive));
    const bool is_root = group_rank_ == root;
    Plan plan;
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Datatype datatype = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    reduction(send, reduce_op, plan, datatype, op);
    // recv is written on root only (Comm::reduce); only root may reduce in place.
    const Operands operands = reduction_operands(send, recv, reduce_op, plan, is_root, started);
    const void* send_arg =
        is_root && operands.input == operands.output ? MPI_IN_PLACE : operands.input;
    MPI_Request* request = request_slot(started);
    check(MPI_Ireduce(send_arg, is_root ? operands.output : nullptr, count, datatype, op, root,
                      comm_, request),
          "MPI_Ireduce", info);
  };
  return launch(std::move(op_signature), info, std::move(start));
}

namespace {

// Note [Collective check]
// With --check-collectives every operation starts only after its group's members exchanged a
// fixed-size description of it (MPI_Iallgather on the communicator's private twin) and found
// them equal, so ranks that issue different collectives get CollectiveMismatch on every rank,
// naming both sides, instead of MPI's truncation error or a hang. all_to_all descriptions leave
// out the counts (uneven splits legitimately differ); a second exchange checks them pairwise
// (rank i's send count for j is rank j's receive count for i) and a third agrees on the verdict,
// so every rank fails together. It costs one to three small collectives per operation: a
// debugging mode, off by default (as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL). Issuing blocks
// until the members described theirs, so under the check ranks must issue the operations of
// different groups in the same order; a program that interleaves two groups differently per rank
// (legal on MPI, whose nonblocking collectives on different communicators may start in any
// order) times out under the check. The rounds share one deadline, the timeout from the check's
// start: a check is one wait, however many rounds it takes (until 2026-12-06 each round had a
// timeout of its own, so an all_to_all whose third member left after the first round reported
// its Timeout up to three timeouts after it was issued: mpi.job.check_deadline).
struct WireSignature {
  std::int64_t seq = -1;
  std::uint64_t digest = 0;  // FNV-1a over the name and every WireOp (all_to_all: no counts)
  WireOp first;              // the first op, for the message
  std::uint32_t ops = 0;
  char name[44] = {};  // NUL-terminated, cut to fit
};
static_assert(std::is_trivially_copyable_v<WireSignature>);
static_assert(sizeof(WireSignature) == 104);

WireSignature wire_of(const std::vector<OpSignature>& signatures, const OpInfo& info) {
  CHORUS_CHECK(!signatures.empty());
  WireSignature wire;
  wire.seq = info.seq;
  wire.ops = static_cast<std::uint32_t>(signatures.size());
  wire.first = WireOp::of(signatures.front());
  const std::size_t length = std::min(info.name.size(), sizeof(wire.name) - 1);
  std::memcpy(wire.name, info.name.data(), length);
  transport::Fnv1a digest;
  const auto mix = [&digest](std::uint64_t value) { digest.integer(value); };
  for (const char c : info.name) {
    mix(static_cast<unsigned char>(c));
  }
  for (const OpSignature& op : signatures) {
    // Every field of the op's one wire encoding, but an all_to_all's counts.
    const WireOp encoded = WireOp::of(op);
    mix(encoded.kind);
    mix(encoded.dtype);
    mix(encoded.lowered_from);
    mix(encoded.layout);  // all_to_all's too: it leaves out dim 0 (Note [Layout digest])
    if (op.kind != OpKind::AllToAll) {
      mix(encoded.send_count);
      mix(encoded.recv_count);
    }
    mix(encoded.reduce_kind);
    mix(encoded.factor_bits);
    mix(static_cast<std::uint32_t>(encoded.root));
  }
  wire.digest = digest.value();
  return wire;
}

bool same_operation(const WireSignature& a, const WireSignature& b) {
  return a.seq == b.seq && a.digest == b.digest && a.ops == b.ops;
}

// Whether two descriptions that are not the same operation read alike because their single ops
// differ only in layout digests (a batch's digest may differ in an op the message leaves out).
bool layout_only(const WireSignature& a, const WireSignature& b) {
  return a.seq == b.seq && a.ops == 1 && b.ops == 1 &&
         std::string_view(a.name) == std::string_view(b.name) &&
         a.first.signature().differs_only_in_layout(b.first.signature());
}

// "all_reduce(Float32, send=4, recv=4, sum)", "all_reduce_coalesced [2 ops, the first
// all_reduce(...)]".
std::string describe(const WireSignature& wire) {
  const std::string name(wire.name);
  const std::string text = wire.first.signature().to_string();
  if (wire.ops == 1 && text.rfind(name + "(", 0) == 0) {
    return text;
  }
  return name + (wire.ops == 1 ? " " + text
                               : " [" + std::to_string(wire.ops) + " ops, the first " + text + "]");
}

}  // namespace

void MpiComm::await_requests(std::unique_ptr<Started>& pending, const OpInfo& info,
                             const char* what, transport::Deadline deadline) {
  std::string failure;
  try {
    for (;;) {
      int done = 0;
      {
        const std::lock_guard mpi_lock(process_->mutex());
        process_->progress_rings();  // a peer may be waiting on one (Note [Ring all_reduce])
        pending->statuses.resize(pending->requests.size());
        if (const int code = MPI_Testall(static_cast<int>(pending->requests.size()),
                                         pending->requests.data(), &done, pending->statuses.data());
            code != MPI_SUCCESS) {
          // A collective's request: no peer to name (its status's MPI_SOURCE is undefined).
          failure = mpi_requests_failure("MPI_Testall (collective check)", code, pending->statuses);
        }
      }
      if (!failure.empty()) {
        // The requests' state is unknown: their buffers stay with the process.
        throw TransportError(context_of(info), failure);
      }
      if (done != 0) {
        return;
      }
      if (since_epoch(*process_) >= deadline.at) {
        // Which member is missing is unknown: a collective request (MPI_Iallgather,
        // MPI_Ialltoall) completes for all members at once or not at all, and its receive
        // buffer may not be read before. Nor is "has not issued it" always so: a member that
        // left after an earlier round (its own deadline passed) issued it (mpi.job.check_deadline).
        throw Timeout(context_of(info),
                      std::string("not started: waited for ") + what +
                          " (--check-collectives) past the deadline; a member of the group has "
                          "not joined this round (it has not issued the operation, gave up on it "
                          "at an earlier round, or is stuck; a collective request does not say "
                          "which member)");
      }
      std::this_thread::yield();
    }
  } catch (...) {
    // A failure, the deadline, or a std::bad_alloc (the statuses, the error's text): what is
    // still in flight stays with the process (park; Note [Issue without allocation]).
    process_->retire(std::move(pending));
    throw;
  }
}

void MpiComm::verify(const std::vector<OpSignature>& signatures, const OpInfo& info,
                     const std::vector<std::size_t>* send_counts,
                     const std::vector<std::size_t>* recv_counts) {
  const std::size_t n = ranks_.size();
  const auto me = static_cast<std::size_t>(group_rank_);
  const bool splits = send_counts != nullptr;  // an all_to_all: two more rounds
  // Every round's (Note [Collective check]). Saturating: an infinite timeout
  // (nanoseconds::max()) is never reached, not an overflow.
  const transport::Deadline deadline = transport::Deadline::after(since_epoch(*process_), timeout_);
  CHORUS_CHECK_EQ(splits, recv_counts != nullptr);
  // Everything every round needs is allocated before the first posting (Note [Issue without
  // allocation]): a std::bad_alloc between two rounds would leave this rank's retry posting the
  // first round's MPI_Iallgather on check_comm_ where its peers post the second's
  // MPI_Ialltoall, an erroneous program. One Started (recycled) and one request serve them all.
  // Owned by `pending` once kept there; used through the plain pointers below (keep moves the
  // owners in rather than copying three shared_ptrs).
  auto wires_owner = std::make_shared<std::vector<WireSignature>>(n + 1);  // [members..., mine]
  std::vector<WireSignature>* const wires = wires_owner.get();
  (*wires)[n] = wire_of(signatures, info);
  std::shared_ptr<std::vector<std::uint64_t>> counts_owner;  // [mine to j, j's to me]
  std::shared_ptr<std::vector<std::int32_t>> verdicts_owner;
  if (splits) {
    counts_owner = std::make_shared<std::vector<std::uint64_t>>(2 * n);
    for (std::size_t j = 0; j < n; ++j) {
      (*counts_owner)[j] = (*send_counts)[j];
    }
    verdicts_owner = std::make_shared<std::vector<std::int32_t>>(n + 1, 0);
  }
  std::vector<std::uint64_t>* const counts = counts_owner.get();
  std::vector<std::int32_t>* const verdicts = verdicts_owner.get();
  std::unique_ptr<Started> pending = process_->take_started();
  // However verify ends: recycled when nothing is in flight (a std::bad_alloc before the first
  // posting, a mismatch found), else parked (a failed posting; await_requests retires it itself
  // when a round fails or times out).
  const OnUnwind retire_on_unwind([&]() noexcept { process_->retire(std::move(pending)); });
  keep(*pending, std::move(wires_owner), std::move(counts_owner), std::move(verdicts_owner));
  MPI_Request* request = request_slot(*pending);  // every round's, with its status
  {
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Iallgather(&(*wires)[n], sizeof(WireSignature), MPI_BYTE, wires->data(),
                         sizeof(WireSignature), MPI_BYTE, check_comm_, request),
          "MPI_Iallgather (collective check)", info);
  }
  await_requests(pending, info, "every member's description of this operation", deadline);
  for (std::size_t i = 0; i < n; ++i) {
    if (i != me && !same_operation((*wires)[i], (*wires)[n])) {
      throw CollectiveMismatch(
          context_of(info),
          "ranks disagree on operation #" + std::to_string(info.seq) + " of group " + label_.str() +
              ": rank " + std::to_string(ranks_[i]) + " issued " + describe((*wires)[i]) +
              (((*wires)[i].seq != info.seq)
                   ? " as its operation #" + std::to_string((*wires)[i].seq)
                   : "") +
              "; rank " + std::to_string(process_->rank()) + " issued " + describe((*wires)[n]) +
              (layout_only((*wires)[i], (*wires)[n]) ? transport::kLayoutMismatchNote : ""));
    }
  }
  if (!splits) {
    process_->retire(std::move(pending));
    return;
  }
  // Pairwise: what each member sends me must be what I expect from it.
  {
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Ialltoall(counts->data(), 1, MPI_UINT64_T, counts->data() + n, 1, MPI_UINT64_T,
                        check_comm_, request),
          "MPI_Ialltoall (collective check)", info);
  }
  await_requests(pending, info, "every member's all_to_all split sizes", deadline);
  // The first member whose count disagrees, or n; described only after the last round, which
  // allocates nothing before it is posted.
  std::size_t disagreeing = 0;
  while (disagreeing < n && (*counts)[n + disagreeing] == (*recv_counts)[disagreeing]) {
    ++disagreeing;
  }
  (*verdicts)[n] = disagreeing == n ? 0 : 1;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Iallgather(&(*verdicts)[n], 1, MPI_INT32_T, verdicts->data(), 1, MPI_INT32_T,
                         check_comm_, request),
          "MPI_Iallgather (collective check)", info);
  }
  await_requests(pending, info, "every member's verdict on the split sizes", deadline);
  std::string problem;
  if (disagreeing != n) {
    problem = "rank " + std::to_string(ranks_[disagreeing]) + " sends " +
              std::to_string((*counts)[n + disagreeing]) + " elements to rank " +
              std::to_string(process_->rank()) + ", which expects " +
              std::to_string((*recv_counts)[disagreeing]);
  }
  for (std::size_t j = 0; j < n && problem.empty(); ++j) {
    if ((*verdicts)[j] != 0) {
      problem =
          "rank " + std::to_string(ranks_[j]) +
          " expects other split sizes than its peers (or itself) send it; its own error names "
          "the pair";
    }
  }
  if (!problem.empty()) {
    throw CollectiveMismatch(context_of(info), "ranks disagree on the split sizes of operation #" +
                                                   std::to_string(info.seq) + " of group " +
                                                   label_.str() + ": " + problem);
  }
  process_->retire(std::move(pending));
}

std::optional<MpiComm::BatchAbandon> MpiComm::batch_abandon() noexcept {
  if (!batching_) {
    return std::nullopt;  // nothing to drop: abandon_batch would do nothing
  }
  return std::optional<BatchAbandon>(std::in_place, *this);
}

void MpiComm::abandon_batch() noexcept {
  // core will not call end_group: nothing of the batch started yet.
  batching_ = false;
  batch_signatures_.clear();
  batch_starts_.clear();
}

void MpiComm::begin_group() {
  CHORUS_CHECK(!batching_);
  CHORUS_CHECK(batch_starts_.empty());
  batching_ = true;
}

std::shared_ptr<transport::Work> MpiComm::end_group(const OpInfo& info) {
  CHORUS_CHECK(batching_);
  batching_ = false;
  std::vector<OpSignature> signatures = std::move(batch_signatures_);
  std::vector<std::function<void(Started&)>> starts = std::move(batch_starts_);
  batch_signatures_.clear();
  batch_starts_.clear();
  // Note [Issue without allocation]: as launch. A later operation's start still allocates after
  // the batch's earlier ones posted; a refusal there parks what they posted.
  std::shared_ptr<MpiWork> work = make_work(info);
  std::unique_ptr<Started> started = process_->take_started();
  started->signatures = std::move(signatures);
  try {
    if (check_collectives_) {
      verify(started->signatures, info, nullptr, nullptr);
    }
    for (const std::function<void(Started&)>& start : starts) {
      start(*started);
    }
  } catch (...) {
    process_->retire(std::move(started));  // parked if anything was posted, as in launch
    throw;
  }
  work->adopt(std::move(started));
  return work;
}

// ---------------------------------------------------------------------------------------------
// MpiTransport

MpiTransport::MpiTransport(std::shared_ptr<MpiProcess> process, std::chrono::nanoseconds timeout,
                           bool check_collectives, MpiSchedule schedule)
    : process_(std::move(process)),
      timeout_(timeout),
      check_collectives_(check_collectives),
      schedule_(agree_on_schedule(schedule)),
      setups_sent_(static_cast<std::size_t>(process_->world_size()), 0),
      setups_received_(static_cast<std::size_t>(process_->world_size()), 0),
      pairings_(static_cast<std::size_t>(process_->world_size()), 0),
      last_paired_(static_cast<std::size_t>(process_->world_size()), 0),
      abandoned_(static_cast<std::size_t>(process_->world_size()), 0),
      abandoned_group_(static_cast<std::size_t>(process_->world_size())),
      partial_(static_cast<std::size_t>(process_->world_size())),
      early_messages_(static_cast<std::size_t>(process_->world_size())) {}

MpiSchedule MpiTransport::agree_on_schedule(MpiSchedule requested) {
  // Every member of a group must run the same schedule for the same all_reduce, or the ring's
  // messages and MPI_Iallreduce wait for each other forever. What each rank requested (its own
  // environment) and whether its node has a CPU per rank can differ between processes, so the
  // ranks compare both once, here: every rank constructs its transport at the start of
  // chorus::mpi::run, together, so this collective strands no one.
  const int world_size = process_->world_size();
  std::vector<int> mine = {static_cast<int>(requested), process_->spin_waits() ? 1 : 0};
  std::vector<int> all(2 * static_cast<std::size_t>(world_size));
  {
    const std::lock_guard mpi_lock(process_->mutex());
    if (const int code =
            MPI_Allgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, process_->control());
        code != MPI_SUCCESS) {
      throw TransportError(ErrorContext{process_->rank(), "chorus::mpi::run", -1, ""},
                           "agreeing on the all_reduce schedule failed: " + mpi_error_text(code));
    }
  }
  bool every_node_spins = true;
  for (int r = 0; r < world_size; ++r) {
    const auto schedule = static_cast<MpiSchedule>(all[2 * static_cast<std::size_t>(r)]);
    if (schedule != requested) {
      throw InvalidArgument(
          ErrorContext{process_->rank(), "chorus::mpi::run", -1, ""},
          "ranks disagree on the MPI schedule: rank " + std::to_string(process_->rank()) +
              " asks for '" + std::string(schedule_name(requested)) + "', rank " +
              std::to_string(r) + " for '" + std::string(schedule_name(schedule)) +
              "' (MpiRunOptions::schedule, CHORUS_MPI_SCHEDULE)");
    }
    every_node_spins = every_node_spins && all[2 * static_cast<std::size_t>(r) + 1] == 1;
  }
  // Oversubscribed, each of the ring's 2(n-1) handoffs waits for a peer to get a CPU
  // (Note [Ring all_reduce]): Auto keeps to MPI_Iallreduce unless every node has a CPU per rank.
  if (requested == MpiSchedule::Auto && !every_node_spins) {
    return MpiSchedule::Mpi;
  }
  return requested;
}

void MpiTransport::rendezvous(const std::vector<int>& ranks, std::uint64_t id,
                              const ErrorContext& context) {
  const std::size_t n = ranks.size();
  const auto world_size = static_cast<std::size_t>(process_->world_size());
  // Members this set-up exchanges no messages with: this rank, and the peers an earlier set-up
  // of this group paired with before it ended without a communicator ("Partial set-ups").
  std::vector<char> settled(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    settled[i] = ranks[i] == process_->rank() ||
                 partial_[static_cast<std::size_t>(ranks[i])] == std::optional(id);
  }
  // "Stale messages": a set-up with a peer that still holds this rank's leftover of another
  // group would pair with it there.
  for (const int rank : ranks) {
    const auto peer = static_cast<std::size_t>(rank);
    if (rank != process_->rank() && !abandoned_group_[peer].empty() && abandoned_[peer] != id) {
      throw TransportError(
          context,
          "an earlier set-up of group " + abandoned_group_[peer] + " timed out waiting for rank " +
              std::to_string(rank) + ", and its message to rank " + std::to_string(rank) +
              " cannot be taken back (MPI cannot cancel a send): rank " + std::to_string(rank) +
              " would take it for this set-up. Retry that group's set-up first (its "
              "first operation), or end the job");
    }
  }
  // Buffers and requests live on the heap: after a Timeout the process keeps them (park).
  // Two words per message: the group's id and the sender's pairings with the receiver.
  auto ids = std::make_shared<std::vector<std::uint64_t>>(2 * n + 2 * n, 0);  // [peers..., mine]
  auto pending = std::make_unique<Started>();
  pending->keep_alive.push_back(ids);
  std::vector<MPI_Request> receives(n, MPI_REQUEST_NULL);
  std::vector<int> send_peers;  // pending->requests[i] sends to send_peers[i]
  // Room for every member's message, request and status, and the members a poll finds
  // missing, before the first posting: a members-only set-up then allocates nothing once its
  // first message is out (Note [Issue without allocation]; a busy reply still does).
  send_peers.reserve(n);
  pending->requests.reserve(n);
  pending->statuses.reserve(n);
  std::vector<int> unarrived;  // the members a poll found missing
  unarrived.reserve(n);
  // The members this set-up waits for; the others' set-up messages are answered ("Busy peers"),
  // settled members' too: they sent this set-up nothing, so a message of theirs is for another.
  std::vector<char> member(world_size, 0);
  bool skips_peers = false;  // "Partial set-ups"
  for (std::size_t i = 0; i < n; ++i) {
    const bool skipped = settled[i] != 0 && ranks[i] != process_->rank();
    member[static_cast<std::size_t>(ranks[i])] = skipped ? 0 : 1;
    skips_peers = skips_peers || skipped;
  }
  // "Busy peers": whether this set-up answered the asker's latest message.
  std::vector<char> answered(world_size, 0);
  std::vector<std::string> busy(world_size);  // what a member answered it is setting up
  // An MPI failure: the call and its text, taken under the MPI lock, thrown outside it.
  std::string failure;
  // "Stale messages": whether peer i's received message was sent for the set-up this rank last
  // paired with that peer (a retry's leftover), not for this one.
  const auto stale_message = [&](std::size_t peer, const std::uint64_t* message) {
    return message[1] < pairings_[peer] && message[0] == last_paired_[peer];
  };
  const auto stale = [&](std::size_t i) {
    return stale_message(static_cast<std::size_t>(ranks[i]), &(*ids)[2 * i]);
  };
  // Both messages of the pair with peer i are (or will be) consumed: counted on both sides.
  const auto record_pairing = [&](std::size_t i) {
    const auto peer = static_cast<std::size_t>(ranks[i]);
    ++pairings_[peer];
    last_paired_[peer] = (*ids)[2 * i];
    abandoned_group_[peer].clear();  // the peer took this rank's leftover first, if any
  };
  // Receives that matched while being cancelled (their message arrived as the deadline passed).
  std::vector<char> matched_at_cancel(n, 0);
  // "Leftovers": a receive of this set-up that never matched must not stay posted, or it would
  // take its peer's message of the next set-up. Call with the MPI lock held.
  const auto cancel_receives = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      if (receives[i] == MPI_REQUEST_NULL) {
        continue;
      }
      MPI_Status status;
      if (MPI_Cancel(&receives[i]) != MPI_SUCCESS ||
          MPI_Wait(&receives[i], &status) != MPI_SUCCESS) {
        pending->requests.push_back(receives[i]);  // state unknown: parked with its buffer
        continue;
      }
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (cancelled == 0) {
        ++setups_received_[static_cast<std::size_t>(ranks[i])];  // it matched before the cancel
        matched_at_cancel[i] = 1;
      }
    }
  };
  // Note [Issue without allocation]: what throws between the postings below without parking
  // `pending` first (a std::bad_alloc, or the mismatch found once every request completed)
  // leaves as an MPI failure does: the receives cancelled, what is in flight parked.
  const OnUnwind park_on_unwind([&]() noexcept {
    if (pending == nullptr) {
      return;  // parked already
    }
    try {
      const std::lock_guard mpi_lock(process_->mutex());
      cancel_receives();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a receive left uncancelled keeps its buffer
    }
    process_->retire(std::move(pending));
  });
  const auto fail_if_any = [&] {
    if (!failure.empty()) {
      {
        const std::lock_guard mpi_lock(process_->mutex());
        cancel_receives();
      }
      process_->park(std::move(pending));
      throw TransportError(context, failure);
    }
  };
  // Peer i's next set-up message that is not stale: an early one (taken by a busy set-up, "Busy
  // peers"), else a receive posted for it (receives[i]). Call with the MPI lock held.
  const auto take_or_receive = [&](std::size_t i) {
    const auto peer = static_cast<std::size_t>(ranks[i]);
    while (!early_messages_[peer].empty()) {
      std::copy_n(early_messages_[peer].front().begin(), 2, &(*ids)[2 * i]);
      early_messages_[peer].pop_front();
      if (!stale(i)) {
        return;  // arrived (receives[i] stays MPI_REQUEST_NULL)
      }
    }
    if (const int code = MPI_Irecv(&(*ids)[2 * i], 2, MPI_UINT64_T, ranks[i], kRendezvousTag,
                                   process_->control(), &receives[i]);
        code != MPI_SUCCESS) {
      failure = "MPI_Irecv (communicator set-up) failed: " + mpi_error_text(code);
    }
  };
  {
    const std::lock_guard mpi_lock(process_->mutex());
    for (std::size_t i = 0; i < n; ++i) {
      if (settled[i] != 0) {
        continue;
      }
      partial_[static_cast<std::size_t>(ranks[i])].reset();  // a set-up of another group
      std::uint64_t* message = &(*ids)[2 * n + 2 * i];
      message[0] = id;
      message[1] = pairings_[static_cast<std::size_t>(ranks[i])];
      send_peers.push_back(ranks[i]);
      MPI_Request* send = &pending->requests.emplace_back(MPI_REQUEST_NULL);  // before the post
      // One tag for every set-up: between two ranks, set-ups pair up in the order each starts
      // them, so a peer busy setting up another group is seen at once (its id differs).
      if (const int code = MPI_Isend(message, 2, MPI_UINT64_T, ranks[i], kRendezvousTag,
                                     process_->control(), send);
          code != MPI_SUCCESS) {
        failure = "MPI_Isend (communicator set-up) failed: " + mpi_error_text(code);
        break;
      }
      ++setups_sent_[static_cast<std::size_t>(ranks[i])];
      take_or_receive(i);
      if (!failure.empty()) {
        break;
      }
    }
  }
  fail_if_any();
  // "Busy peers": takes every set-up message of a non-member that waited here (dropping stale
  // ones, keeping the others in early_messages_ for this rank's set-up with it) and answers the
  // latest with this set-up's group, once per set-up (again if a newer one arrives; an earlier
  // set-up may have taken it). Call with the MPI lock held.
  const auto answer_askers = [&] {
    for (std::size_t source = 0; source < world_size && failure.empty(); ++source) {
      if (member[source] != 0) {
        continue;
      }
      for (;;) {
        int waiting = 0;
        MPI_Message probed = MPI_MESSAGE_NULL;
        if (const int code = MPI_Improbe(static_cast<int>(source), kRendezvousTag,
                                         process_->control(), &waiting, &probed, MPI_STATUS_IGNORE);
            code != MPI_SUCCESS) {
          failure = "MPI_Improbe (communicator set-up) failed: " + mpi_error_text(code);
          break;
        }
        if (waiting == 0) {
          break;
        }
        std::array<std::uint64_t, 2> message = {};
        if (const int code = MPI_Mrecv(message.data(), 2, MPI_UINT64_T, &probed, MPI_STATUS_IGNORE);
            code != MPI_SUCCESS) {
          failure = "MPI_Mrecv (communicator set-up) failed: " + mpi_error_text(code);
          break;
        }
        ++setups_received_[source];
        if (early_messages_[source].empty() && stale_message(source, message.data())) {
          continue;  // "Stale messages": a leftover its sender does not wait on
        }
        early_messages_[source].push_back(message);
        answered[source] = 0;
      }
      if (early_messages_[source].empty() || answered[source] != 0 || !failure.empty()) {
        continue;
      }
      answered[source] = 1;
      auto reply = std::make_shared<BusyReply>();
      reply->answers = setups_received_[source];  // the asker's latest message here
      const std::size_t length = std::min(context.group.size(), sizeof(reply->group) - 1);
      std::memcpy(reply->group, context.group.data(), length);
      // Kept, and its request made, before the post (Note [Issue without allocation]).
      const BusyReply* sent = reply.get();
      pending->keep_alive.push_back(std::move(reply));
      send_peers.push_back(static_cast<int>(source));
      MPI_Request* request = &pending->requests.emplace_back(MPI_REQUEST_NULL);
      if (const int code = MPI_Isend(sent, sizeof(BusyReply), MPI_BYTE, static_cast<int>(source),
                                     kBusyTag, process_->control(), request);
          code != MPI_SUCCESS) {
        failure = "MPI_Isend (communicator set-up) failed: " + mpi_error_text(code);
        break;
      }
    }
  };
  // Takes every busy reply that arrived; keeps those that answer this set-up's message (older
  // ones answer set-ups already over). Call with the MPI lock held.
  const auto take_replies = [&] {
    while (failure.empty()) {
      int arrived = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      if (const int code = MPI_Improbe(MPI_ANY_SOURCE, kBusyTag, process_->control(), &arrived,
                                       &message, &status);
          code != MPI_SUCCESS) {
        failure = "MPI_Improbe (communicator set-up) failed: " + mpi_error_text(code);
        break;
      }
      if (arrived == 0) {
        break;
      }
      // Received as bytes up to its own size, so a longer message is MPI_ERR_TRUNCATE here and
      // a shorter one is caught by its count: either way a TransportError, never a reply read
      // from bytes no message wrote.
      BusyReply reply{};
      MPI_Status received;
      if (const int code = MPI_Mrecv(&reply, sizeof(BusyReply), MPI_BYTE, &message, &received);
          code != MPI_SUCCESS) {
        failure = "MPI_Mrecv (communicator set-up) failed: " + mpi_error_text(code);
        break;
      }
      int bytes = 0;
      MPI_Get_count(&received, MPI_BYTE, &bytes);
      if (bytes != static_cast<int>(sizeof(BusyReply))) {
        failure = "a busy reply from rank " + std::to_string(status.MPI_SOURCE) + " had " +
                  std::to_string(bytes) + " bytes, not " + std::to_string(sizeof(BusyReply)) +
                  " (a message of another kind on chorus's control communicator)";
        break;
      }
      const auto source = static_cast<std::size_t>(status.MPI_SOURCE);
      if (member[source] != 0 && reply.answers == setups_sent_[source]) {
        reply.group[sizeof(reply.group) - 1] = '\0';
        busy[source] = reply.group;
      }
    }
  };
  // The members of `missing` whose messages still have not arrived once their receives are
  // cancelled ("Leftovers"): a message that arrived as its receive was cancelled is an arrival,
  // unless stale.
  const auto cancel_missing = [&](const std::vector<int>& missing) {
    {
      const std::lock_guard mpi_lock(process_->mutex());
      cancel_receives();
    }
    std::vector<int> still_missing;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::ranges::find(missing, ranks[i]) != missing.end() &&
          (matched_at_cancel[i] == 0 || stale(i))) {
        still_missing.push_back(ranks[i]);
      }
    }
    return still_missing;
  };
  // Ends this set-up without a communicator, `still_missing` having sent nothing: what is
  // pending is parked, and each pair is recorded as the peer will see it.
  const auto abandon = [&](const std::vector<int>& still_missing) {
    process_->park(std::move(pending));
    for (std::size_t i = 0; i < n; ++i) {
      if (settled[i] != 0) {
        continue;
      }
      const auto peer = static_cast<std::size_t>(ranks[i]);
      if (std::ranges::find(still_missing, ranks[i]) == still_missing.end()) {
        // This pair's messages are consumed on both sides (the peer takes this rank's when it
        // gets here): counted as on the peer, or the counts part ("Stale messages"); a retry
        // skips the peer ("Partial set-ups").
        record_pairing(i);
        if ((*ids)[2 * i] == id) {
          partial_[peer] = id;
        }
      } else if (abandoned_group_[peer].empty()) {
        // This rank's message stays there ("Stale messages").
        abandoned_[peer] = id;
        abandoned_group_[peer] = context.group;
      }
    }
  };
  // A skipped member that sent this rank a set-up message since (taken by answer_askers, or by
  // an earlier set-up) is setting up another group: it will not create this one ("Partial
  // set-ups"). Its world rank, or -1.
  const auto departed = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      const auto peer = static_cast<std::size_t>(ranks[i]);
      if (settled[i] != 0 && ranks[i] != process_->rank() && !early_messages_[peer].empty()) {
        return ranks[i];
      }
    }
    return -1;
  };
  // Saturating: an infinite timeout (nanoseconds::max()) is never reached, not an overflow.
  const transport::Deadline deadline = transport::Deadline::after(now(), timeout_);
  for (;;) {
    unarrived.clear();
    {
      const std::lock_guard mpi_lock(process_->mutex());
      process_->progress_rings();  // a peer may be waiting on one (Note [Ring all_reduce])
      for (std::size_t i = 0; i < n; ++i) {
        int arrived = 1;
        if (receives[i] != MPI_REQUEST_NULL) {
          if (const int code = MPI_Test(&receives[i], &arrived, MPI_STATUS_IGNORE);
              code != MPI_SUCCESS) {
            failure = "MPI_Test (communicator set-up) failed: " + mpi_error_text(code);
            break;
          }
          if (arrived != 0) {
            const auto peer = static_cast<std::size_t>(ranks[i]);
            ++setups_received_[peer];
            if (stale(i)) {
              // "Stale messages": sent for a set-up this rank has since paired; the next one.
              take_or_receive(i);
              if (!failure.empty()) {
                break;
              }
              arrived = receives[i] == MPI_REQUEST_NULL ? 1 : 0;
            }
          }
        }
        if (arrived == 0) {
          unarrived.push_back(ranks[i]);
        }
      }
      if (!unarrived.empty() || skips_peers) {
        answer_askers();  // with nothing missing, a last look for a skipped peer that moved on
      }
      if (!unarrived.empty()) {
        take_replies();
      }
    }
    fail_if_any();
    if (const int gone = departed(); gone >= 0) {
      abandon(cancel_missing(unarrived));
      partial_[static_cast<std::size_t>(gone)].reset();  // as it did on its side
      throw CollectiveMismatch(
          context,
          "rank " + std::to_string(gone) +
              " is setting up another group instead of this retry: an earlier set-up of this "
              "group exchanged its messages with rank " +
              std::to_string(gone) + " before it ended without a communicator, and rank " +
              std::to_string(gone) +
              " moved on, so it would never join this rank in creating the communicator. "
              "Retry a group whose set-up failed on every member that reached it, or on none");
    }
    if (unarrived.empty()) {
      break;
    }
    if (now() >= deadline.at) {
      const std::vector<int> still_missing = cancel_missing(unarrived);
      if (still_missing.empty()) {
        break;  // every peer's message arrived after all: the set-up completes
      }
      abandon(still_missing);
      throw Timeout(context, unreached_set_up_message(still_missing, busy, context.group));
    }
    std::this_thread::yield();
  }
  // Every peer's id arrived, so every peer posted its sends to us; ours are 16-byte eager
  // messages whose receives the peers posted with theirs, and busy replies are eager too: this
  // completes without waiting on anyone's progress but MPI's.
  {
    const std::lock_guard mpi_lock(process_->mutex());
    pending->statuses.resize(pending->requests.size());
    if (const int code = MPI_Waitall(static_cast<int>(pending->requests.size()),
                                     pending->requests.data(), pending->statuses.data());
        code != MPI_SUCCESS) {
      failure = mpi_requests_failure("MPI_Waitall (communicator set-up)", code, pending->statuses,
                                     send_peers);
    }
  }
  if (!failure.empty()) {
    // Requests MPI_Waitall did not complete are still pending: their buffers stay (park).
    process_->park(std::move(pending));
    throw TransportError(context, failure);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (settled[i] == 0) {
      record_pairing(i);  // both messages of the pair are consumed, matching or not
    }
  }
  // A member whose message named another group (settled members sent none this time).
  const auto differs = [&](std::size_t i) { return settled[i] == 0 && (*ids)[2 * i] != id; };
  std::size_t different = 0;
  while (different < n && !differs(different)) {
    ++different;
  }
  if (different == n) {
    for (const int rank : ranks) {
      partial_[static_cast<std::size_t>(rank)].reset();  // MPI_Comm_create_group comes next
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (settled[i] == 0 && !differs(i)) {
      partial_[static_cast<std::size_t>(ranks[i])] = id;  // "Partial set-ups"
    }
  }
  throw CollectiveMismatch(
      context, "rank " + std::to_string(ranks[different]) +
                   " is setting up a different group at the same time (ranks or tag "
                   "differ): ranks must first use the groups they share in the same order, "
                   "or MPI would hang creating their communicators");
}

std::shared_ptr<transport::Comm> MpiTransport::create_comm(const std::string& tag,
                                                           const std::vector<int>& ranks) {
  CHORUS_CHECK(!ranks.empty());
  const std::uint64_t id = comm_id_of(tag, ranks);
  // Everything that allocates comes before the rendezvous: once it completed, the peers go on
  // into MPI_Comm_create_group and wait there for this rank, so a std::bad_alloc after it could
  // not be retried (Note [Issue without allocation]). The communicators are handed over without
  // allocating (attach).
  auto created =
      std::make_shared<MpiComm>(process_, tag, ranks, id, timeout_, schedule_, check_collectives_);
  const ErrorContext context{process_->rank(), "communicator set-up", -1,
                             transport::group_label(tag, ranks)};
  rendezvous(ranks, id, context);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm check_comm = MPI_COMM_NULL;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    // Collective over the members only (MPI 3); all of them are here (the rendezvous). On the
    // communicator parent (Note [Communicator rendezvous], "Creation"): its errors return
    // (MPI_ERRORS_RETURN) even when the program initialised MPI and world's handler is still
    // MPI_ERRORS_ARE_FATAL, its ranks are world's, and no point-to-point message of chorus's
    // travels on it, since Open MPI agrees on the new communicator with point-to-point messages
    // on the parent under create_group's tag.
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Comm_group(process_->comm_parent(), &world_group);
    MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
    const int code =
        MPI_Comm_create_group(process_->comm_parent(), group, create_group_tag(id), &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (code != MPI_SUCCESS) {
      throw TransportError(context, "MPI_Comm_create_group failed: " + mpi_error_text(code));
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (check_collectives_) {
      // Note [Collective check]: the descriptions travel on a twin, apart from the data.
      if (const int dup = MPI_Comm_dup(comm, &check_comm); dup != MPI_SUCCESS) {
        MPI_Comm_free(&comm);
        throw TransportError(context, "MPI_Comm_dup failed: " + mpi_error_text(dup));
      }
    }
  }
  created->attach(comm, check_comm);
  return created;
}

transport::Duration MpiTransport::now() { return since_epoch(*process_); }

std::string MpiTransport::supports(OpKind /*kind*/, DType /*dtype*/, const ReduceOp& /*reduce_op*/,
                                   Device device) const {
  // Every dtype and reduction maps (Note [MPI mapping]); only host memory moves.
  if (!device.is_cpu()) {
    return "the mpi transport moves host memory only";
  }
  return {};
}

}  // namespace chorus::mpi::detail
