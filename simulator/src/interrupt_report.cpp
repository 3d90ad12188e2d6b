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

// Process-wide, as the disposition is: the info of the run that published last, the disposition
// the handler replaced, and how many runs have it installed.
std::atomic<const RunInterruptInfo*> published{nullptr};
std::mutex install_mutex;  // serialises publish/withdraw; the handler never takes it
struct sigaction previous_action;
int runs_installed = 0;

void on_sigint(int signal) {
  if (const RunInterruptInfo* info = published.load(std::memory_order_acquire); info != nullptr) {
    char message[512];
    std::size_t length = 0;
    append_text(message, sizeof message, &length, "chorus sim: interrupted at virtual time ");
    append_number(message, sizeof message, &length,
                  info->now_ns->load(std::memory_order_relaxed) / 1000);
    append_text(message, sizeof message, &length, " us while ");
    if (const int rank = info->running_rank->load(std::memory_order_relaxed); rank >= 0) {
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
    written = write(STDERR_FILENO, info->replay, text_length(info->replay));
    (void)written;
  }
  // End as the signal would have: the disposition the run found, then the signal again (it is
  // blocked while this handler runs, so it is delivered once the handler returns).
  sigaction(SIGINT, &previous_action, nullptr);
  raise(signal);
}

}  // namespace

void publish_interrupt_info(const RunInterruptInfo* info) {
  CHORUS_CHECK(info != nullptr && info->running_rank != nullptr && info->now_ns != nullptr &&
               info->replay != nullptr);
  std::lock_guard<std::mutex> lock(install_mutex);
  if (runs_installed == 0) {
    struct sigaction action {};
    action.sa_handler = on_sigint;
    action.sa_flags = SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    struct sigaction found {};
    CHORUS_CHECK_EQ(sigaction(SIGINT, nullptr, &found), 0);
    if (found.sa_handler == SIG_IGN) {
      return;  // the caller ignores SIGINT (nohup, a background job): so does the run
    }
    CHORUS_CHECK_EQ(sigaction(SIGINT, &action, &previous_action), 0);
  }
  ++runs_installed;
  published.store(info, std::memory_order_release);
}

void withdraw_interrupt_info(const RunInterruptInfo* info) noexcept {
  std::lock_guard<std::mutex> lock(install_mutex);
  const RunInterruptInfo* expected = info;
  published.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel);
  if (runs_installed > 0 && --runs_installed == 0) {
    published.store(nullptr, std::memory_order_release);
    sigaction(SIGINT, &previous_action, nullptr);
  }
}

}  // namespace chorus::sim::detail
