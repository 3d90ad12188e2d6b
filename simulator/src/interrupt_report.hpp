#pragma once

// Note [Interrupt report]
// The simulator preempts a rank only at its chorus calls: a rank stuck in its own code (a loop
// that never calls chorus, a blocking read) stalls every rank, and the run neither ends nor
// fails — on NCCL its peers would time out. With SimOptions::report_on_interrupt (chorus::run
// sets it) the person at the terminal who presses Ctrl-C learns where the run was: a SIGINT
// during the run writes
//   chorus sim: interrupted at virtual time 12 us while rank 2 was running its own code (the
//   simulator runs one rank at a time and switches only at chorus calls, ...)
//     replay: CHORUS_SIM_SEED=3 ./prog
// for every run in progress (runs on several threads of one process: up to
// kInterruptReportsMax of them), and then ends the process as the signal would have (the
// disposition the first run found is put back and the signal raised again).
//
// The handler takes no lock and allocates nothing: what it writes comes from a
// RunInterruptInfo each run owns while it is published, in a fixed table of atomics. A handler
// running on another thread than the run's may still be reading an info as its run withdraws
// it, so the handler counts itself in (handlers_running) before it reads the table and out
// after, and withdrawing waits for that count to reach zero once the info is out of the table.
// Threads that run ranks get an alternate signal stack (fiber stacks are small), as for guard
// pages.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace chorus::sim::detail {

// Runs in progress at once whose interrupt is reported; later ones are not.
inline constexpr std::size_t kInterruptReportsMax = 8;

// What the SIGINT handler reads, owned by the run for as long as it is published.
struct RunInterruptInfo {
  const std::atomic<int>* running_rank = nullptr;     // the rank running now, or -1
  const std::atomic<std::int64_t>* now_ns = nullptr;  // virtual time
  const char* replay = nullptr;                       // "  replay: ...\n"
};

// Publishes `info` (the SIGINT handler is installed by the first run in progress, keeping the
// disposition it replaces). Nothing when the caller ignores SIGINT or the table is full.
void publish_interrupt_info(const RunInterruptInfo* info);
// Takes `info` back if it was published; the last run in progress restores the disposition.
// After it returns, no handler reads `info`.
void withdraw_interrupt_info(const RunInterruptInfo* info) noexcept;

}  // namespace chorus::sim::detail
