#include "detail/work_registry.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "detail/generations.hpp"
#include "detail/storage.hpp"

namespace chorus::detail {
namespace {

// Generations for work identity (Note [Registry links]), as the storages' (Note [Generations in
// batches]).
struct WorkGenerations {};

// `error` reworded so that where it is raised (a later, unrelated call) it says which collective
// it belongs to: "the result of all_reduce #3 (issued at f:l) <what happened>: <detail>". Keeps
// the error's type.
std::exception_ptr explain_failure(const std::exception_ptr& error, const WorkPosition& info,
                                   std::string_view what_happened) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return make_error(e.code(), e.context(),
                      "the result of " + std::string(info.op) + " #" + std::to_string(info.seq) +
                          " (issued at " + info.site.to_string() + ") " +
                          std::string(what_happened) + ": " + e.detail());
  } catch (...) {
    return error;
  }
}

// The error of a work nobody waited.
std::exception_ptr explain_unwaited_failure(const std::exception_ptr& error,
                                            const WorkPosition& info, bool at_rank_exit) {
  return explain_failure(error, info,
                         at_rank_exit
                             ? "was still pending when the rank ended, and completing it failed"
                             : "was dropped un-waited, and completing it failed");
}

// The error of a collective that failed after a wait on a CUDA result had ordered the stream
// after it (Note [Stream-waited works]).
std::exception_ptr explain_stream_failure(const std::exception_ptr& error,
                                          const WorkPosition& info) {
  return explain_failure(
      error, info, "was waited on the device stream, and the collective failed after that wait");
}

}  // namespace

PendingWork::PendingWork(std::shared_ptr<transport::Work> work, WorkInfo info,
                         std::function<void()> fixup,
                         std::shared_ptr<transport::Transport> transport,
                         transport::Duration timeout, Completion completion, StreamSource stream)
    : PendingWork(info.rank, info.op, info.seq, info.group, info.site, std::move(fixup), transport,
                  timeout, completion, std::move(stream)) {
  // Its own copy of the label: `info` is the caller's, and may die before the work.
  own_group_ = std::make_unique<const transport::GroupLabel>(std::move(info.group));
  group_ = own_group_.get();
  attach(std::move(work));
}

// Note [Borrowed group labels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A work's group label is read in one place: claim_locked, which copies it into the report's
// line of an unwaited work. Copying it into every work (Note [Shared group labels]: a std::string
// copy, a call to memcpy, and its destruction, ~40 instructions a collective) paid for a read that
// almost never happens. So a work made from parts, every collective's (Call::start in
// collectives.cpp), borrows its communicator slot's label (CommSlot::label) instead. That is
// safe because of when claim_locked runs: under the registry's lock, on a work still listed and
// not yet claimed. Such a work's rank has not finished its exit (complete_all_at_exit claims
// every listed work before it returns, under the same lock), and a rank's communicator slots, map
// nodes that never move, live until after its exit (RankState::end_rank, ~RankState). A work can
// outlive its listing (a waiter's reference, a stream wait, a failure being reported), but then
// nothing reads its label. The constructor from a WorkInfo keeps its own copy (own_group_): its
// callers (tests) pass a temporary.

PendingWork::PendingWork(int rank, std::string_view op, std::int64_t seq,
                         const transport::GroupLabel& group, CallSite site,
                         std::function<void()>&& fixup,
                         const std::shared_ptr<transport::Transport>& transport,
                         transport::Duration timeout, Completion completion, StreamSource&& stream)
    : generation_(next_generation<WorkGenerations>()),
      position_{rank, op, seq, site},
      group_(&group),
      fixup_(std::move(fixup)),
      transport_(transport),
      timeout_(timeout),
      completion_(completion),
      stream_(std::move(stream)) {
  // Core's own invariants, not a caller's misuse (Note [Work's own checks]).
  CHORUS_DCHECK(transport_ != nullptr);
  CHORUS_DCHECK(completion_ == Completion::Host || !fixup_);
}

// Note [Work's own checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every collective makes a PendingWork, attaches its transport work and adds it to the registry
// (Call::prepare_registration and register_work in collectives.cpp), so the checks on that path
// ran once an operation in every build. Those that check core's own code, settled where the values
// are made, are CHORUS_DCHECKs (Note [Debug-only checks]): the transport is the rank state's (set
// for the rank's life), only a host completion gets a fixup (Call::start), a work is attached once,
// before it is registered (register_work, add), and add_reserved gets the attached work that
// reserve() made room for. The one that checks another party stays in every build: attach's, that
// the transport's work is not null (a transport returns one or throws: Note [Transport contract]).
void PendingWork::attach(std::shared_ptr<transport::Work> work) noexcept {
  CHORUS_CHECK(work != nullptr);
  CHORUS_DCHECK(work_ == nullptr);   // once
  CHORUS_DCHECK(owner_ == nullptr);  // before it is registered
  work_ = std::move(work);
}

transport::Duration PendingWork::deadline_from_now() const {
  return transport::Deadline::after(transport_->now(), timeout_).at;
}

void PendingWork::wait_on_host(transport::Duration at) const {
  if (work_->status() != transport::WorkStatus::Completed) {
    work_->wait(transport::Deadline{at});
  }
  CHORUS_CHECK(work_->status() == transport::WorkStatus::Completed);
}

void PendingWork::finish_on_host(transport::Duration at) const {
  CHORUS_CHECK(completion_ == Completion::Stream);
  wait_on_host(at);
}

void PendingWork::complete() const {
  std::optional<transport::Duration> at;
  complete_sharing(at);
}

void PendingWork::complete(transport::Duration at) const {
  std::optional<transport::Duration> shared = at;
  complete_sharing(shared);
}

// inline (declared so): used in this file only; see the declaration.
inline void PendingWork::complete_sharing(std::optional<transport::Duration>& at) const {
  if (completion_ == Completion::Stream) {
    if (work_->status() == transport::WorkStatus::Failed) {
      std::rethrow_exception(work_->error());
    }
    work_->wait_on(stream_.current());  // the current stream of the outputs' device, now
    return;
  }
  if (work_->status() != transport::WorkStatus::Completed) {
    if (!at.has_value()) {
      at = deadline_from_now();
    }
    // wait_on_host without its own status() test, made just above (a virtual call): waiting a
    // work that completed meanwhile on another thread returns at once (Work::wait is idempotent).
    work_->wait(transport::Deadline{*at});
    CHORUS_CHECK(work_->status() == transport::WorkStatus::Completed);
  }
  if (fixup_) {
    std::call_once(fixup_once_, fixup_);
  }
}

void WorkRegistry::add(const std::shared_ptr<PendingWork>& work,
                       const std::vector<Storage*>& storages) {
  add_under(work, storages);
}

void WorkRegistry::add(const std::shared_ptr<PendingWork>& work, Storage* storage) {
  add_under(work, std::span<Storage* const>(&storage, 1));
}

void WorkRegistry::add_under(const std::shared_ptr<PendingWork>& work,
                             std::span<Storage* const> storages) {
  CHORUS_CHECK(work != nullptr);
  reserve(*work, storages);
  add_reserved(work, storages);
}

WorkRegistry::WorkRegistry() {
  if (transport::recycling_enabled()) {
    SpareWorkLists::take(works_);
    CHORUS_CHECK(works_.empty());
  }
}

WorkRegistry::~WorkRegistry() {
  // Only an empty list's room (holes only: clearing it destroys no work) goes to the next one.
  if (listed_ == 0 && reserved_ == 0 && transport::recycling_enabled()) {
    works_.clear();
    SpareWorkLists::give(works_);
  }
}

// Note [Registration's own checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// reserve and add_reserved run once an operation (Call::start and register_work), and their
// checks of what registration's own code settles ran there in every build, ~20 instructions an
// operation with the links' own (StampedLinks::push_back). As Note [Work's own checks], they run
// in debug builds only: the storages are not none and not null (Call passes its outputs' storages,
// a fresh output's at least, and WorkRegistry::add's callers pass theirs), each is registered with
// no other live registry (core registers a fresh output's storage, or a caller's only when this
// rank made it: Storage::made_by), a work's storages are distinct (fresh outputs), a work is
// reserved, listed and linked once (made for the one call by prepare_registration), and
// add_reserved follows a reserve(), which made the room that the list and the links then fill.
// What a transport or a user could break keeps its check: attach's non-null work, the pending
// count's bound (add_pending), one registry per storage when it attaches (attach_registry).
void WorkRegistry::reserve(PendingWork& work, std::span<Storage* const> storages) {
  // Note [Registration's own checks].
  CHORUS_DCHECK(!storages.empty());
  CHORUS_DCHECK(work.owner_ == nullptr);  // not registered
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  // A slot in the work list, growing it as push_back would (geometrically): the list keeps its
  // capacity, so after the first few collectives this allocates nothing.
  const std::size_t slots_needed = works_.size() + reserved_ + 1;
  if (slots_needed > works_.capacity()) {
    works_.reserve(std::max(slots_needed, 2 * works_.capacity()));
  }
  // The links, all or none: the work's own list (nobody else's yet), then each storage's.
  work.storages_.reserve(storages.size());
  std::size_t reserved_storages = 0;
  try {
    for (Storage* storage : storages) {
      // Note [Registration's own checks].
      CHORUS_DCHECK(storage != nullptr);
      // One live registry per storage (Storage::attach_registry): checked before its list is
      // touched, not only when the work is added after the operation started.
      CHORUS_DCHECK(storage->registry_.expired() || storage->attached_ == this);
      storage->works_.reserve(1);
      ++reserved_storages;
    }
  } catch (...) {
    for (std::size_t i = 0; i < reserved_storages; ++i) {
      storages[i]->works_.release(1);
    }
    work.storages_.release(storages.size());
    throw;  // out of memory: nothing reserved (the work list's capacity stays, unused)
  }
  ++reserved_;
}

// Inlined into add_reserved, its only user, on every collective: GCC kept it out of line (its
// checks' failure paths make it look large), and the call and the frame cost ~15 instructions an
// operation.
[[gnu::always_inline]] inline void WorkRegistry::link_locked(PendingWork& work,
                                                             Storage* storage) noexcept {
  // Note [Registration's own checks].
  CHORUS_DCHECK(storage != nullptr);
  CHORUS_DCHECK(!work.storages_.contains(storage));  // no duplicates
  storage->attach_registry(*this);
  // Both in room reserve() made: neither allocates.
  storage->works_.push_back(&work, work.generation());
  work.storages_.push_back(storage, storage->generation());
  storage->add_pending();
}

void WorkRegistry::add_reserved(std::shared_ptr<PendingWork> work,
                                std::span<Storage* const> storages) noexcept {
  // Note [Work's own checks].
  CHORUS_DCHECK(work != nullptr);
  CHORUS_DCHECK(!storages.empty());
  CHORUS_DCHECK(work->work_ != nullptr);  // attached
  PendingWork& listed = *work;            // the list owns it from here
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  CHORUS_DCHECK_GT(reserved_, 0u);  // Note [Registration's own checks]
  --reserved_;
  list_locked(std::move(work));
  for (Storage* storage : storages) {
    link_locked(listed, storage);
  }
  CHORUS_DCHECK_EQ(listed.storages_.reserved(), 0u);  // exactly the storages reserved
}

void WorkRegistry::cancel_reservation(PendingWork& work,
                                      std::span<Storage* const> storages) noexcept {
  CHORUS_CHECK(work.owner_ == nullptr);  // never added
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  CHORUS_CHECK_GT(reserved_, 0u);
  --reserved_;
  work.storages_.release(storages.size());
  for (Storage* storage : storages) {
    storage->works_.release(1);
  }
}

void WorkRegistry::list_locked(std::shared_ptr<PendingWork> work) noexcept {
  // Note [Registration's own checks].
  CHORUS_DCHECK(work->owner_ == nullptr);              // a work is registered once
  CHORUS_DCHECK_LT(works_.size(), works_.capacity());  // reserved: no reallocation
  PendingWork& listed = *work;
  works_.push_back(std::move(work));
  listed.slot_ = works_.size() - 1;
  listed.owner_ = this;
  ++listed_;
}

void WorkRegistry::unlist_locked(PendingWork& work) noexcept {
  // retire_locked, the only caller, checked both just before in every build (its storages' loop
  // between changes neither): again in debug builds only (Note [Work's own checks]).
  CHORUS_DCHECK_LT(work.slot_, works_.size());
  CHORUS_DCHECK(works_[work.slot_].get() == &work);
  const std::size_t slot = work.slot_;
  work.slot_ = PendingWork::kNotListed;
  work.owner_ = nullptr;
  work.storages_.clear();
  --listed_;
  // `work` may be destroyed from here on: works_ may have held its last reference.
  if (listed_ == 0) {
    works_.clear();
    return;
  }
  works_[slot].reset();
  if (works_.size() - listed_ <= listed_) {
    return;  // holes are not the majority yet
  }
  std::size_t kept = 0;
  for (std::shared_ptr<PendingWork>& listed : works_) {
    if (listed != nullptr) {
      listed->slot_ = kept;
      works_[kept++] = std::move(listed);
    }
  }
  works_.resize(kept);
}

// inline (declared so): GCC kept it out of line, a call and a frame in every wait_storage (~10
// instructions an operation); it is used in this file only.
inline const std::shared_ptr<PendingWork>& WorkRegistry::listed_work_locked(
    const StampedLinks<PendingWork>::Link& link) const {
  const PendingWork& work = *link.target;
  // A work stays listed while any storage links it, so this is the work that was linked.
  CHORUS_CHECK_EQ(work.generation(), link.stamp);
  CHORUS_CHECK(work.owner_ == this);
  return works_[work.slot_];
}

std::vector<std::shared_ptr<PendingWork>> WorkRegistry::works_of(const Storage& storage) const {
  std::vector<std::shared_ptr<PendingWork>> works;
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  works.reserve(storage.works_.size());
  storage.works_.for_each([&](const StampedLinks<PendingWork>::Link& link) {
    works.push_back(listed_work_locked(link));
  });
  return works;
}

void WorkRegistry::wait_storage(const Storage& storage) {
  std::shared_ptr<PendingWork> only;  // the storage's work when it has exactly one
  {
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    if (storage.works_.empty()) {
      return;
    }
    if (storage.works_.size() == 1) {
      only = listed_work_locked(storage.works_.front());
    }
  }
  // With several works the general path; with one, that work (if another thread retired it
  // meanwhile, completing it again is a no-op). Works issued on the storage after the look
  // above are not waited: they began after this wait did, and a thread that reads a tensor
  // while another issues an in-place collective on it races with that collective anyway.
  std::exception_ptr error =
      only != nullptr ? complete_and_retire_one(only) : complete_and_retire(works_of(storage));
  if (error) {
    std::rethrow_exception(error);
  }
}

void WorkRegistry::wait_storages(const std::vector<const Storage*>& storages) {
  std::vector<std::shared_ptr<PendingWork>> works;
  std::unordered_set<const PendingWork*> seen;  // `works` keeps each alive: no address reuse
  for (const Storage* storage : storages) {
    for (std::shared_ptr<PendingWork>& work : works_of(*storage)) {
      if (seen.insert(work.get()).second) {
        works.push_back(std::move(work));
      }
    }
  }
  if (std::exception_ptr error = complete_and_retire(works)) {
    std::rethrow_exception(error);
  }
}

std::exception_ptr WorkRegistry::complete_and_retire(
    const std::vector<std::shared_ptr<PendingWork>>& works) {
  std::exception_ptr first_error;
  std::vector<std::exception_ptr> errors(works.size());
  // One deadline for the whole wait (Note [Work lifecycle], step 2), set by the first work that
  // needs a host wait: K works whose peer is stuck cost the waiter one timeout, not K.
  std::optional<transport::Duration> at;
  for (std::size_t i = 0; i < works.size(); ++i) {
    try {
      works[i]->complete_sharing(at);
    } catch (...) {
      errors[i] = std::current_exception();
      if (!first_error) {
        first_error = errors[i];
      }
    }
  }
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  for (std::size_t i = 0; i < works.size(); ++i) {
    retire_completed_locked(works[i], errors[i]);
  }
  return first_error;
}

std::exception_ptr WorkRegistry::complete_and_retire_one(const std::shared_ptr<PendingWork>& work) {
  std::exception_ptr error;
  try {
    work->complete();
  } catch (...) {
    error = std::current_exception();
  }
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  if (!error && work->completion() == Completion::Host) {
    // retire_completed_locked's whole effect for a host work that completed (a stream-waited
    // list is for Stream works, and nothing is reported without an error), without its call and
    // frame: every wait of a tensor comes here.
    retire_locked(*work, error);
    return error;
  }
  retire_completed_locked(work, error);
  return error;
}

void WorkRegistry::retire_completed_locked(const std::shared_ptr<PendingWork>& work,
                                           const std::exception_ptr& error,
                                           const Claim* claim) noexcept {
  if (!retire_locked(*work, error)) {
    // A concurrent waiter retired it first. If that one's stream wait succeeded and this one saw
    // the failure that came after, this caller raises it: settle must not raise it again.
    if (error) {
      for (StreamWaited& entry : stream_waited_) {
        if (entry.work == work) {
          entry.reported = true;
        }
      }
    }
    return;
  }
  if (error || work->completion() != Completion::Stream) {
    return;
  }
  try {
    StreamWaited entry{work};
    if (claim != nullptr) {
      entry.dropped = true;
      entry.at_rank_exit = claim->at_rank_exit;
      entry.record = claim->record;
    }
    stream_waited_.push_back(std::move(entry));
    has_stream_waited_.store(true, std::memory_order_release);
  } catch (...) {
    // Out of memory: the transport work is released now, as before Note [Stream-waited works].
  }
}

void WorkRegistry::defer_stream_failure_locked(const StreamWaited& entry,
                                               const std::exception_ptr& error) noexcept {
  if (!entry.dropped) {
    defer_failure_locked(error, kNoRecord,
                         [&] { return explain_stream_failure(error, entry.work->position()); });
    return;
  }
  defer_failure_locked(error, entry.record, [&] {
    return explain_unwaited_failure(error, entry.work->position(), entry.at_rank_exit);
  });
}

template <class Explain>
void WorkRegistry::defer_failure_locked(const std::exception_ptr& error, std::size_t record,
                                        Explain explain) noexcept {
  // The deferred error first: it is what fails the rank. Out of memory explaining it, the
  // transport's own error is raised instead (its text lacks the work's story, not the failure).
  std::exception_ptr explained;
  try {
    explained = explain();
  } catch (...) {
    explained = error;
  }
  defer_error_locked(std::move(explained));
  if (record != kNoRecord) {
    try {
      unwaited_[record].error = describe(error);
    } catch (...) {
      // Out of memory: the report's line lacks the error; the rank still fails with it.
    }
  }
}

// inline (declared so): used in this file only; see the declaration.
inline bool WorkRegistry::retire_locked(const PendingWork& work, const std::exception_ptr& error) {
  if (work.owner_ != this) {
    return false;  // retired already by a concurrent waiter (or never registered here)
  }
  CHORUS_CHECK_LT(work.slot_, works_.size());
  PendingWork& listed = *works_[work.slot_];
  CHORUS_CHECK(&listed == &work);  // listed here, not in another rank's registry
  listed.storages_.for_each([&](const StampedLinks<const Storage>::Link& link) {
    const Storage* storage = link.target;
    // A storage unlinks itself before it dies, so this is the storage that was linked.
    CHORUS_CHECK_EQ(storage->generation(), link.stamp);
    storage->works_.erase(&listed);
    auto* mutable_storage = const_cast<Storage*>(storage);  // NOLINT: registry owns the state word
    if (error) {
      mutable_storage->set_failure(error);  // before the count drops: never observed as ready
    }
    mutable_storage->remove_pending();
  });
  unlist_locked(listed);
  return true;
}

void WorkRegistry::retire(const PendingWork& work, const std::exception_ptr& error) {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  retire_locked(work, error);
}

void WorkRegistry::on_storage_dropped(const Storage& storage) noexcept {
  // While an exception unwinds this thread (or fiber), completing the work could wait for peers
  // that are themselves waiting for this rank's next collective, which the unwinding rank will
  // never issue: the peers would be told "deadlock" rather than the truth. So such drops stay
  // registered and are completed at the rank's next collective or when it ends. The transport
  // may defer any other drop the same way (Note [Work lifecycle], step 3).
  const bool unwinding = std::uncaught_exceptions() > 0;
  ClaimBatch claims;
  {
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    storage.works_.for_each([&](const StampedLinks<PendingWork>::Link& link) {
      const std::shared_ptr<PendingWork>& work = listed_work_locked(link);
      work->storages_.erase(&storage);
      if (!work->storages_.empty() || work->claimed_) {
        // Still referenced; or already claimed (its rank exited and is finishing it, and a
        // tensor another rank kept was the last reference): finished where it was claimed.
        return;
      }
      work->dropped_ = true;
      work->drop_listed_ = list_drops_;  // decided now, even if completed later (deferred)
      const transport::Work& transport_work = work->work();
      transport_work.on_dropped();
      Claim* slot = nullptr;
      if (!unwinding && !transport_work.defer_finalization()) {
        slot = claims.slot();  // null: out of memory, completed later as a deferred drop
      }
      if (slot != nullptr) {
        *slot = claim_locked(work, /*at_rank_exit=*/false);
      } else {
        may_have_deferred_drops_.store(true, std::memory_order_release);
      }
    });
    storage.works_.clear();
  }
  std::optional<transport::Duration> at;  // several works on one storage: one deadline
  claims.finalize_all(*this, at);
}

WorkRegistry::Claim* WorkRegistry::ClaimBatch::slot() noexcept {
  if (!first_.has_value()) {
    // Not emplace(): clang 14 takes Claim, whose members have default initializers, for not
    // default-constructible inside its enclosing class, and the fuzz preset would not build.
    return &first_.emplace(Claim{});
  }
  try {
    return &more_.emplace_back();
  } catch (...) {
    return nullptr;  // out of memory
  }
}

void WorkRegistry::ClaimBatch::finalize_all(WorkRegistry& registry,
                                            std::optional<transport::Duration>& at) const noexcept {
  if (!first_.has_value()) {
    CHORUS_CHECK(more_.empty());
    return;
  }
  registry.finalize(*first_, shared_deadline(at, *first_->work));
  for (const Claim& claim : more_) {
    registry.finalize(claim, shared_deadline(at, *claim.work));
  }
}

transport::Duration WorkRegistry::shared_deadline(std::optional<transport::Duration>& at,
                                                  const PendingWork& first) {
  if (!at.has_value()) {
    at = first.deadline_from_now();
  }
  return *at;
}

void WorkRegistry::complete_deferred_drops() noexcept {
  std::optional<transport::Duration> at;
  complete_deferred_drops(at);
}

void WorkRegistry::complete_deferred_drops(std::optional<transport::Duration>& at) noexcept {
  if (!may_have_deferred_drops_.load(std::memory_order_acquire)) {
    return;  // no drop was deferred since the last scan
  }
  // In rounds: one, unless memory runs out (ClaimBatch); each round claims at least one work.
  for (bool all_claimed = false; !all_claimed;) {
    ClaimBatch claims;
    {
      std::lock_guard<transport::FutexMutex> lock(mutex_);
      all_claimed = true;
      for (const std::shared_ptr<PendingWork>& work : works_) {
        if (work != nullptr && work->dropped_ && !work->claimed_) {
          Claim* slot = claims.slot();
          if (slot == nullptr) {
            all_claimed = false;  // out of memory: the rest in the next round
            break;
          }
          *slot = claim_locked(work, /*at_rank_exit=*/false);
        }
      }
      if (all_claimed) {
        may_have_deferred_drops_.store(false, std::memory_order_relaxed);  // every one is claimed
      }
    }
    // One deadline for all of them (Note [Work lifecycle]): K drops whose peer is stuck cost one
    // timeout, not K.
    claims.finalize_all(*this, at);
  }
}

void WorkRegistry::complete_all_at_exit() noexcept {
  // One deadline for the whole exit (Note [Work lifecycle], step 4), set by the first batch that
  // has a work to complete.
  std::optional<transport::Duration> at;
  complete_deferred_drops(at);
  // The leftovers, in rounds: one, unless memory runs out (ClaimBatch).
  for (bool all_claimed = false; !all_claimed;) {
    ClaimBatch claims;
    {
      std::lock_guard<transport::FutexMutex> lock(mutex_);
      all_claimed = true;
      for (const std::shared_ptr<PendingWork>& work : works_) {
        if (work == nullptr || work->claimed_) {
          continue;  // a claimed one: a drop on another thread or rank (below)
        }
        Claim* slot = claims.slot();
        if (slot == nullptr) {
          all_claimed = false;  // out of memory: the rest in the next round
          break;
        }
        // A drop deferred while the exit finalized the deferred drops (by one of their
        // finalizations) is a drop, listed as list_drops was when it was made; the rest are
        // left at the exit.
        *slot = claim_locked(work, /*at_rank_exit=*/!work->dropped_);
      }
    }
    claims.finalize_all(*this, at);
  }
  // Works another context is finalizing: complete and retire them here too (both idempotent),
  // so the rank ends with an empty registry whatever that context does next. A failure is
  // recorded here too (once, whoever is first): that context may record it only after the rank
  // has read its errors, and the failure would be raised nowhere. One at a time, allocating
  // nothing: each leaves the registry once retired here or there.
  for (;;) {
    std::shared_ptr<PendingWork> work;
    {
      std::lock_guard<transport::FutexMutex> lock(mutex_);
      for (const std::shared_ptr<PendingWork>& listed : works_) {
        if (listed != nullptr && listed->claimed_) {
          work = listed;
          break;
        }
      }
    }
    if (work == nullptr) {
      break;
    }
    std::exception_ptr error;
    try {
      work->complete(shared_deadline(at, *work));
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    // A claimed work is a drop finalizing elsewhere: kept as one if it was stream-waited.
    const Claim claim{work, work->unwaited_record_, /*at_rank_exit=*/false};
    retire_completed_locked(work, error, &claim);
    if (error) {
      try {
        record_drop_failure_locked(*work, error, /*at_rank_exit=*/false);
      } catch (...) {
        // Out of memory while recording: never throw at exit.
      }
    }
  }
  finish_stream_waits_at_exit(at);
}

void WorkRegistry::settle_stream_waits() noexcept {
  if (!has_stream_waited_.load(std::memory_order_acquire)) {
    return;
  }
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  try {
    for (auto entry = stream_waited_.begin(); entry != stream_waited_.end();) {
      const transport::WorkStatus status = entry->work->work().status();
      if (status == transport::WorkStatus::Pending) {
        ++entry;  // released once it finished; the ones after it need not wait for it
        continue;
      }
      if (status == transport::WorkStatus::Failed && !entry->reported) {
        defer_stream_failure_locked(*entry, entry->work->work().error());
      }
      entry = stream_waited_.erase(entry);
    }
  } catch (...) {
    // Out of memory recording the error: the work stays listed, the exit waits for it.
  }
  has_stream_waited_.store(!stream_waited_.empty(), std::memory_order_release);
}

void WorkRegistry::finish_stream_waits_at_exit(std::optional<transport::Duration>& at) noexcept {
  // One at a time, taken off the front under the lock (a move and a pop: nothing allocates).
  std::optional<transport::Duration> deadline;
  while (true) {
    std::optional<StreamWaited> entry;
    {
      std::lock_guard<transport::FutexMutex> lock(mutex_);
      if (stream_waited_.empty()) {
        has_stream_waited_.store(false, std::memory_order_release);
        return;
      }
      entry.emplace(std::move(stream_waited_.front()));
      stream_waited_.erase(stream_waited_.begin());
    }
    // One deadline for all of them, and for the rest of the exit: the exit waits at most the
    // rank's timeout, not one per work.
    if (!deadline) {
      deadline = shared_deadline(at, *entry->work);
    }
    try {
      entry->work->finish_on_host(*deadline);
    } catch (...) {
      if (entry->reported) {
        continue;
      }
      try {
        std::lock_guard<transport::FutexMutex> lock(mutex_);
        defer_stream_failure_locked(*entry, std::current_exception());
      } catch (...) {
        // Out of memory while recording: never throw at exit.
      }
    }
  }
}

void WorkRegistry::defer_error_locked(std::exception_ptr error) noexcept {
  // Out of memory: the first error without room waits in a member of its own (a copy of an
  // exception_ptr allocates nothing), so the rank still fails. Until it is taken, later errors
  // are lost rather than listed after it, where they would be raised before it.
  if (unlisted_deferred_error_ == nullptr) {
    try {
      deferred_errors_.push_back(error);
    } catch (...) {
      unlisted_deferred_error_ = std::move(error);
    }
  }
  has_deferred_errors_.store(true, std::memory_order_release);
}

std::size_t WorkRegistry::stream_waited_in_flight() const {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  return stream_waited_.size();
}

WorkRegistry::Claim WorkRegistry::claim_locked(const std::shared_ptr<PendingWork>& work,
                                               bool at_rank_exit) noexcept {
  CHORUS_CHECK(!work->claimed_);
  work->claimed_ = true;
  const WorkPosition& info = work->position();
  Claim claim{work, unwaited_.size(), at_rank_exit};
  if (!at_rank_exit && !work->drop_listed_) {
    claim.record = kNoRecord;  // a drop made on purpose (list_drops): no report line
    return claim;
  }
  try {
    unwaited_.push_back(UnwaitedWork{info.rank,
                                     std::string(info.op),
                                     info.seq,
                                     work->group().str(),
                                     info.site,
                                     at_rank_exit,
                                     {}});
  } catch (...) {
    claim.record = kNoRecord;  // out of memory: the report loses this line
  }
  work->unwaited_record_ = claim.record;
  return claim;
}

void WorkRegistry::finalize(const Claim& claim, transport::Duration at) noexcept {
  std::exception_ptr error;
  try {
    claim.work->complete(at);
  } catch (...) {
    error = std::current_exception();
  }
  claim.work->work().on_finalized(claim.at_rank_exit, error != nullptr);
  try {
    std::lock_guard<transport::FutexMutex> lock(mutex_);
    retire_completed_locked(claim.work, error, &claim);
    if (error) {
      record_drop_failure_locked(*claim.work, error, claim.at_rank_exit);
    }
  } catch (...) {
    // Out of memory while recording: never throw from a drop.
  }
}

void WorkRegistry::record_drop_failure_locked(PendingWork& work, const std::exception_ptr& error,
                                              bool at_rank_exit) {
  if (work.failure_recorded_) {
    return;
  }
  work.failure_recorded_ = true;
  defer_failure_locked(error, work.unwaited_record_, [&] {
    return explain_unwaited_failure(error, work.position(), at_rank_exit);
  });
}

std::size_t WorkRegistry::size() const {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  return listed_;
}

std::vector<UnwaitedWork> WorkRegistry::unwaited() const {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  return unwaited_;
}

bool WorkRegistry::list_drops(bool on) noexcept {
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  return std::exchange(list_drops_, on);
}

std::exception_ptr WorkRegistry::take_deferred_error() {
  if (!has_deferred_errors_.load(std::memory_order_acquire)) {
    return nullptr;
  }
  std::lock_guard<transport::FutexMutex> lock(mutex_);
  if (deferred_errors_.empty()) {
    // The one recorded without room (defer_error_locked), after those listed before it.
    has_deferred_errors_.store(false, std::memory_order_relaxed);
    return std::exchange(unlisted_deferred_error_, nullptr);
  }
  // One at a time, in the order recorded: the others stay for the rank's next collectives or
  // waits. At exit RankContext::finish takes the first of those left; any others are in the
  // report only.
  std::exception_ptr first = deferred_errors_.front();
  deferred_errors_.erase(deferred_errors_.begin());
  has_deferred_errors_.store(!deferred_errors_.empty() || unlisted_deferred_error_ != nullptr,
                             std::memory_order_relaxed);
  return first;
}

}  // namespace chorus::detail
