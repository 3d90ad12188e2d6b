// The SIGINT side of Note [Interrupt report].

#include "interrupt_report.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "chorus/check.hpp"
#include "signal_text.hpp"

namespace chorus::sim::detail {
namespace {

// Process-wide, as the disposition is: the runs in progress, the handlers reading them, and the
// disposition the handler replaced. install_mutex serialises publish and withdraw; the handler
// never takes it.
std::atomic<const RunInterruptInfo*> published[kInterruptReportsMax] = {};
std::atomic<int> handlers_running{0};
std::mutex install_mutex;
struct sigaction previous_action;  // written before the handler is installed
int runs_published = 0;

void report(const RunInterruptInfo& info) {
  char message[512];
  std::size_t length = 0;
  append_text(message, sizeof message, &length, "chorus sim: interrupted at virtual time ");
  append_number(message, sizeof message, &length,
                info.now_ns->load(std::memory_order_relaxed) / 1000);
  append_text(message, sizeof message, &length, " us while ");
  if (const int rank = info.running_rank->load(std::memory_order_relaxed); rank >= 0) {
    append_text(message, sizeof message, &length, "rank ");
    append_number(message, sizeof message, &length, rank);
    append_text(message, sizeof message, &length,
                " was running its own code (the simulator runs one rank at a time and switches "
                "only at chorus calls, so a rank that never makes one stalls every rank; on "
                "NCCL its peers would time out)\n");
  } else {
    append_text(message, sizeof message, &length, "no rank was running\n");
  }
  ssize_t written = write(STDERR_FILENO, message, length);
  written = write(STDERR_FILENO, info.replay, text_length(info.replay));
  (void)written;
}

void on_sigint(int signal) {
  handlers_running.fetch_add(1, std::memory_order_acq_rel);
  for (const std::atomic<const RunInterruptInfo*>& slot : published) {
    if (const RunInterruptInfo* info = slot.load(std::memory_order_acquire); info != nullptr) {
      report(*info);
    }
  }
  handlers_running.fetch_sub(1, std::memory_order_acq_rel);
  // End as the signal would have: the disposition the first run found, then the signal again
  // (blocked while this handler runs, so it is delivered once the handler returns).
  sigaction(SIGINT, &previous_action, nullptr);
  raise(signal);
}

}  // namespace

void publish_interrupt_info(const RunInterruptInfo* info) {
  CHORUS_CHECK(info != nullptr && info->running_rank != nullptr && info->now_ns != nullptr &&
               info->replay != nullptr);
  std::lock_guard<std::mutex> lock(install_mutex);
  std::atomic<const RunInterruptInfo*>* free_slot = nullptr;
  for (std::atomic<const RunInterruptInfo*>& slot : published) {
    if (slot.load(std::memory_order_relaxed) == nullptr) {
      free_slot = &slot;
      break;
    }
  }
  if (free_slot == nullptr) {
    return;  // kInterruptReportsMax runs in progress: this one is not reported
  }
  if (runs_published == 0) {
    struct sigaction found {};
    CHORUS_CHECK_EQ(sigaction(SIGINT, nullptr, &found), 0);
    if (found.sa_handler == SIG_IGN) {  // NOLINT: a union member
      return;  // the caller ignores SIGINT (a background job of a script): so does the run
    }
    struct sigaction action {};
    action.sa_handler = on_sigint;  // NOLINT: a union member
    action.sa_flags = SA_ONSTACK | (found.sa_flags & SA_RESTART);
    sigemptyset(&action.sa_mask);
    previous_action = found;
    CHORUS_CHECK_EQ(sigaction(SIGINT, &action, nullptr), 0);
  }
  ++runs_published;
  free_slot->store(info, std::memory_order_release);
}

void withdraw_interrupt_info(const RunInterruptInfo* info) noexcept {
  std::lock_guard<std::mutex> lock(install_mutex);
  for (std::atomic<const RunInterruptInfo*>& slot : published) {
    const RunInterruptInfo* expected = info;
    if (!slot.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel)) {
      continue;
    }
    // A handler on another thread may have loaded `info` before it left the table.
    while (handlers_running.load(std::memory_order_acquire) != 0) {
    }
    if (--runs_published == 0) {
      sigaction(SIGINT, &previous_action, nullptr);
    }
    return;
  }
}

}  // namespace chorus::sim::detail
