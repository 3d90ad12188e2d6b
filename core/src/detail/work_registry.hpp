#pragma once

// Note [Work lifecycle]
// The work registry is the seed's data_ptr -> Work map, done right. One per rank.
//
// 1. Issue. A collective starts a transport Work and registers one PendingWork under each output
//    storage (one storage for a single op, k for a coalesced op: still one PendingWork). Each
//    registration raises the storage's pending count (Note [Pending storage]).
// 2. Wait. wait_tensor, wait_tensors and every data access reach wait_storage/wait_storages: the
//    transport Work is waited outside the registry lock, its completion fixup runs once, then
//    the work is *retired*: it leaves the registry and every storage it sits under. Retiring is
//    idempotent, so concurrent waiters from several threads are safe and the first one wins.
//    The works of one wait (wait_tensors' works of one registry, or several works pending on one
//    storage) are completed together: in the order found, under one deadline, and each retired
//    with its own error (the first error is rethrown).
// 3. Drop. When the last Tensor of a pending storage dies, Storage::~Storage calls
//    on_storage_dropped: the storage's entries leave; a work left with no storage is completed
//    right there (the seed's finalizer policy: never leave a collective dangling) and recorded as
//    unwaited with its call site. A failure while completing is recorded (report + deferred
//    error raised at the rank's next collective or explicit wait, or when the rank ends), never
//    thrown from the destructor; every wait has a deadline, so the destructor cannot block
//    forever. A drop during exception unwinding is completed later instead (at the rank's next
//    collective or its end): the unwinding rank will not issue the collectives its peers may be
//    waiting for, so waiting there could only end in a misleading deadlock. Any other drop is
//    deferred the same way when the transport work asks for it (defer_finalization): when a
//    dropped result is finalized is not fixed on a real runtime, and the simulator makes it a
//    choice of its decision stream. A deferred drop is completed by settle_unwaited (the rank's
//    next collective, wait_tensor, wait_tensors, work_registry_size) or at rank exit, and is
//    reported as dropped (not "at exit"), as list_drops was when it was dropped, even when the
//    finalization of another deferred drop at the exit dropped it (a work already taken as a
//    leftover stays "at exit"); a failure is raised by that same settle_unwaited.
// 4. Rank exit. RankContext::finish completes whatever is left and records it as unwaited at
//    exit, so work_registry_size() is 0 after every rank.
// Works completed together (the works of one wait, deferred drops, leftovers at exit) share one
// deadline: now plus the rank's timeout when the batch began (for a wait: when the first of its
// works needed a host wait). Deferred drops and leftovers are completed and reported in the order
// they were issued. The rank's exit is one batch (deferred drops, leftovers, drops finalizing
// elsewhere, stream-waited works), so K leftovers whose peer is stuck cost one timeout, not K,
// and so do K stuck works waited by one wait_tensors (until 2026-12-04 each took its own).
// The transport work hears of steps 3 and 4 (transport::Work::on_dropped when its last storage
// goes, on_finalized once core completed it as unwaited), so that a transport can log them: the
// simulator's event log draws drops and finalizations (Note [Event log], simulator/src/world.hpp).
//
// Note [Registry links]
// The registry is keyed by storage identity, never by raw address. A storage lists its pending
// works and a work lists its storages, both in place (StampedLinks: one link inline, which is
// nearly always all), and the registry lists its works in issue order; every link is guarded by
// the registry's mutex. Every storage and every work carries a generation from a process-wide
// counter (never reused), and every link is stamped with its target's generation and checked
// against it whenever it is followed. A new storage at a recycled address starts with no links
// and a new generation, so it can never match a stale entry; a work that left the registry is
// marked so, and a late cleanup of an old work cannot touch newer entries. A storage may hold
// several pending works, and one work may sit under several storages, without duplicates.
// Registering and retiring a work finds nothing by hashing and touches no heap memory after the
// first few collectives (the work list keeps its capacity).
//
// Note [Registration]
// Once the transport has started an operation, core must not lose it: a started operation whose
// Work is destroyed unwaited is abandoned silently, and its peers may wait for it. So everything
// its registration needs is made before the start (Call::start): the PendingWork, built without
// its transport work, the fixup, the list of output storages, and room in the registry
// (WorkRegistry::reserve: a slot in the work list, and a link in each output storage's list and in
// the work's own). Reserving is all or nothing and may throw std::bad_alloc; then nothing has
// started and no sequence number is taken. After the start, PendingWork::attach and
// WorkRegistry::add_reserved only fill what was reserved: they allocate nothing and cannot throw,
// so every started operation is registered, and waitable. Room reserved and never filled (the
// transport's call threw) is given back at once, while the outputs are still alive
// (cancel_reservation, from Call::register_work: later, unwinding may have destroyed them), and so
// is the sequence number: an operation whose transport call threw took no position in its
// communicator's order, and the next call gets the same number (Note [Transport contract]).
// Reserved room is counted (the registry's and each StampedLinks'), so another thread registering
// meanwhile cannot use it up. The hot path allocates what it did before (the PendingWork, a second
// storage's link), only earlier; the reservation itself allocates only when a list must grow, as a
// push would have. It takes the registry's mutex twice (reserve, add_reserved), uncontended, where
// add took it once.
//
// Note [Atomic counts per operation]
// In a process that has ever run a second thread (every MPI or NCCL process: those libraries
// start threads of their own), each std::shared_ptr or std::weak_ptr copy and release is an
// atomic read-modify-write, ~20 cycles even uncontended; libstdc++ counts with plain
// increments only while the process has one thread. bench_registry's issue-and-wait took
// 283-298 ns with one thread and 400-408 ns once a thread had existed, ~34 locked instructions
// per operation, so the per-operation path moves owners instead of copying them where a copy
// bought nothing: the registry takes its PendingWork by move (add_reserved), a storage takes
// its registry's weak pointer only when it first attaches (Storage::attach_registry), and a
// rank waiting on a storage it made uses its own registry directly instead of locking the
// storage's weak pointer (Storage::wait_ready_slow; the maker's registry is alive while the
// rank runs, and the only one a storage's works are registered with).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/call_site.hpp"
#include "chorus/runtime.hpp"
#include "chorus/transport/futex_mutex.hpp"
#include "chorus/transport/group_label.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/current_streams.hpp"
#include "detail/stamped_links.hpp"

namespace chorus::detail {

class Storage;
class WorkRegistry;

// What the report and error messages say about a work.
struct WorkInfo {
  int rank = -1;
  std::string_view op;  // the API name: a string literal (transport::OpInfo::name)
  std::int64_t seq = -1;
  transport::GroupLabel group;  // Note [Shared group labels] (chorus/transport/group_label.hpp)
  CallSite site;
};

// A work's own part of its WorkInfo: all but the group, which the work borrows (PendingWork::
// group(); Note [Borrowed group labels]).
struct WorkPosition {
  int rank = -1;
  std::string_view op;  // the API name: a string literal (transport::OpInfo::name)
  std::int64_t seq = -1;
  CallSite site;
};

// How a wait completes a work: DESIGN 2.4's device semantics.
enum class Completion : std::uint8_t {
  Host,    // CPU outputs: the host blocks until the transport work finished
  Stream,  // CUDA outputs: the device's current stream waits on it (Work::wait_on), no host block
};

// Where a Completion::Stream work finds the stream its wait orders: the rank's current stream of
// the outputs' device when the wait runs (Note [Current stream]). Empty: the legacy default
// stream.
struct StreamSource {
  std::shared_ptr<const CurrentStreams> streams;
  int device_index = -1;

  void* current() const { return streams != nullptr ? streams->get(device_index) : nullptr; }
};

// One issued collective as core sees it: the transport Work plus what must happen when it
// completes. Thread-safe.
class PendingWork {
 public:
  // `fixup` runs once, after the transport work completed successfully, before any waiter
  // returns (e.g. all_gather's rearrangement for gather_dim != 0). It must not wait on any
  // storage; Completion::Stream works have none (a host fixup cannot follow a stream wait).
  // `timeout` bounds each wait on `transport`'s clock.
  PendingWork(std::shared_ptr<transport::Work> work, WorkInfo info, std::function<void()> fixup,
              std::shared_ptr<transport::Transport> transport, transport::Duration timeout,
              Completion completion = Completion::Host, StreamSource stream = {});
  // The same without its transport work, made before the operation starts (Note [Registration]):
  // attach() gives it the work once started. Nothing but attach() may be called before that.
  // Its arguments by reference: made for every collective (through std::allocate_shared, which
  // forwards them), where by-value parameters cost one more move and destruction each. Its
  // position is made in place from the parts, without `group`: the work borrows that label
  // (group(); Note [Borrowed group labels]), which must outlive the work's time listed.
  PendingWork(int rank, std::string_view op, std::int64_t seq, const transport::GroupLabel& group,
              CallSite site, std::function<void()>&& fixup,
              const std::shared_ptr<transport::Transport>& transport, transport::Duration timeout,
              Completion completion = Completion::Host, StreamSource&& stream = {});
  // Gives a PendingWork made without its transport work that work (not null), once, before it is
  // registered. Never throws.
  void attach(std::shared_ptr<transport::Work> work) noexcept;

  // Completion::Host: waits for the transport work and runs the fixup once. Completion::Stream:
  // orders the current stream (StreamSource) after it (what follows on the stream sees the result;
  // the host does not wait). Rethrows the work's error (every call, for every caller; a stream wait
  // sees only errors known by then). Idempotent. A host wait lasts until now plus the timeout.
  void complete() const;
  // The same, with the host wait lasting until `at` (on the transport's clock): works completed
  // together share one deadline (Note [Work lifecycle], step 4).
  void complete(transport::Duration at) const;
  // For a Completion::Stream work after its stream wait (Note [Stream-waited works]): blocks the
  // host until the transport work finished or `at` (on the transport's clock) passed; rethrows
  // its error.
  void finish_on_host(transport::Duration at) const;
  // Now plus the timeout, on the transport's clock (saturating).
  transport::Duration deadline_from_now() const;

  // A generation from a process-wide counter, never reused (Note [Registry links]).
  std::uint64_t generation() const noexcept { return generation_; }
  Completion completion() const noexcept { return completion_; }
  // Its rank, op, seq and call site; its group is group().
  const WorkPosition& position() const noexcept { return position_; }
  // The label of the work's group (read only while the work is listed and unclaimed: Note
  // [Borrowed group labels]).
  const transport::GroupLabel& group() const noexcept { return *group_; }
  const transport::Work& work() const noexcept { return *work_; }

 private:
  friend class WorkRegistry;

  std::uint64_t generation_;
  std::shared_ptr<transport::Work> work_;
  WorkPosition position_;
  const transport::GroupLabel* group_;  // *own_group_, or the label it borrows (never null)
  // Only a work made from a WorkInfo (tests) owns its label: a work made from parts, every
  // collective's, held an empty GroupLabel that it made and ended for nothing (~8 instructions an
  // operation; Note [Borrowed group labels]).
  std::unique_ptr<const transport::GroupLabel> own_group_;
  std::function<void()> fixup_;
  mutable std::once_flag fixup_once_;
  std::shared_ptr<transport::Transport> transport_;
  transport::Duration timeout_;
  Completion completion_;
  StreamSource stream_;

  // The registry's links (Note [Registry links]), guarded by its mutex.
  static constexpr std::size_t kNotListed = static_cast<std::size_t>(-1);
  const WorkRegistry* owner_ = nullptr;   // the registry that lists it; null once retired
  std::size_t slot_ = kNotListed;         // index in owner_->works_ while listed
  StampedLinks<const Storage> storages_;  // valid while listed: ~Storage unlists itself first
  bool dropped_ = false;  // every storage is gone; the work stays until it completes
  // Whether its drop gets a report line: list_drops when it was dropped, not when a deferred drop
  // is completed (RankContext::list_drops applies to the drops made from then on).
  bool drop_listed_ = true;
  bool claimed_ = false;  // someone is completing it as unwaited (its report line exists)
  std::size_t unwaited_record_ = static_cast<std::size_t>(-1);  // its report line; -1: none
  bool failure_recorded_ = false;  // its failure is in the report and the deferred errors

  void wait_on_host(transport::Duration at) const;  // the transport's host wait, until `at`
  // complete(): the host wait lasts until `*at`; unset, `at` is first set to now plus the timeout
  // (when a host wait is needed), so works completed in turn with one `at` share its deadline.
  // Inline, defined in work_registry.cpp, its only user: every wait of a tensor calls it, and out
  // of line it was a call and a frame per operation.
  inline void complete_sharing(std::optional<transport::Duration>& at) const;
};

class WorkRegistry : public std::enable_shared_from_this<WorkRegistry> {
 public:
  // Takes the room of an earlier registry's work list, and gives its own back when it ends
  // empty (Note [Recycled rank states] in rank_state.hpp).
  WorkRegistry();
  ~WorkRegistry();
  WorkRegistry(const WorkRegistry&) = delete;
  WorkRegistry& operator=(const WorkRegistry&) = delete;

  // Registers `work` under each of `storages` (distinct, alive, not yet attached to another
  // registry). Throws std::bad_alloc, and then registers nothing.
  void add(const std::shared_ptr<PendingWork>& work, const std::vector<Storage*>& storages);
  // The same for one storage (every single-output collective), without a vector.
  void add(const std::shared_ptr<PendingWork>& work, Storage* storage);

  // add() in two steps (Note [Registration]). reserve() makes room for `work` (not registered)
  // under `storages` (not empty, distinct, alive until the room is filled or given back); throws
  // std::bad_alloc, and then reserves nothing. add_reserved() registers `work`, its transport work
  // attached, under the same storages in that room; cancel_reservation() gives the room back
  // unused. Exactly one of them follows each reserve(). Neither allocates or throws.
  void reserve(PendingWork& work, std::span<Storage* const> storages);
  // `work` is moved into the registry's list (a caller that keeps its own reference passes a
  // copy).
  void add_reserved(std::shared_ptr<PendingWork> work, std::span<Storage* const> storages) noexcept;
  void cancel_reservation(PendingWork& work, std::span<Storage* const> storages) noexcept;

  // Waits every work pending on `storage`, retires them, and rethrows the first failure after
  // all were waited. Several works share one deadline (Note [Work lifecycle], step 2).
  void wait_storage(const Storage& storage);
  // Waits every distinct work pending on any of `storages` once, all under one deadline, then as
  // wait_storage.
  void wait_storages(const std::vector<const Storage*>& storages);

  // Removes `work` from the registry and every storage it sits under, marking those storages
  // failed when `error` is set. A no-op when `work` is not registered (any more): a late
  // cleanup of an old work cannot touch newer entries. A work is registered with one registry
  // in its life (it is not retired through another one while listed there).
  void retire(const PendingWork& work, const std::exception_ptr& error);

  // Called by ~Storage (Note [Work lifecycle], step 3). Never throws: a work it has no memory to
  // claim now (ClaimBatch) is left as a deferred drop.
  void on_storage_dropped(const Storage& storage) noexcept;

  // Whether complete_deferred_drops, settle_stream_waits or take_deferred_error may have
  // something to do: the flags each of them reads first, read together inline, so the settling
  // at every collective and wait (RankState::settle_unwaited) costs three loads when there is
  // nothing to settle, the usual case.
  bool may_need_settling() const noexcept {
    return may_have_deferred_drops_.load(std::memory_order_acquire) ||
           has_stream_waited_.load(std::memory_order_acquire) ||
           has_deferred_errors_.load(std::memory_order_acquire);
  }

  // Completes the works whose drop step 3 deferred (while an exception was unwinding, or because
  // the transport work asked). Call only when no exception is in flight. Never throws.
  void complete_deferred_drops() noexcept;

  // Completes every remaining work, recording each as unwaited at exit (step 4), then waits on the
  // host for the stream-waited works still running (Note [Stream-waited works]). Never throws.
  void complete_all_at_exit() noexcept;

  // Note [Stream-waited works]
  // A wait on a CUDA result (Completion::Stream) orders the device's stream after the collective
  // and returns at once: the collective may still be running. The registry retires the work (its
  // storages are ready in stream order) but keeps the PendingWork, and through it the transport
  // work and the buffers that work keeps alive, until the transport reports it finished. Without
  // this the transport work would die pending: nothing would free its buffers or watch it for
  // errors and timeouts. settle_stream_waits (at every collective and explicit wait) releases
  // every finished one, whatever runs before it (works on different communicators finish on
  // different streams, in any order), and turns a failure into a deferred error naming the
  // collective, in the order they were waited; the rank's exit waits on the host, under the rank's
  // timeout, for the ones still running, so a failure after the last wait still fails the rank.
  void settle_stream_waits() noexcept;
  // Stream-waited works not yet released (tests).
  std::size_t stream_waited_in_flight() const;
  // The allocation a batch of claims makes for its second claim (registry_out_of_memory_test).
  static constexpr std::size_t second_claim_bytes() noexcept { return sizeof(Claim); }

  // Distinct pending works. Exact at every point.
  std::size_t size() const;

  // Unwaited works recorded so far (drops and exits).
  std::vector<UnwaitedWork> unwaited() const;
  // Whether later drops are recorded there (RankContext::list_drops); returns the previous
  // setting. A drop is recorded or not as the setting was when it was made, however late it is
  // completed. Works completed at exit are recorded either way.
  bool list_drops(bool on) noexcept;
  // The first error recorded while completing a dropped work that has not been raised yet;
  // null if none. Each error is handed out once, in the order recorded; later ones wait for
  // later calls.
  std::exception_ptr take_deferred_error();

 private:
  // A work taken for completion as unwaited, and its line in the report.
  static constexpr std::size_t kNoRecord = static_cast<std::size_t>(-1);
  // Puts a dropped work's failure in its report line and the deferred errors, once, whichever
  // context completing it gets there first (a drop's finalize, or the rank's exit).
  void record_drop_failure_locked(PendingWork& work, const std::exception_ptr& error,
                                  bool at_rank_exit);
  struct Claim {
    std::shared_ptr<PendingWork> work;
    std::size_t record = kNoRecord;
    bool at_rank_exit = false;
  };
  // Claims taken together under the lock and finalized after it. The first is held inline: a
  // batch of one (nearly always) allocates nothing, and a batch whose vector cannot grow (out of
  // memory, in a noexcept drop or exit) still finalizes its first work, so every round of
  // claiming makes progress; a work that found no slot stays for a later round.
  class ClaimBatch {
   public:
    // A slot for the next claim; null when out of memory.
    Claim* slot() noexcept;
    bool empty() const noexcept { return !first_.has_value(); }
    // Finalizes every claim in the order claimed, their waits lasting until `at` (set here if
    // unset and needed).
    void finalize_all(WorkRegistry& registry,
                      std::optional<transport::Duration>& at) const noexcept;

   private:
    std::optional<Claim> first_;
    std::vector<Claim> more_;
  };
  // A stream-waited work still running (Note [Stream-waited works]).
  struct StreamWaited {
    std::shared_ptr<PendingWork> work;
    bool dropped = false;  // finalized after a drop, not waited by the program
    bool at_rank_exit = false;
    std::size_t record = kNoRecord;  // a dropped one's report line
    bool reported = false;           // its failure already reached a waiter
  };

  // Both add()s: reserve(), then add_reserved().
  void add_under(const std::shared_ptr<PendingWork>& work, std::span<Storage* const> storages);
  // Lists `work` (not yet registered anywhere) in a slot reserve() made.
  void list_locked(std::shared_ptr<PendingWork> work) noexcept;
  // Puts `work` (listed) under `storage` (alive, attached to no other registry) in links
  // reserve() made. Inline, defined in work_registry.cpp, its only user (add_reserved).
  inline void link_locked(PendingWork& work, Storage* storage) noexcept;
  // Unlists `work` (listed): its slot becomes a hole, and the list is compacted once holes are
  // the majority, so the list keeps issue order and unlisting costs O(1) amortised.
  void unlist_locked(PendingWork& work) noexcept;
  // The listed work a storage's link leads to, its stamp checked. Inline, defined in
  // work_registry.cpp, its only user (a call and a frame in every wait_storage otherwise).
  inline const std::shared_ptr<PendingWork>& listed_work_locked(
      const StampedLinks<PendingWork>::Link& link) const;
  std::vector<std::shared_ptr<PendingWork>> works_of(const Storage& storage) const;
  // Completes `works` under one deadline (Note [Work lifecycle], step 2), then retires each with
  // its own error; returns the first error.
  std::exception_ptr complete_and_retire(const std::vector<std::shared_ptr<PendingWork>>& works);
  // The same for one work (a storage with one pending work: the common case), without vectors.
  std::exception_ptr complete_and_retire_one(const std::shared_ptr<PendingWork>& work);
  // Returns whether `work` was registered (false: a concurrent waiter retired it first). Inline,
  // defined in work_registry.cpp, its only user (a wait of one work retires through it directly).
  inline bool retire_locked(const PendingWork& work, const std::exception_ptr& error);
  // retire_locked, then, for a Stream work that completed without error, keeps it in
  // stream_waited_ (Note [Stream-waited works]); `claim` is set when it was finalized after a
  // drop. Never throws (out of memory: not kept).
  void retire_completed_locked(const std::shared_ptr<PendingWork>& work,
                               const std::exception_ptr& error,
                               const Claim* claim = nullptr) noexcept;
  // Defers the error of a stream-waited work that failed, worded for how it was waited (a
  // dropped one also gets its report line's error). Never throws.
  void defer_stream_failure_locked(const StreamWaited& entry,
                                   const std::exception_ptr& error) noexcept;
  // Defers `error` as explain() words it (out of memory: `error` itself), then writes it into
  // report line `record` (kNoRecord: none; out of memory the line lacks it). Never throws.
  template <class Explain>
  void defer_failure_locked(const std::exception_ptr& error, std::size_t record,
                            Explain explain) noexcept;
  // The deadline a batch of works completed together shares (Note [Work lifecycle]): `*at`,
  // first set to now plus `first`'s timeout.
  static transport::Duration shared_deadline(std::optional<transport::Duration>& at,
                                             const PendingWork& first);
  // complete_deferred_drops, their waits lasting until `at` (set here if unset and needed).
  void complete_deferred_drops(std::optional<transport::Duration>& at) noexcept;
  // Waits on the host for every stream-waited work (the rank's exit), until `at` (set here if
  // unset and needed). Never throws.
  void finish_stream_waits_at_exit(std::optional<transport::Duration>& at) noexcept;
  // Records `error` to be raised at the rank's next collective or wait (or by finish()).
  // Never throws: out of memory, the first error without room is still kept.
  void defer_error_locked(std::exception_ptr error) noexcept;
  // Marks `work` as being completed as unwaited and writes its report line (step 3 and 4: the
  // line exists from the claim on, so a report taken meanwhile has it; a deferred drop is
  // claimed when it is completed).
  Claim claim_locked(const std::shared_ptr<PendingWork>& work, bool at_rank_exit) noexcept;
  // Completes a claimed work (its host wait lasting until `at`), retires it, and records a
  // failure (report, deferred error).
  void finalize(const Claim& claim, transport::Duration at) noexcept;

  mutable transport::FutexMutex mutex_;  // Note [Futex mutex]
  // The registered works in issue order, with holes (null) where works left
  // (Note [Registry links]); PendingWork::slot_ is each one's index.
  std::vector<std::shared_ptr<PendingWork>> works_;
  struct SpareWorkListsTag {};
  using SpareWorkLists =
      transport::RecycledObjects<std::vector<std::shared_ptr<PendingWork>>,
                                 transport::kRecycledBlocksMax, SpareWorkListsTag>;
  std::size_t listed_ = 0;  // the works in works_ that are not holes
  // Slots of works_ that reserve() promised and add_reserved() has not filled yet: always
  // works_.size() + reserved_ <= works_.capacity() (Note [Registration]).
  std::size_t reserved_ = 0;
  std::vector<UnwaitedWork> unwaited_;
  bool list_drops_ = true;  // drops get a line in unwaited_ (exits always do)
  std::vector<std::exception_ptr> deferred_errors_;
  // An error deferred when deferred_errors_ had no room and none could be made: taken after them.
  std::exception_ptr unlisted_deferred_error_;
  // Note [Stream-waited works]. A vector: nothing allocated until a CUDA result is waited on the
  // device (a std::deque allocates two blocks when made, per rank and per simulated run), and
  // its room is kept from wait to wait.
  std::vector<StreamWaited> stream_waited_;
  // Every collective settles deferred drops and errors first; these flags (written under
  // mutex_, read without it) let it skip the lock and the scan of every entry when there is
  // nothing to settle, which is nearly always. A drop or error racing with the read is settled
  // at the next collective, exactly as when it raced with taking the lock.
  std::atomic<bool> may_have_deferred_drops_{false};  // set when a drop is deferred
  std::atomic<bool> has_deferred_errors_{false};      // either of the two above holds an error
  std::atomic<bool> has_stream_waited_{false};        // !stream_waited_.empty()
};

}  // namespace chorus::detail
