// A collective whose transport call runs out of memory on the simulator (Note [Transport
// contract], Note [Operation positions] in simulator/src/world.cpp): every allocation of one
// rank's call, refused in turn, fails the call with nothing started and no sequence number taken,
// or leaves the operation started with the right result; either way the rank's next collective
// on the group succeeds, bit for bit, under the number the failed call had, and the simulation
// ends normally. Its own executable: it replaces the global operator new.

#include <gtest/gtest.h>

#include <atomic>
#include <chorus/chorus.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/refusing_new.hpp"
#include "support/sim_helpers.hpp"

namespace {

// While counting, the allocations of the refusing thread (the refusing rank's, on the threads
// executor: the scheduler and the other ranks run on their own threads) are numbered from 1, and
// the one numbered refuse_allocation_number (0: none) is refused; with refuse_onwards, that one
// and every one after it.
std::atomic<bool> counting{false};
std::atomic<std::size_t> allocations_counted{0};
std::atomic<std::size_t> refuse_allocation_number{0};
std::atomic<bool> refuse_onwards{false};
std::atomic<std::size_t> allocations_refused{0};
thread_local bool refusing_thread = false;

// From here on, the calling thread's `number`-th allocation is refused (0: none), or with
// `onwards` every one from that one on (on the threads executor, the rank's own thread, which
// ends with the rank), until stop_refusing().
void start_refusing(std::size_t number, bool onwards) {
  allocations_counted = 0;
  allocations_refused = 0;
  refuse_allocation_number = number;
  refuse_onwards = onwards;
  refusing_thread = true;
  counting = true;
}

void stop_refusing() {
  counting = false;
  refuse_allocation_number = 0;
  refuse_onwards = false;
}

}  // namespace

bool chorus::testing::refuse_allocation(std::size_t) noexcept {
  if (!refusing_thread || !counting.load()) {
    return false;
  }
  std::size_t number = allocations_counted.fetch_add(1) + 1;
  bool refuse = false;
  if (refuse_onwards.load()) {
    const std::size_t first = refuse_allocation_number.load();
    refuse = first != 0 && number >= first;
  } else {
    refuse = refuse_allocation_number.compare_exchange_strong(number, 0);
  }
  if (refuse) {
    allocations_refused.fetch_add(1);
  }
  return refuse;
}

namespace chorus {
namespace {

using sim::SimEvent;
using sim::SimOptions;
using sim::SimReport;

// The options of every sweep: seed 7, the ranks on threads (the refusing one on a thread of its
// own), and the event log on (Fail events' texts are made too, so their allocations are refused as
// well).
SimOptions sweep_options(int world_size) {
  SimOptions options = testing::quiet_options(world_size, /*seed=*/7);
  options.executor = sim::ExecutorKind::Threads;
  options.record_events = true;
  return options;
}

// Rank r's input i: r * 100 + i, so that every sum is exact and distinct.
Tensor input_of(int r, std::int32_t elements, std::int32_t offset = 0) {
  std::vector<std::int32_t> values;
  for (std::int32_t i = 0; i < elements; ++i) {
    values.push_back(r * 100 + offset + i);
  }
  return Tensor::from_vector(values);
}

// The sum over `world_size` ranks of input_of(r, elements, offset).
std::vector<std::int32_t> sum_of(int world_size, std::int32_t elements, std::int32_t offset = 0) {
  std::vector<std::int32_t> sum(static_cast<std::size_t>(elements), 0);
  for (int r = 0; r < world_size; ++r) {
    for (std::int32_t i = 0; i < elements; ++i) {
      sum[static_cast<std::size_t>(i)] += r * 100 + offset + i;
    }
  }
  return sum;
}

// One kind of collective call on the world group. It moves its results into `results` (room
// made beforehand), so it allocates nothing after the call returns.
struct CallKind {
  const char* name;
  std::function<void(const std::vector<Tensor>& inputs, std::vector<Tensor>& results)> call;
  std::vector<std::int32_t> sizes;  // of its inputs
};

std::vector<CallKind> call_kinds() {
  return {
      {"all_reduce",
       [](const std::vector<Tensor>& inputs, std::vector<Tensor>& results) {
         results[0] = all_reduce(inputs[0], "sum", world());
       },
       {5}},
      {"all_reduce_coalesced",
       [](const std::vector<Tensor>& inputs, std::vector<Tensor>& results) {
         results = all_reduce_coalesced(inputs, "sum", world());
       },
       {3, 4, 2}},
  };
}

// What rank 0, the refusing rank, saw in one run.
struct Outcome {
  bool threw = false;           // the refused call threw (std::bad_alloc or chorus::Error)
  std::string what;             // what it threw
  std::int64_t error_seq = -2;  // a chorus::Error's context().seq
  bool refused = false;         // the refusal happened (the call made that many allocations)
  std::vector<std::vector<std::int32_t>> results;  // per rank: the call's (or its retry's) results
  std::vector<std::int32_t> after;                 // rank 0: the all_reduce after it
};

// Every rank: all_reduce #0, then the kind's call (#1), of which rank 0's `refuse`-th allocation
// is refused (0: none); a rank whose call threw issues it again, which must be #1 again. Then
// all_reduce #2 on the same group.
// With `guard`, pending outputs are protected (Note [Guard pages]), and every result is read after
// its wait: one left protected faults.
Outcome run_once(const CallKind& kind, int world_size, std::size_t refuse, SimReport& report,
                 bool guard = false) {
  Outcome outcome;
  outcome.results.resize(static_cast<std::size_t>(world_size));
  SimOptions options = sweep_options(world_size);
  options.guard_pending_outputs = guard;
  report = sim::run(options, [&] {
    const int me = rank();
    EXPECT_EQ(wait_tensor(all_reduce(input_of(me, 2), "sum", world())).to_vector<std::int32_t>(),
              sum_of(world_size, 2));
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; i < kind.sizes.size(); ++i) {
      inputs.push_back(input_of(me, kind.sizes[i], static_cast<std::int32_t>(10 * i)));
    }
    std::vector<Tensor> results(inputs.size());
    if (me == 0) {
      allocations_counted = 0;
      refuse_allocation_number = refuse;
      refusing_thread = true;
      counting = true;
      try {
        kind.call(inputs, results);
      } catch (const std::bad_alloc&) {
        outcome.threw = true;
        outcome.what = "std::bad_alloc";
      } catch (const Error& error) {
        outcome.threw = true;
        outcome.what = error.what();
        outcome.error_seq = error.context().seq;
      }
      counting = false;
      refusing_thread = false;
      outcome.refused = refuse != 0 && refuse_allocation_number.load() == 0;
      refuse_allocation_number = 0;
      if (outcome.threw) {
        kind.call(inputs, results);  // the retry: memory is back
      }
    } else {
      kind.call(inputs, results);
    }
    for (const Tensor& result : wait_tensors(results)) {
      const auto values = result.to_vector<std::int32_t>();
      auto& mine = outcome.results[static_cast<std::size_t>(me)];
      mine.insert(mine.end(), values.begin(), values.end());
    }
    const auto after = wait_tensor(all_reduce(input_of(me, 3), "sum", world()));
    if (me == 0) {
      outcome.after = after.to_vector<std::int32_t>();
    } else {
      EXPECT_EQ(after.to_vector<std::int32_t>(), sum_of(world_size, 3));
    }
  });
  return outcome;
}

// The sequence numbers of rank 0's Issue events, in order.
std::vector<std::int64_t> issued_seqs(const SimReport& report) {
  std::vector<std::int64_t> seqs;
  for (const SimEvent& event : report.events) {
    if (event.kind == SimEvent::Kind::Issue && event.rank == 0) {
      seqs.push_back(event.seq);
    }
  }
  return seqs;
}

class SimOutOfMemory : public ::testing::TestWithParam<int> {};

// Before the fix, the refused call took sequence number 1 for good (core) while the simulator
// never counted it, and the retry stopped the process (CHORUS_CHECK_EQ in SimWorld::start); a
// refusal while staging a coalesced call left SimComm's batch open, and the retry's begin_group
// stopped it (CHORUS_CHECK(!batching_)).
void expect_refused_calls_take_no_sequence_number(int world_size, bool guard) {
  for (const CallKind& kind : call_kinds()) {
    SCOPED_TRACE(kind.name);
    std::vector<std::int32_t> expected;
    for (std::size_t i = 0; i < kind.sizes.size(); ++i) {
      const auto part = sum_of(world_size, kind.sizes[i], static_cast<std::int32_t>(10 * i));
      expected.insert(expected.end(), part.begin(), part.end());
    }
    std::size_t threw = 0;
    std::uint64_t report_guarded = 0;  // outputs guarded, over the sweep
    // n = 0: nothing refused. Then the n-th allocation, until a run makes fewer than n.
    for (std::size_t n = 0;; ++n) {
      ASSERT_LT(n, 10'000u) << "the sweep does not end";
      SCOPED_TRACE("allocation " + std::to_string(n) + " refused");
      SimReport report;
      const Outcome outcome = run_once(kind, world_size, n, report, guard);
      std::string errors;
      for (const std::string& error : report.rank_errors) {
        errors += error + "\n";
      }
      ASSERT_TRUE(report.ok()) << errors;
      EXPECT_TRUE(report.unwaited.empty());
      report_guarded += report.mark_count("guard.protect");
      for (const auto& results : outcome.results) {
        EXPECT_EQ(results, expected);
      }
      EXPECT_EQ(outcome.after, sum_of(world_size, 3));
      if (outcome.threw) {
        ASSERT_TRUE(outcome.refused) << outcome.what;
        // std::bad_alloc, or the InvalidArgument an output's allocation becomes, which names
        // the sequence number the call would have had.
        EXPECT_TRUE(outcome.what == "std::bad_alloc" ||
                    outcome.what.find("cannot allocate the output") != std::string::npos)
            << outcome.what;
        if (outcome.what != "std::bad_alloc") {
          EXPECT_EQ(outcome.error_seq, 1);
        }
        ++threw;
      }
      // The refused call left no operation behind, and its retry was #1: rank 0 issued #0, #1,
      // #2 (an event the log lost to a refusal is missing, never another number).
      const std::vector<std::int64_t> seqs = issued_seqs(report);
      if (report.events_not_recorded == 0) {
        EXPECT_EQ(seqs, (std::vector<std::int64_t>{0, 1, 2})) << outcome.what;
      } else {
        // A refusal absorbed by the log: the event lost is #1's Issue or Arrive event.
        EXPECT_FALSE(outcome.threw) << outcome.what;
        EXPECT_EQ(report.events_not_recorded, 1u);
        EXPECT_TRUE(seqs == (std::vector<std::int64_t>{0, 1, 2}) ||
                    seqs == (std::vector<std::int64_t>{0, 2}))
            << ::testing::PrintToString(seqs);
      }
      EXPECT_EQ(report.ops_issued[0], 3u) << "the refused call started nothing";
      if (!outcome.refused && n != 0) {
        break;  // the call made fewer than n allocations: every one was refused once
      }
    }
    EXPECT_GT(threw, 0u) << "the sweep refused the call's allocations";
    if (guard) {
      EXPECT_GT(report_guarded, 0u);
    }
  }
}

TEST_P(SimOutOfMemory, ARefusedCallTakesNoSequenceNumberAndTheRetrySucceeds) {
  expect_refused_calls_take_no_sequence_number(GetParam(), /*guard=*/false);
}

#if !defined(CHORUS_ASAN) && !defined(CHORUS_TSAN)  // guard pages: Note [Guard pages]
// The same with the pending outputs protected. A refusal in SimAllocator::protect between
// mprotect and recording the block's owner left the block protected after completion (until
// 2026-12-04): the simulator's write of the result, or the rank's read of it, faulted.
TEST_P(SimOutOfMemory, ARefusalWhileGuardingOutputsLeavesNoBlockProtected) {
  expect_refused_calls_take_no_sequence_number(GetParam(), /*guard=*/true);
}
#endif

INSTANTIATE_TEST_SUITE_P(WorldSizes, SimOutOfMemory, ::testing::Values(1, 2));

// ---- Operations that fail, with allocations refused while they fail (Note [Operation
// positions]): every member's wait ends with the failure's code, whatever was refused.

// How operation #0 on the world group fails.
enum class Failing {
  Mismatch,        // rank 0 arrives last with another count: judged in rank 0's start
  TransportError,  // injected at rank 0's operation: marked in rank 0's start
  Timeout,         // rank 1's hangs and rank 0's wait times out: failed in rank 0's wait
};

const char* name(Failing failing) {
  switch (failing) {
    case Failing::Mismatch:
      return "mismatch";
    case Failing::TransportError:
      return "transport error";
    case Failing::Timeout:
      return "timeout";
  }
  return "?";
}

// What each rank saw of operation #0 and of #1 after it.
struct FailingOutcome {
  std::vector<std::optional<ErrorCode>> codes;  // per rank: #0's wait (none: it succeeded)
  std::vector<std::string> whats;
  std::vector<std::vector<std::int32_t>> results;  // per rank: #0's result where it succeeded
  std::vector<std::optional<ErrorCode>> after;     // per rank: #1's wait
  std::vector<std::string> after_whats;
  std::vector<std::vector<std::int32_t>> after_results;
  bool threw = false;  // rank 0's refused call (wait) threw std::bad_alloc, and was issued
                       // (waited) again
  std::size_t refused = 0;
};

// Runs `body` on the calling rank with its `number`-th allocation refused (0: none), or with
// `onwards` every allocation from that one on; true when `body` threw std::bad_alloc, or the
// InvalidArgument an output's allocation becomes.
bool refusing(std::size_t number, bool onwards, const std::function<void()>& body) {
  start_refusing(number, onwards);
  bool threw = false;
  try {
    body();
  } catch (const std::bad_alloc&) {
    threw = true;
  } catch (const InvalidArgument& error) {
    if (std::string(error.what()).find("cannot allocate the output") == std::string::npos) {
      throw;
    }
    threw = true;
  }
  counting = false;
  refusing_thread = false;
  refuse_allocation_number = 0;
  refuse_onwards = false;
  return threw;
}

// Waits for `tensor` on the calling rank: its values, or the code of the error it raised.
void wait_into(const Tensor& tensor, std::optional<ErrorCode>& code, std::string& what,
               std::vector<std::int32_t>& values) {
  try {
    values = wait_tensor(tensor).to_vector<std::int32_t>();
  } catch (const Error& error) {
    code = error.code();
    what = error.what();
  }
}

constexpr std::int32_t kElements = 5;

// Every rank: operation #0 on the world group, which fails as `failing` says, with rank 0's
// `refuse`-th allocation (`onwards`: and every later one) refused in its call (Mismatch,
// TransportError) or in its wait (Timeout); a call that threw is issued again, memory back. Then
// every rank issues #1.
FailingOutcome run_failing(Failing failing, int world_size, std::size_t refuse, bool onwards,
                           SimReport& report) {
  const auto size = static_cast<std::size_t>(world_size);
  FailingOutcome outcome;
  outcome.codes.resize(size);
  outcome.whats.resize(size);
  outcome.results.resize(size);
  outcome.after.resize(size);
  outcome.after_whats.resize(size);
  outcome.after_results.resize(size);
  SimOptions options = sweep_options(world_size);
  if (failing == Failing::TransportError) {
    options.faults = {sim::Fault::transport_error(0, 1)};  // rank 0's #0 (after the side one)
  } else if (failing == Failing::Timeout) {
    // Rank 1's #0 hangs; the other ranks stall far past rank 0's deadline starting #1, so that
    // rank 0's wait is the one that times out.
    options.timeout = std::chrono::microseconds(50);
    options.faults = {sim::Fault::hang(1, 0)};
    for (int r = 1; r < world_size; ++r) {
      options.faults.push_back(sim::Fault::delay(r, 1, 10'000));
    }
  }
  std::vector<int> everyone;
  for (int r = 0; r < world_size; ++r) {
    everyone.push_back(r);
  }
  report = sim::run(options, [&] {
    const int me = rank();
    const auto mine = static_cast<std::size_t>(me);
    const Tensor input = input_of(me, failing == Failing::Mismatch && me == 0 ? 4 : kElements);
    const Tensor after_input = input_of(me, kElements, 50);
    std::optional<Tensor> result;
    std::optional<Tensor> after;
    if (failing == Failing::Timeout) {
      if (me != 0) {
        result = all_reduce(input, "sum", world());
        after = all_reduce(after_input, "sum", world());  // stalls (Delay)
      }
    } else {
      const ProcessGroup side = new_group(everyone, "side");
      if (me != 0) {
        result = all_reduce(input, "sum", world());
      }
      // Rank 0 issues #0 once every other rank did (Mismatch: it is judged in rank 0's start).
      wait_tensor(all_reduce(input_of(me, 1), "sum", side));
    }
    if (me == 0) {
      const auto issue = [&] { result = all_reduce(input, "sum", world()); };
      if (failing == Failing::Timeout) {
        issue();
        std::exception_ptr error;  // kept as is: its text is copied with memory back
        outcome.threw = refusing(refuse, onwards, [&] {
          try {
            wait_tensor(*result);
          } catch (const Error&) {
            error = std::current_exception();
          }
        });
        if (error) {
          try {
            std::rethrow_exception(error);
          } catch (const Error& caught) {
            outcome.codes[0] = caught.code();
            outcome.whats[0] = caught.what();
          }
        }
      } else {
        outcome.threw = refusing(refuse, onwards, issue);
      }
      outcome.refused = allocations_refused.load();
      if (outcome.threw && failing != Failing::Timeout) {
        issue();  // memory is back
      }
    }
    // Rank 0's refused wait (Timeout) never throws std::bad_alloc (the test checks): it ended.
    if (me != 0 || failing != Failing::Timeout) {
      wait_into(*result, outcome.codes[mine], outcome.whats[mine], outcome.results[mine]);
    }
    if (!after) {
      after = all_reduce(after_input, "sum", world());
    }
    wait_into(*after, outcome.after[mine], outcome.after_whats[mine], outcome.after_results[mine]);
  });
  return outcome;
}

// Note [Operation positions]: the fixed texts of what fails without the memory to say why
// (world.cpp), which show that a fallback was taken.
constexpr const char* kFixedErrorText = "the simulator ran out of memory describing this failure";
constexpr const char* kFixedAbortText = "the simulator ran out of memory failing an operation";
constexpr const char* kFixedTimeoutText = "the simulator ran out of memory describing more";
constexpr const char* kNotRecordedText =
    "the simulator ran out of memory recording why this operation failed";

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

class SimOutOfMemoryFailing : public ::testing::TestWithParam<std::tuple<Failing, int, bool>> {};

// Until 2026-12-04 a refusal inside SimWorld::fail_slot, after it took the slot away, left the
// members it had not failed yet pending (their waits ended as Deadlock, or a timed-out member's
// stopped the process: the slot was gone), and a second refusal in SimWorld::fail_out_of_memory
// stopped the process (CHORUS_CHECK).
TEST_P(SimOutOfMemoryFailing, EveryMemberFailsWithTheFailuresCode) {
  const auto [failing, world_size, onwards] = GetParam();
  SCOPED_TRACE(name(failing));
  const ErrorCode code = failing == Failing::Mismatch         ? ErrorCode::CollectiveMismatch
                         : failing == Failing::TransportError ? ErrorCode::TransportError
                                                              : ErrorCode::Timeout;
  std::size_t judged_out_of_memory = 0;  // runs that failed #0 with Aborted: out of memory
  std::size_t refused_runs = 0;
  std::string texts;  // every error text of the sweep, one a line
  // n = 0: nothing refused. Then the n-th allocation (onwards: and all after it), until a run
  // makes fewer than n.
  for (std::size_t n = 0;; ++n) {
    ASSERT_LT(n, 10'000u) << "the sweep does not end";
    SCOPED_TRACE("allocation " + std::to_string(n) + (onwards ? " onwards" : "") + " refused");
    SimReport report;
    const FailingOutcome outcome = run_failing(failing, world_size, n, onwards, report);
    ASSERT_TRUE(report.ok()) << ::testing::PrintToString(report.rank_errors);
    if (n != 0 && outcome.refused == 0) {
      break;  // every allocation was refused once
    }
    refused_runs += n != 0 ? 1 : 0;
    // Every member ends #0 alike: all with `code`, or all with Aborted where judging rank 0's
    // arrival ran out of memory. A TransportError's start that threw after its fault fired
    // leaves the fault spent (Note [Fault injection]): the retry succeeds, bit for bit.
    if (failing == Failing::Timeout) {
      ASSERT_FALSE(outcome.threw) << "rank 0's wait on a timed-out operation threw std::bad_alloc";
    }
    const std::optional<ErrorCode> first = outcome.codes[0];
    if (!first) {
      ASSERT_EQ(failing, Failing::TransportError);
      EXPECT_TRUE(outcome.threw);
      for (int r = 0; r < world_size; ++r) {
        const auto index = static_cast<std::size_t>(r);
        EXPECT_FALSE(outcome.codes[index]) << "rank " << r << ": " << outcome.whats[index];
        EXPECT_EQ(outcome.results[index], sum_of(world_size, kElements)) << "rank " << r;
        EXPECT_FALSE(outcome.after[index]) << "rank " << r;
        EXPECT_EQ(outcome.after_results[index], sum_of(world_size, kElements, 50));
      }
      continue;
    }
    if (*first == ErrorCode::Aborted) {
      ++judged_out_of_memory;
      EXPECT_NE(failing, Failing::Timeout);
      EXPECT_FALSE(outcome.threw);
    } else {
      EXPECT_EQ(*first, code) << outcome.whats[0];
    }
    for (int r = 0; r < world_size; ++r) {
      const auto index = static_cast<std::size_t>(r);
      texts += outcome.whats[index] + "\n" + outcome.after_whats[index] + "\n";
      EXPECT_EQ(outcome.codes[index], first) << "rank " << r << ": " << outcome.whats[index];
      if (*first == ErrorCode::Aborted) {
        EXPECT_NE(outcome.whats[index].find("out of memory"), std::string::npos)
            << outcome.whats[index];
      }
      // The communicator is aborted after it.
      EXPECT_EQ(outcome.after[index], ErrorCode::Aborted) << "rank " << r;
    }
  }
  EXPECT_GT(refused_runs, 0u);
  if (failing != Failing::Timeout) {
    EXPECT_GT(judged_out_of_memory, 0u) << "a refusal reached judge_arrival";
  }
  // The fallbacks were reached: a member's fixed error and the fixed abort reason (every
  // allocation refused), time_out_out_of_memory's text (one refused while describing the
  // timeout, the errors made).
  if (onwards) {
    EXPECT_TRUE(contains(texts, kFixedErrorText)) << texts;
    EXPECT_TRUE(contains(texts, kFixedAbortText)) << texts;
  } else if (failing == Failing::Timeout) {
    EXPECT_TRUE(contains(texts, kFixedTimeoutText)) << texts;
  }
}

INSTANTIATE_TEST_SUITE_P(FailuresWorldSizes, SimOutOfMemoryFailing,
                         ::testing::Combine(::testing::Values(Failing::Mismatch,
                                                              Failing::TransportError,
                                                              Failing::Timeout),
                                            ::testing::Values(2, 3), ::testing::Bool()));

// ---- A Hang that replaces a TransportError (Note [Fault injection]), with allocations refused

// The faults fired in `report` agree with its "fault.*" marks.
void expect_faults_marked(const SimReport& report) {
  std::uint64_t hangs = 0;
  std::uint64_t transport_errors = 0;
  for (const sim::Fault& fault : report.faults_fired) {
    hangs += fault.kind == sim::Fault::Kind::Hang ? 1 : 0;
    transport_errors += fault.kind == sim::Fault::Kind::TransportError ? 1 : 0;
  }
  EXPECT_EQ(report.mark_count("fault.hang"), hangs);
  EXPECT_EQ(report.mark_count("fault.transport_error"), transport_errors);
}

class SimOutOfMemoryFaults : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Rank 1 arrives at #0 with an injected TransportError, rank 0 last with a Hang, which replaces it
// (withdrawn), while rank 0's `n`-th allocation (onwards: and every later one) is refused. Until
// 2026-12-05 SimWorld::mark_slot_fault withdrew the TransportError before recording the Hang: a
// refusal there left the slot marked with the withdrawn fault, and the operation's failure
// withdrew it again (CHORUS_CHECK, the process stopped), or left "fault.hang" counted for a fault
// never recorded.
TEST_P(SimOutOfMemoryFaults, AHangReplacingATransportErrorIsRecordedOnce) {
  // Not a structured binding: the lambdas below capture `onwards` (clang 14 cannot).
  const auto world_size = std::get<0>(GetParam());
  const auto onwards = std::get<1>(GetParam());
  const auto size = static_cast<std::size_t>(world_size);
  std::size_t refused_runs = 0;
  std::size_t timed_out = 0;
  for (std::size_t n = 0;; ++n) {
    ASSERT_LT(n, 10'000u) << "the sweep does not end";
    SCOPED_TRACE("allocation " + std::to_string(n) + (onwards ? " onwards" : "") + " refused");
    SimOptions options = sweep_options(world_size);
    options.timeout = std::chrono::microseconds(50);
    // Rank 1's #0 is its operation 0; rank 0's #0 its operation 1, after the side one.
    options.faults = {sim::Fault::transport_error(1, 0), sim::Fault::hang(0, 1)};
    std::vector<int> everyone;
    for (int r = 0; r < world_size; ++r) {
      everyone.push_back(r);
    }
    std::vector<std::optional<ErrorCode>> codes(size);
    std::vector<std::string> whats(size);
    std::vector<std::optional<ErrorCode>> after(size);
    bool threw = false;
    std::size_t refused = 0;
    const SimReport report = sim::run(options, [&] {
      const int me = rank();
      const auto mine = static_cast<std::size_t>(me);
      const Tensor input = input_of(me, kElements);
      std::optional<Tensor> result;
      const ProcessGroup side = new_group(everyone, "side");
      if (me != 0) {
        result = all_reduce(input, "sum", world());
      }
      wait_tensor(all_reduce(input_of(me, 1), "sum", side));  // rank 0 arrives at #0 last
      if (me == 0) {
        const auto issue = [&] { result = all_reduce(input, "sum", world()); };
        threw = refusing(n, onwards, issue);
        refused = allocations_refused.load();
        if (threw) {
          issue();  // memory is back; the Hang fired for the refused start, and stays spent
        }
      }
      std::vector<std::int32_t> values;
      wait_into(*result, codes[mine], whats[mine], values);
      std::string what;
      wait_into(all_reduce(input_of(me, 1), "sum", world()), after[mine], what, values);
    });
    ASSERT_TRUE(report.ok()) << ::testing::PrintToString(report.rank_errors);
    if (n != 0 && refused == 0) {
      break;  // every allocation was refused once
    }
    refused_runs += n != 0 ? 1 : 0;
    // Every member ends #0 alike: Timeout where the Hang marked the slot (a start that threw
    // before the fault fired, retried, too), TransportError where rank 0's start threw after
    // (its retry brings no Hang), Aborted where judging its arrival ran out of memory (neither
    // fault acted: both withdrawn).
    ASSERT_TRUE(codes[0]) << "#0 cannot succeed";
    const ErrorCode code = *codes[0];
    std::vector<sim::Fault> fired;
    if (code == ErrorCode::Timeout) {
      ++timed_out;
      fired = {sim::Fault::hang(0, 1)};
    } else if (code == ErrorCode::TransportError) {
      EXPECT_TRUE(threw);
      fired = {sim::Fault::transport_error(1, 0)};
    } else {
      EXPECT_EQ(code, ErrorCode::Aborted) << whats[0];
      EXPECT_FALSE(threw);
    }
    EXPECT_EQ(report.faults_fired, fired);
    expect_faults_marked(report);
    for (std::size_t r = 0; r < size; ++r) {
      EXPECT_EQ(codes[r], code) << "rank " << r << ": " << whats[r];
      EXPECT_EQ(after[r], ErrorCode::Aborted) << "rank " << r;  // the communicator is aborted
    }
  }
  EXPECT_GT(refused_runs, 0u);
  EXPECT_GT(timed_out, 0u);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SimOutOfMemoryFaults,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()));

// ---- A timeout with several operations outstanding, every allocation refused from some point

class SimOutOfMemoryTimeout : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Rank 1's #0 hangs; every rank issues #0 and #1, rank 0 #2 too and waits on it, with its `n`-th
// allocation (onwards: and every later one) refused, while the other ranks stall starting #2 (a
// Delay) until rank 0's deadline passed. The timeout fails #0, #1 and #2 with Timeout on every
// member (the later arrivals at #2 read its failure record) and aborts the communicator from #3.
// Until 2026-12-05 a group had one spare failure record: the second operation failed out of memory
// aborted the communicator after it at once, so #2 failed with Aborted.
TEST_P(SimOutOfMemoryTimeout, EveryOutstandingOperationTimesOut) {
  // Not a structured binding: the lambdas below capture `onwards` (clang 14 cannot).
  const auto world_size = std::get<0>(GetParam());
  const auto onwards = std::get<1>(GetParam());
  const auto size = static_cast<std::size_t>(world_size);
  constexpr std::size_t kOutstanding = 3;
  std::size_t refused_runs = 0;
  std::string texts;  // every error text of the sweep, one a line
  for (std::size_t n = 0;; ++n) {
    ASSERT_LT(n, 10'000u) << "the sweep does not end";
    SCOPED_TRACE("allocation " + std::to_string(n) + (onwards ? " onwards" : "") + " refused");
    SimOptions options = sweep_options(world_size);
    options.timeout = std::chrono::microseconds(50);
    options.faults = {sim::Fault::hang(1, 0)};
    for (int r = 1; r < world_size; ++r) {
      options.faults.push_back(sim::Fault::delay(r, 2, 10'000));
    }
    std::vector<std::vector<std::optional<ErrorCode>>> codes(
        size, std::vector<std::optional<ErrorCode>>(kOutstanding + 1));
    std::vector<std::vector<std::string>> whats(size, std::vector<std::string>(kOutstanding + 1));
    bool threw = false;
    std::size_t refused = 0;
    const SimReport report = sim::run(options, [&] {
      const int me = rank();
      const auto mine = static_cast<std::size_t>(me);
      std::vector<Tensor> results;
      for (std::size_t i = 0; i < kOutstanding; ++i) {
        results.push_back(all_reduce(input_of(me, kElements), "sum", world()));  // others stall
      }
      std::vector<std::int32_t> values;
      if (me == 0) {
        std::exception_ptr error;  // kept as is: its text is copied with memory back
        threw = refusing(n, onwards, [&] {
          try {
            wait_tensor(results[kOutstanding - 1]);
          } catch (const Error&) {
            error = std::current_exception();
          }
        });
        refused = allocations_refused.load();
        if (error) {
          try {
            std::rethrow_exception(error);
          } catch (const Error& caught) {
            codes[0][kOutstanding - 1] = caught.code();
            whats[0][kOutstanding - 1] = caught.what();
          }
        }
      }
      for (std::size_t i = 0; i < kOutstanding; ++i) {
        if (me != 0 || i != kOutstanding - 1) {  // rank 0 waited on the last one above
          wait_into(results[i], codes[mine][i], whats[mine][i], values);
        }
      }
      wait_into(all_reduce(input_of(me, kElements), "sum", world()), codes[mine][kOutstanding],
                whats[mine][kOutstanding], values);
    });
    ASSERT_TRUE(report.ok()) << ::testing::PrintToString(report.rank_errors);
    ASSERT_FALSE(threw) << "rank 0's wait threw std::bad_alloc";
    if (n != 0 && refused == 0) {
      break;  // every allocation was refused once
    }
    refused_runs += n != 0 ? 1 : 0;
    for (std::size_t r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < kOutstanding; ++i) {
        EXPECT_EQ(codes[r][i], ErrorCode::Timeout)
            << "rank " << r << "'s #" << i << ": " << whats[r][i];
        texts += whats[r][i] + "\n";
      }
      EXPECT_EQ(codes[r][kOutstanding], ErrorCode::Aborted) << "rank " << r;
      texts += whats[r][kOutstanding] + "\n";
    }
  }
  EXPECT_GT(refused_runs, 0u);
  // The fallbacks were reached: the fixed abort reason, time_out_out_of_memory's text (one
  // refusal while describing the timeout, the errors made), and with every allocation refused,
  // the members' fixed errors and, for the ranks arriving at #2 later, its failure recorded
  // without a text (in a spare record).
  EXPECT_TRUE(contains(texts, kFixedAbortText)) << texts;
  if (onwards) {
    EXPECT_TRUE(contains(texts, kFixedErrorText)) << texts;
    EXPECT_TRUE(contains(texts, kNotRecordedText)) << texts;
  } else {
    EXPECT_TRUE(contains(texts, kFixedTimeoutText)) << texts;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SimOutOfMemoryTimeout,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()));

// ---- Operations the scheduler fails (SimWorld::complete_operation, declare_deadlock), with the
// scheduler's allocations refused

enum class SchedulerFailing {
  TransportError,  // injected at rank 1's #0: failed where it would complete
  Deadlock,        // rank 1's #0 hangs and nobody has a deadline: declared a deadlock
};

class SimOutOfMemoryScheduler
    : public ::testing::TestWithParam<std::tuple<SchedulerFailing, bool>> {};

// Both ranks issue #0 and wait on it; from rank 0's start to the end of its wait, the scheduler's
// (the thread running sim::run) `n`-th allocation (onwards: and every later one) is refused. Until
// 2026-12-05 complete_operation and declare_deadlock aborted the communicator after failing the
// operation without a fallback: a refusal there threw std::bad_alloc out of the scheduler, with the
// operation failed and the communicator not aborted.
TEST_P(SimOutOfMemoryScheduler, TheOperationFailsAndTheCommunicatorIsAborted) {
  const auto [failing, onwards] = GetParam();
  constexpr int kWorldSize = 2;
  const ErrorCode code =
      failing == SchedulerFailing::TransportError ? ErrorCode::TransportError : ErrorCode::Deadlock;
  std::size_t refused_runs = 0;
  std::string texts;  // every error text of the sweep, one a line
  for (std::size_t n = 0;; ++n) {
    ASSERT_LT(n, 10'000u) << "the sweep does not end";
    SCOPED_TRACE("allocation " + std::to_string(n) + (onwards ? " onwards" : "") + " refused");
    SimOptions options = sweep_options(kWorldSize);  // the scheduler on a thread of its own too
    if (failing == SchedulerFailing::TransportError) {
      options.faults = {sim::Fault::transport_error(1, 0)};
    } else {
      options.faults = {sim::Fault::hang(1, 0)};
      options.timeout = std::chrono::nanoseconds::max();  // no deadline
    }
    std::vector<std::optional<ErrorCode>> codes(kWorldSize);
    std::vector<std::string> whats(kWorldSize);
    std::vector<std::optional<ErrorCode>> after(kWorldSize);
    std::vector<std::string> after_whats(kWorldSize);
    allocations_counted = 0;
    allocations_refused = 0;
    refuse_allocation_number = n;
    refuse_onwards = onwards;
    refusing_thread = true;  // this thread runs the scheduler; rank 0 counts while it waits
    SimReport report;
    try {
      report = sim::run(options, [&] {
        const int me = rank();
        const auto mine = static_cast<std::size_t>(me);
        if (me == 0) {
          counting = true;  // from before #0 starts: its completion may follow at once
        }
        const Tensor result = all_reduce(input_of(me, kElements), "sum", world());
        std::vector<std::int32_t> values;
        if (me == 0) {
          try {
            wait_tensor(result);
          } catch (const Error& error) {
            counting = false;
            codes[0] = error.code();
            whats[0] = error.what();
          }
          counting = false;
        } else {
          wait_into(result, codes[mine], whats[mine], values);
        }
        wait_into(all_reduce(input_of(me, kElements), "sum", world()), after[mine],
                  after_whats[mine], values);
      });
    } catch (...) {
      refusing_thread = false;
      counting = false;
      FAIL() << "sim::run threw: " << describe(std::current_exception());
    }
    refusing_thread = false;
    stop_refusing();
    ASSERT_TRUE(report.ok()) << ::testing::PrintToString(report.rank_errors);
    if (n != 0 && allocations_refused.load() == 0) {
      break;  // every allocation was refused once
    }
    refused_runs += n != 0 ? 1 : 0;
    for (std::size_t r = 0; r < kWorldSize; ++r) {
      EXPECT_EQ(codes[r], code) << "rank " << r << ": " << whats[r];
      EXPECT_EQ(after[r], ErrorCode::Aborted) << "rank " << r << ": " << after_whats[r];
      texts += whats[r] + "\n" + after_whats[r] + "\n";
    }
  }
  EXPECT_GT(refused_runs, 0u);
  if (onwards) {  // the fallbacks were reached
    EXPECT_TRUE(contains(texts, kFixedErrorText)) << texts;
    EXPECT_TRUE(contains(texts, kFixedAbortText)) << texts;
  }
}

INSTANTIATE_TEST_SUITE_P(Failures, SimOutOfMemoryScheduler,
                         ::testing::Combine(::testing::Values(SchedulerFailing::TransportError,
                                                              SchedulerFailing::Deadlock),
                                            ::testing::Bool()));

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

// ---- The simulator's allocator (Note [Simulator allocator]) and a rank's end, out of memory.

// The policies that make the simulator own the storages: (policy, guard pages).
std::vector<std::pair<sim::AllocatorPolicy, bool>> allocator_modes() {
  std::vector<std::pair<sim::AllocatorPolicy, bool>> modes = {
      {sim::AllocatorPolicy::LifoReuse, false},
      {sim::AllocatorPolicy::Quarantine, false},
      {sim::AllocatorPolicy::Random, false},
  };
#if !defined(CHORUS_ASAN) && !defined(CHORUS_TSAN)  // guard pages: Note [Guard pages]
  modes.emplace_back(sim::AllocatorPolicy::Pooled, true);
#endif
  return modes;
}

SimOptions allocator_options(sim::AllocatorPolicy policy, bool guard) {
  SimOptions options = sweep_options(1);
  options.allocator = policy;
  options.guard_pending_outputs = guard;
  options.quarantine_frees = 0;  // a freed block is reusable at once
  return options;
}

// A storage whose allocation ran out of memory loses no block: a rank frees a block, the next
// allocation of its size is refused at each of its allocations in turn, and the one after it
// still gets the freed block back (the only free one: every policy hands it out). Until
// 2026-12-06 a refusal recording the block (SimAllocator's live list) or counting its reuse (its
// first mark) after the block left the free list lost it.
TEST(SimOutOfMemoryAllocator, ARefusedAllocationLosesNoFreedBlock) {
  for (const auto& [policy, guard] : allocator_modes()) {
    SCOPED_TRACE(std::to_string(static_cast<int>(policy)) + (guard ? " with guard pages" : ""));
    std::size_t threw = 0;
    for (std::size_t n = 1;; ++n) {
      ASSERT_LT(n, 10'000u) << "the sweep does not end";
      SCOPED_TRACE("allocation " + std::to_string(n) + " refused");
      bool reused = false;
      bool refused = false;
      const SimReport report = sim::run(allocator_options(policy, guard), [&] {
        Tensor first = Tensor::empty({16});
        const void* address = first.unsafe_data_ptr();
        first = Tensor();
        threw += refusing(n, false, [] { (void)Tensor::empty({16}); }) ? 1 : 0;
        refused = allocations_refused.load() != 0;
        reused = Tensor::empty({16}).unsafe_data_ptr() == address;
      });
      EXPECT_TRUE(report.ok());
      EXPECT_TRUE(reused);
      if (!refused) {
        break;  // Tensor::empty made fewer than n allocations
      }
    }
    EXPECT_GT(threw, 0u);
  }
}

// A storage freed while memory is short is freed: the allocator's bookkeeping of the free (a
// quarantine's list, a mark counted the first time) is not allowed to fail it. Until 2026-12-06 a
// refusal there escaped SimAllocator's noexcept release and ended the process (std::terminate).
TEST(SimOutOfMemoryAllocator, AFreeWhileMemoryIsShortEndsNothing) {
  for (const auto& [policy, guard] : allocator_modes()) {
    SCOPED_TRACE(std::to_string(static_cast<int>(policy)) + (guard ? " with guard pages" : ""));
    SimOptions options = allocator_options(policy, guard);
    options.quarantine_frees = 16;
    std::size_t refused = 0;
    const SimReport report = sim::run(options, [&] {
      std::vector<Tensor> tensors;
      for (int i = 0; i < 40; ++i) {
        tensors.push_back(Tensor::empty({16}));
      }
      EXPECT_FALSE(refusing(1, true, [&] {
        while (!tensors.empty()) {
          tensors.pop_back();  // frees a block: allocates nothing itself
        }
      }));
      refused = allocations_refused.load();
      EXPECT_EQ(Tensor::full({16}, 2.0).to_vector<float>(), std::vector<float>(16, 2.0F));
    });
    EXPECT_TRUE(report.ok());
    if (policy == sim::AllocatorPolicy::Quarantine) {
      EXPECT_GT(refused, 0u);  // the quarantine's bookkeeping was refused
    }
  }
}

// A rank that ends with an error while its memory is short ends cleanly: describing the error
// for the report is refused, yet the run ends, the error is the run's first, and the report
// describes it. Until 2026-12-06 the refusal escaped SimWorld::rank_body and ended the process
// (std::terminate).
TEST(SimOutOfMemoryRankEnd, ARankThatEndsWithAnErrorWhileMemoryIsShortIsReported) {
  for (const int world_size : {1, 2}) {
    SCOPED_TRACE("world size " + std::to_string(world_size));
    const std::exception_ptr error = std::make_exception_ptr(
        std::runtime_error("rank 0 gave up: a message longer than a short string holds"));
    const SimReport report = sim::simulate(sweep_options(world_size), [&] {
      if (rank() == 0) {
        start_refusing(1, true);
        std::rethrow_exception(error);
      }
      (void)all_reduce(Tensor::ones({1}), "sum", {rank()}).item<float>();
    });
    stop_refusing();
    EXPECT_GT(allocations_refused.load(), 0u);
    EXPECT_EQ(report.first_error, error);
    EXPECT_EQ(report.first_error_rank, 0);
    ASSERT_EQ(report.rank_errors.size(), static_cast<std::size_t>(world_size));
    EXPECT_EQ(report.rank_errors[0], "rank 0 gave up: a message longer than a short string holds");
  }
}

// A rank that ends with an error while its memory is short, and a peer that joins a collective the
// rank never joined only after it ended: the peer's error says why the rank failed, as the
// report does, and so does the rank's End event where the log kept it (until the fix, both ended
// in an empty text: RankSlot::failure, left empty by the refusal, was used as it was).
TEST(SimOutOfMemoryRankEnd, APeerArrivingAfterARankThatEndedWithAnErrorWhileMemoryIsShortSaysWhy) {
  const std::string message = "rank 0 gave up: a message longer than a short string holds";
  std::size_t arrived_after = 0;
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::exception_ptr error = std::make_exception_ptr(std::runtime_error(message));
    std::string what;
    SimOptions options = sweep_options(2);
    options.seed = seed;
    const SimReport report = sim::simulate(options, [&] {
      const ProcessGroup signal = new_group({0, 1}, "signal");
      wait_tensor(all_reduce(input_of(rank(), 1), "sum", signal));
      if (rank() == 0) {
        start_refusing(1, true);
        std::rethrow_exception(error);
      }
      try {
        wait_tensor(all_reduce(input_of(1, 1), "sum", world()));
      } catch (const RankFailure& e) {
        what = e.what();
      }
    });
    stop_refusing();
    ASSERT_EQ(report.rank_errors.size(), 2u);
    EXPECT_EQ(report.rank_errors[0], message);
    if (contains(what, "failed before joining this collective")) {
      ++arrived_after;  // described in rank 1's start, once rank 0 had ended
      EXPECT_TRUE(what.ends_with("): " + message)) << what;
    }
    for (const SimEvent& event : report.events) {
      if (event.kind == SimEvent::Kind::End && event.rank == 0) {
        EXPECT_EQ(event.detail, "threw " + message);
      }
    }
  }
  EXPECT_GT(arrived_after, 0u) << "no seed had rank 1 arrive after rank 0 ended";
}

// A rank that returns while its memory is short, leaving a peer waiting in a collective it never
// joins: the peer's wait fails (Deadlock, with a fixed text: describing the absent rank, and
// making the error, ran out of memory), and the run ends. Until 2026-12-06 the refusal escaped
// SimWorld::on_rank_exit, in the ending rank's rank_body, and ended the process (std::terminate).
TEST(SimOutOfMemoryRankEnd, APeerWaitingForARankThatReturnsWhileMemoryIsShortFails) {
  std::optional<ErrorCode> code;
  std::string what;
  const SimReport report = sim::simulate(sweep_options(2), [&] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    if (rank() == 1) {
      const Tensor pending = all_reduce(input_of(1, kElements), "sum", world());
      wait_tensor(all_reduce(input_of(1, 1), "sum", signal));
      std::vector<std::int32_t> values;
      wait_into(pending, code, what, values);
      return;
    }
    wait_tensor(all_reduce(input_of(0, 1), "sum", signal));  // rank 1 issued its all_reduce
    start_refusing(1, true);
  });
  stop_refusing();
  EXPECT_GT(allocations_refused.load(), 0u);
  EXPECT_TRUE(report.ok());
  // Made on the refusing rank, the error is the fixed one made in advance; rank 1, which raises
  // it, makes it again under its own context (Note [Operation positions], SimWork::raised_error).
  // Until 2026-12-07 it named no rank, operation or group.
  EXPECT_EQ(what,
            "chorus::Deadlock: [rank 1] all_reduce #0 on group [0, 1]: (the simulator ran out of "
            "memory describing this failure)");
}

// A Crash fault whose crash runs out of memory, each allocation of the crashing call refused in
// turn (onwards: and every later one): the rank either crashed, its RankFailure saying so in
// full and its peer's operation in flight failed with RankFailure, or it is alive (the call threw
// std::bad_alloc: the Crash fired and is spent, or fires at the retry) and its retry completes
// the peer's operation. Until 2026-12-07 SimWorld::crash marked the rank crashed before making
// its text: a refusal there left a crashed rank whose RankFailure said nothing.
TEST(SimOutOfMemoryCrash, ARankIsCrashedWithItsTextOrAlive) {
  // Rank 1's operation 0 is the signal, 1 its all_reduce #0 on the world group.
  const sim::Fault fault = sim::Fault::crash(1, 1);
  const std::string crashed =
      "chorus::RankFailure: [rank 1] all_reduce #0 on group [0, 1]: rank 1 crashed (injected "
      "fault: " +
      fault.to_string() + ", starting all_reduce #0 on group [0, 1])";
  for (const bool onwards : {false, true}) {
    std::size_t crashed_runs = 0;
    std::size_t alive_runs = 0;
    for (std::size_t n = 0;; ++n) {
      ASSERT_LT(n, 10'000u) << "the sweep does not end";
      SCOPED_TRACE("allocation " + std::to_string(n) + (onwards ? " onwards" : "") + " refused");
      SimOptions options = sweep_options(2);
      options.faults = {fault};
      std::exception_ptr crash;  // rank 1's RankFailure, from its call or its retry
      std::optional<ErrorCode> codes[2];
      std::string whats[2];
      std::vector<std::int32_t> values[2];
      std::size_t refused = 0;
      (void)sim::simulate(options, [&] {
        const ProcessGroup signal = new_group({0, 1}, "signal");
        const auto me = static_cast<std::size_t>(rank());
        if (rank() == 0) {
          const Tensor pending = all_reduce(input_of(0, kElements), "sum", world());
          wait_tensor(all_reduce(input_of(0, 1), "sum", signal));  // #0 is in flight
          wait_into(pending, codes[me], whats[me], values[me]);
          return;
        }
        wait_tensor(all_reduce(input_of(1, 1), "sum", signal));
        std::optional<Tensor> result;
        const auto issue = [&] {
          try {
            result = all_reduce(input_of(1, kElements), "sum", world());
          } catch (const RankFailure&) {
            crash = std::current_exception();  // copied without allocating
          }
        };
        if (refusing(n, onwards, issue)) {
          issue();  // memory is back
        }
        refused = allocations_refused.load();
        if (result) {
          wait_into(*result, codes[me], whats[me], values[me]);
        }
      });
      if (n != 0 && refused == 0) {
        break;  // every allocation was refused once
      }
      if (crash != nullptr) {
        ++crashed_runs;
        EXPECT_EQ(describe(crash), crashed);
        EXPECT_EQ(codes[0], ErrorCode::RankFailure) << whats[0];
      } else {
        ++alive_runs;
        EXPECT_EQ(codes[1], std::nullopt) << whats[1];
        EXPECT_EQ(values[1], sum_of(2, kElements));
        EXPECT_EQ(codes[0], std::nullopt) << whats[0];
        EXPECT_EQ(values[0], sum_of(2, kElements));
      }
    }
    EXPECT_GT(crashed_runs, 0u);
    EXPECT_GT(alive_runs, 0u);
  }
}

// A rank waiting on another rank's failed result while its memory is short: each allocation of
// the wait refused in turn, the wait raises the failure (the waiter's copy, or where making that
// ran out of memory the issuer's error), never std::bad_alloc (detail::raised_by_calling_rank).
TEST(SimOutOfMemoryWait, AWaitOnAnotherRanksFailedResultRaisesTheFailure) {
  Tensor shared;
  std::vector<std::string> seen;
  std::size_t swept = 0;
  const SimReport report = sim::simulate(sweep_options(3), [&] {
    const ProcessGroup signal = new_group({0, 1, 2}, "signal");
    if (rank() == 0) {
      shared = all_reduce(input_of(0, 1), "sum", {0, 2});
    }
    wait_tensor(all_reduce(input_of(rank(), 1), "sum", signal));  // rank 0 issued its all_reduce
    if (rank() != 1) {
      if (rank() == 0) {
        EXPECT_THROW((void)shared.to_vector<std::int32_t>(), Deadlock);
      }
      return;  // rank 2 without joining rank 0's all_reduce
    }
    EXPECT_THROW((void)shared.to_vector<std::int32_t>(), Deadlock);  // failed: no wait from here
    for (std::size_t n = 1;; ++n) {
      ASSERT_LT(n, 1'000u) << "the sweep does not end";
      start_refusing(n, false);
      std::exception_ptr caught;
      try {
        (void)shared.to_vector<std::int32_t>();
      } catch (...) {
        counting = false;
        caught = std::current_exception();
      }
      counting = false;
      refusing_thread = false;
      refuse_allocation_number = 0;
      if (allocations_refused.load() == 0) {
        break;  // the wait made fewer than n allocations
      }
      ++swept;
      seen.push_back(describe(caught));
    }
  });
  shared = Tensor();
  EXPECT_GT(swept, 0u);
  for (const std::string& what : seen) {
    EXPECT_TRUE(what.starts_with("chorus::Deadlock: [rank 1] all_reduce #0 on group [0, 2]: rank 0 "
                                 "issued this collective and rank 1 waited on its result: ") ||
                what.starts_with("chorus::Deadlock: [rank 0] all_reduce #0 on group [0, 2]: "))
        << what;
  }
}

}  // namespace
}  // namespace chorus
