// The fiber rank executor (Note [Rank executor]): each rank is a Boost.Context fiber with its
// own guarded stack, switched on the scheduler's thread. Under AddressSanitizer and
// ThreadSanitizer every switch is announced with the sanitizer's fiber API, so ASan follows the
// stacks and TSan keeps each rank's own context (Note [Fibers under TSan]).
//
// Note [Fiber exception state]
// The C++ runtime keeps the exceptions being handled (the caught-exception chain that `throw;`
// and std::current_exception read) and std::uncaught_exceptions() in per-*thread* globals. Fibers
// share the thread, so a rank that reaches a chorus call inside a catch handler would otherwise
// see another rank's exception when it resumes. Every switch therefore swaps those globals: each
// context (the scheduler, each rank) keeps its own copy.

#include <cxxabi.h>

#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "executor.hpp"

#if defined(CHORUS_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(CHORUS_TSAN)
#include <sanitizer/tsan_interface.h>

#include <string>
#endif

// Note [Context jumps without the PLT]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every fiber switch calls Boost.Context's jump_fcontext, two a rank step, in the shared library:
// through the PLT, a call and a jump each. Declared `noplt` (GCC's; clang has no such attribute),
// a call reads the function's address from the GOT itself, one jump fewer a switch. The library is
// bound at start-up then, as -fno-plt would bind it, not at the first call.
#if defined(__GNUC__) && !defined(__clang__)
namespace boost::context::detail {
extern "C" [[gnu::noplt]] transfer_t jump_fcontext(fcontext_t const to, void* vp);
}  // namespace boost::context::detail
#endif

namespace chorus::sim::detail {
namespace {

namespace ctx = boost::context;

#if defined(CHORUS_ASAN)
constexpr std::size_t kStackBytes = std::size_t{8} << 20;  // ASan's redzones grow frames
#else
constexpr std::size_t kStackBytes = std::size_t{1} << 20;
#endif

// Note [Fiber stack pool]
// A guarded stack costs an mmap and an mprotect to make, page faults on first use and an munmap
// (with its TLB shootdown) to free: for a world of 4 ranks that was most of its ~120 us fixed
// cost (docs/performance.md). Stacks are therefore kept, per OS thread (fibers are created and
// destroyed on the scheduler's thread), for the next world: up to kPooledStacksMax of them, each
// keeping the pages its last rank touched. A reused stack holds the previous rank's garbage instead
// of zeros; a program whose result depends on that reads uninitialised memory, which no schedule
// makes defined. Under ASan a stack is unpoisoned when it comes back: frames of a fiber that ended
// by switching away never returned to clear their redzones.
constexpr std::size_t kPooledStacksMax = 64;

class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (ctx::stack_context& stack : free_) {
      ctx::protected_fixedsize_stack(kStackBytes).deallocate(stack);
    }
  }

  ctx::stack_context take() {
    if (free_.empty()) {
      return ctx::protected_fixedsize_stack(kStackBytes).allocate();
    }
    const ctx::stack_context stack = free_.back();
    free_.pop_back();
    return stack;
  }

  void give_back(ctx::stack_context& stack) noexcept {
    CHORUS_CHECK(stack.sp != nullptr);
    if (free_.size() >= kPooledStacksMax) {
      ctx::protected_fixedsize_stack(kStackBytes).deallocate(stack);
      return;
    }
#if defined(CHORUS_ASAN)
    // Not the guard page at the bottom: it stays inaccessible.
    const std::size_t page = ctx::stack_traits::page_size();
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(stack.sp) - stack.size + page,
                                stack.size - page);
#endif
    try {
      free_.push_back(stack);
    } catch (...) {
      ctx::protected_fixedsize_stack(kStackBytes).deallocate(stack);
    }
  }

 private:
  std::vector<ctx::stack_context> free_;
};

thread_local StackPool stack_pool;

// Announces stack switches to ASan; no-ops otherwise.
struct SanitizerStack {
  const void* bottom = nullptr;
  std::size_t size = 0;
  void* fake_stack = nullptr;
};

inline void start_switch([[maybe_unused]] void** fake_stack_save,
                         [[maybe_unused]] const SanitizerStack& to) {
#if defined(CHORUS_ASAN)
  __sanitizer_start_switch_fiber(fake_stack_save, to.bottom, to.size);
#endif
}

inline void finish_switch([[maybe_unused]] void* fake_stack,
                          [[maybe_unused]] SanitizerStack* from) {
#if defined(CHORUS_ASAN)
  if (from != nullptr) {
    __sanitizer_finish_switch_fiber(fake_stack, &from->bottom, &from->size);
  } else {
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
  }
#endif
}

// Note [Fibers under TSan]
// ThreadSanitizer keeps a context per thread (its shadow call stack, its clock, its name in
// reports). Fibers switched on one thread would all use the scheduler thread's: a report could
// not say which rank made an access, and the entries each fiber leaves on the shared shadow stack
// when it is made pile up there, world after world. So each rank gets a TSan context of its own,
// named "chorus rank N", and the scheduler announces each switch (__tsan_switch_to_fiber):
// - into a rank, just before the jump; back to its own context just after the jump returns. The
//   rank side (suspend) announces nothing: the frames around each jump are entered and left in
//   the rank's context, so every context's shadow stack stays balanced.
// - with synchronisation: one context runs at a time, and each switch orders what ran before it
//   before what runs after it, as the threads executor's baton does. So ranks never race with
//   one another here (they cannot: they share a thread); what TSan checks is everything else,
//   e.g. a thread that is not a rank and touches a rank's data without synchronising.
// - around the making of the fiber too: Boost.Context enters the new stack once then, to park the
//   fiber's entry function, and that entry's frame belongs to the rank.
// - from the frame that jumps (start, resume) itself: the switch's helper is always inlined, even
//   at -O0 (the tsan preset's Debug build). As a function of its own, its instrumented entry would
//   be pushed in one context and its exit popped in the other: a new context's shadow stack would
//   go one below its start, and the next entry would write outside it.
// A rank's context stays current until the jump back from its last frames returns, and is
// destroyed with its lane. A rank's stack in a report ends in the scheduler's frames that made
// it and first resumed it (entered in the rank's context, never left): they did not run on the
// rank's stack.
#if defined(CHORUS_TSAN)
class TsanContext {
 public:
  TsanContext() : context_(__tsan_create_fiber(0)) {}
  TsanContext(TsanContext&& other) noexcept : context_(std::exchange(other.context_, nullptr)) {}
  TsanContext& operator=(TsanContext&&) = delete;
  ~TsanContext() {
    if (context_ != nullptr) {
      __tsan_destroy_fiber(context_);
    }
  }

  void name_after(int rank) {
    const std::string name = "chorus rank " + std::to_string(rank);
    __tsan_set_fiber_name(context_, name.c_str());  // TSan keeps its own copy
  }
  void* get() const noexcept { return context_; }
  // The calling thread's current context (the scheduler's).
  static void* current() noexcept { return __tsan_get_current_fiber(); }

 private:
  void* context_;
};

// Makes a lane's context current while it lives, and the scheduler's again after. Both switches
// are inlined into the caller's frame, even at -O0 (Note [Fibers under TSan]).
class InLaneContext {
 public:
  [[gnu::always_inline]] InLaneContext(const TsanContext& lane, void* scheduler)
      : scheduler_(scheduler) {
    __tsan_switch_to_fiber(lane.get(), 0);
  }
  InLaneContext(const InLaneContext&) = delete;
  InLaneContext& operator=(const InLaneContext&) = delete;
  [[gnu::always_inline]] ~InLaneContext() { __tsan_switch_to_fiber(scheduler_, 0); }

 private:
  void* scheduler_;
};
#else
struct TsanContext {
  void name_after(int /*rank*/) {}
  static void* current() noexcept { return nullptr; }
};

struct InLaneContext {
  InLaneContext(const TsanContext& /*lane*/, void* /*scheduler*/) {}
};
#endif

// The Itanium C++ ABI's per-thread exception globals (libsupc++'s __cxa_eh_globals on x86-64 and
// AArch64: the caught-exception chain and the uncaught-exception count).
struct ExceptionGlobals {
  void* caught_exceptions = nullptr;
  unsigned int uncaught_exceptions = 0;
};
#if defined(__arm__)
#error "the ARM EH ABI adds fields to __cxa_eh_globals; extend ExceptionGlobals first"
#endif

ExceptionGlobals* thread_exception_globals() noexcept {
  return reinterpret_cast<ExceptionGlobals*>(abi::__cxa_get_globals());  // NOLINT: ABI layout
}

// Note [Exception globals copied whole]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// resume swaps the thread's exception globals with the lane's, four copies a rank step. Assigned
// as a struct, each copy was two loads and two stores (the pointer, then the count), and the
// scheduler's saved copy went through the stack twice: sixteen instructions a step. Copied as
// their bytes, padding and all, each is one 16-byte load and store. The runtime's struct has the
// same members in the same order (the #error above), so it has the same size and the padding
// copied is its own: no byte outside it is written.
inline void copy_exceptions(ExceptionGlobals& to, const ExceptionGlobals& from) noexcept {
  std::memcpy(&to, &from, sizeof(ExceptionGlobals));
}

// Note [A switch leaves its fiber empty]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `f = std::move(f).resume()` empties f before it jumps and assigns the context that jumps back
// into it after. The assignment ends what f held before it, which the compiler must read again
// after the jump (the other context could have written it) and test, to unwind a fiber left
// there: three instructions a switch, two switches a rank step. Nothing fills a lane's fibers
// while the other side runs: a rank's `fiber` is the scheduler's to set (resume, make_lanes) and
// its `scheduler` the rank's (suspend, run_lane), each only on its own side of the switch. So the
// slot is still empty when the jump returns: release builds tell the compiler so, debug builds
// check it.
[[gnu::always_inline]] inline void switch_to(ctx::fiber& slot) noexcept {
  ctx::fiber back = std::move(slot).resume();
#if CHORUS_DCHECK_IS_ON
  CHORUS_CHECK(!slot);
#else
  if (slot) {
    __builtin_unreachable();
  }
#endif
  slot = std::move(back);
}

// One per run: recycled (Note [Recycled blocks]).
class FiberExecutor final : public RankExecutor, public transport::RecycledNew<FiberExecutor> {
 public:
  ~FiberExecutor() override {
    stop();
    SpareLanes::give(lanes_);  // Note [Recycled rooms]: the lanes' room, for the next executor
  }

  void start(int count, std::function<void(int)> body) override {
    CHORUS_CHECK(lanes_.empty());
    lanes_ = SpareLanes::take();  // Note [Recycled rooms]: an earlier executor's, empty
    body_ = std::move(body);
    // The scheduler resumes ranks from the thread that starts them: its exception globals stay
    // where they are (a libstdc++ call and a TLS lookup per switch otherwise).
    scheduler_thread_globals_ = thread_exception_globals();
    scheduler_tsan_ = TsanContext::current();
    try {
      make_lanes(count);
    } catch (...) {
      end_made_lanes();
      throw;
    }
  }

  void resume(int rank) override {
    Lane& lane = lane_of(rank);
    // The scheduler resumes only runnable ranks, and a rank is Finished (never runnable again)
    // before its body returns (SimWorld::rank_body); end_made_lanes resumes only lanes it made,
    // whose bodies never ran. So release builds do not check it at every rank step.
    CHORUS_DCHECK(!lane.finished);
#if defined(CHORUS_TSAN)
    // The scheduler's thread, in its own context (Note [Fibers under TSan]).
    CHORUS_CHECK(TsanContext::current() == scheduler_tsan_);
#endif
    // Every switch into a rank starts here and every switch out of it returns here, so swapping
    // the exception globals around this call gives each context its own (Note [Fiber exception
    // state]).
    // Note [Exception globals copied whole].
    ExceptionGlobals* globals = scheduler_thread_globals_;
    ExceptionGlobals scheduler_exceptions;
    copy_exceptions(scheduler_exceptions, *globals);
    copy_exceptions(*globals, lane.exceptions);
    void* fake_stack = nullptr;
    start_switch(&fake_stack, lane.stack);
    {
      const InLaneContext in_lane(lane.tsan, scheduler_tsan_);  // Note [Fibers under TSan]
      switch_to(lane.fiber);  // Note [A switch leaves its fiber empty]
    }
    finish_switch(fake_stack, nullptr);
    copy_exceptions(lane.exceptions, *globals);
    copy_exceptions(*globals, scheduler_exceptions);
  }

  void suspend(int rank) override {
    Lane& lane = lane_of(rank);
    start_switch(&lane.stack.fake_stack, scheduler_stack_);
    switch_to(lane.scheduler);  // Note [A switch leaves its fiber empty]
    finish_switch(lane.stack.fake_stack, &scheduler_stack_);
  }

  bool finished(int rank) const override {
    return lanes_.at(static_cast<std::size_t>(rank)).finished;
  }

  void stop() override {
    for (const Lane& lane : lanes_) {
      CHORUS_CHECK(lane.finished);
    }
    lanes_.clear();
  }

 private:
  struct Lane {
    // Note [Fibers under TSan]. First, so that it outlives the fibers below.
    [[no_unique_address]] TsanContext tsan;
    ctx::fiber fiber;      // the rank, while suspended
    ctx::fiber scheduler;  // the scheduler, while the rank runs
    SanitizerStack stack;
    ExceptionGlobals exceptions;  // this rank's, while it is suspended
    bool finished = false;
  };

  // The lane of `rank`: the scheduler resumes only ranks it made (SimWorld::execute's decision,
  // end_made_lanes' index) and a rank suspends itself (every caller of SimWorld::yield passes its
  // own rank, see yield; debug builds check it there), so the rank is always one of the lanes'
  // and release builds index without at()'s bounds check, twice a rank step; debug builds check
  // it here too.
  Lane& lane_of(int rank) noexcept {
    CHORUS_DCHECK(rank >= 0 && static_cast<std::size_t>(rank) < lanes_.size());
    return lanes_[static_cast<std::size_t>(rank)];
  }

  // A guarded stack from this thread's pool (Note [Fiber stack pool]) that tells its lane where
  // it lives (for the sanitizer annotations).
  struct RecordingStack {
    SanitizerStack* record;

    ctx::stack_context allocate() {
      if (RefuseContextsAfter::refuses_next()) {
        throw std::bad_alloc();  // as protected_fixedsize_stack's refused mmap
      }
      ctx::stack_context context = stack_pool.take();
      record->bottom = static_cast<char*>(context.sp) - context.size;
      record->size = context.size;
      return context;
    }
    void deallocate(ctx::stack_context& context) noexcept { stack_pool.give_back(context); }
  };

  void make_lanes(int count) {
    lanes_.resize(static_cast<std::size_t>(count));
    for (int rank = 0; rank < count; ++rank) {
      Lane& lane = lanes_[static_cast<std::size_t>(rank)];
      lane.tsan.name_after(rank);
      const InLaneContext in_lane(lane.tsan, scheduler_tsan_);  // Note [Fibers under TSan]
      lane.fiber = ctx::fiber(
          std::allocator_arg, RecordingStack{&lane.stack},
          [this, rank](ctx::fiber&& scheduler) { return run_lane(rank, std::move(scheduler)); });
    }
  }

  // After make_lanes failed, in its handler: the fibers made run to their end without their body,
  // through resume() and its annotations (destroying an unstarted fiber would unwind it on its own
  // stack, unannounced to the sanitizers), which keep the handler's exception aside meanwhile
  // (Note [Fiber exception state]). The executor is empty again.
  void end_made_lanes() {
    cancelled_ = true;
    for (std::size_t r = 0; r < lanes_.size(); ++r) {
      if (lanes_[r].fiber) {
        resume(static_cast<int>(r));
      } else {
        lanes_[r].finished = true;  // never made
      }
    }
    stop();
    cancelled_ = false;
  }

  ctx::fiber run_lane(int rank, ctx::fiber&& scheduler) {
    finish_switch(nullptr, &scheduler_stack_);
    Lane& lane = lanes_[static_cast<std::size_t>(rank)];
    lane.scheduler = std::move(scheduler);
    if (!cancelled_) {
      body_(rank);
    }
    lane.finished = true;
    start_switch(nullptr, scheduler_stack_);  // this stack is about to die
    return std::move(lane.scheduler);
  }

  std::function<void(int)> body_;
  bool cancelled_ = false;  // start() failed: lanes end without their body
  // A std::vector, not inline (Note [Small per-run vectors]): under TSan a Lane's TsanContext
  // cannot be assigned, which boost's small_vector needs. Its room goes from executor to executor
  // on the thread (Note [Recycled rooms]), emptied: every run makes an executor.
  struct SpareLanesTag {};
  using SpareLanes = transport::RecycledRooms<std::vector<Lane>, SpareLanesTag, 4>;
  std::vector<Lane> lanes_;
  SanitizerStack scheduler_stack_;
  void* scheduler_tsan_ = nullptr;  // the scheduler's TSan context (Note [Fibers under TSan])
  ExceptionGlobals* scheduler_thread_globals_ = nullptr;
};

}  // namespace

std::unique_ptr<RankExecutor> make_fiber_executor() { return std::make_unique<FiberExecutor>(); }

// Note [Fiber switches called directly].
void resume_fiber(RankExecutor& fibers, int rank) {
  static_cast<FiberExecutor&>(fibers).resume(rank);
}
void suspend_fiber(RankExecutor& fibers, int rank) {
  static_cast<FiberExecutor&>(fibers).suspend(rank);
}

}  // namespace chorus::sim::detail
