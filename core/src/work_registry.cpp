#include "detail/work_registry.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "chorus/check.hpp"
#include "detail/storage.hpp"

namespace chorus::detail {
namespace {

std::atomic<std::uint64_t> next_work_id{1};

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

PendingWork::PendingWork(std::shared_ptr<transport::Work> work, WorkInfo info,
                         std::function<void()> fixup,
                         std::shared_ptr<transport::Transport> transport,
                         transport::Duration timeout)
    : id_(next_work_id.fetch_add(1, std::memory_order_relaxed)),
      work_(std::move(work)),
      info_(std::move(info)),
      fixup_(std::move(fixup)),
      transport_(std::move(transport)),
      timeout_(timeout) {
  CHORUS_CHECK(work_ != nullptr);
  CHORUS_CHECK(transport_ != nullptr);
}

void PendingWork::complete() {
  if (work_->status() != transport::WorkStatus::Completed) {
    const transport::Duration now = transport_->now();
    const transport::Duration at =
        timeout_ >= transport::Duration::max() - now ? transport::Duration::max() : now + timeout_;
    work_->wait(transport::Deadline{at});
  }
  CHORUS_CHECK(work_->status() == transport::WorkStatus::Completed);
  if (fixup_) {
    std::call_once(fixup_once_, fixup_);
  }
}

void WorkRegistry::add(const std::shared_ptr<PendingWork>& work,
                       const std::vector<Storage*>& storages) {
  CHORUS_CHECK(work != nullptr);
  CHORUS_CHECK(!storages.empty());
  std::shared_ptr<WorkRegistry> self = shared_from_this();
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& entry = works_[work->id()];
  CHORUS_CHECK(entry.work == nullptr);  // a work is registered once
  entry.work = work;
  for (Storage* storage : storages) {
    CHORUS_CHECK(storage != nullptr);
    CHORUS_CHECK(std::find(entry.storages.begin(), entry.storages.end(), storage) ==
                 entry.storages.end());  // no duplicates
    storage->attach_registry(self);
    std::vector<std::uint64_t>& ids = by_storage_[storage->id()];
    CHORUS_CHECK(std::find(ids.begin(), ids.end(), work->id()) == ids.end());
    ids.push_back(work->id());
    entry.storages.push_back(storage);
    storage->add_pending();
  }
}

std::vector<std::shared_ptr<PendingWork>> WorkRegistry::works_of(const Storage& storage) const {
  std::vector<std::shared_ptr<PendingWork>> works;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_storage_.find(storage.id());
  if (it == by_storage_.end()) {
    return works;
  }
  works.reserve(it->second.size());
  for (std::uint64_t work_id : it->second) {
    auto entry = works_.find(work_id);
    CHORUS_CHECK(entry != works_.end());
    works.push_back(entry->second.work);
  }
  return works;
}

void WorkRegistry::wait_storage(const Storage& storage) {
  if (std::exception_ptr error = complete_and_retire(works_of(storage))) {
    std::rethrow_exception(error);
  }
}

void WorkRegistry::wait_storages(const std::vector<const Storage*>& storages) {
  std::vector<std::shared_ptr<PendingWork>> works;
  std::unordered_set<std::uint64_t> seen;
  for (const Storage* storage : storages) {
    for (std::shared_ptr<PendingWork>& work : works_of(*storage)) {
      if (seen.insert(work->id()).second) {
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
  for (std::size_t i = 0; i < works.size(); ++i) {
    try {
      works[i]->complete();
    } catch (...) {
      errors[i] = std::current_exception();
      if (!first_error) {
        first_error = errors[i];
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < works.size(); ++i) {
    retire_locked(*works[i], errors[i]);
  }
  return first_error;
}

void WorkRegistry::retire_locked(const PendingWork& work, const std::exception_ptr& error) {
  auto it = works_.find(work.id());
  if (it == works_.end()) {
    return;  // retired already by a concurrent waiter
  }
  for (const Storage* storage : it->second.storages) {
    auto ids = by_storage_.find(storage->id());
    CHORUS_CHECK(ids != by_storage_.end());
    std::erase(ids->second, work.id());
    if (ids->second.empty()) {
      by_storage_.erase(ids);
    }
    auto* mutable_storage = const_cast<Storage*>(storage);  // NOLINT: registry owns the state word
    if (error) {
      mutable_storage->set_failure(error);  // before the count drops: never observed as ready
    }
    mutable_storage->remove_pending();
  }
  works_.erase(it);
}

void WorkRegistry::retire(const PendingWork& work, const std::exception_ptr& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  retire_locked(work, error);
}

void WorkRegistry::on_storage_dropped(const Storage& storage) noexcept {
  std::vector<std::shared_ptr<PendingWork>> orphans;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto ids = by_storage_.find(storage.id());
    if (ids == by_storage_.end()) {
      return;
    }
    for (std::uint64_t work_id : ids->second) {
      auto entry = works_.find(work_id);
      CHORUS_CHECK(entry != works_.end());
      std::erase(entry->second.storages, &storage);
      if (entry->second.storages.empty()) {
        orphans.push_back(std::move(entry->second.work));
        works_.erase(entry);
      }
    }
    by_storage_.erase(ids);
  }
  for (const std::shared_ptr<PendingWork>& work : orphans) {
    complete_unwaited(work, /*at_exit=*/false);
  }
}

void WorkRegistry::complete_all_at_exit() noexcept {
  std::vector<std::shared_ptr<PendingWork>> remaining;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remaining.reserve(works_.size());
    for (auto& [id, entry] : works_) {
      remaining.push_back(entry.work);
    }
  }
  // Oldest first, so the report reads in issue order.
  std::sort(remaining.begin(), remaining.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  for (const std::shared_ptr<PendingWork>& work : remaining) {
    std::exception_ptr error;
    try {
      work->complete();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    retire_locked(*work, error);
    UnwaitedWork record{work->info().rank,     work->info().op,
                        work->info().seq,      work->info().group,
                        work->info().site,
                        /*at_rank_exit=*/true, error ? describe(error) : std::string()};
    unwaited_.push_back(std::move(record));
    if (error) {
      deferred_errors_.push_back(error);
    }
  }
}

void WorkRegistry::complete_unwaited(const std::shared_ptr<PendingWork>& work,
                                     bool at_exit) noexcept {
  std::exception_ptr error;
  try {
    work->complete();
  } catch (...) {
    error = std::current_exception();
  }
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    unwaited_.push_back(UnwaitedWork{work->info().rank, work->info().op, work->info().seq,
                                     work->info().group, work->info().site, at_exit,
                                     error ? describe(error) : std::string()});
    if (error) {
      deferred_errors_.push_back(error);
    }
  } catch (...) {
    // Out of memory while recording: the report loses this line; never throw from a drop.
  }
}

std::size_t WorkRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return works_.size();
}

std::vector<UnwaitedWork> WorkRegistry::unwaited() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unwaited_;
}

std::exception_ptr WorkRegistry::take_deferred_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (deferred_errors_.empty()) {
    return nullptr;
  }
  std::exception_ptr first = deferred_errors_.front();
  deferred_errors_.clear();
  return first;
}

}  // namespace chorus::detail
