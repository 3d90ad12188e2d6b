#pragma once

// Note [Rank executor]
// The simulator runs each rank as ordinary blocking code on its own execution context and
// switches between them explicitly: the scheduler resumes one rank, which runs until it
// suspends (at its next chorus call) or finishes, and control returns to the scheduler. Only one
// context runs at a time. The scheduler never depends on how contexts are made: fibers
// (Boost.Context, ~11 ns per switch) and OS threads (~25 us per switch) implement the same
// interface, and the simulator is identical on both.
//
// Rank-local state (RankContext::current) is a thread_local; whoever resumes a context must
// rebind it there (the simulator does so after every suspend returns).

#include <functional>
#include <memory>

#include "chorus/sim/sim.hpp"

namespace chorus::sim::detail {

class RankExecutor {
 public:
  virtual ~RankExecutor() = default;

  // Prepares `count` contexts; context r runs body(r) when first resumed. `body` must not
  // throw. When a context cannot be made (out of memory for a stack, no thread to be had), the
  // contexts made so far end without running `body`, the executor is empty again (it may start
  // anew), and the error propagates: std::bad_alloc, std::system_error.
  virtual void start(int count, std::function<void(int)> body) = 0;
  // Scheduler side: runs context `rank` until it suspends or its body returns.
  virtual void resume(int rank) = 0;
  // Rank side, from inside body(rank): gives control back to the scheduler; returns when the
  // scheduler resumes `rank` again.
  virtual void suspend(int rank) = 0;
  // Whether body(rank) has returned.
  virtual bool finished(int rank) const = 0;
  // Releases the contexts; every body must have returned, and each executor checks that it has
  // (CHORUS_CHECK, release builds too): SimWorld::run relies on this check at a run's end.
  virtual void stop() = 0;
};

// Test seam for the failure path of start() in every build: while one lives on a thread (one
// at a time), the executors started on that thread make `made` contexts in all and refuse every
// one after, as the system would (a fiber's stack: std::bad_alloc; a thread: std::system_error).
// The system's own refusal needs an address-space limit, which the sanitizers' shadow memory
// cannot live under.
class RefuseContextsAfter {
 public:
  explicit RefuseContextsAfter(int made);
  ~RefuseContextsAfter();
  RefuseContextsAfter(const RefuseContextsAfter&) = delete;
  RefuseContextsAfter& operator=(const RefuseContextsAfter&) = delete;

  // The executors ask before making each context: whether it is refused (else it is counted).
  static bool refuses_next() noexcept;
};

std::unique_ptr<RankExecutor> make_thread_executor();
std::unique_ptr<RankExecutor> make_fiber_executor();

// Note [Fiber switches called directly]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The scheduler resumes a rank, and the rank suspends, once a rank step each. Through the
// virtual calls each is a call the link-time optimiser cannot see into: the switch's own frame
// set-up, and the executor's table read. These call the fiber executor's resume and suspend by
// name (the class is final), so the optimiser may inline them into their callers
// (SimWorld::switch_into and switch_out, which know which executor they made). `fibers` must be one
// make_fiber_executor made.
void resume_fiber(RankExecutor& fibers, int rank);
void suspend_fiber(RankExecutor& fibers, int rank);

// The executor `kind` resolves to (Auto -> Fibers).
ExecutorKind resolve_executor(ExecutorKind kind) noexcept;

}  // namespace chorus::sim::detail
