#pragma once

// Note [Property runners]
// One driver runs every property, whatever the transport: for case i it generates an input from
// rc::Random(mix(seed, property name, i)) at size i * 100 / cases (so a property's cases do not
// depend on which other properties run), executes it, and on the first failure shrinks it
// greedily: it walks the failing input's RapidCheck shrinks in order, executes each, moves to the
// first that still fails and starts again, until no shrink fails (or the run budget is spent).
// The path of shrink indices taken, with the seed and case number, names the minimal input
// exactly, which is what a replay token carries.
//
// The runners differ only in how they execute an input:
// - check_on_simulator (called outside any rank): the input is the case plus a schedule — a
//   RapidCheck-generated choice list by default, so schedules shrink with the case, or a seed for
//   the random/pct/portfolio strategies. Each execution is one sim::simulate of options.ranks
//   ranks running the property's check; the verdict is "no rank failed". Properties marked
//   schedule_independent run again under other strategies and reduction orders and must give
//   each rank the same result digest.
// - check_in_lockstep (called on every rank of any transport, inside chorus::run): every rank
//   generates the same inputs (the generation depends only on the seed and the world size), runs
//   the check, and the ranks agree on the verdict with an all_reduce, so every rank takes the
//   same shrinking path and reaches the same collectives. Failing ranks' messages are gathered so
//   that every rank can report them. Properties that need the simulator are skipped.
// A rank's work registry must be empty when a check returns: the runners check it after every
// case. Results a check drops un-waited (on purpose, as async.registry_cleanup does) are not
// reported: the simulator runner never prints its runs' reports, and the lockstep runner keeps
// them out of its rank's report while a case runs (RankContext::list_drops), which the transport
// would print at the rank's end.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/props/property.hpp"
#include "chorus/run.hpp"

namespace chorus::transport {
class Transport;
}

namespace chorus::props {

// The tag of the communicator (every rank of the world) the lockstep runner agrees on verdicts
// over: its own, so that the properties' collectives, and their sequence numbers on world(), are
// theirs alone.
inline constexpr std::string_view kVerdictGroupTag = "chorus.check.verdicts";

enum class Verdict { Passed, Failed, Skipped };
std::string_view name(Verdict verdict) noexcept;  // passed, FAILED, skipped

struct PropertyResult {
  std::string name;
  Verdict verdict = Verdict::Passed;
  int cases = 0;           // generated cases executed (the failing one included)
  std::uint64_t runs = 0;  // executions: cases, schedule variants and shrinking steps
  std::chrono::nanoseconds time{0};
  std::string skip_reason;  // Skipped: why
  // Failed, after shrinking:
  std::string counterexample;  // the minimal case (and schedule), as RapidCheck shows it
  std::string failure;         // every failing rank's error
  std::string timeline;        // simulator: per-rank timeline of the minimal failing run
  std::string replay_token;    // "chorus-check:4:..."; `chorus replay TOKEN`
  int shrink_steps = 0;        // shrinks taken from the first failing case
};

struct CheckReport {
  std::vector<PropertyResult> results;
  std::chrono::nanoseconds time{0};
  bool passed() const noexcept;  // no property failed
};

// Progress callbacks (the CLI draws its bar with them). The lockstep runner calls them on rank 0
// only. Called on the thread that runs the runner.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual void on_property_start(const Property& /*property*/, int /*index*/, int /*count*/) {}
  virtual void on_case(const Property& /*property*/, int /*case_index*/, int /*cases*/) {}
  virtual void on_shrink(const Property& /*property*/, int /*steps*/) {}
  virtual void on_property_end(const PropertyResult& /*result*/) {}
};

struct CheckOptions {
  int ranks = 8;           // simulator world size (check_in_lockstep: the transport's)
  std::uint64_t seed = 0;  // decides every case and schedule
  int cases = 100;         // per property
  // Simulator schedules: nullopt generates choice lists with RapidCheck (they shrink); a
  // strategy draws each case's schedule from a generated seed instead.
  std::optional<sim::Strategy> strategy;
  int pct_depth = 2;
  sim::ReductionOrder reduction_order = sim::ReductionOrder::Fixed;
  // Executions allowed while shrinking one failure.
  int shrink_runs_max = 2000;
  // Test hook, simulator only: wraps each rank's transport (tests plant bugs with it).
  std::function<std::shared_ptr<transport::Transport>(std::shared_ptr<transport::Transport>)>
      wrap_transport;
  Listener* listener = nullptr;
};

// The properties whose names match `glob` ('*' any run of characters, '?' one character), in
// order. Several globs may be given separated by commas; blanks around each are ignored. Throws
// InvalidArgument naming every glob that matches no property (an empty one included), even when
// others match. Never blocks.
std::vector<Property> select(const std::vector<Property>& properties, std::string_view glob);

// Throws InvalidArgument unless `options` are in range: ranks in [1, 1024], cases at least 1,
// pct_depth in [1, 3], shrink_runs_max not negative. Both runners call it first; a program that
// starts ranks for check_in_lockstep calls it before, so that bad options are refused once,
// outside any rank. Never blocks.
void check_options(const CheckOptions& options);

// Runs every property on the simulator (Note [Property runners]). Blocks; call it outside any
// rank. Throws InvalidArgument for options out of range (check_options).
CheckReport check_on_simulator(const std::vector<Property>& properties,
                               const CheckOptions& options);

// Runs every property on the calling rank's transport in lockstep with the other ranks (Note
// [Property runners]); call it on every rank, with the same properties and options. Every rank
// returns the same report. Throws InvalidArgument for options out of range (check_options, with
// ranks the world's size) on every rank alike.
CheckReport check_in_lockstep(const std::vector<Property>& properties, const CheckOptions& options);

// The chorus::run options for check_in_lockstep on `transport` ("sim", "mpi" or "nccl"): its
// ranks and seed, and on the simulator its schedule: `strategy` (a generated choice list is the
// simulator runner's alone: nullopt means RandomWalk here), `pct_depth` and `reduction_order`,
// which the lockstep tokens record, and `pct_steps`, PCT's estimate of the run's length, from the
// number of `properties` the runner will not skip, cases and ranks. Real transports ignore the
// schedule fields (the caller should refuse them; the CLI does). Never blocks, never throws.
RunOptions lockstep_run_options(const std::vector<Property>& properties,
                                const CheckOptions& options, const std::string& transport);

// Reruns a failing case from its replay token on the simulator, with events recorded (for
// timelines and traces): returns the run's report, `result` filled as a check would.
struct Replay {
  PropertyResult result;
  sim::SimReport report;
};
Replay replay(const std::vector<Property>& properties, std::string_view token,
              sim::SimOptions extra = {});
// What `chorus replay` prints of `replayed`, the replay of `token`: the property and the case,
// then "FAILED:" with the failure and the timeline of the run, or "passed (the failure did not
// reproduce)" with replay_note's note for a lockstep token. Property programs print the same.
std::string replay_text(const Replay& replayed, std::string_view token);

// A table: property, cases, runs, time, verdict; then the total.
std::string summary_table(const CheckReport& report);
// What replaying `token` reruns, when that is not the run that printed it: empty for a token of
// the simulator runner (it replays that run's schedule); for a lockstep token (`:lockstep:`),
// which records no schedule, a note that its replay runs the case alone on the simulator with
// choice 0 at every scheduling decision, so a failure that depended on the lockstep run's
// schedule or transport may not reproduce. Empty for a malformed token (never throws:
// failure_report calls it on whatever token a result holds).
std::string replay_note(std::string_view token);

// A failed property's minimal counterexample, errors, timeline and replay command (with
// replay_note's note, if any): `replay_with`
// followed by the token (a program checking its own properties names itself, and passes the
// token to props::replay with its own property list).
std::string failure_report(const PropertyResult& result,
                           std::string_view replay_with = "chorus replay");

}  // namespace chorus::props
