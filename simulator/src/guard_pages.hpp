#pragma once

// Note [Guard pages]
// With SimOptions::guard_pending_outputs the simulator's allocator gives every storage whole
// pages (Note [Simulator allocator]), and SimWorld::start protects (PROT_NONE) the block of each
// output it poisons, once the operation is registered and pending. The world unprotects a work's
// blocks before it touches them itself: at completion (before hashing inputs and writing results)
// and when the operation fails; the allocator unprotects a block freed while still protected.
// Between issue and completion, the program touching that memory (through unsafe_data_ptr(): every
// other access waits first) faults. The SIGSEGV handler looks the address up in a fixed table of
// protected ranges, writes
//   chorus sim: rank 2 read the pending output of all_reduce #3 on group [0, 1] (issued by rank
//   2 at a.cpp:12) at step 1234 without waiting
// then the run's replay line (the world's, made when the run starts), and aborts: the run never
// ends, so its report, timeline and trace are not written, and the replay line is how to get
// back to the fault. A fault outside the table goes to the handler that was installed before ours.
//
// A signal handler may take no lock and allocate nothing, so each entry's text is formatted when
// the range is protected, and entries are published with atomics. The table, the handler and
// the disposition are process-wide because signal dispositions are; entries are only written by
// the context holding a world's scheduling turn. The handler runs on an alternate signal stack
// (fiber stacks are small), which every thread running ranks installs (ensure_signal_alt_stack).
// ASan and TSan own SIGSEGV, so sim::run refuses guard mode in those builds.

#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus::sim::detail {

// Ranges protected at once, over every world of the process.
inline constexpr std::size_t kGuardedRangesMax = 4096;

// Installs the SIGSEGV handler (once per process). Thread-safe.
void install_guard_handler();
// Gives the calling thread an alternate signal stack for the simulator's signal handlers (this
// one and Note [Interrupt report]'s), once per thread.
void ensure_signal_alt_stack();

// Registers [begin, begin + nbytes) with the fault report `what` ("the pending output of ...");
// `step` is read at fault time (the world's decision counter), and `replay` (null: none), a
// text written after the report, too: both belong to the world, which outlives its ranges.
// Returns the entry's index, or -1 when the table is full (the caller leaves the range
// unprotected: SimAllocator marks "guard.table_full").
int add_guarded_range(const void* begin, std::size_t nbytes, const std::string& what,
                      const std::uint64_t* step, const char* replay = nullptr);
void remove_guarded_range(int index) noexcept;

// The simulated rank running on the calling thread, or -1 (world.cpp; reads a thread_local, so
// the handler may call it).
int guard_fault_rank() noexcept;

}  // namespace chorus::sim::detail
