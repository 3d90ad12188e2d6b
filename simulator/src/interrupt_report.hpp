#pragma once

// Note [Interrupt report]
// The simulator preempts a rank only at its chorus calls: a rank stuck in its own code (a loop
// that never calls chorus, a blocking read) stalls every rank, and the run neither ends nor
// fails — on NCCL its peers would time out. With SimOptions::report_on_interrupt (chorus::run
// sets it) the person at the terminal who presses Ctrl-C learns where the run was: a SIGINT
// during the run writes
//   chorus sim: interrupted at step 12 (virtual time 12 us) while rank 2 was running its own
//   code (the simulator runs one rank at a time and switches only at chorus calls: ...)
//     replay: CHORUS_SIM_SEED=3 ./prog
// and then ends the process as the signal would have (the disposition the run found is put
// back and the signal raised again). The handler takes no lock and allocates nothing: what it
// writes comes from a RunInterruptInfo the world owns for the run, published with an atomic. The
// handler, like a signal disposition, is process-wide: a run on another thread at the same time
// replaces the published info, and the last run to end puts the disposition back. Threads that
// run ranks get an alternate signal stack (fiber stacks are small), as for guard pages.

#include <atomic>
#include <cstdint>

namespace chorus::sim::detail {

// What the SIGINT handler reads, owned by the run for as long as it is published.
struct RunInterruptInfo {
  const std::atomic<int>* running_rank = nullptr;     // the rank running now, or -1
  const std::atomic<std::int64_t>* now_ns = nullptr;  // virtual time
  const std::atomic<std::uint64_t>* steps = nullptr;  // scheduling decisions taken
  const char* replay = nullptr;                       // "  replay: ...\n"
};

// Publishes `info` and installs the SIGINT handler, keeping the disposition it replaces.
void publish_interrupt_info(const RunInterruptInfo* info);
// Takes `info` back (if it is the one published) and restores the disposition kept.
void withdraw_interrupt_info(const RunInterruptInfo* info) noexcept;

}  // namespace chorus::sim::detail
