// The SIGSEGV side of Note [Guard pages].

#include "guard_pages.hpp"

#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "chorus/check.hpp"
#include "signal_text.hpp"

namespace chorus::sim::detail {
namespace {

constexpr std::size_t kWhatMax = 480;
constexpr std::size_t kAltStackBytes = std::size_t{64} << 10;

struct GuardedRange {
  std::atomic<std::uintptr_t> begin{0};  // 0: a free entry; published last
  std::uintptr_t end = 0;
  const std::uint64_t* step = nullptr;
  const char* replay = nullptr;
  char what[kWhatMax] = {};
};

// Process-wide: see Note [Guard pages].
GuardedRange guarded_ranges[kGuardedRangesMax];
std::mutex guarded_ranges_mutex;  // serialises add/remove; the handler never takes it
struct sigaction previous_action;
std::once_flag handler_once;

bool faulted_on_write(void* context) {
#if defined(__x86_64__) && defined(REG_ERR)
  // The page-fault error code: bit 1 set for a write access.
  return (static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 0x2) != 0;
#else
  (void)context;
  return false;
#endif
}

void on_segv(int signal, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (const GuardedRange& range : guarded_ranges) {
    const std::uintptr_t begin = range.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address >= range.end) {
      continue;
    }
    char message[kWhatMax + 160];
    std::size_t length = 0;
    // A rank's own thread (or fiber) says which; a thread the program started has no rank.
    if (const int rank = guard_fault_rank(); rank >= 0) {
      append_text(message, sizeof message, &length, "chorus sim: rank ");
      append_number(message, sizeof message, &length, rank);
    } else {
      append_text(message, sizeof message, &length, "chorus sim: a thread of no rank");
    }
    append_text(message, sizeof message, &length,
                faulted_on_write(context) ? " wrote to " : " read ");
    append_text(message, sizeof message, &length, range.what);
    append_text(message, sizeof message, &length, " at step ");
    append_number(message, sizeof message, &length, static_cast<std::int64_t>(*range.step));
    append_text(message, sizeof message, &length,
                " without waiting (guard pages: SimOptions::guard_pending_outputs)\n");
    ssize_t written = write(STDERR_FILENO, message, length);
    if (range.replay != nullptr) {
      written = write(STDERR_FILENO, range.replay, text_length(range.replay));
    }
    (void)written;
    std::abort();
  }
  // Not a guarded page: hand the fault to whoever handled SIGSEGV before us, staying installed
  // for later guard-mode runs. A handler is called directly; the default action (or ignoring,
  // which the kernel does not honour for a real fault) is restored so that returning re-executes
  // the access under it, and a signal sent by kill() is raised again.
  if ((previous_action.sa_flags & SA_SIGINFO) != 0 && previous_action.sa_sigaction != nullptr) {
    previous_action.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal);
    return;
  }
  sigaction(SIGSEGV, &previous_action, nullptr);
  if (info->si_code <= 0) {
    raise(signal);
  }
}

// Disables the thread's alternate stack before freeing it.
struct AltStack {
  std::unique_ptr<char[]> memory;
  ~AltStack() {
    if (memory != nullptr) {
      stack_t off{};
      off.ss_flags = SS_DISABLE;
      sigaltstack(&off, nullptr);
    }
  }
};
thread_local AltStack alt_stack;

}  // namespace

void install_guard_handler() {
  std::call_once(handler_once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    CHORUS_CHECK_EQ(sigaction(SIGSEGV, &action, &previous_action), 0);
  });
}

void ensure_signal_alt_stack() {
  if (alt_stack.memory != nullptr) {
    return;
  }
  stack_t current{};
  CHORUS_CHECK_EQ(sigaltstack(nullptr, &current), 0);
  if ((current.ss_flags & SS_DISABLE) == 0) {
    return;  // the thread has one already (gtest's death tests, a host program)
  }
  alt_stack.memory = std::make_unique<char[]>(kAltStackBytes);
  stack_t stack{};
  stack.ss_sp = alt_stack.memory.get();
  stack.ss_size = kAltStackBytes;
  CHORUS_CHECK_EQ(sigaltstack(&stack, nullptr), 0);
}

int add_guarded_range(const void* begin, std::size_t nbytes, const std::string& what,
                      const std::uint64_t* step, const char* replay) {
  CHORUS_CHECK(begin != nullptr);
  CHORUS_CHECK_GT(nbytes, 0u);
  std::lock_guard<std::mutex> lock(guarded_ranges_mutex);
  for (std::size_t i = 0; i < kGuardedRangesMax; ++i) {
    GuardedRange& range = guarded_ranges[i];
    if (range.begin.load(std::memory_order_relaxed) != 0) {
      continue;
    }
    range.end = reinterpret_cast<std::uintptr_t>(begin) + nbytes;
    range.step = step;
    range.replay = replay;
    const std::size_t length = std::min(what.size(), kWhatMax - 1);
    std::memcpy(range.what, what.data(), length);
    range.what[length] = '\0';
    range.begin.store(reinterpret_cast<std::uintptr_t>(begin), std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;  // full: the caller leaves this output unprotected (poisoned only)
}

void remove_guarded_range(int index) noexcept {
  CHORUS_CHECK_GE(index, 0);
  CHORUS_CHECK_LT(static_cast<std::size_t>(index), kGuardedRangesMax);
  std::lock_guard<std::mutex> lock(guarded_ranges_mutex);
  guarded_ranges[static_cast<std::size_t>(index)].begin.store(0, std::memory_order_release);
}

}  // namespace chorus::sim::detail
