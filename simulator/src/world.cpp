#include "world.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <new>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bits.hpp"
#include "chorus/check.hpp"
#include "chorus/kernels.hpp"
#include "chorus/transport/group_label.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "guard_pages.hpp"
#include "sim_allocator.hpp"
#include "sim_transport.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace chorus::sim::detail {
namespace {

// The simulated rank running on this OS thread (rebound at every switch, like
// RankContext::current).
struct CurrentRank {
  const SimWorld* world = nullptr;
  int rank = -1;
};
// Note [Thread-locals in initial-exec]: the scheduler rebinds it at every rank step.
[[gnu::tls_model("initial-exec")]] thread_local CurrentRank this_thread_rank;

// Debug builds check at every decision the completable groups kept against a scan (Note
// [Completable groups]), and at every arrival the reference member kept against a scan: checks
// that compute more than a condition, so not CHORUS_DCHECKs (Note [Debug-only checks]).
constexpr bool kCheckDecisions = CHORUS_DCHECK_IS_ON;

// Note [Recycled schedule buffer]
// The decisions a run records (up to SimOptions::schedule_record_max) go into a buffer that
// outlives the run on its thread: growing a fresh vector by doubling, run after run, page faults
// on every new block (half the time of a 16k-decision run went there). A long run's report gets
// an exact-size copy; buffers above kRecycledScheduleMax decisions are not kept.
// A short run's buffer (room for up to kHandedScheduleMax decisions, within glibc's heap, not
// mmapped) goes to the report as it is instead, and the thread keeps a fresh one of the same
// room: one allocation as the copy's, without copying the decisions one by one (Decision is not
// trivial, so the copy was a loop, ~8 instructions a decision). Such a report's schedule keeps
// that room (at most ~96 KiB) even when its run made fewer decisions than an earlier one.
constexpr std::size_t kRecycledScheduleMax = std::size_t{1} << 16;
constexpr std::size_t kHandedScheduleMax = std::size_t{1} << 12;
static_assert(kHandedScheduleMax <= kRecycledScheduleMax, "the fresh buffer is kept");
static_assert(kHandedScheduleMax * sizeof(Decision) < std::size_t{128} << 10,
              "below glibc's default mmap threshold");
thread_local std::vector<Decision> recycled_schedule;

bool current_rank_of_thread_is_none() noexcept { return this_thread_rank.world == nullptr; }

// Note [Inlined hot helpers]
// GCC at -O3 left the small helpers of every decision and every operation as calls (execute,
// kth_runnable, set_phase, bind, yield, decision_code, DecisionStream::choose, current_rank,
// wait_on_rank, judge_arrival, overlaps, has_all_to_all; later take_step, run_rank,
// update_completable, head_can_complete): each call saved and restored the
// caller's registers and spilled what it held, often more than the helper's own work. They are
// [[gnu::always_inline]] (GCC and Clang), which took bench_sim's BM_Schedule4Ranks8Collectives
// from 278.9k to 270.5k instructions per schedule; they behave exactly as before. A member
// marked so is declared `inline` in world.hpp and defined here, so only this file may call it:
// one used elsewhere fails to compile ("used but never defined"); give it an out-of-line
// wrapper then, as current_rank wraps rank_on_this_thread and scheduling_point wraps yield.

// SimWorld::current_rank, inlined into this file's callers at every scheduling point (yield,
// start, a work's wait and poll): Note [Inlined hot helpers].
[[gnu::always_inline]] inline int rank_on_this_thread(const SimWorld& world) noexcept {
  return this_thread_rank.world == &world ? this_thread_rank.rank : -1;
}

// Note [Decision codes]
// ~~~~~~~~~~~~~~~~~~~~~
// The schedule hash mixes one code per decision: its kind, rank, communicator and seq, chained
// through hash_combine (decision_code). A decision's code is all the scheduler needs of it, and
// all but the last link is fixed for a run: "run rank r" is entirely (run_codes_, made once a
// run; for a rank below SimWorld::kSmallWorld copied from a table made at compile time), and
// "complete an operation of group g" only adds the seq to the group's prefix
// (SimGroup::complete_code, made with the group). So a completion costs one hash_combine for its
// code, not three; the codes, and so every schedule hash, are the same as decision_code's.
constexpr std::uint64_t decision_code_prefix(Decision::Kind kind, int rank, std::uint64_t comm_id) {
  std::uint64_t code = kind == Decision::Kind::RunRank ? 1 : 2;
  code = hash_combine(code, static_cast<std::uint64_t>(rank));
  return hash_combine(code, comm_id);
}

// Note [Inlined hot helpers].
[[gnu::always_inline]] constexpr std::uint64_t decision_code(const Decision& decision) {
  return hash_combine(decision_code_prefix(decision.kind, decision.rank, decision.comm_id),
                      static_cast<std::uint64_t>(decision.seq));
}

// Whether two operation names (OpInfo::name, string literals) are the same. Every member's call
// usually names the operation with the same literal: equal addresses and lengths answer without
// comparing characters (a library call per arrival otherwise).
[[gnu::always_inline]] inline bool same_op_name(std::string_view a, std::string_view b) noexcept {
  return (a.data() == b.data() && a.size() == b.size()) || a == b;
}

// Whether `group`'s head operation can be completed now: the lowest outstanding seq, the next to
// complete, every member arrived, no Hang fault (Note [Completable groups]). Inlined into
// update_completable, which start calls at every arrival (Note [Inlined hot helpers]).
[[gnu::always_inline]] inline bool head_can_complete(const SimGroup& group) noexcept {
  const auto head = group.slots.begin();
  return head != group.slots.end() && head->first == group.next_to_complete &&
         head->second.arrived == static_cast<int>(group.ranks.size()) && !head->second.hangs();
}

// The mark each reduction op leaves in its mode (Note [Reduction order modes]): "reduction.tree".
// Made once per order and process (every run's report marks its order).
const std::string& reduction_mark(ReductionOrder order) {
  constexpr std::size_t kOrders = static_cast<std::size_t>(ReductionOrder::Adversarial) + 1;
  static const std::array<std::string, kOrders> marks = [] {
    std::array<std::string, kOrders> made;
    for (std::size_t i = 0; i < kOrders; ++i) {
      made[i] = "reduction." + std::string(name(static_cast<ReductionOrder>(i)));
    }
    return made;
  }();
  return marks[static_cast<std::size_t>(order)];
}

// marks[key] += count, where a new mark's key is made in its node from `key` (every run's report
// adds its order's and its strategy's marks: no temporary string made, moved and destroyed).
void add_mark(std::map<std::string, std::uint64_t, std::less<>>& marks, std::string_view key,
              std::uint64_t count) {
  auto it = marks.lower_bound(key);
  if (it == marks.end() || it->first != key) {
    it = marks.emplace_hint(it, key, 0);
  }
  it->second += count;
}

// Note [All-reduce blocks] (world.hpp): small enough that a block of every input and the result
// stay in L2 while it is reduced and copied out. 128 KiB gave 0.67-0.74 of chorus bench's memory
// probe at 1 MiB per rank on 8 ranks where 32 KiB gave 0.43-0.70 (4 KiB and 8 KiB did worse),
// interleaved in one session (docs/performance.md).
constexpr std::size_t kAllReduceBlockBytes = std::size_t{128} << 10;
// Note [All-reduce blocks]: from this many output bytes in all (every member's output), the
// copies stream past the caches.
constexpr std::size_t kStreamingOutputBytes = std::size_t{16} << 20;

// Copies `bytes` with non-temporal stores where the target has SSE2 (what glibc's memcpy does for
// copies larger than the caches): the destination's lines are not read first, and the result
// does not evict what the caches hold. The caller issues a store fence (fence_streaming) before
// anyone may read the copies.
void copy_streaming(unsigned char* dst, const unsigned char* src, std::size_t bytes) {
#if defined(__SSE2__)
  constexpr std::size_t kVector = 16;
  const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(dst) % kVector;
  const std::size_t head = std::min(bytes, misaligned == 0 ? 0 : kVector - misaligned);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + kVector <= bytes; i += kVector) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void fence_streaming() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Whether group rank `group_rank`'s `op` reads its send buffer. A broadcast's non-root ranks
// pass their output as a stand-in send (core has no input for them), which is an output only:
// poisoned and guarded while pending, never checksummed as an input.
bool reads_send(const SimOp& op, int group_rank) {
  return op.kind != transport::OpKind::Broadcast || op.root == group_rank;
}

// Whether group rank `group_rank`'s `op` has an output: a reduce's non-root ranks have none.
bool writes_recv(const SimOp& op, int group_rank) {
  return op.kind != transport::OpKind::Reduce || op.root == group_rank;
}

// Whether `arrival` has an all_to_all, whose counts can split (SimWorld::split_disagreement).
// Inline in judge_arrival: most operations have none, and then no call scans the peers. A plain
// loop: std::any_of's find_if, which libstdc++ unrolls by four, gave a list of one op a count,
// three size tests and the tail's (~20 instructions a start, for ~9 here).
[[gnu::always_inline]] inline bool has_all_to_all(const SimGroup::Arrival& arrival) noexcept {
  for (const SimOp& op : arrival.ops) {
    if (op.kind == transport::OpKind::AllToAll) {
      return true;
    }
  }
  return false;
}

// Note [Input snapshots]: the bytes `ops`, started by group rank `group_rank`, copy at issue.
std::size_t snapshot_bytes(std::span<const SimOp> ops, int group_rank) {
  std::size_t total = 0;
  for (const SimOp& op : ops) {
    if (reads_send(op, group_rank) && op.send.nbytes() <= kInputSnapshotBytesMax) {
      total += op.send.nbytes();
    }
  }
  return total;
}

// Whether the bytes [a, a + a_bytes) and [b, b + b_bytes) share one.
[[gnu::always_inline]] inline bool bytes_overlap(const void* a, std::size_t a_bytes, const void* b,
                                                 std::size_t b_bytes) {
  const auto* a0 = static_cast<const unsigned char*>(a);
  const auto* b0 = static_cast<const unsigned char*>(b);
  if (a0 == nullptr || b0 == nullptr || a_bytes == 0 || b_bytes == 0) {
    return false;
  }
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

[[gnu::always_inline]] inline bool overlaps(const transport::Buffer& a,
                                            const transport::Buffer& b) {
  return bytes_overlap(a.data, a.nbytes(), b.data, b.nbytes());
}

// Note [Operation positions]: the texts of what fails without the memory to say why. The abort
// reason fits the room group_for makes in every group's abort_reason.
constexpr std::string_view kOutOfMemoryErrorDetail =
    "(the simulator ran out of memory describing this failure)";
constexpr std::string_view kOutOfMemoryJudgingDetail =
    "the simulator ran out of memory checking this operation against its peers'";
constexpr std::string_view kOutOfMemoryAbortReason =
    "the simulator ran out of memory failing an operation";
constexpr std::string_view kOutOfMemoryAbortDetail =
    "the communicator was aborted: the simulator ran out of memory failing an operation";
constexpr std::string_view kTimedOutOutOfMemoryDetail =
    "a wait passed its deadline before the collective completed; the communicator is aborted, "
    "as a watchdog would (the simulator ran out of memory describing more)";
constexpr std::string_view kFailureNotRecordedDetail =
    "(the simulator ran out of memory recording why this operation failed)";
constexpr std::string_view kAbsentOutOfMemoryDetail =
    "a member ended (or crashed) without joining this collective (the simulator ran out of memory "
    "describing more)";

// try_make_error with `work`'s context, or `fallback` where making the error runs out of memory.
// Never throws.
std::exception_ptr make_error_or(ErrorCode code, const SimWork& work, std::string_view detail,
                                 const std::exception_ptr& fallback) noexcept {
  try {
    if (std::exception_ptr error = try_make_error(code, work.context(), std::string(detail))) {
      return error;
    }
  } catch (const std::bad_alloc&) {  // making the context or copying the detail
  }
  return fallback;
}

// Every ErrorCode, InputModified the last (chorus/error.hpp).
constexpr std::size_t kErrorCodes = static_cast<std::size_t>(ErrorCode::InputModified) + 1;

// Note [Operation positions]: per ErrorCode, an error with a fixed text for a member whose own
// error could not be made. Made once per process, by the first world (a std::bad_alloc then
// fails that world's creation, and the next one tries again): they never change, and one error
// rethrown on several threads at once is safe (rethrow_exception counts its references).
const std::array<std::exception_ptr, kErrorCodes>& out_of_memory_errors() {
  static const std::array<std::exception_ptr, kErrorCodes> errors = [] {
    std::array<std::exception_ptr, kErrorCodes> made;
    for (std::size_t code = 0; code < kErrorCodes; ++code) {
      made[code] = try_make_error(static_cast<ErrorCode>(code), ErrorContext{},
                                  std::string(kOutOfMemoryErrorDetail));
      if (made[code] == nullptr) {
        throw std::bad_alloc();
      }
    }
    return made;
  }();
  return errors;
}

// Note [Recycled signature lists]
// Every operation's fingerprint lists its ops' signatures in a std::vector of its own
// (transport::Fingerprint::ops), so every operation allocated one block and freed it when its
// SimWork died: a glibc pair (about 200 instructions), the simulator's last allocation per
// operation in a steady schedule. A SimWork's destructor now gives its list, emptied but keeping
// its room (up to kRecycledRoomBytesMax, some 60 signatures), to a per-thread stack of at most
// kRecycledBlocksMax lists, and the SimWork that start makes takes one from there before it
// reserves (transport::RecycledRooms, Note [Recycled rooms], under Note [Recycled blocks]' rules:
// a SimWork destroyed after its thread's stack closed frees its list as before, and nothing is
// recycled under AddressSanitizer or while testing::recycle_blocks_enabled is false, so the
// out-of-memory tests still see, and refuse, the list's allocation).
struct SignatureListTag {};
using RecycledSignatureLists =
    transport::RecycledRooms<std::vector<transport::OpSignature>, SignatureListTag,
                             transport::kRecycledBlocksMax>;

// Note [Recycled group rooms]
// Every run makes its communicators' groups anew (group_for), each with three heap blocks
// besides its slots: its member list (SimGroup::ranks), the group index's copy of it (the key),
// and the room of its abort reason (made at creation: Note [Operation positions]), three
// allocations a run for the world's communicator. A group that dies, and the index as its world
// ends, give that room, emptied, to per-thread stacks, and group_for takes it from there
// (transport::RecycledRooms, Note [Recycled rooms]): only room travels between runs, never a
// value.
struct RankListTag {};
struct AbortReasonTag {};
using RecycledRankLists = transport::RecycledRooms<std::vector<int>, RankListTag>;
using RecycledAbortReasons = transport::RecycledRooms<std::string, AbortReasonTag>;

// Note [Recycled slots]
// A communicator keeps the slots of its completed operations for its next ones
// (SimGroup::spare_slots), but every run makes its communicators anew, so each run made its
// first slots again: the arrivals, and each arrival's room for its ops and input snapshots, about
// ten allocations a run. A group that dies now gives its spare slots to a per-thread list of at
// most kRecycledSlotsMax, and start takes one from there when its group has no spare. A slot from
// a group of another size has as many arrivals as that one had: start resizes them to its own
// group's. Only slots whose rooms are small are kept (kRecycledSlotBytesMax), so a thread keeps
// at most half a megabyte for them. Under Note [Recycled blocks]' rules otherwise: trivially
// destructible per-thread storage, emptied and closed at thread exit, nothing recycled under
// AddressSanitizer or while testing::recycle_blocks_enabled is false.
class RecycledSlots {
 public:
  using Node = SimGroup::SlotNode;

  // A spare slot of an earlier group, or an empty node when none is kept.
  static Node take() noexcept {
    Node node;
    if (transport::recycling_enabled()) {
      (void)Kept::take(node);
    }
    return node;
  }
  // Keeps `node` (a spare slot: emptied by recycle_slot) for a later take(); leaves it alone
  // (its owner frees it) when recycling is off, its rooms are large, or the list is full or
  // closed.
  static void give(Node& node) noexcept {
    if (!transport::recycling_enabled() || node.empty() || !small(node.mapped())) {
      return;
    }
    (void)Kept::give(node);
  }

 private:
  static constexpr std::size_t kRecycledSlotsMax = 8;
  static constexpr std::size_t kRecycledSlotBytesMax = std::size_t{64}
                                                       << 10;  // its arrivals' rooms
  using Kept = transport::RecycledObjects<Node, kRecycledSlotsMax>;

  static bool small(const SimGroup::Slot& slot) noexcept {
    std::size_t bytes = slot.arrivals.capacity() * sizeof(SimGroup::Arrival);
    for (const SimGroup::Arrival& arrival : slot.arrivals) {
      CHORUS_CHECK(!arrival.arrived && arrival.ops.empty() && arrival.work == nullptr);
      bytes += arrival.ops.capacity() * sizeof(SimOp) + arrival.inputs.capacity();
    }
    return bytes <= kRecycledSlotBytesMax;
  }
};

}  // namespace

int guard_fault_rank() noexcept { return this_thread_rank.rank; }

// ---- SimWork

SimWork::SimWork(SimWorld& world, int rank, std::uint64_t comm_id, std::span<const SimOp> ops,
                 const transport::OpInfo& info, const std::shared_ptr<const std::string>& group)
    : world_(world.weak_from_this()),
      world_address_(&world),
      rank_(rank),
      fingerprint_{comm_id, info.seq, RecycledSignatureLists::take()},
      op_(info.name),
      seq_(info.seq),
      group_(group),
      site_(info.site) {
  // start's group's label, made with the group (group_for) and never reset: checked in debug
  // builds only, as start's other checks of what the world guarantees (Note [Start's own checks]).
  CHORUS_DCHECK(group_ != nullptr);
  // Note [Operation positions]: made before the operation counts. Into the work's own list, not
  // one made beside it and moved in: each moved-from list was one more destructor call.
  fingerprint_.ops.reserve(ops.size());
  for (const SimOp& op : ops) {
    // Made in the list's room: emplace_back constructs from the maker, and GCC builds the
    // conversion's result, OpSignature::of's, directly there (CWG 2327); push_back moved a
    // temporary in and destroyed it. A compiler that does not elide here moves it, as before.
    struct Signature {
      const SimOp& source;
      operator transport::OpSignature() const {  // NOLINT(google-explicit-constructor)
        return transport::OpSignature::of(source.kind, source.send, source.recv, source.reduce_op,
                                          source.root);
      }
    };
    fingerprint_.ops.emplace_back(Signature{op});
  }
}

SimWork::~SimWork() { RecycledSignatureLists::give(fingerprint_.ops); }

void SimWork::on_dropped() const noexcept {
  if (std::shared_ptr<SimWorld> world = world_.lock()) {
    world->on_work_dropped(*this);
  }
}

void SimWork::on_finalized(bool at_rank_exit, bool failed) const noexcept {
  if (std::shared_ptr<SimWorld> world = world_.lock()) {
    world->on_work_finalized(*this, at_rank_exit, failed);
  }
}

bool SimWork::defer_finalization() const noexcept {
  std::shared_ptr<SimWorld> world = world_.lock();
  return world != nullptr && world->choose_deferred_finalization();
}

// Note [Waits without a lock]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank's wait (and poll) on its work is a step of every operation, and each one locked the
// world's weak_ptr (a compare-and-swap, then the release of the shared_ptr it made) only to reach
// the world and to check that it had not ended. Neither needs the lock on a rank:
// - a caller that is a rank of the work's world runs inside that world's run(), on its thread, so
//   the world is alive while the call lasts: the work reaches it through the address it was made
//   with (SimWork::world_address_);
// - whether the caller is such a rank compares this thread's world (bound by a live world) with
//   that address, which cannot name another world while the work lives: the world's block
//   (allocate_shared in sim_run.cpp) is freed only once its last weak_ptr, the work's among them,
//   is gone. The work still checks that its world has not expired (a load of the count, not a
//   lock), as the lock checked before: wait and wait_on check it as before (a pending work's world
//   is alive by construction: a world fails every outstanding work before it ends, Note
//   [Simulator failures]), and is_completed, which may be asked after the world ended, answers
//   from the status then, as before.
// A thread that is not a rank still locks: it waits on the world's condition variable
// (wait_off_rank), and the world may end as soon as the work finished, while the waiter is still
// returning from that wait; the shared_ptr keeps it alive until then.
bool SimWork::is_completed() {
  if (!world_.expired()) {
    if (const int caller = rank_on_this_thread(*world_address_); caller >= 0) {
      return world_address_->poll_on_rank(*this, caller);
    }
  }
  return status() != transport::WorkStatus::Pending;
}

void SimWork::wait(transport::Deadline deadline) {
  // A finished work returns at once, without a scheduling point (Note [Simulator scheduling]).
  if (status() == transport::WorkStatus::Pending) {
    // A world ends only after failing every outstanding work (Note [Simulator failures]): true by
    // construction, so checked in debug builds only (Note [Start's own checks]). The rank test
    // below compares the address only, and a thread off the rank locks the world and checks it.
    CHORUS_DCHECK(!world_.expired());
    if (const int caller = rank_on_this_thread(*world_address_); caller >= 0) {
      world_address_->wait_on_rank(*this, deadline, caller);  // Note [Waits without a lock]
    } else {
      const std::shared_ptr<SimWorld> world = world_.lock();
      CHORUS_CHECK(world != nullptr);
      world->wait_off_rank(*this);
    }
  }
  rethrow_if_failed();
}

void SimWork::wait_on(void* /*stream*/) {
  if (status() != transport::WorkStatus::Pending) {
    rethrow_if_failed();
    return;
  }
  std::shared_ptr<SimWorld> world = world_.lock();
  // A world ends only after failing every outstanding work (Note [Simulator failures]).
  CHORUS_CHECK(world != nullptr);
  if (!world->cuda_devices()) {
    throw InvalidArgument(context(), "the sim transport has no device streams; wait on the host");
  }
  // A simulated stream wait (SimOptions::cuda_devices): the rank waits until the collective
  // completed, under the rank's timeout, as core's host waits do.
  wait(transport::Deadline::after(world->now(), world->timeout()));
}

std::exception_ptr SimWork::error() const {
  return status() == transport::WorkStatus::Failed ? raised_error() : nullptr;
}

// Note [Operation positions]: out of memory making a member's error, fail_slot gives it one of
// out_of_memory_errors(), which name no rank, operation or group. The rank that raises it may
// have the memory fail_slot's thread had not: there it is made again with this work's context
// and the same fixed text, so it reads like every other error ("[rank R] op #seq on group G: ").
// Out of memory there too, the fixed error. Only a failed work looks.
std::exception_ptr SimWork::raised_error() const noexcept {
  const std::array<std::exception_ptr, kErrorCodes>& fixed = out_of_memory_errors();
  const auto it = std::find(fixed.begin(), fixed.end(), error_);
  if (it == fixed.end()) {
    return error_;
  }
  return make_error_or(static_cast<ErrorCode>(it - fixed.begin()), *this, kOutOfMemoryErrorDetail,
                       error_);
}

void SimWork::mark_completed() noexcept {
  // Its one caller, complete_operation, completes a slot's works, which are pending while the
  // slot is outstanding (fail_slot fails them and takes the slot away): true by construction, so
  // checked in debug builds only (Note [Debug-only checks]). mark_failed's callers are several,
  // and its check stays.
  CHORUS_DCHECK(status() == transport::WorkStatus::Pending);
  status_.store(transport::WorkStatus::Completed, std::memory_order_release);
}

void SimWork::mark_failed(std::exception_ptr error) noexcept {
  CHORUS_CHECK(status() == transport::WorkStatus::Pending);
  error_ = std::move(error);
  status_.store(transport::WorkStatus::Failed, std::memory_order_release);
}

void SimWork::rethrow_if_failed() const {
  if (status() == transport::WorkStatus::Failed) {
    std::rethrow_exception(raised_error());
  }
}

std::string SimGroup::missing_members(std::int64_t seq) const {
  std::string missing;
  if (auto it = slots.find(seq); it != slots.end()) {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (!it->second.arrivals[i].arrived) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(ranks[i]);
      }
    }
  }
  return missing;
}

SimGroup::~SimGroup() {
  // Note [Recycled slots]: the spares outlive their group.
  while (!spare_slots.empty()) {
    RecycledSlots::Node node = std::move(spare_slots.back());
    spare_slots.pop_back();
    RecycledSlots::give(node);  // else the node frees the slot
  }
  // Note [Recycled group rooms].
  RecycledRankLists::give(ranks);
  RecycledAbortReasons::give(abort_reason);
}

int SimGroup::group_rank_of(int rank) const noexcept {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

namespace {

// SimGroup::recycle_slot, also inlined into complete_operation (every completion recycles its
// slot there): out of line it was a call and a frame at each.
[[gnu::always_inline]] inline void recycle_slot_of(SimGroup& group,
                                                   SimGroup::SlotNode&& node) noexcept {
  SimGroup::Slot& slot = node.mapped();
  for (SimGroup::Arrival& arrival : slot.arrivals) {
    arrival.arrived = false;
    arrival.ops.clear();     // keeps its room
    arrival.inputs.clear();  // keeps its room
    arrival.work.reset();
  }
  slot.arrived = 0;
  slot.lowest_arrived = -1;
  slot.fault.reset();
  slot.fault_random = false;
  slot.fault_detail.clear();
  // start reserved room for every slot of the group: allocates nothing.
  CHORUS_CHECK_LT(group.spare_slots.size(), group.spare_slots.capacity());
  group.spare_slots.push_back(std::move(node));
}

}  // namespace

void SimGroup::recycle_slot(SlotNode&& node) noexcept { recycle_slot_of(*this, std::move(node)); }

// ---- SimWorld: setup and the rank side

namespace {

// at + by, or the clock's last instant where it would pass it: virtual time near the end of the
// clock (after a time skip to the deadline of a timeout close to Duration::max()) must not wrap.
// The last instant is Duration::max() - 1 ns, since Duration::max() means "never" (a deadline
// that never passes; skip_virtual_time's "nothing to skip to"); a wake-up there still happens.
transport::Duration saturating_add(transport::Duration at, transport::Duration by) {
  constexpr transport::Duration kLastInstant = transport::Duration::max() - transport::Duration(1);
  std::int64_t sum = 0;
  return __builtin_add_overflow(at.count(), by.count(), &sum) || sum > kLastInstant.count()
             ? kLastInstant
             : transport::Duration(sum);
}

// describe(error) for RankSlot::failure, or empty where that runs out of memory (the rank's
// memory may be what ran out): the rank still ends, with its error, and the report describes
// the error once the ranks are done.
std::string describe_failure(const std::exception_ptr& error) noexcept {
  try {
    return describe(error);
  } catch (const std::bad_alloc&) {
    return {};
  }
}

// Unwinds a rank that retries forever after the step budget ran out (SimWorld::stop_rank). Not
// a chorus::Error, nor a std::exception, so that the handler that kept the rank retrying does not
// take it; rank_body records `error` as the rank's.
struct RankStopped {
  std::exception_ptr error;
};

std::unique_ptr<ChoiceSource> source_for(const SimOptions& options) {
  if (options.choices) {
    return recorded_source(*options.choices);
  }
  if (options.fuzz_bytes) {
    return bytes_source(*options.fuzz_bytes);
  }
  return prng_source(options.seed);
}

}  // namespace

SimWorld::SimWorld(const SimOptions& options)
    : options_(options),
      stream_(source_for(options_), options_.strategy, options_.pct_depth, options_.pct_steps,
              options_.seed, options_.choices.has_value(), options_.choices_record_max) {
  CHORUS_CHECK_GE(options_.world_size, 1);
  CHORUS_CHECK_LE(options_.world_size, kMaxWorldSize);
  if (options_.allocator != AllocatorPolicy::Pooled || options_.guard_pending_outputs) {
    allocator_ = std::make_shared<SimAllocator>(
        SimAllocator::Config{options_.allocator, options_.quarantine_frees,
                             options_.guard_pending_outputs, options_.world_size,
                             options_.print_failures, options_.host_pool_bytes_max},
        stream_);
  }
  if (options_.guard_pending_outputs) {
    install_guard_handler();
  }
  faults_planned_ = !options_.faults.empty() || options_.random_faults.enabled();
  fault_spent_.assign(options_.faults.size(), false);
  failing_errors_.resize(static_cast<std::size_t>(options_.world_size));
  failing_events_.resize(static_cast<std::size_t>(options_.world_size));
  out_of_memory_errors();  // made before an operation needs one
}

SimWorld::~SimWorld() {
  if (allocator_ != nullptr) {
    allocator_->detach();  // blocks kept past the run may still be freed, never allocated
  }
  // Note [Recycled group rooms]: the index's keys give their member lists' room.
  while (!group_index_.empty()) {
    auto node = group_index_.extract(group_index_.begin());
    RecycledRankLists::give(std::get<1>(node.key()));
  }
}

int SimWorld::current_rank() const noexcept { return rank_on_this_thread(*this); }

void SimWorld::bind(int rank) noexcept {
  this_thread_rank = CurrentRank{this, rank};
  RankContext::bind(ranks_[static_cast<std::size_t>(rank)].context.get());
}

void SimWorld::switch_into(int rank) {
  if (on_fibers_) {  // Note [Fiber switches called directly]
    resume_fiber(*executor_, rank);
  } else {
    executor_->resume(rank);
  }
}

void SimWorld::switch_out(int rank) {
  if (on_fibers_) {  // Note [Fiber switches called directly]
    suspend_fiber(*executor_, rank);
  } else {
    executor_->suspend(rank);
  }
}

void SimWorld::yield(int rank) {
  // Every caller passes its own rank: start (and stall, under it) checks it on entry, the waits
  // and the polls pass rank_on_this_thread's, scheduling_point checks it below. So only debug
  // builds look it up again at every scheduling point.
  CHORUS_DCHECK_EQ(rank_on_this_thread(*this), rank);
  switch_out(rank);
  bind(rank);  // fibers share the OS thread: restore this rank's bindings
}

void SimWorld::scheduling_point(int rank) {
  CHORUS_CHECK_EQ(rank_on_this_thread(*this), rank);
  yield(rank);
}

void SimWorld::rank_body(int rank) {
  bind(rank);
  RankSlot& slot = ranks_[static_cast<std::size_t>(rank)];
  try {
    if (options_.guard_pending_outputs || options_.report_on_interrupt) {
      // Note [Guard pages], Note [Interrupt report]: a handler must not run on a fiber stack.
      // Out of memory for it, the rank fails with std::bad_alloc before its function runs.
      ensure_signal_alt_stack();
    }
    rank_main_();
  } catch (const RankStopped& stopped) {
    slot.error = stopped.error;
    slot.failed = true;
    slot.threw = true;
    slot.failure = describe_failure(slot.error);
  } catch (...) {
    slot.error = std::current_exception();
    slot.failed = true;
    slot.threw = true;
    slot.failure = describe_failure(slot.error);
  }
  // Seen now, not once the rank has settled its pending results below: that can wait for peers
  // that meanwhile fail, and the first error must stay the one raised first.
  if (slot.error && !first_error_) {
    first_error_ = slot.error;
    first_error_rank_ = rank;
  }
  if (options_.record_events) {
    record_rank_end(rank);
  }
  // From here the rank never starts another operation: peers stop waiting for it now, before
  // it completes its leftovers (which may need those peers).
  if (slot.may_still_arrive()) {
    ++ranks_gone_;  // Note [Absent members]
  }
  slot.exited = true;
  on_rank_exit(rank);
  RankContext::Summary summary = slot.context->finish();
  slot.unwaited = std::move(summary.unwaited);
  if (!slot.error && summary.error) {
    slot.error = summary.error;
    slot.failed = true;
    slot.failure = describe_failure(summary.error);
  }
  if (slot.error && !first_error_) {
    first_error_ = slot.error;
    first_error_rank_ = rank;
  }
  set_phase(static_cast<std::size_t>(rank), Phase::Finished);
  RankContext::bind(nullptr);
  this_thread_rank = CurrentRank{};
}

std::shared_ptr<SimGroup> SimWorld::group_for(const std::string& tag,
                                              const std::vector<int>& ranks) {
  // Every member asks; only the first makes the group, so the others look up without a copy
  // of the key (std::less<> compares the tuples element by element). The members of a
  // communicator ask in turn, so the group made last is asked for most: two comparisons, not a
  // walk of the index (the same group: each key names one).
  if (!groups_.empty()) {
    const std::shared_ptr<SimGroup>& last = groups_.back();
    if (last->ranks == ranks && last->tag == tag) {
      return last;
    }
  }
  if (auto it = group_index_.find(std::tie(tag, ranks)); it != group_index_.end()) {
    return groups_[it->second];
  }
  // Note [Recycled group rooms]: the key's and the group's member lists and the abort reason's
  // room.
  std::vector<int> key_ranks = RecycledRankLists::take();
  key_ranks.assign(ranks.begin(), ranks.end());
  auto key = std::make_tuple(tag, std::move(key_ranks));
  auto group = std::allocate_shared<SimGroup>(
      transport::RecyclingAllocator<SimGroup>{});  // Note [Recycled blocks]: one per run at least
  group->id = groups_.size() + 1;
  group->complete_code = decision_code_prefix(Decision::Kind::CompleteOp, -1, group->id);
  group->tag = tag;
  group->ranks = RecycledRankLists::take();
  group->ranks.assign(ranks.begin(), ranks.end());
  group->issued.assign(ranks.size(), 0);
  group->last_sites.assign(ranks.size(), CallSite{});
  group->abort_reason = RecycledAbortReasons::take();
  group->abort_reason.reserve(kOutOfMemoryAbortReason.size());
  group->label = std::allocate_shared<const std::string>(
      transport::RecyclingAllocator<std::string>{}, transport::group_label(tag, ranks));
  // Room for every candidate of a decision (the scheduler then allocates nothing for them), and
  // for the group before the index names it.
  candidates_.reserve(ranks_.size() + groups_.size() + 1);
  groups_.reserve(groups_.size() + 1);
  group_index_.emplace(std::move(key), groups_.size());
  groups_.push_back(group);
  return group;
}

// Note [Operation positions]
// A sequence number names an operation's position in its communicator's order (Note [Transport
// contract]): a start that throws took none, and core gives the number back, so the start must
// leave no trace of the operation. Everything start can run out of memory making (the
// fingerprint, the work, which also names the arrival's operation (its error context is made
// only for an error, where fail_slot catches a refusal), room for the outputs to guard, the slot
// and its arrivals (or a spare slot of the group's, SimGroup::spare_slots), room for the
// ops' input snapshots in the arrival, the error of an operation that fails at once (where
// try_make_error cannot make it, start throws std::bad_alloc), the guard's description, a spare
// failure record for the slot it makes) is made first; a std::bad_alloc there leaves nothing (a
// slot made for it is erased). Then the operation counts (group.issued, ops_issued_), its point of
// no return. What follows allocates nothing, or, where it still may, fails cleanly instead of
// throwing:
// - the Issue, Arrive and Fail events: out of memory the log loses them (record_event), or a
//   Fail event its detail (fail_slot);
// - judge_arrival (only a mismatch's description, an injected TransportError or Hang being
//   marked, a member that can never arrive, and the abort after a mismatch allocate): the
//   operation fails with Aborted and its communicator is aborted after it
//   (fail_out_of_memory). That needs memory for the abort's reason; refused, the reason is a
//   fixed text in room every group makes at its creation (abort_group_out_of_memory);
// - fail_slot (here, and wherever an operation fails) never throws: it makes every member's
//   error and the failure record before it takes the slot away, and where one is refused it
//   uses what was made in advance: an error of the same code with a fixed text (one per
//   ErrorCode, made once per process, by the first world: out_of_memory_errors; where it is
//   raised, SimWork::raised_error makes it again under the member's rank, op, seq and group,
//   memory permitting), and for the
//   record one of the group's spare nodes (code only: a member arriving later gets a fixed
//   text). The group keeps at least one spare per outstanding operation (start makes one with
//   each slot, before its operation counts; the nodes stay with the group, so only a new high of
//   outstanding operations allocates), and only an outstanding operation is failed, so a spare
//   is always there: every member of every operation failed, whoever fails it (a timeout failing
//   several, a deadlock, a crash), fails with the code it was failed with, and the members
//   arriving later get that code too;
// - a member that will never arrive (check_absent_members, in start and when a rank ends): out
//   of memory describing it, the operation fails with the code absence() gives (RankFailure or
//   Deadlock) and a fixed text, so a rank that ends while memory is short fails its peers' waits
//   as it would otherwise;
// - a wait's timeout (time_out, outside start too): out of memory describing it, the waited
//   operation and those before it still outstanding fail with Timeout and a fixed text, and the
//   communicator is aborted after it (time_out_out_of_memory);
// - the scheduler's failures (a TransportError at completion, a deadlock, a group disagreement)
//   allocate nothing they cannot do without either: out of memory, a TransportError's detail is
//   the fault's description alone, a deadlock's `why` without the rank table, and a group
//   disagreement is not looked for (the deadlock is declared instead). Not covered: the
//   scheduler's other allocations (the livelock's and the liveness violation's texts and lists,
//   a time skip's first mark, the schedule log, the changed-input check's scratch) can still let
//   std::bad_alloc out of sim::run, which then fails as a whole;
// - the abort after a failure: every caller aborts through abort_group_or_out_of_memory, whose
//   reason, out of memory, is the fixed text. That text loses what happened to the operation
//   ("operation #3 timed out", "... failed with a transport error"): the later operations'
//   Aborted errors no longer name it, while the failed operation's own errors still carry its
//   code;
// - guarding the outputs: they stay poisoned, unguarded, or partly guarded. SimAllocator::protect
//   records the block's owner before it protects the block, so every block it protected is one
//   that completion or failure unguards.
// Faults fire between the two (Note [Fault injection]), unchanged: a Delay stalls and a Crash
// throws before the operation counts, as before; ops_started, the index faults count in, counts
// every start that got that far, one that throws included, and a fault that fired (and a random
// draw made) for a start that then threw stays fired. Nothing here draws a decision.

// Note [Start's own checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// start checks that it runs on the rank that calls it (a comm used from another thread fails
// there), that the rank has not exited (its leftovers complete after that) and that core
// numbered the operation as the contract says; those stay in every build. What the comm and
// start itself guarantee is a CHORUS_DCHECK, checked in debug builds only (Note [Debug-only
// checks]), as the scheduler's facts are (Note [Completable groups]): `group_rank` is the rank's
// place in the group (SimComm computes it once, from the group's member list, which never changes),
// and the arrival is still empty (core's numbering, checked, brings each member once to a seq, and
// a slot is new or emptied by recycle_slot), its snapshot room reserved by the reserve above it.
// Nor is a group without failures searched for the operation's failure, and only a start that made
// its slot tops up the spare failure records. Together some 33 instructions a start (1,050 a
// schedule of 32).

std::shared_ptr<SimWork> SimWorld::start(int rank, SimGroup& group, int group_rank,
                                         std::vector<SimOp>& ops, const transport::OpInfo& info) {
  CHORUS_CHECK_EQ(rank_on_this_thread(*this), rank);
  RankSlot& me = ranks_[static_cast<std::size_t>(rank)];
  CHORUS_CHECK(!me.exited);
  // True by construction (Note [Start's own checks]), so release builds skip them.
  CHORUS_DCHECK(group_rank >= 0 && static_cast<std::size_t>(group_rank) < group.ranks.size());
  CHORUS_DCHECK_EQ(group.ranks[static_cast<std::size_t>(group_rank)], rank);
  if (stopping_ranks_) [[unlikely]] {
    stop_rank(rank, group, info);
  }
  if (me.crashed) {
    throw_crashed(rank, group, info);
  }
  // Note [Operation positions]: what can run out of memory is made before the operation counts.
  // Note [Recycled signature lists]: usually room from an operation completed earlier.
  auto work = std::allocate_shared<SimWork>(
      transport::RecyclingAllocator<SimWork>{}, *this, rank, group.id,
      std::span<const SimOp>(ops.data(), ops.size()), info, group.label);  // Note [Recycled blocks]
  const transport::Fingerprint& fingerprint = work->fingerprint();
  const std::uint64_t op_index = me.ops_started++;
  // Note [Fault injection]: a Delay stalls here, a Crash throws; the others mark the slot below.
  if (faults_planned_) [[unlikely]] {
    fire_start_faults(rank, group, info, op_index);
  }
  // Core numbers each communicator's operations 0, 1, 2, ... (Note [Transport contract]).
  CHORUS_CHECK_EQ(info.seq, group.issued[static_cast<std::size_t>(group_rank)]);
  // Nothing else runs from here to the yield below, so what decides the operation's fate now
  // still holds when it counts. An operation that fails at once fails with an error made now.
  // A group with no failure (nearly every start) is not searched for one.
  const bool fails_early = (!group.failures.empty() && group.failures.count(info.seq) != 0) ||
                           !liveness_violation_.empty() || livelocked_ ||
                           (group.aborted_from >= 0 && info.seq >= group.aborted_from);
  // After the fault loop: a Delay's stall runs other ranks, whose starts use guarded_ and
  // guard_what_ too. Only guard mode fills them, so an operation without it touches neither.
  if (options_.guard_pending_outputs) {
    guarded_.clear();
    guarded_.reserve(ops.size());  // no allocation a run without guard mode
    guard_what_ = guard_description(*work, group, rank, info.site);
  }
  SimGroup::Slot* slot = nullptr;
  if (fails_early) {
    early_ = early_failure(group, *work, info.seq);
  } else {
    // Last: a slot made here is erased again if making its arrivals or its spare failure record
    // fails, and nothing after it can throw before the operation counts.
    // A spare slot keeps its arrivals' room (SimGroup::spare_slots).
    auto entry = group.slots.find(info.seq);
    const bool created = entry == group.slots.end();
    bool from_spare = false;
    if (created) {
      entry = make_slot(group, info.seq, from_spare);
    }
    try {
      // A new slot has none; one recycled from another run's group has that group's count
      // (Note [Recycled slots]); one found here was sized by the start that made it.
      if (created && entry->second.arrivals.size() != group.ranks.size()) {
        entry->second.arrivals.resize(group.ranks.size());
      }
      // Room for the input snapshots (a spare slot's arrival usually has it already). The ops
      // need none: the caller's list is swapped in (Note [Ops built in place]).
      SimGroup::Arrival& arrival = entry->second.arrivals[static_cast<std::size_t>(group_rank)];
      if (options_.check_buffers) {
        arrival.inputs.reserve(snapshot_bytes(ops, group_rank));
      }
      // A spare per outstanding operation: only a new high of them allocates. Only a slot made
      // here can raise the count of slots above the spares' (a later member finds the slot its
      // spare was made with; fail_slot takes a spare only with the slot it fails), so the later
      // members' starts skip the comparison.
      while (created && group.spare_failures.size() < group.slots.size()) {
        group.spare_failures.try_emplace(static_cast<std::int64_t>(group.spare_failures.size()));
      }
      CHORUS_DCHECK_GE(group.spare_failures.size(), group.slots.size());
    } catch (...) {
      if (from_spare) {
        group.recycle_slot(group.slots.extract(entry));  // back with the spares, still empty
      } else if (created) {
        group.slots.erase(entry);  // nothing else saw it
      }
      update_completable(group);
      throw;
    }
    slot = &entry->second;
  }

  // The point of no return: the operation takes its position (Note [Operation positions]).
  group.issued[static_cast<std::size_t>(group_rank)] += 1;
  group.last_sites[static_cast<std::size_t>(group_rank)] = info.site;
  ops_issued_[static_cast<std::size_t>(rank)] += 1;
  record(SimEvent::Kind::Issue, rank, *work);

  // Outputs hold poison until completion, so a read that skipped the wait sees garbage (with
  // guard pages, a fault: Note [Guard pages]). Note [Buffer checks].
  for (const SimOp& op : ops) {
    if (writes_recv(op, group_rank) &&
        (!reads_send(op, group_rank) || !overlaps(op.send, op.recv)) && op.recv.count > 0) {
      if (options_.check_buffers) {
        kernels::fill_poison(op.recv.data, op.recv.dtype, op.recv.count);
      }
      if (options_.guard_pending_outputs) {
        guarded_.push_back(op.recv);  // reserved above: no allocation
      }
    }
  }

  if (fails_early) {
    fail_work(*work, std::move(early_.error), std::move(early_.event));
  } else {
    SimGroup::Arrival& arrival = slot->arrivals[static_cast<std::size_t>(group_rank)];
    // Note [Start's own checks]: core's numbering (checked above) brings each member once, and
    // recycle_slot (or a new slot) left the arrival empty, its room reserved above.
    CHORUS_DCHECK(!arrival.arrived);
    CHORUS_DCHECK(arrival.ops.empty());
    CHORUS_DCHECK(arrival.work == nullptr);
    CHORUS_DCHECK(!options_.check_buffers ||
                  arrival.inputs.size() + snapshot_bytes(ops, group_rank) <=
                      arrival.inputs.capacity());
    if (options_.check_buffers) {               // Note [Input snapshots]
      arrival.completed_at_issue = completed_;  // Note [Likely writers]
      ++arrivals_unfinished_;
      for (SimOp& op : ops) {
        op.input_hash = 0;
        if (!reads_send(op, group_rank)) {
          continue;
        }
        const auto* bytes = static_cast<const unsigned char*>(op.send.data);
        const std::size_t size = op.send.nbytes();
        if (size <= kInputSnapshotBytesMax) {
          arrival.inputs.insert(arrival.inputs.end(), bytes, bytes + size);  // reserved above
        } else {
          op.input_hash = checksum_bytes(bytes, size);
        }
      }
    }
    arrival.arrived = true;
    // Note [Ops built in place]: the caller's list itself, not its ops moved one by one; the
    // caller gets the arrival's empty list and its room. Allocates nothing.
    arrival.ops.swap(ops);
    // recycle_slot left it empty: a copy swapped in takes the count inline, where assigning
    // called shared_ptr's out-of-line assignment (which would also release an old work).
    std::shared_ptr<SimWork>(work).swap(arrival.work);
    slot->arrived += 1;
    const int reference_member = slot->lowest_arrived;
    if (reference_member < 0 || group_rank < reference_member) {
      slot->lowest_arrived = group_rank;
    }
    // Note [Completable groups]: only the arrival that fills its slot can make the group's head
    // completable; one that leaves the slot short changes nothing the kept state says (the head
    // is this slot, still short, or another one, unchanged). Debug builds check the kept state at
    // every decision.
    if (slot->arrived == static_cast<int>(group.ranks.size())) {
      update_completable(group);
    }
    record(SimEvent::Kind::Arrive, rank, *work);
    try {
      judge_arrival(group, *slot, group_rank, reference_member, rank, info, fingerprint);
    } catch (const std::bad_alloc&) {
      fail_out_of_memory(group, info.seq);
    }
  }
  // After the input hashes (an input may share a block with an output of the batch), and only
  // while the operation is still pending (a failed one is never completed, so never unguarded).
  if (options_.guard_pending_outputs && work->status() == transport::WorkStatus::Pending) {
    try {
      guard_outputs(*work, guarded_, guard_what_);
    } catch (const std::bad_alloc&) {
      // Note [Operation positions]: the outputs stay poisoned, unguarded (or partly guarded).
    }
  }
  yield(rank);
  return work;
}

void SimWorld::fire_start_faults(int rank, SimGroup& group, const transport::OpInfo& info,
                                 std::uint64_t op_index) {
  // A local until the faults are done: a Delay's stall runs other ranks, whose starts set
  // slot_fault_ too.
  std::optional<FiredFault> slot_fault;
  for (const FiredFault& fired : fire_faults(rank, op_index)) {
    switch (fired.fault.kind) {
      case Fault::Kind::Delay:
        stall(rank, fired.fault.delay_steps);
        break;
      case Fault::Kind::Crash:
        crash(rank, group, info, op_index);
      case Fault::Kind::TransportError:
      case Fault::Kind::Hang:
        slot_fault = fired;
        break;
    }
  }
  slot_fault_ = std::move(slot_fault);
}

SeqTable<SimGroup::Slot>::iterator SimWorld::make_slot(SimGroup& group, std::int64_t seq,
                                                       bool& from_spare) {
  // Room among the spares for every slot of the group, this one included, so that recycle_slot
  // allocates nothing (SimGroup::spare_slots), and in the table for this one, so that inserting
  // a spare allocates nothing; only a new high allocates, and then before anything changed.
  const std::size_t room = group.slots.size() + group.spare_slots.size() + 1;
  if (group.spare_slots.capacity() < room) {
    group.spare_slots.reserve(std::max(room, 2 * group.spare_slots.capacity()));
  }
  group.slots.reserve_one();
  if (group.spare_slots.empty()) {
    // Note [Recycled slots]: one an earlier run's group left on this thread.
    if (RecycledSlots::Node recycled = RecycledSlots::take(); !recycled.empty()) {
      group.spare_slots.push_back(std::move(recycled));  // reserved above: allocates nothing
    }
  }
  SeqTable<SimGroup::Slot>::iterator entry;
  from_spare = !group.spare_slots.empty();
  if (from_spare) {
    SimGroup::SlotNode spare = std::move(group.spare_slots.back());
    group.spare_slots.pop_back();
    spare.key() = seq;
    entry = group.slots.insert(std::move(spare));  // reserved above: allocates nothing
  } else {
    entry = group.slots.try_emplace(seq);
  }
  // Note [Completable groups]: only a slot made here changes the group; finding one (the later
  // members' starts) changes nothing until the arrival, which updates it.
  update_completable(group);
  return entry;
}

SimWorld::EarlyFailure SimWorld::early_failure(const SimGroup& group, const SimWork& work,
                                               std::int64_t seq) {
  ErrorCode code = ErrorCode::Aborted;
  std::string detail;
  if (auto failed = group.failures.find(seq); failed != group.failures.end()) {
    code = failed->second.code;
    detail = failed->second.detail;
  } else if (!liveness_violation_.empty()) {
    code = ErrorCode::Deadlock;
    detail = liveness_violation_;
  } else if (livelocked_) {
    detail = "the simulation exceeded its step budget and was aborted";
  } else {
    CHORUS_CHECK(group.aborted_from >= 0 && seq >= group.aborted_from);
    detail = "the communicator was aborted: " + group.abort_reason;
  }
  if (detail.empty()) {
    detail = kFailureNotRecordedDetail;  // fail_slot used the spare failure
  }
  EarlyFailure early;
  early.error = try_make_error(code, work.context(), detail);
  if (early.error == nullptr) {
    throw std::bad_alloc();  // before the operation counts
  }
  early.event = fail_event(code, detail);
  return early;
}

void SimWorld::judge_arrival(SimGroup& group, SimGroup::Slot& slot, int group_rank,
                             int reference_member, int rank, const transport::OpInfo& info,
                             const transport::Fingerprint& fingerprint) {
  // Compare with the first other arrival (in group-rank order): every arrival is compared, so all
  // must agree. The slot keeps which one that is (Slot::lowest_arrived); debug builds check it
  // against a scan of the members.
  if constexpr (kCheckDecisions) {
    int scanned = -1;
    for (std::size_t i = 0; i < slot.arrivals.size(); ++i) {
      if (slot.arrivals[i].arrived && static_cast<int>(i) != group_rank) {
        scanned = static_cast<int>(i);
        break;
      }
    }
    CHORUS_CHECK_EQ(reference_member, scanned);
  }
  const SimGroup::Arrival* reference = nullptr;
  int reference_rank = -1;
  if (reference_member >= 0) {
    reference = &slot.arrivals[static_cast<std::size_t>(reference_member)];
    reference_rank = group.ranks[static_cast<std::size_t>(reference_member)];
  }
  if (reference != nullptr && (!reference->work->fingerprint().same_ops(fingerprint) ||
                               !same_op_name(reference->op_name(), info.name))) {
    fail_mismatch(group, *reference, reference_rank, rank, info, fingerprint);
  } else if (!has_all_to_all(slot.arrivals[static_cast<std::size_t>(group_rank)]) ||
             !fail_split(group, slot, group_rank, info.seq)) {
    if (faults_planned_ && slot_fault_) {  // set by this start (fire_start_faults)
      mark_slot_fault(slot, *slot_fault_);
      update_completable(group);  // a Hang is no candidate
    }
    if (ranks_gone_ > 0) {                          // Note [Absent members]
      check_absent_members(group, info.seq, slot);  // the slot at hand: no lookup
    }
  }
}

void SimWorld::fail_mismatch(SimGroup& group, const SimGroup::Arrival& reference,
                             int reference_rank, int rank, const transport::OpInfo& info,
                             const transport::Fingerprint& fingerprint) {
  const auto issued = [](std::string_view op, const transport::Fingerprint& print) {
    const std::string name(op);
    const std::string ops_text = print.to_string();
    return ops_text.rfind(name + "(", 0) == 0 ? ops_text : name + " " + ops_text;
  };
  std::ostringstream detail;
  detail << "ranks disagree on operation #" << info.seq << " of group " << *group.label << ": rank "
         << reference_rank << " issued "
         << issued(reference.op_name(), reference.work->fingerprint()) << " at "
         << reference.site().to_string() << "; rank " << rank << " issued "
         << issued(std::string(info.name), fingerprint) << " at " << info.site.to_string();
  if (reference.op_name() == info.name &&
      reference.work->fingerprint().differs_only_in_layout(fingerprint)) {
    detail << transport::kLayoutMismatchNote;  // the signatures print alike
  }
  fail_slot(group, info.seq, ErrorCode::CollectiveMismatch, detail.str());
  abort_group_or_out_of_memory(group, info.seq + 1, "operation #", info.seq,
                               " was a collective mismatch");
}

void SimWorld::fail_out_of_memory(SimGroup& group, std::int64_t seq) noexcept {
  // Note [Operation positions]: the operation counted and arrived, so it cannot be taken back;
  // judging it ran out of memory, so it fails, and the communicator with it (what judging would
  // have found is unknown). Out of memory again, the abort's reason is a fixed text.
  fail_slot(group, seq, ErrorCode::Aborted, kOutOfMemoryJudgingDetail);
  abort_group_or_out_of_memory(group, seq + 1,
                               "the simulator ran out of memory checking operation #", seq, "");
}

std::string SimWorld::guard_description(const SimWork& work, const SimGroup& group, int rank,
                                        const CallSite& site) {
  return "the pending output of " + std::string(work.op()) + " #" + std::to_string(work.seq()) +
         " on group " + *group.label + " (issued by rank " + std::to_string(rank) + " at " +
         site.to_string() + ")";
}

void SimWorld::guard_outputs(const SimWork& work, const std::vector<transport::Buffer>& outputs,
                             const std::string& what) {
  CHORUS_CHECK(options_.guard_pending_outputs);
  for (const transport::Buffer& output : outputs) {
    if (allocator_->protect(output.data, output.nbytes(), &work, what, &steps_,
                            replay_line_.empty() ? nullptr : replay_line_.c_str())) {
      mark("guard.protect");
    }  // else poisoned only; the allocator marked why (guard.unowned, shared, table_full)
  }
}

bool SimWorld::fail_split(SimGroup& group, const SimGroup::Slot& slot, int group_rank,
                          std::int64_t seq) {
  const std::string split = split_disagreement(group, slot, group_rank);
  if (split.empty()) {
    return false;
  }
  fail_slot(group, seq, ErrorCode::CollectiveMismatch,
            "ranks disagree on operation #" + std::to_string(seq) + " of group " + *group.label +
                ": " + split);
  abort_group_or_out_of_memory(group, seq + 1, "operation #", seq, " was a collective mismatch");
  return true;
}

std::string SimWorld::split_disagreement(const SimGroup& group, const SimGroup::Slot& slot,
                                         int group_rank) const {
  const auto me = static_cast<std::size_t>(group_rank);
  const SimGroup::Arrival& mine = slot.arrivals[me];
  for (std::size_t peer = 0; peer < slot.arrivals.size(); ++peer) {
    const SimGroup::Arrival& theirs = slot.arrivals[peer];
    if (!theirs.arrived) {
      continue;  // the rank's own pair too: core refuses it first, but a transport-level op may not
    }
    for (std::size_t i = 0; i < mine.ops.size(); ++i) {
      const SimOp& a = mine.ops[i];
      const SimOp& b = theirs.ops[i];
      if (a.kind != transport::OpKind::AllToAll) {
        continue;
      }
      const auto describe = [&](std::size_t sender, std::size_t receiver, std::size_t sent,
                                std::size_t expected) {
        std::ostringstream out;
        out << "all_to_all counts disagree: rank " << group.ranks[sender] << " sends " << sent
            << " elements to rank " << group.ranks[receiver] << " (issued at "
            << slot.arrivals[sender].site().to_string() << ") but rank " << group.ranks[receiver]
            << " expects " << expected << " from rank " << group.ranks[sender] << " (issued at "
            << slot.arrivals[receiver].site().to_string() << ")";
        return out.str();
      };
      if (a.send_counts[peer] != b.recv_counts[me]) {
        return describe(me, peer, a.send_counts[peer], b.recv_counts[me]);
      }
      if (b.send_counts[me] != a.recv_counts[peer]) {
        return describe(peer, me, b.send_counts[me], a.recv_counts[peer]);
      }
    }
  }
  return {};
}

void SimWorld::wait_on_rank(SimWork& work, transport::Deadline deadline, int rank) {
  RankSlot& slot = ranks_[static_cast<std::size_t>(rank)];
  // A scheduling point before the rank blocks (SimWork::wait calls this only for a pending work:
  // Note [Simulator scheduling]).
  yield(rank);
  bool blocked = false;
  while (work.status() == transport::WorkStatus::Pending) {
    if (slot.timed_out || (!deadline.is_never() && now() >= deadline.at)) {
      slot.timed_out = false;
      try {
        time_out(work, deadline, rank);
      } catch (const std::bad_alloc&) {
        time_out_out_of_memory(work);
      }
      break;
    }
    set_phase(static_cast<std::size_t>(rank), Phase::Blocked);
    slot.blocked_on = &work;
    slot.deadline = deadline;
    earliest_deadline_ = std::min(earliest_deadline_, deadline.at);
    work.add_waiter(rank);
    if (!blocked) {
      blocked = true;
      record(SimEvent::Kind::WaitBegin, rank, work);
    }
    yield(rank);
    CHORUS_CHECK(slot.phase == Phase::Runnable);
  }
  if (blocked) {
    record(SimEvent::Kind::WaitEnd, rank, work);
  }
  slot.timed_out = false;  // a timeout that raced with completion is moot
}

void SimWorld::time_out(SimWork& work, transport::Deadline deadline, int waiter) {
  SimGroup& group = group_of(work);
  const std::int64_t seq = work.fingerprint().seq;
  const auto seconds = std::chrono::duration<double>(deadline.at).count();
  const std::string deadline_text =
      " passed its deadline (virtual time " + std::to_string(seconds) + " s)";
  const std::string waiter_text = "rank " + std::to_string(waiter) + "'s wait";
  // Why operation `at` had not completed: members missing, its own fault.
  const auto why = [&](std::int64_t at, const SimGroup::Slot& slot) {
    std::string text;
    if (const std::string missing = group.missing_members(at); !missing.empty()) {
      text += ", when rank(s) " + missing + " had not joined it yet";
    }
    if (slot.hangs()) {  // a TransportError would act only at completion
      text += ": " + slot.fault_detail;
    }
    return text;
  };
  const auto op_name = [](const SimGroup::Slot& slot) {
    const auto arrived = std::ranges::find_if(slot.arrivals, &SimGroup::Arrival::arrived);
    CHORUS_CHECK(arrived != slot.arrivals.end());  // a slot exists once a member arrived
    return arrived->op_name();
  };
  const std::string watchdog = "; the communicator is aborted, as a watchdog would";
  // A watchdog aborts the communicator: the operations issued before the waited one and still
  // outstanding fail too (they time out with it: none can complete any more), and the waited
  // one names the first of them that an injected fault hung, the reason it could not complete.
  std::string behind;
  std::vector<std::pair<std::int64_t, std::string>> earlier;
  for (const auto& [at, slot] : group.slots) {
    if (at >= seq) {
      break;
    }
    const std::string name(op_name(slot));
    if (behind.empty() && slot.hangs()) {
      behind = ", behind " + name + " #" + std::to_string(at) +
               ", which hung (injected fault: " + slot.fault->to_string() + ")";
    }
    earlier.emplace_back(at, waiter_text + " on " + std::string(work.op()) + " #" +
                                 std::to_string(seq) + deadline_text +
                                 " before this collective completed" + why(at, slot) + watchdog);
  }
  const auto waited = group.slots.find(seq);
  CHORUS_CHECK(waited != group.slots.end());  // pending, so outstanding
  std::string detail =
      waiter_text + deadline_text + " before the collective completed" + why(seq, waited->second);
  if (!waited->second.hangs()) {
    detail += behind;
  }
  detail += watchdog;
  for (const auto& [at, earlier_detail] : earlier) {
    fail_slot(group, at, ErrorCode::Timeout, earlier_detail);
  }
  fail_slot(group, seq, ErrorCode::Timeout, detail);
  abort_group_or_out_of_memory(group, seq + 1, "operation #", seq, " timed out");
}

void SimWorld::time_out_out_of_memory(const SimWork& work) noexcept {
  // Note [Operation positions]: time_out ran out of memory describing the timeout, before or
  // after it failed some of the operations; what it left is failed as it would have, with fixed
  // texts.
  SimGroup& group = group_of(work);
  const std::int64_t seq = work.fingerprint().seq;
  for (auto it = group.slots.begin(); it != group.slots.end() && it->first <= seq;
       it = group.slots.begin()) {
    fail_slot(group, it->first, ErrorCode::Timeout, kTimedOutOutOfMemoryDetail);
  }
  abort_group_out_of_memory(group, seq + 1);
}

bool SimWorld::poll_on_rank(SimWork& work, int rank) {
  yield(rank);
  return work.status() != transport::WorkStatus::Pending;
}

void SimWorld::wait_off_rank(SimWork& work) {
  // A rank that waited here would block the thread every rank runs on (fibers) or hold the turn
  // (threads): ranks wait through wait_on_rank.
  CHORUS_CHECK(current_rank_of_thread_is_none());
  std::unique_lock<std::mutex> lock(off_rank_mutex_);
  // Note [Off-rank waiters]: counted before the first look at the status.
  off_rank_waiters_.fetch_add(1, std::memory_order_acq_rel);
  off_rank_cv_.wait(lock, [&] { return work.status() != transport::WorkStatus::Pending; });
  off_rank_waiters_.fetch_sub(1, std::memory_order_relaxed);
}

// Note [Off-rank waiters]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every completion and failure notifies the threads that are not ranks and wait on a work
// (wait_off_rank), but almost no run has one: a notify that locked the mutex each time cost
// every operation a lock and an unlock. So a waiter counts itself, under the mutex, before it
// first reads the status, and a notify that sees no waiter returns without the lock. The status
// is stored before the notify reads the count, and both sides reach the count by a
// read-modify-write (the notify's adds 0), so the two are ordered in the count's modification
// order and at least one sees the other: either the notify's comes first, and the waiter's
// acquires it and so sees the work done and does not sleep; or the waiter's comes first, and the
// notify sees the waiter and takes the lock, which the waiter holds until it sleeps, so the
// notify cannot fall between its check and its sleep. (Not fences with plain loads: GCC's
// ThreadSanitizer refuses std::atomic_thread_fence.)
void SimWorld::notify_off_rank_waiters() {
  if (off_rank_waiters_.fetch_add(0, std::memory_order_acq_rel) == 0) {
    return;
  }
  // Under the lock: a waiter between its check and its sleep cannot miss this.
  std::lock_guard<std::mutex> lock(off_rank_mutex_);
  off_rank_cv_.notify_all();
}

// ---- The scheduler

SimReport SimWorld::run(std::function<void()> rank_main) {
  rank_main_ = std::move(rank_main);
  const int size = options_.world_size;
  schedule_ = std::exchange(recycled_schedule, {});  // Note [Recycled schedule buffer]
  schedule_.clear();
  try {
    start_ranks();
  } catch (...) {
    // No rank ran: the executor ended the contexts it made (RankExecutor::start).
    release_run_resources();
    throw;
  }
  schedule();
  // The executor and the world agree that every rank ended: checked once a run, not per decision
  // (rank_body sets Finished as its last step, so a check as the body returns would test nothing).
  // The executor's side is stop()'s own check of each lane (both executors check it there), not a
  // virtual finished() call per rank as well.
  for (int r = 0; r < size; ++r) {
    CHORUS_CHECK(ranks_[static_cast<std::size_t>(r)].phase == Phase::Finished);
  }
  executor_->stop();

  SimReport report;
  report.world_size = size;
  report.seed = options_.seed;
  report.choice_source = options_.choices      ? SimReport::ChoiceSource::List
                         : options_.fuzz_bytes ? SimReport::ChoiceSource::FuzzBytes
                                               : SimReport::ChoiceSource::Seed;
  report.steps = steps_;
  report.schedule_hash = schedule_hash_;
  report.strategy = stream_.strategy();
  report.choices_exhausted = stream_.exhausted();
  if (!stream_.overflowed()) {
    const std::span<const std::uint64_t> choices = stream_.choices();
    report.choices.assign(choices.begin(), choices.end());
    // Without the trailing zeros (Note [Replay tokens]).
    const auto last_nonzero =
        std::find_if(choices.rbegin(), choices.rend(), [](std::uint64_t c) { return c != 0; });
    report.replay_token =
        encode_replay_token(options_.world_size, run_shape(options_),
                            choices.first(static_cast<std::size_t>(choices.rend() - last_nonzero)));
  }
  report.data_hash = data_hash_;
  report.marks = marks_;
  if (allocator_ != nullptr) {
    allocator_->check_quarantine();  // every rank ended: its last frees are checked too
    for (const auto& [name, count] : allocator_->marks()) {
      report.marks[name] += count;
    }
  }
  if (reductions_ > 0) {
    add_mark(report.marks, reduction_mark(options_.reduction_order), reductions_);
  }
  report.faults_fired = faults_fired_;
  report.stuck_ranks = stuck_ranks_;
  // Strategy marks: which strategy made the schedule choices, and PCT's change points.
  add_mark(report.marks, report.strategy == Strategy::Pct ? "strategy.pct" : "strategy.random_walk",
           steps_);
  if (const std::size_t passed = stream_.pct_change_points_passed(); passed > 0) {
    report.marks["strategy.pct.change_point"] += passed;
  }
  if (const std::size_t room = schedule_.capacity(); room <= kHandedScheduleMax) {
    report.schedule = std::move(schedule_);  // Note [Recycled schedule buffer]
    schedule_ = std::vector<Decision>();
    try {
      schedule_.reserve(room);
    } catch (const std::bad_alloc&) {
      // The next run on the thread grows its own.
    }
  } else {
    report.schedule.assign(schedule_.begin(), schedule_.end());
  }
  report.ops_issued.assign(ops_issued_.begin(), ops_issued_.end());
  if (options_.record_events) {
    report.marks["timeline.events"] += events_.size();
    if (events_not_recorded_ > 0) {
      report.marks["timeline.events_not_recorded"] += events_not_recorded_;
    }
  }
  report.events = std::move(events_);
  report.events_not_recorded = events_not_recorded_;
  report.collectives_completed = completed_;
  report.virtual_time = now();
  report.rank_errors.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    RankSlot& slot = ranks_[static_cast<std::size_t>(r)];
    report.unwaited.insert(report.unwaited.end(), slot.unwaited.begin(), slot.unwaited.end());
    if (slot.error || !slot.failure.empty()) {  // else failure_text is empty, as resize left it
      report.rank_errors[static_cast<std::size_t>(r)] = failure_text(slot);
    }
  }
  report.first_error = first_error_;
  report.first_error_rank = first_error_rank_;
  release_run_resources();
  return report;
}

void SimWorld::start_ranks() {
  const int size = options_.world_size;
  ranks_.resize(static_cast<std::size_t>(size));
  candidates_.reserve(ranks_.size() + groups_.size() + 1);  // as group_for does
  for (int r = 0; r < size; ++r) {
    RankOptions rank_options;
    rank_options.timeout = options_.timeout;
    rank_options.host_pool_bytes_max = options_.host_pool_bytes_max;
    rank_options.host_allocator = allocator_;
    if (options_.cuda_devices) {
      rank_options.device_memory = make_simulated_device_memory(r);
    }
    // Each run makes one per rank: recycled (Note [Recycled blocks]).
    std::shared_ptr<transport::Transport> rank_transport =
        std::allocate_shared<SimTransport>(transport::RecyclingAllocator<SimTransport>{}, *this, r);
    if (options_.wrap_transport) {
      rank_transport = options_.wrap_transport(std::move(rank_transport));
      CHORUS_CHECK(rank_transport != nullptr);
    }
    ranks_[static_cast<std::size_t>(r)].context =
        make_rank_context(std::move(rank_transport), std::move(rank_options));
  }
  run_codes_.resize(static_cast<std::size_t>(size));
  // Every rank starts runnable (RankSlot's phase).
  runnable_words_.assign((static_cast<std::size_t>(size) + 63) / 64, 0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(size); ++r) {
    runnable_words_[r / 64] |= std::uint64_t{1} << (r % 64);
  }
  runnable_count_ = static_cast<std::size_t>(size);
  ops_issued_.assign(static_cast<std::size_t>(size), 0);
  // Note [Decision codes]: a small world's are the same every run, made at compile time (each
  // took three hash_combines a rank and run).
  static constexpr std::array<std::uint64_t, kSmallWorld> kSmallWorldRunCodes = [] {
    std::array<std::uint64_t, kSmallWorld> codes{};
    for (std::size_t r = 0; r < codes.size(); ++r) {
      codes[r] = decision_code(Decision{Decision::Kind::RunRank, static_cast<int>(r), 0, -1});
    }
    return codes;
  }();
  for (int r = 0; r < size; ++r) {
    const auto index = static_cast<std::size_t>(r);
    run_codes_[index] = index < kSmallWorld
                            ? kSmallWorldRunCodes[index]
                            : decision_code(Decision{Decision::Kind::RunRank, r, 0, -1});
  }
  on_fibers_ = resolve_executor(options_.executor) == ExecutorKind::Fibers;
  executor_ = on_fibers_ ? make_fiber_executor() : make_thread_executor();
  executor_->start(size, [this](int rank) { rank_body(rank); });
}

SimWorld::RankContextPtr SimWorld::make_rank_context(
    std::shared_ptr<transport::Transport> transport, RankOptions options) {
  transport::RecyclingAllocator<RankContext> allocator;
  RankContext* block = allocator.allocate(1);
  try {
    return RankContextPtr(new (block) RankContext(std::move(transport), std::move(options)));
  } catch (...) {
    allocator.deallocate(block, 1);
    throw;
  }
}

void SimWorld::release_run_resources() noexcept {
  if (schedule_.capacity() <= kRecycledScheduleMax) {  // Note [Recycled schedule buffer]
    schedule_.clear();
    recycled_schedule = std::move(schedule_);
  }
  // Rank contexts go before the world: their transports point at it.
  for (RankSlot& slot : ranks_) {
    slot.context.reset();
  }
}

// Note [Step checks]
// ~~~~~~~~~~~~~~~~~~
// Three checks of every decision depend only on the step count until they first act: the
// liveness phase (SimOptions::liveness_steps, from the first decision when it is on), the step
// budget (max_steps) and, past it, the stop of the ranks (steps_after_budget, only once
// livelocked_, which the budget sets). So a decision before the first step any of them can act
// at compares steps_ once, and the checks run, in their order, from that step on.
void SimWorld::schedule() {
  // Each run schedules once, from an empty record (run): schedule_.size() is min(steps_, max).
  CHORUS_CHECK(steps_ == 0 && schedule_.empty());
  const std::uint64_t checked_from = options_.liveness_steps > 0 ? 0 : options_.max_steps;
  while (true) {
    if (now() >= earliest_deadline_) {  // Note [Deadline scan]
      wake_due_ranks();
    }
    // Note [Runnable set]: the candidates are the runnable ranks in rank order, then the
    // completable operations in group order. Only PCT looks at the ranks; a uniform choice needs
    // their count, and the chosen one is found in the bitset, so candidates_ lists the ranks for
    // PCT only.
    // Note [Completable groups]: the completions are listed for PCT only, too.
    const bool by_priority = stream_.schedules_by_priority();
    if (by_priority || kCheckDecisions) {
      candidates_.clear();
      if (by_priority) {
        for (std::size_t w = 0; w < runnable_words_.size(); ++w) {
          for (std::uint64_t word = runnable_words_[w]; word != 0; word &= word - 1) {
            const auto r =
                static_cast<int>(w * 64 + static_cast<std::size_t>(std::countr_zero(word)));
            candidates_.push_back(Decision{Decision::Kind::RunRank, r, 0, -1});
          }
        }
      }
      std::size_t completions = 0;
      for (const std::shared_ptr<SimGroup>& group : groups_) {
        const bool completable = head_can_complete(*group);
        CHORUS_CHECK(completable == group->completable);  // every change was followed
        if (completable) {
          candidates_.push_back(
              Decision{Decision::Kind::CompleteOp, -1, group->id, group->next_to_complete});
          ++completions;
        }
      }
      CHORUS_CHECK_EQ(completions, completable_groups_);
    }
    const std::size_t num_candidates =
        by_priority ? candidates_.size() : runnable_count_ + completable_groups_;
    if (num_candidates == 0) {
      bool all_finished = true;
      for (const RankSlot& slot : ranks_) {
        all_finished = all_finished && slot.phase == Phase::Finished;
      }
      if (all_finished) {
        break;
      }
      if (!fail_group_mismatches() && !skip_virtual_time()) {
        declare_deadlock("no rank can make progress (deadlock)");
      }
      continue;
    }
    if (steps_ >= checked_from) [[unlikely]] {  // Note [Step checks]
      if (options_.liveness_steps > 0 && check_liveness()) {
        continue;
      }
      if (steps_ >= options_.max_steps && !livelocked_) {
        livelocked_ = true;
        declare_deadlock("the simulation took " + std::to_string(steps_) +
                         " scheduling decisions without ending (livelock?); step budget "
                         "SimOptions::max_steps exhausted");
        continue;
      }
      if (livelocked_ && steps_ - options_.max_steps >= options_.steps_after_budget) {
        stopping_ranks_ = true;  // a rank still issuing operations retries forever: stop_rank
      }
    }
    std::size_t index = 0;
    if (!by_priority) {
      index = static_cast<std::size_t>(stream_.choose(num_candidates));
      if (index < runnable_count_) {  // Note [Uniform rank steps]
        const int rank = kth_runnable(index);
        take_step(run_codes_[static_cast<std::size_t>(rank)],
                  Decision{Decision::Kind::RunRank, rank, 0, -1});
        run_rank(rank);
        continue;
      }
    }
    // Made here, past the uniform rank steps: declared before them, it was written whole as a
    // default on their way too.
    const Decision decision =
        by_priority ? candidates_[stream_.choose_schedule({candidates_.data(), candidates_.size()})]
                    : kth_completable(index - runnable_count_);
    // Note [Decision codes].
    const std::uint64_t code = decision.kind == Decision::Kind::RunRank
                                   ? run_codes_[static_cast<std::size_t>(decision.rank)]
                                   : hash_combine(groups_[decision.comm_id - 1]->complete_code,
                                                  static_cast<std::uint64_t>(decision.seq));
    take_step(code, decision);
    execute(decision);
  }
  // Nothing can be outstanding once every rank finished: each rank completed its works before
  // finishing, and an operation a finished rank never joined was failed when it exited.
  for (const std::shared_ptr<SimGroup>& group : groups_) {
    CHORUS_CHECK(group->slots.empty());
  }
}

void SimWorld::set_phase(std::size_t r, Phase phase) noexcept {
  RankSlot& slot = ranks_[r];
  const bool was_runnable = slot.phase == Phase::Runnable;
  const bool runnable = phase == Phase::Runnable;
  slot.phase = phase;
  if (was_runnable != runnable) {
    runnable_words_[r / 64] ^= std::uint64_t{1} << (r % 64);
    runnable_count_ = runnable ? runnable_count_ + 1 : runnable_count_ - 1;
  }
}

int SimWorld::kth_runnable(std::size_t k) const noexcept {
  // Up to 64 ranks the set is one word, and k < runnable_count_ is its population count: no
  // count per word (a libgcc call on generic x86-64, which has no popcnt instruction).
  if (runnable_words_.size() == 1) {
    return kth_set_bit(runnable_words_[0], k);
  }
  for (std::size_t w = 0; w < runnable_words_.size(); ++w) {
    const std::uint64_t word = runnable_words_[w];
    const auto in_word = static_cast<std::size_t>(std::popcount(word));
    if (k < in_word) {
      return static_cast<int>(w * 64) + kth_set_bit(word, k);
    }
    k -= in_word;
  }
  CHORUS_CHECK(false);  // k < runnable_count_
  return -1;
}

// Note [Uniform rank steps]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Most decisions (76 of a typical schedule's 84) are a uniform choice of a rank to run. Made as
// one Decision, assigned into a default one and then recorded, hashed and executed by kind, the
// decision lived on the stack (push_back's reallocation takes the address of what it appends):
// written whole as a default, then its rank, its kind and rank read back after the draw and again
// around the resume's call. So a uniform rank step takes its own way through the loop: the rank
// stays a value, its code is run_codes_'s, the record appends a Decision made for it, and
// run_rank resumes it. The same decision, code, record and order as the general way (take_step
// and execute, which PCT's choices and completions still take).
void SimWorld::take_step(std::uint64_t code, const Decision& decision) {
  CHORUS_DCHECK_EQ(code, decision_code(decision));  // Note [Decision codes]
  schedule_hash_ = hash_combine(schedule_hash_, code);
  // The first schedule_record_max decisions: schedule_ holds one per step so far until then.
  if (steps_ < options_.schedule_record_max) {
    schedule_.push_back(decision);
  }
  ++steps_;
  now_ns_.store(saturating_add(now(), kStepDuration).count(), std::memory_order_relaxed);
}

void SimWorld::run_rank(int rank) {
  // True by construction: the decision was drawn from the runnable set (kth_runnable, or PCT's
  // candidates), so release builds do not look at the rank's slot again.
  CHORUS_DCHECK(ranks_[static_cast<std::size_t>(rank)].phase == Phase::Runnable);
  running_rank_.store(rank, std::memory_order_relaxed);
  switch_into(rank);
  running_rank_.store(-1, std::memory_order_relaxed);
  RankContext::bind(nullptr);
  this_thread_rank = CurrentRank{};
  // A rank whose body returned is Finished: checked once the schedule ends (run), not here with
  // a virtual call per decision to ask the executor.
}

void SimWorld::execute(const Decision& decision) {
  if (decision.kind == Decision::Kind::RunRank) {
    run_rank(decision.rank);
    return;
  }
  SimGroup& group = *groups_[decision.comm_id - 1];
  CHORUS_CHECK_EQ(group.slots.begin()->first, decision.seq);
  complete_operation(group);
}

void SimWorld::complete_operation(SimGroup& group) {
  auto head = group.slots.begin();
  const std::int64_t seq = head->first;
  if (options_.guard_pending_outputs) {
    for (const SimGroup::Arrival& arrival : head->second.arrivals) {
      unguard_outputs(*arrival.work);  // before reading inputs and writing outputs
    }
  }
  if (head->second.fault &&
      head->second.fault->kind == Fault::Kind::TransportError) {  // Note [Fault injection]
    // Note [Operation positions]: out of memory, the detail is the fault's alone (read by
    // fail_slot only before it takes the slot away).
    std::string fault_detail = std::move(head->second.fault_detail);  // fail_slot erases the slot
    std::string detail;
    try {
      detail = fault_detail + "; the communicator is aborted, as a real transport would";
    } catch (const std::bad_alloc&) {
      detail.clear();
    }
    fail_slot(group, seq, ErrorCode::TransportError, detail.empty() ? fault_detail : detail);
    abort_group_or_out_of_memory(group, seq + 1, "operation #", seq,
                                 " failed with a transport error");
    return;
  }
  if (std::string modified = options_.check_buffers ? modified_inputs(group, head->second) : "";
      !modified.empty()) {
    fail_slot(group, seq, ErrorCode::InputModified, modified);
    return;
  }
  // Back to the group's spares at the end (recycle_slot_of, as SimGroup::recycle_slot), for its
  // room.
  auto node = group.slots.extract(head);
  SimGroup::Slot& slot = node.mapped();
  group.next_to_complete += 1;
  advance_completion(group);
  const std::size_t size = group.ranks.size();
  const std::size_t num_ops = slot.arrivals[0].ops.size();
  PerRank<const void*>& sources = sources_;  // kept across operations: no allocation
  // Every case below sets all `size` entries before it reads one: sized, not filled (a fill was a
  // memset call per completion). Nearly always the size is the last completion's already: tested
  // first, as resize takes its out-of-line growing path for an equal size too.
  if (sources.size() != size) {
    sources.resize(size);
  }
  for (std::size_t i = 0; i < num_ops; ++i) {
    const SimOp& first = slot.arrivals[0].ops[i];
    const DType dtype = first.send.dtype;
    const std::size_t element = element_size(dtype);
    switch (first.kind) {
      case transport::OpKind::AllReduce: {
        // Reduce into rank 0's output unless it overlaps another rank's input, then copy.
        // Rank 0's side (null or empty overlaps nothing) is judged once rather than once an input,
        // and held in locals: a store to `sources` may alias `first.recv.data` (both void
        // pointers), which the loop would otherwise load again after each.
        sources[0] = first.send.data;
        bool recv0_overlaps = false;
        const void* const recv0 = first.recv.data;
        const std::size_t recv0_bytes = first.recv.nbytes();
        const bool recv0_may_overlap = recv0 != nullptr && recv0_bytes > 0;
        for (std::size_t j = 1; j < size; ++j) {
          const transport::Buffer& send = slot.arrivals[j].ops[i].send;
          sources[j] = send.data;
          if (recv0_may_overlap && !recv0_overlaps) {
            recv0_overlaps = bytes_overlap(recv0, recv0_bytes, send.data, send.nbytes());
          }
        }
        void* target = first.recv.data;
        if (recv0_overlaps) {
          scratch_.resize(first.recv.nbytes());
          target = scratch_.data();
        }
        plan_reduction(size);
        // Note [All-reduce blocks]: a block at a time, reduced and then copied to the other
        // outputs while it is still in cache. Ring orders depend on where a segment starts, so
        // they reduce the whole buffer first.
        const std::size_t count = first.send.count;
        std::size_t block = count;
        bool streaming = false;
        if (options_.reduction_order != ReductionOrder::Ring &&
            count * element > kAllReduceBlockBytes && !cross_aliased(slot, i)) {
          block = std::max<std::size_t>(kAllReduceBlockBytes / element, 1);
          streaming = size * count * element >= kStreamingOutputBytes;
        }
        for (std::size_t begin = 0; begin < count; begin += block) {
          const std::size_t length = std::min(block, count - begin);
          const std::size_t offset = begin * element;
          // The first block starts where the inputs do: only a later one needs its own list (an
          // operation of one block, the usual small one, makes none).
          const void* const* block_from = sources.data();
          if (begin > 0) {
            block_sources_.resize(size);
            for (std::size_t j = 0; j < size; ++j) {
              block_sources_[j] = static_cast<const unsigned char*>(sources[j]) + offset;
            }
            block_from = block_sources_.data();
          }
          unsigned char* reduced = static_cast<unsigned char*>(target) + offset;
          reduce_contributions(reduced, block_from, size, length, dtype, first.reduce_op, seq, size,
                               0);
          for (const SimGroup::Arrival& arrival : slot.arrivals) {  // `size` of them
            auto* recv = static_cast<unsigned char*>(arrival.ops[i].recv.data) + offset;
            if (recv == reduced) {
              continue;
            }
            if (streaming) {
              copy_streaming(recv, reduced, length * element);
            } else {
              std::memcpy(recv, reduced, length * element);
            }
          }
        }
        if (streaming) {
          fence_streaming();
          mark("allreduce.streaming");
        }
        break;
      }
      case transport::OpKind::AllGather: {
        const std::size_t block = first.send.nbytes();
        for (std::size_t dst = 0; dst < size; ++dst) {
          auto* recv = static_cast<unsigned char*>(slot.arrivals[dst].ops[i].recv.data);
          for (std::size_t src = 0; src < size && block > 0; ++src) {
            std::memcpy(recv + src * block, slot.arrivals[src].ops[i].send.data, block);
          }
        }
        break;
      }
      case transport::OpKind::ReduceScatter: {
        const std::size_t count = first.recv.count;
        plan_reduction(size);
        for (std::size_t dst = 0; dst < size; ++dst) {
          for (std::size_t j = 0; j < size; ++j) {
            sources[j] = static_cast<const unsigned char*>(slot.arrivals[j].ops[i].send.data) +
                         dst * count * element;
          }
          if (count > 0) {
            reduce_contributions(slot.arrivals[dst].ops[i].recv.data, sources.data(), size, count,
                                 dtype, first.reduce_op, seq, 1, dst);
          }
        }
        break;
      }
      case transport::OpKind::AllToAll: {
        // Block j of rank i's send lands as block i of rank j's recv. send_offset[i * size + j]:
        // where rank i's block for j starts (packed displacements).
        std::vector<std::size_t> send_offset(size * size, 0);
        for (std::size_t src = 0; src < size; ++src) {
          const SimOp& sender = slot.arrivals[src].ops[i];
          for (std::size_t dst = 1; dst < size; ++dst) {
            send_offset[src * size + dst] =
                send_offset[src * size + dst - 1] + sender.send_counts[dst - 1];
          }
        }
        for (std::size_t dst = 0; dst < size; ++dst) {
          const SimOp& receiver = slot.arrivals[dst].ops[i];
          auto* recv = static_cast<unsigned char*>(receiver.recv.data);
          std::size_t recv_offset = 0;
          for (std::size_t src = 0; src < size; ++src) {
            const auto* send =
                static_cast<const unsigned char*>(slot.arrivals[src].ops[i].send.data);
            const std::size_t bytes = receiver.recv_counts[src] * element;
            if (bytes > 0) {
              std::memcpy(recv + recv_offset * element,
                          send + send_offset[src * size + dst] * element, bytes);
            }
            recv_offset += receiver.recv_counts[src];
          }
        }
        break;
      }
      case transport::OpKind::Broadcast: {
        const SimOp& root = slot.arrivals[static_cast<std::size_t>(first.root)].ops[i];
        for (std::size_t dst = 0; dst < size; ++dst) {
          const SimOp& receiver = slot.arrivals[dst].ops[i];
          if (receiver.recv.data != root.send.data && root.send.nbytes() > 0) {
            std::memmove(receiver.recv.data, root.send.data, root.send.nbytes());
          }
        }
        break;
      }
      case transport::OpKind::Reduce: {
        for (std::size_t j = 0; j < size; ++j) {
          sources[j] = slot.arrivals[j].ops[i].send.data;
        }
        const SimOp& root = slot.arrivals[static_cast<std::size_t>(first.root)].ops[i];
        bool overlapping = false;
        for (std::size_t j = 0; j < size; ++j) {
          overlapping = overlapping || (j != static_cast<std::size_t>(first.root) &&
                                        overlaps(root.recv, slot.arrivals[j].ops[i].send));
        }
        plan_reduction(size);
        if (first.send.count > 0) {
          void* target = root.recv.data;
          if (overlapping) {
            scratch_.resize(root.recv.nbytes());
            target = scratch_.data();
          }
          reduce_contributions(target, sources.data(), size, first.send.count, dtype,
                               first.reduce_op, seq, size, 0);
          if (target != root.recv.data) {
            std::memcpy(root.recv.data, target, root.recv.nbytes());
          }
        }
        break;
      }
    }
  }
  if (options_.hash_data) {
    for (const SimGroup::Arrival& arrival : slot.arrivals) {
      for (const SimOp& op : arrival.ops) {
        data_hash_ = hash_combine(data_hash_, hash_bytes(op.recv.data, op.recv.nbytes()));
      }
    }
  }
  for (SimGroup::Arrival& arrival : slot.arrivals) {
    arrival.work->mark_completed();
    record(SimEvent::Kind::Complete, arrival.work->rank(), *arrival.work);
    wake_waiters(*arrival.work);
  }
  ++completed_;
  if (options_.check_buffers) {                                   // Note [Likely writers]
    CHORUS_CHECK_GE(arrivals_unfinished_, slot.arrivals.size());  // each arrival was counted
    arrivals_unfinished_ -= slot.arrivals.size();
    if (arrivals_unfinished_ > 0) {  // some other operation may have an input here
      remember_writes(group, seq, slot);
    }
  }
  notify_off_rank_waiters();
  recycle_slot_of(group, std::move(node));
}

namespace {

// Appends the pairwise tree over `count` sources from `first` (Note [Reduction order modes]).
void append_pairwise_tree(std::vector<int>& program, int first, std::size_t count) {
  CHORUS_CHECK_GE(count, std::size_t{1});
  if (count == 1) {
    program.push_back(first);
    return;
  }
  const std::size_t left = std::bit_floor(count - 1);  // the largest power of two below count
  append_pairwise_tree(program, first, left);
  append_pairwise_tree(program, first + static_cast<int>(left), count - left);
  program.push_back(kernels::kCombine);
}

// Appends a tree over `leaves` whose shape `choose(n)` decides: 1 + choose(k - 1) of k leaves go
// right, so choices of 0 give the left fold.
template <class Choose>
void append_drawn_tree(std::vector<int>& program, std::span<const int> leaves, Choose& choose) {
  CHORUS_CHECK(!leaves.empty());
  if (leaves.size() == 1) {
    program.push_back(leaves.front());
    return;
  }
  const auto right = static_cast<std::size_t>(1 + choose(leaves.size() - 1));
  CHORUS_CHECK_LT(right, leaves.size());
  append_drawn_tree(program, leaves.first(leaves.size() - right), choose);
  append_drawn_tree(program, leaves.last(right), choose);
  program.push_back(kernels::kCombine);
}

}  // namespace

void SimWorld::plan_reduction(std::size_t size) {
  CHORUS_CHECK_GE(size, std::size_t{1});
  ++reductions_;
  reduction_program_.clear();
  if (options_.reduction_order != ReductionOrder::Fixed &&
      options_.reduction_order != ReductionOrder::Ring) {
    plan_reduction_program(size);
  }
}

void SimWorld::plan_reduction_program(std::size_t size) {
  switch (options_.reduction_order) {
    case ReductionOrder::Fixed:
    case ReductionOrder::Ring:
      return;
    case ReductionOrder::Tree:
      append_pairwise_tree(reduction_program_, 0, size);
      break;
    case ReductionOrder::Adversarial: {
      std::vector<int> left(size);  // members not yet placed, in group-rank order
      for (std::size_t j = 0; j < size; ++j) {
        left[j] = static_cast<int>(j);
      }
      std::vector<int> order;
      order.reserve(size);
      while (left.size() > 1) {
        const auto pick = static_cast<std::ptrdiff_t>(stream_.choose(left.size()));
        order.push_back(left[static_cast<std::size_t>(pick)]);
        left.erase(left.begin() + pick);
      }
      order.push_back(left.front());
      auto choose = [this](std::size_t n) { return stream_.choose(n); };
      append_drawn_tree(reduction_program_, order, choose);
      break;
    }
  }
  CHORUS_CHECK_EQ(reduction_program_.size(), 2 * size - 1);
}

void SimWorld::reduce_contributions(void* dst, const void* const* sources, std::size_t size,
                                    std::size_t count, DType dtype, const ReduceOp& reduce_op,
                                    std::int64_t seq, std::size_t ring_chunks,
                                    std::size_t ring_first_chunk) {
  if (options_.reduction_order == ReductionOrder::Fixed) {
    kernels::reduce(dst, sources, size, count, dtype, reduce_op);
    return;
  }
  reduce_in_order(dst, sources, size, count, dtype, reduce_op, seq, ring_chunks, ring_first_chunk);
}

void SimWorld::reduce_in_order(void* dst, const void* const* sources, std::size_t size,
                               std::size_t count, DType dtype, const ReduceOp& reduce_op,
                               std::int64_t seq, std::size_t ring_chunks,
                               std::size_t ring_first_chunk) {
  switch (options_.reduction_order) {
    case ReductionOrder::Fixed:
      kernels::reduce(dst, sources, size, count, dtype, reduce_op);
      return;
    case ReductionOrder::Ring: {
      CHORUS_CHECK_GE(ring_chunks, std::size_t{1});
      CHORUS_CHECK_GE(seq, 0);
      const std::size_t element = element_size(dtype);
      const std::size_t chunk_elements = (count + ring_chunks - 1) / ring_chunks;
      ring_sources_.resize(size);
      for (std::size_t c = 0; c < ring_chunks && c * chunk_elements < count; ++c) {
        const std::size_t begin = c * chunk_elements;
        const std::size_t length = std::min(chunk_elements, count - begin);
        const std::size_t start = (static_cast<std::size_t>(seq) + ring_first_chunk + c + 1) % size;
        for (std::size_t j = 0; j < size; ++j) {
          ring_sources_[j] =
              static_cast<const unsigned char*>(sources[(start + j) % size]) + begin * element;
        }
        kernels::reduce(static_cast<unsigned char*>(dst) + begin * element, ring_sources_.data(),
                        size, length, dtype, reduce_op);
      }
      return;
    }
    case ReductionOrder::Tree:
    case ReductionOrder::Adversarial:
      kernels::reduce_program(dst, sources, size, count, dtype, reduce_op, reduction_program_);
      return;
  }
}

bool SimWorld::cross_aliased(const SimGroup::Slot& slot, std::size_t op) {
  for (std::size_t j = 0; j < slot.arrivals.size(); ++j) {
    const transport::Buffer& recv = slot.arrivals[j].ops[op].recv;
    for (std::size_t k = 0; k < slot.arrivals.size(); ++k) {
      const transport::Buffer& send = slot.arrivals[k].ops[op].send;
      const bool in_place = k == j && send.data == recv.data;
      if (!in_place && overlaps(recv, send)) {
        return true;
      }
    }
  }
  return false;
}

std::string SimWorld::modified_inputs(const SimGroup& group, const SimGroup::Slot& slot) const {
  std::string detail;
  // Every completion runs this loop (with buffer checks), and almost never finds a change: it
  // walks the arrivals, the ops and the snapshots with pointers (the memcmp calls would make it
  // load each vector's bounds again), and builds the text out of line.
  const SimGroup::Arrival* const arrivals = slot.arrivals.data();
  const std::size_t members = slot.arrivals.size();
  for (std::size_t i = 0; i < members; ++i) {
    const SimGroup::Arrival& arrival = arrivals[i];
    const unsigned char* snapshot = arrival.inputs.data();  // the next op's copy
    [[maybe_unused]] const unsigned char* const snapshots_end = snapshot + arrival.inputs.size();
    const SimOp* const ops_begin = arrival.ops.data();
    const SimOp* const ops_end = ops_begin + arrival.ops.size();
    for (const SimOp* op = ops_begin; op != ops_end; ++op) {
      if (!reads_send(*op, static_cast<int>(i))) {
        continue;  // a broadcast's stand-in send on a non-root: its output, not an input
      }
      // Note [Input snapshots]: a small input against its copy, a large one by checksum.
      const transport::Buffer& send = op->send;
      const std::size_t size = send.nbytes();
      bool modified = false;
      if (size <= kInputSnapshotBytesMax) {
        // start copied this op's input here (the same test of the same op, which nothing changes
        // until the slot is recycled): true by construction, so checked in debug builds only
        // (Note [Debug-only checks]).
        CHORUS_DCHECK_LE(size, static_cast<std::size_t>(snapshots_end - snapshot));
        modified = size > 0 && std::memcmp(send.data, snapshot, size) != 0;
        snapshot += size;
      } else {
        modified = checksum_bytes(send.data, size) != op->input_hash;
      }
      if (modified) [[unlikely]] {
        append_modified_input(detail, group.ranks[i], static_cast<std::size_t>(op - ops_begin),
                              arrival, send);
      }
    }
  }
  if (!detail.empty()) {
    detail +=
        " before the collective completed: the result would depend on timing (on NCCL, a "
        "data race); wait for the collective before writing its input";
  }
  return detail;
}

void SimWorld::remember_writes(const SimGroup& group, std::int64_t seq,
                               const SimGroup::Slot& slot) noexcept {
  for (std::size_t i = 0; i < slot.arrivals.size(); ++i) {
    const SimGroup::Arrival& arrival = slot.arrivals[i];
    RankSlot& writer = ranks_[static_cast<std::size_t>(arrival.work->rank())];
    for (const SimOp& op : arrival.ops) {
      // A broadcast's root whose output is its input is not written (complete_operation).
      const bool written = writes_recv(op, static_cast<int>(i)) && op.recv.count > 0 &&
                           !(op.kind == transport::OpKind::Broadcast &&
                             op.root == static_cast<int>(i) && op.recv.data == op.send.data);
      if (!written) {
        continue;
      }
      new (&writer.recent_writes[writer.recent_writes_next].write)
          RecentWrite{op.recv.data, op.recv.nbytes(),  arrival.work->rank(), arrival.op_name(),
                      seq,          group.label.get(), arrival.site(),       completed_};
      writer.recent_writes_next = (writer.recent_writes_next + 1) % kRecentWritesMax;
      writer.recent_writes_count = std::min(writer.recent_writes_count + 1, kRecentWritesMax);
    }
  }
}

std::string SimWorld::likely_writer(const transport::Buffer& input, int rank,
                                    std::uint64_t completed_at_issue) const {
  // The input's own rank's outputs first, newest first (its collectives write its tensors),
  // then the other ranks' (a tensor shared across ranks in one process).
  const auto found = [&](const RankSlot& writer) -> const RecentWrite* {
    for (std::size_t k = 1; k <= writer.recent_writes_count; ++k) {
      const RecentWrite& write =
          writer
              .recent_writes[(writer.recent_writes_next + kRecentWritesMax - k) % kRecentWritesMax]
              .write;
      if (write.completed > completed_at_issue &&
          bytes_overlap(write.output, write.output_bytes, input.data, input.nbytes())) {
        return &write;
      }
    }
    return nullptr;
  };
  const RecentWrite* write = found(ranks_[static_cast<std::size_t>(rank)]);
  for (std::size_t other = 0; write == nullptr && other < ranks_.size(); ++other) {
    if (other != static_cast<std::size_t>(rank)) {
      write = found(ranks_[other]);
    }
  }
  if (write == nullptr) {
    return "";
  }
  return ", likely through rank " + std::to_string(write->rank) + "'s " + std::string(write->op) +
         " #" + std::to_string(write->seq) + " on group " + *write->group + " (issued at " +
         write->site.to_string() +
         "), which completed while it was pending and wrote its output there";
}

void SimWorld::append_modified_input(std::string& detail, int rank, std::size_t op,
                                     const SimGroup::Arrival& arrival,
                                     const transport::Buffer& send) const {
  detail += (detail.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) +
            " modified input " + std::to_string(op) + " of " + std::string(arrival.op_name()) +
            " (issued at " + arrival.site().to_string() + ")" +
            likely_writer(send, rank, arrival.completed_at_issue);
}

void SimWorld::wake_waiters(SimWork& work) {
  for (int rank : work.waiters()) {
    RankSlot& waiter = ranks_[static_cast<std::size_t>(rank)];
    if (waiter.phase == Phase::Blocked && waiter.blocked_on == &work) {
      set_phase(static_cast<std::size_t>(rank), Phase::Runnable);
      waiter.blocked_on = nullptr;
    }
  }
  work.clear_waiters();
}

void SimWorld::advance_completion(SimGroup& group) {
  // Nearly always no failure is recorded: tested before the map's look-up.
  while (!group.failures.empty() && group.failures.count(group.next_to_complete) != 0) {
    group.next_to_complete += 1;
  }
  update_completable(group);
}

// Note [Completable groups]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A decision's candidates are the runnable ranks, then every group whose head operation can be
// completed: the lowest outstanding seq, the next to complete, every member arrived, no Hang
// fault. Scanning the groups for them cost every decision a visit to each group's head, though
// they change only with a group's slots: an operation created, arrived at, marked with a fault,
// completed or failed, or next_to_complete moving on. So each of those places calls
// update_completable, which judges the group's head again and keeps SimGroup::completable and
// their count, completable_groups_; of the arrivals, only the one that fills its slot (start: one
// that leaves it short leaves the head short, or another slot, unchanged). A uniform choice needs
// only the count, and the group of a chosen completion is found by kth_completable (one decision in
// ten in a typical run); PCT weighs every candidate and still lists them by the scan. Either way
// the candidates, and so every seed's schedule, are the same; debug builds check the kept set
// against the scan at every decision.
void SimWorld::update_completable(SimGroup& group) noexcept {
  const bool completable = head_can_complete(group);
  if (completable != group.completable) {
    group.completable = completable;
    completable_groups_ = completable ? completable_groups_ + 1 : completable_groups_ - 1;
  }
}

Decision SimWorld::kth_completable(std::size_t k) const {
  for (const std::shared_ptr<SimGroup>& group : groups_) {
    if (group->completable && k-- == 0) {  // its head is next_to_complete
      return Decision{Decision::Kind::CompleteOp, -1, group->id, group->next_to_complete};
    }
  }
  CHORUS_CHECK(false);  // k < completable_groups_
  return Decision{};
}

void SimWorld::wake_due_ranks() {
  // Note [Deadline scan] (world.hpp): before earliest_deadline_ no blocked rank can time out
  // and no delayed rank wakes.
  if (now() < earliest_deadline_) {
    return;
  }
  earliest_deadline_ = transport::Duration::max();
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    RankSlot& slot = ranks_[r];
    if (slot.phase == Phase::Blocked && !slot.deadline.is_never() && now() >= slot.deadline.at) {
      set_phase(r, Phase::Runnable);
      slot.blocked_on = nullptr;
      slot.timed_out = true;
    } else if (slot.phase == Phase::Blocked) {
      earliest_deadline_ = std::min(earliest_deadline_, slot.deadline.at);
    } else if (slot.phase == Phase::Delayed && now() >= slot.wake_at) {
      set_phase(r, Phase::Runnable);
    } else if (slot.phase == Phase::Delayed) {
      earliest_deadline_ = std::min(earliest_deadline_, slot.wake_at);
    }
  }
}

// ---- Failures (Note [Simulator failures])

std::string SimWorld::fail_event(ErrorCode code, std::string_view detail) const {
  std::string event;  // one allocation, no temporaries
  if (options_.record_events) {
    const std::string_view code_name = error_code_name(code);
    event.reserve(code_name.size() + 2 + detail.size());
    event.append(code_name).append(": ").append(detail);
  }
  return event;
}

void SimWorld::fail_work(SimWork& work, std::exception_ptr error, std::string event) noexcept {
  unguard_outputs(work);
  work.mark_failed(std::move(error));
  record(SimEvent::Kind::Fail, work.rank(), work, std::move(event));
  wake_waiters(work);
}

// ---- The event log (Note [Event log])

template <typename Fill>
void SimWorld::append_event(Fill&& fill) noexcept {
  if (events_.size() >= options_.events_record_max) {
    ++events_not_recorded_;
    return;
  }
  // Out of memory, the log loses the event, as it does past events_record_max (Note [Operation
  // positions]: start records after the point of no return).
  const std::size_t before = events_.size();
  try {
    fill(events_.emplace_back());
  } catch (const std::bad_alloc&) {
    if (events_.size() > before) {
      events_.pop_back();  // the half-filled event
    }
    ++events_not_recorded_;
  }
}

void SimWorld::record_event(SimEvent::Kind kind, int rank, const SimWork& work,
                            std::string detail) noexcept {
  append_event([&](SimEvent& event) { fill_event(event, kind, rank, work, std::move(detail)); });
}

void SimWorld::record_rank_end(int rank) noexcept {
  const RankSlot& slot = ranks_[static_cast<std::size_t>(rank)];
  append_event([&](SimEvent& event) {
    event.kind = SimEvent::Kind::End;
    event.step = steps_;
    event.time = now();
    event.rank = rank;
    event.owner = rank;
    event.detail = slot.crashed ? slot.crash
                   : slot.threw ? "threw " + failure_text(slot)
                                : std::string("returned");
  });
}

void SimWorld::fill_event(SimEvent& event, SimEvent::Kind kind, int rank, const SimWork& work,
                          std::string detail) {
  event.kind = kind;
  event.step = steps_;
  event.time = now();
  event.rank = rank;
  event.op = work.op();
  event.comm_id = work.fingerprint().comm_id;
  event.group = work.group();
  event.seq = work.seq();
  event.owner = work.rank();
  event.site = work.site();
  event.detail = std::move(detail);
}

void SimWorld::on_work_dropped(const SimWork& work) noexcept {
  const int rank = current_rank();
  if (rank < 0) {
    return;  // a thread that is not a rank: it may not touch the world's state
  }
  try {
    mark("timeline.drop");
    record(SimEvent::Kind::Drop, rank, work);
  } catch (...) {
    // Out of memory while logging: the log loses this event.
  }
}

void SimWorld::on_work_finalized(const SimWork& work, bool at_rank_exit, bool failed) noexcept {
  const int rank = current_rank();
  if (rank < 0) {
    return;  // as on_work_dropped
  }
  try {
    mark(at_rank_exit ? "timeline.finalize.at_rank_exit" : "timeline.finalize");
    if (options_.record_events) {  // the detail is built only for the log
      record_event(
          SimEvent::Kind::Finalize, rank, work,
          std::string(at_rank_exit ? "at rank exit" : "after a drop") + (failed ? ", failed" : ""));
    }
  } catch (...) {
    // As on_work_dropped.
  }
}

bool SimWorld::choose_deferred_finalization() noexcept {
  if (!options_.choose_finalization || current_rank() < 0) {
    return false;  // no choice: finalize now (as on_work_dropped, only a rank may draw)
  }
  try {
    const bool defer = stream_.choose(2) == 1;
    mark(defer ? "finalize.deferred" : "finalize.now");
    return defer;
  } catch (...) {
    return false;  // out of memory recording the choice: finalize now
  }
}

namespace {

// Whether an operation failing with `code` is what its injected TransportError or Hang did: a
// hang ends in its waiters' Timeout, or in a Deadlock when nobody waits with a deadline.
bool fault_acted(Fault::Kind kind, ErrorCode code) {
  return kind == Fault::Kind::TransportError
             ? code == ErrorCode::TransportError
             : code == ErrorCode::Timeout || code == ErrorCode::Deadlock;
}

}  // namespace

void SimWorld::fail_slot(SimGroup& group, std::int64_t seq, ErrorCode code,
                         std::string_view detail) noexcept {
  // Note [Operation positions]: what can run out of memory is made, or replaced, first. The
  // failure, for the members arriving later (the first one recorded stays): out of memory, one of
  // the group's spare nodes with the code alone. An operation is failed only while outstanding
  // (it has a slot) or once failed (recorded already), and start keeps a spare per slot, so one
  // is always left.
  if (!group.failures.contains(seq)) {
    try {
      group.failures.try_emplace(seq, SimGroup::Failure{code, std::string(detail)});
    } catch (const std::bad_alloc&) {
      CHORUS_CHECK(group.slots.contains(seq));
      CHORUS_CHECK(!group.spare_failures.empty());
      SimGroup::Failures::node_type spare =
          group.spare_failures.extract(std::prev(group.spare_failures.end()));
      spare.key() = seq;
      spare.mapped().code = code;
      spare.mapped().detail.clear();
      group.failures.insert(std::move(spare));  // allocates nothing
    }
  }
  advance_completion(group);
  auto it = group.slots.find(seq);
  if (it == group.slots.end()) {
    return;
  }
  // Every member's error and Fail event text, while the slot stands: out of memory, an error of
  // the same code with a fixed text, and an event without its detail.
  const std::size_t members = it->second.arrivals.size();
  CHORUS_CHECK_LE(members, failing_errors_.size());
  for (std::size_t i = 0; i < members; ++i) {
    const SimGroup::Arrival& arrival = it->second.arrivals[i];
    if (!arrival.arrived) {
      continue;
    }
    failing_errors_[i] = make_error_or(code, *arrival.work, detail,
                                       out_of_memory_errors()[static_cast<std::size_t>(code)]);
    try {
      failing_events_[i] = fail_event(code, detail);
    } catch (const std::bad_alloc&) {
      failing_events_[i].clear();
    }
  }
  SimGroup::Slot slot = std::move(it->second);
  group.slots.erase(it);
  update_completable(group);
  // Note [Fault injection]: a fault whose operation failed for another reason never acted.
  if (slot.fault && !fault_acted(slot.fault->kind, code)) {
    withdraw_fault(*slot.fault, slot.fault_random);
  }
  for (std::size_t i = 0; i < members; ++i) {
    if (slot.arrivals[i].arrived) {
      fail_work(*slot.arrivals[i].work, std::move(failing_errors_[i]),
                std::move(failing_events_[i]));
      failing_errors_[i] = nullptr;
    }
  }
  notify_off_rank_waiters();
}

void SimWorld::abort_group(SimGroup& group, std::int64_t from_seq, const std::string& reason) {
  if (group.aborted_from >= 0 && group.aborted_from <= from_seq) {
    return;
  }
  // What can run out of memory first: a refusal changes nothing.
  const std::string detail = "the communicator was aborted: " + reason;
  group.abort_reason = reason;
  group.aborted_from = from_seq;
  fail_slots_from(group, from_seq, detail);
}

void SimWorld::abort_group_or_out_of_memory(SimGroup& group, std::int64_t from_seq,
                                            std::string_view before, std::int64_t seq,
                                            std::string_view after) noexcept {
  if (group.aborted_from >= 0 && group.aborted_from <= from_seq) {
    return;  // as abort_group, before making a reason
  }
  try {
    std::string reason(before);
    reason += std::to_string(seq);
    reason += after;
    abort_group(group, from_seq, reason);
  } catch (const std::bad_alloc&) {
    abort_group_out_of_memory(group, from_seq);
  }
}

void SimWorld::abort_group_out_of_memory(SimGroup& group, std::int64_t from_seq) noexcept {
  if (group.aborted_from >= 0 && group.aborted_from <= from_seq) {
    return;
  }
  group.abort_reason.assign(kOutOfMemoryAbortReason);  // within the room group_for made
  group.aborted_from = from_seq;
  fail_slots_from(group, from_seq, kOutOfMemoryAbortDetail);
}

void SimWorld::fail_slots_from(SimGroup& group, std::int64_t from_seq,
                               std::string_view detail) noexcept {
  // fail_slot takes each slot away.
  for (auto it = group.slots.lower_bound(from_seq); it != group.slots.end();
       it = group.slots.lower_bound(from_seq)) {
    fail_slot(group, it->first, ErrorCode::Aborted, detail);
  }
}

std::string SimWorld::failure_text(const RankSlot& slot) {
  // Empty where the rank ran out of memory describing its error (describe_failure).
  return slot.failure.empty() && slot.error ? describe(slot.error) : slot.failure;
}

std::pair<ErrorCode, std::string> SimWorld::absence(const SimGroup& group,
                                                    std::size_t member) const {
  const int rank = group.ranks[member];
  const RankSlot& slot = ranks_[static_cast<std::size_t>(rank)];
  if (slot.crashed) {
    return {ErrorCode::RankFailure, slot.crash};
  }
  if (slot.may_still_arrive()) {
    return {ErrorCode::Aborted, {}};
  }
  // Where the member stopped on this group: a skipped collective shows as the later operations
  // pairing with the wrong calls, which the member's last site points at.
  const std::int64_t issued = group.issued[member];
  const std::string last = issued == 0 ? "it issued no operation on this group"
                                       : "its last operation on this group was #" +
                                             std::to_string(issued - 1) + ", issued at " +
                                             group.last_sites[member].to_string();
  if (slot.threw) {
    return {ErrorCode::RankFailure, "rank " + std::to_string(rank) +
                                        " failed before joining this collective (" + last +
                                        "): " + failure_text(slot)};
  }
  return {ErrorCode::Deadlock, "rank " + std::to_string(rank) +
                                   " returned from its rank function without joining this "
                                   "collective (" +
                                   last + "; on NCCL this would hang)"};
}

void SimWorld::check_absent_members(SimGroup& group, std::int64_t seq) {
  if (auto it = group.slots.find(seq); it != group.slots.end()) {
    check_absent_members(group, seq, it->second);
  }
}

void SimWorld::check_absent_members(SimGroup& group, std::int64_t seq, const SimGroup::Slot& slot) {
  if (slot.arrived == static_cast<int>(group.ranks.size())) {
    return;  // the last member just arrived: nobody is missing (the common case at the last)
  }
  for (std::size_t i = 0; i < group.ranks.size(); ++i) {
    if (slot.arrivals[i].arrived) {
      continue;
    }
    if (ranks_[static_cast<std::size_t>(group.ranks[i])].may_still_arrive()) {
      continue;  // absence's empty answer, without making it
    }
    ErrorCode code = ErrorCode::Aborted;
    std::string why;
    try {
      std::tie(code, why) = absence(group, i);
    } catch (const std::bad_alloc&) {
      // Note [Operation positions]: out of memory describing the absent member, the operation
      // fails all the same, with absence()'s code and a fixed text.
      const RankSlot& absent = ranks_[static_cast<std::size_t>(group.ranks[i])];
      fail_slot(group, seq,
                absent.crashed || absent.threw ? ErrorCode::RankFailure : ErrorCode::Deadlock,
                kAbsentOutOfMemoryDetail);
      return;
    }
    if (!why.empty()) {
      fail_slot(group, seq, code, why);
      return;
    }
  }
}

void SimWorld::on_rank_exit(int rank) noexcept {
  for (const std::shared_ptr<SimGroup>& group : groups_) {
    const int group_rank = group->group_rank_of(rank);
    if (group_rank < 0) {
      continue;
    }
    // Slot by slot, allocating nothing (the rank's memory may be what ran out): checking one may
    // erase it, so the next is looked up after it.
    for (auto it = group->slots.begin(); it != group->slots.end();) {
      const std::int64_t seq = it->first;
      check_absent_members(*group, seq);
      it = group->slots.upper_bound(seq);
    }
  }
}

std::string SimWorld::rank_table() const {
  std::ostringstream out;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    const RankSlot& slot = ranks_[r];
    out << "\n  rank " << r << ": ";
    switch (slot.phase) {
      case Phase::Runnable:
        out << (slot.exited ? "ended, completing its un-waited collectives" : "runnable");
        break;
      case Phase::Delayed:
        out << "delayed by an injected fault until virtual time "
            << std::chrono::duration<double>(slot.wake_at).count() << " s";
        break;
      case Phase::Finished:
        out << (slot.failed ? "ended with an error: " + failure_text(slot) : "finished");
        break;
      case Phase::Blocked: {
        const SimWork& work = *slot.blocked_on;
        out << "waiting in ";
        if (work.rank() != static_cast<int>(r)) {
          out << "rank " << work.rank() << "'s ";
        }
        out << work.op() << " #" << work.seq() << " on group " << work.group();
        const SimGroup& group = *groups_[work.fingerprint().comm_id - 1];
        auto it = group.slots.find(work.seq());
        if (it != group.slots.end()) {
          out << " (issued at " << work.site().to_string() << ")";
          if (const std::string missing = group.missing_members(work.seq()); !missing.empty()) {
            out << "; not yet joined by rank(s) " << missing;
          } else if (it->second.fault) {
            out << "; " << it->second.fault_detail;
          } else if (group.next_to_complete != work.seq()) {
            out << "; queued behind #" << group.next_to_complete << " of the same group";
          }
        }
        break;
      }
    }
  }
  return out.str();
}

bool SimWorld::fail_group_mismatches() {
  // For each pair of blocked ranks a < b: a waits on an operation of group G that b has not
  // joined, b waits on one of group H != G that a has not joined, and each group holds the other
  // rank. Each waits for the other to join its group first: they disagree on the group.
  struct Waiting {
    int rank;
    SimGroup* group;
    std::int64_t seq;
    const SimGroup::Arrival* arrival;  // the waiter's own arrival, for its call site
  };
  // Messages first: failing a slot erases it, and `arrival` points into it.
  struct Disagreement {
    Waiting a;
    Waiting b;
    std::string detail;
  };
  std::vector<Disagreement> disagreements;
  // Note [Operation positions]: out of memory finding them, nothing failed yet, and the ranks are
  // declared deadlocked instead.
  try {
    std::vector<Waiting> waiting;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      const RankSlot& slot = ranks_[r];
      if (slot.phase != Phase::Blocked || slot.blocked_on->rank() != static_cast<int>(r)) {
        continue;
      }
      SimGroup& group = group_of(*slot.blocked_on);
      const std::int64_t seq = slot.blocked_on->fingerprint().seq;
      auto it = group.slots.find(seq);
      if (it != group.slots.end()) {
        const int me = group.group_rank_of(static_cast<int>(r));
        waiting.push_back(Waiting{static_cast<int>(r), &group, seq,
                                  &it->second.arrivals[static_cast<std::size_t>(me)]});
      }
    }
    const auto has_not_joined = [](const Waiting& w, int rank) {
      const int member = w.group->group_rank_of(rank);
      return member >= 0 &&
             !w.group->slots.at(w.seq).arrivals[static_cast<std::size_t>(member)].arrived;
    };
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      for (std::size_t j = i + 1; j < waiting.size(); ++j) {
        const Waiting& a = waiting[i];
        const Waiting& b = waiting[j];
        if (a.group == b.group || !has_not_joined(a, b.rank) || !has_not_joined(b, a.rank)) {
          continue;
        }
        std::ostringstream detail;
        detail << "ranks disagree on the group of their next collective: rank " << a.rank
               << " waits in " << a.arrival->op_name() << " #" << a.seq << " on group "
               << *a.group->label << " (issued at " << a.arrival->site().to_string()
               << ") while rank " << b.rank << " waits in " << b.arrival->op_name() << " #" << b.seq
               << " on group " << *b.group->label << " (issued at " << b.arrival->site().to_string()
               << "); each group holds both ranks, so neither can complete";
        disagreements.push_back(Disagreement{a, b, detail.str()});
      }
    }
  } catch (const std::bad_alloc&) {
    return false;
  }
  for (const Disagreement& disagreement : disagreements) {
    for (const Waiting& side : {disagreement.a, disagreement.b}) {
      if (side.group->slots.count(side.seq) != 0) {
        fail_slot(*side.group, side.seq, ErrorCode::CollectiveMismatch, disagreement.detail);
        abort_group_or_out_of_memory(*side.group, side.seq + 1, "operation #", side.seq,
                                     " was a collective mismatch");
      }
    }
  }
  return !disagreements.empty();
}

void SimWorld::declare_deadlock(std::string_view why) noexcept {
  // Note [Operation positions]: out of memory describing the ranks, the detail is `why` alone.
  std::string described;
  try {
    described.reserve(why.size() + 1);
    described.append(why).append(":").append(rank_table());
  } catch (const std::bad_alloc&) {
    described.clear();
  }
  const std::string_view detail = described.empty() ? why : std::string_view(described);
  for (const std::shared_ptr<SimGroup>& group : groups_) {
    if (!group->slots.empty()) {
      // No rank runs meanwhile: the slots are those outstanding now, each failed in turn.
      const std::int64_t first = group->slots.begin()->first;
      while (!group->slots.empty()) {
        fail_slot(*group, group->slots.begin()->first, ErrorCode::Deadlock, detail);
      }
      abort_group_or_out_of_memory(*group, first, "operation #", first, " deadlocked");
    }
  }
  // Every blocked rank waited on an outstanding operation, so all of them can run now.
  for (const RankSlot& slot : ranks_) {
    CHORUS_CHECK(slot.phase != Phase::Blocked);
  }
}

// ---- Faults (Note [Fault injection], Note [Virtual time skip], Note [Liveness phase])

namespace {

// A literal: withdraw_fault, in fail_slot, must not allocate (Note [Operation positions]). Each is
// "fault." and the kind's name in sim_run.cpp (name(Fault::Kind)), which record_fault checks.
std::string_view fault_mark(Fault::Kind kind) noexcept {
  switch (kind) {
    case Fault::Kind::Crash:
      return "fault.crash";
    case Fault::Kind::TransportError:
      return "fault.transport_error";
    case Fault::Kind::Hang:
      return "fault.hang";
    case Fault::Kind::Delay:
      return "fault.delay";
  }
  return "fault.unknown";
}

}  // namespace

void SimWorld::record_fault(const Fault& fault, bool random) {
  // What can run out of memory first, so that a refusal records nothing: room in faults_fired_,
  // then the marks (the second refused, the first is taken back).
  if (faults_fired_.size() == faults_fired_.capacity()) {
    faults_fired_.reserve(std::max<std::size_t>(4, 2 * faults_fired_.capacity()));
  }
  const std::string_view kind_mark = fault_mark(fault.kind);
  // "fault." and sim_run.cpp's name(kind): the names a report's reader looks for.
  CHORUS_CHECK(kind_mark.substr(std::string_view("fault.").size()) == name(fault.kind));
  mark(kind_mark);
  if (random) {
    try {
      mark("fault.random");
    } catch (const std::bad_alloc&) {
      unmark(kind_mark);
      throw;
    }
    random_faults_fired_ += 1;
  }
  faults_fired_.push_back(fault);  // room made above: no allocation
}

void SimWorld::withdraw_fault(const Fault& fault, bool random) {
  // random_faults_fired_ keeps counting it: the window never reopens once closed, so the
  // liveness phase, once begun, sees no new fault (Note [Liveness phase]).
  unmark(fault_mark(fault.kind));
  if (random) {
    unmark("fault.random");
  }
  const auto recorded = std::find(faults_fired_.rbegin(), faults_fired_.rend(), fault);
  CHORUS_CHECK(recorded != faults_fired_.rend());
  faults_fired_.erase(std::next(recorded).base());
}

void SimWorld::mark_slot_fault(SimGroup::Slot& slot, const FiredFault& fired) {
  const Fault::Kind kind = fired.fault.kind;
  // Note [Fault injection]: a Hang preempts a TransportError; of two of one kind the first stays.
  if (slot.fault &&
      (slot.fault->kind != Fault::Kind::TransportError || kind != Fault::Kind::Hang)) {
    return;
  }
  // Note [Operation positions]: what can run out of memory first (the detail, then the record,
  // which undoes itself when refused), so that a std::bad_alloc leaves the slot's fault and the
  // faults recorded as they were; withdrawing the replaced one and assigning allocate nothing.
  std::string detail = kind == Fault::Kind::Hang ? "it hung" : "the transport reported a failure";
  detail += " (injected fault: ";
  detail += fired.fault.to_string();
  detail += ")";
  record_fault(fired.fault, fired.random);
  if (slot.fault) {
    withdraw_fault(*slot.fault, slot.fault_random);
  }
  slot.fault = fired.fault;
  slot.fault_random = fired.random;
  slot.fault_detail = std::move(detail);
}

std::vector<SimWorld::FiredFault> SimWorld::fire_faults(int rank, std::uint64_t op_index) {
  std::vector<FiredFault> firing;
  for (std::size_t i = 0; i < options_.faults.size(); ++i) {
    const Fault& fault = options_.faults[i];
    if (!fault_spent_[i] && fault.rank == rank && fault.at_op == op_index) {
      fault_spent_[i] = true;
      firing.push_back({fault, false});
    }
  }
  const auto is = [](Fault::Kind kind) {
    return [kind](const FiredFault& fired) { return fired.fault.kind == kind; };
  };
  // A crash here ends the rank before it arrives: a transport error or hang of this operation
  // never happens (and is not reported), a delay happens first.
  if (const auto crash = std::ranges::find_if(firing, is(Fault::Kind::Crash));
      crash != firing.end()) {
    const FiredFault fatal = *crash;
    std::erase_if(firing, std::not_fn(is(Fault::Kind::Delay)));
    firing.push_back(fatal);
  }
  // A hang means the operation never completes, so a transport error there (raised where it
  // would have completed) never happens either, and is not reported.
  if (std::ranges::any_of(firing, is(Fault::Kind::Hang))) {
    std::erase_if(firing, is(Fault::Kind::TransportError));
  }
  // A Delay or Crash acts now; a TransportError or Hang once it marks its slot (start).
  const auto record_if_acting = [this](const FiredFault& fired) {
    if (fired.fault.kind == Fault::Kind::Delay || fired.fault.kind == Fault::Kind::Crash) {
      record_fault(fired.fault, fired.random);
    }
  };
  for (const FiredFault& fired : firing) {
    record_if_acting(fired);
  }
  CHORUS_CHECK_GE(steps_, 1u);  // a rank runs only inside a decision, which counted itself
  const bool draw = firing.empty() && random_window_open(steps_ - 1);
  if (!draw) {  // an explicit fault here, or the window is closed: no random one
    return firing;
  }
  const RandomFaults& random = options_.random_faults;
  // One choice among kMillion, read as offset (choice - 1) mod kMillion: an offset below total
  // is a fault (by kind, in the order of `kinds`). Choices 1..total so fire, and choice 0 (a
  // shrunk list's, or past a list's end) is offset 999'999: no fault unless the total is
  // certainty. The small indices a generated list starts with reach faults (sim::gen_choices).
  constexpr std::uint64_t kMillion = 1'000'000;
  const std::uint64_t ppm[] = {random.crash_ppm, random.transport_error_ppm, random.hang_ppm,
                               random.delay_ppm};
  const Fault::Kind kinds[] = {Fault::Kind::Crash, Fault::Kind::TransportError, Fault::Kind::Hang,
                               Fault::Kind::Delay};
  std::uint64_t total = 0;
  for (std::uint64_t p : ppm) {
    total += p;
  }
  CHORUS_CHECK_LE(total, kMillion);  // checked by sim::simulate
  const std::uint64_t choice = stream_.choose(kMillion);
  std::uint64_t offset = (choice + kMillion - 1) % kMillion;
  if (offset >= total) {
    return firing;
  }
  for (std::size_t k = 0; k < std::size(kinds); ++k) {
    if (offset < ppm[k]) {
      Fault fault{kinds[k], rank, op_index, 0};
      if (fault.kind == Fault::Kind::Delay) {
        fault.delay_steps = 1 + stream_.choose(random.delay_steps_max);  // >= 1: sim::simulate
      }
      firing.push_back({fault, true});
      record_if_acting(firing.back());
      return firing;
    }
    offset -= ppm[k];
  }
  CHORUS_CHECK(false);  // offset < total
  return firing;
}

void SimWorld::stall(int rank, std::uint64_t steps) {
  CHORUS_CHECK_GE(steps, 1u);
  RankSlot& slot = ranks_[static_cast<std::size_t>(rank)];
  CHORUS_CHECK(slot.phase == Phase::Runnable);
  set_phase(static_cast<std::size_t>(rank), Phase::Delayed);
  slot.wake_at = saturating_add(now(), kStepDuration * static_cast<std::int64_t>(steps));
  earliest_deadline_ = std::min(earliest_deadline_, slot.wake_at);
  yield(rank);
  CHORUS_CHECK(slot.phase == Phase::Runnable);
}

void SimWorld::stop_rank(int rank, const SimGroup& group, const transport::OpInfo& info) {
  ++marks_["livelock.rank_stopped"];
  throw RankStopped{std::make_exception_ptr(Deadlock(
      ErrorContext{rank, std::string(info.name), info.seq, *group.label},
      "rank " + std::to_string(rank) + " still issued operations " +
          std::to_string(steps_ - options_.max_steps) +
          " scheduling decisions after the step budget (SimOptions::max_steps = " +
          std::to_string(options_.max_steps) +
          ") ran out, catching the errors they raised, so the simulator stopped it (catch only "
          "the errors you mean to retry, such as Aborted or TransportError)"))};
}

void SimWorld::throw_crashed(int rank, const SimGroup& group, const transport::OpInfo& info) const {
  throw RankFailure(ErrorContext{rank, std::string(info.name), info.seq, *group.label},
                    ranks_[static_cast<std::size_t>(rank)].crash);
}

void SimWorld::crash(int rank, const SimGroup& group, const transport::OpInfo& info,
                     std::uint64_t op_index) {
  RankSlot& slot = ranks_[static_cast<std::size_t>(rank)];
  CHORUS_CHECK(slot.may_still_arrive());  // start refuses an exited or crashed rank
  // Note [Operation positions]: what can run out of memory (the text, the list of operations in
  // flight) is made before the rank is marked crashed; a std::bad_alloc here leaves it alive, the
  // Crash fired and spent, like any start that threw. Until 2026-12-07 the rank was marked first:
  // a refusal left it crashed without a text (its RankFailure said nothing) and its operations in
  // flight not failed.
  std::string text = "rank " + std::to_string(rank) +
                     " crashed (injected fault: " + Fault::crash(rank, op_index).to_string() +
                     ", starting " + std::string(info.name) + " #" + std::to_string(info.seq) +
                     " on group " + *group.label + ")";
  std::vector<std::pair<SimGroup*, std::int64_t>> in_flight;
  for (const std::shared_ptr<SimGroup>& member_of : groups_) {
    if (member_of->group_rank_of(rank) >= 0) {
      for (const auto& [seq, outstanding] : member_of->slots) {
        in_flight.emplace_back(member_of.get(), seq);
      }
    }
  }
  ++ranks_gone_;  // Note [Absent members]
  slot.crashed = true;
  slot.crash = std::move(text);
  // Its operations in flight die with it; those it has not joined yet fail through absence().
  for (const auto& [member_of, seq] : in_flight) {
    fail_slot(*member_of, seq, ErrorCode::RankFailure, slot.crash);  // never throws
  }
  throw_crashed(rank, group, info);
}

bool SimWorld::skip_virtual_time() {
  // Only a fault stalls the world in a way that time resolves.
  transport::Duration next = transport::Duration::max();
  bool hung = false;
  for (const RankSlot& slot : ranks_) {
    if (slot.phase == Phase::Delayed) {
      next = std::min(next, slot.wake_at);
    }
  }
  for (const std::shared_ptr<SimGroup>& group : groups_) {
    for (const auto& [seq, slot] : group->slots) {
      hung = hung || slot.hangs();
    }
  }
  if (next == transport::Duration::max() && !hung) {
    return false;
  }
  for (const RankSlot& slot : ranks_) {
    if (slot.phase == Phase::Blocked && !slot.deadline.is_never()) {
      next = std::min(next, slot.deadline.at);
    }
  }
  if (next == transport::Duration::max()) {
    return false;  // a hang nobody waits on with a deadline: declare_deadlock names it
  }
  // wake_due_ranks ran: every wake-up and deadline still pending lies ahead.
  CHORUS_CHECK(next > now());
  now_ns_.store(next.count(), std::memory_order_relaxed);
  earliest_deadline_ = std::min(earliest_deadline_, next);
  mark("fault.time_skip");
  return true;
}

bool SimWorld::random_window_open(std::uint64_t decision) const {
  const RandomFaults& random = options_.random_faults;
  return random.enabled() && random_faults_fired_ < random.max_faults &&
         (random.until_step == 0 || decision < random.until_step);
}

bool SimWorld::faults_over() const {
  if (random_window_open(steps_)) {  // between decisions: steps_ is the next one's index
    return false;
  }
  // A delayed rank is still inside its fault: the phase starts once it woke.
  if (std::ranges::any_of(ranks_,
                          [](const RankSlot& slot) { return slot.phase == Phase::Delayed; })) {
    return false;
  }
  // So is an operation that hangs: it ends when a wait on it times out (its members' errors),
  // and until then the ranks waiting on it are stuck by the fault, not by the program.
  for (const std::shared_ptr<SimGroup>& group : groups_) {
    if (std::ranges::any_of(group->slots, [](const auto& entry) { return entry.second.hangs(); })) {
      return false;
    }
  }
  for (std::size_t i = 0; i < options_.faults.size(); ++i) {
    const RankSlot& slot = ranks_[static_cast<std::size_t>(options_.faults[i].rank)];
    if (!fault_spent_[i] && !slot.exited && !slot.crashed) {
      return false;
    }
  }
  return true;
}

bool SimWorld::check_liveness() {
  if (!liveness_from_) {
    if (!faults_over()) {
      return false;
    }
    liveness_from_ = steps_;
    mark("liveness.phase");
  }
  if (!liveness_violation_.empty() || steps_ - *liveness_from_ < options_.liveness_steps) {
    return false;
  }
  std::string stuck;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].phase != Phase::Finished) {
      stuck_ranks_.push_back(static_cast<int>(r));
      stuck += (stuck.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  CHORUS_CHECK(!stuck_ranks_.empty());  // the scheduler had candidates
  liveness_violation_ = "liveness violated: rank(s) " + stuck +
                        " did not finish within SimOptions::liveness_steps = " +
                        std::to_string(options_.liveness_steps) +
                        " scheduling decisions once no fault could fire (from decision " +
                        std::to_string(*liveness_from_) + ")";
  mark("liveness.violation");
  declare_deadlock(liveness_violation_);
  return true;
}

}  // namespace chorus::sim::detail
