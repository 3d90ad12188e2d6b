#pragma once

// chorus::sim_rapidcheck — RapidCheck drives the simulator's decision stream (Note [Decision
// stream], simulator/src/decision_stream.hpp): RapidCheck generates choice lists, runs the
// program under each, and on a failure shrinks the list (shorter, smaller indices) to a minimal
// interleaving, reported with its replay token. A separate library, so that nothing else in
// chorus depends on RapidCheck: link chorus::sim_rapidcheck to use this header.
//
//   RC_GTEST_PROP(MyCollectives, HoldUnderEverySchedule, ()) {
//     sim::check_schedule(options, *sim::gen_choices(), program);
//   }
//
// or, outside a RapidCheck property, with a fixed RapidCheck seed:
//
//   const sim::ScheduleCheck check = sim::check_schedules(options, program);
//   if (!check.passed) { /* check.choices, check.replay_token, check.message */ }

#include <rapidcheck.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chorus/sim/sim.hpp"

namespace chorus::sim {

// Generated choice indices lie in [0, kGeneratedChoiceIndexMax]: the stream takes each modulo its
// number of options, so every option of a choice with up to kGeneratedChoiceIndexMax + 1 options
// is reachable: a scheduling decision's options are the runnable ranks and then the ready
// collectives, so every rank of the largest world plus as many ready collectives. (At 7, eight
// runnable ranks hid every completion behind them.) Shrinking still moves each index towards 0.
inline constexpr std::uint64_t kGeneratedChoiceIndexMax = 2 * kMaxWorldSize - 1;

// With random faults (SimOptions::random_faults), check_schedules generates indices up to
// kGeneratedFaultChoiceIndexMax instead: a random fault is one choice among a million, firing on
// indices 1 to the kinds' total ppm, so every kind is reachable (with indices below 2048 a
// kind whose ppm range starts higher is never reached, and nearly every draw fires). A
// scheduling decision's options then differ in probability by at most 2 * kMaxWorldSize / 10^6.
// With check_schedule, pass that bound to gen_choices yourself when faults are on.
inline constexpr std::uint64_t kGeneratedFaultChoiceIndexMax = 999'999;

// gen_choices' default list length.
inline constexpr std::size_t kGeneratedChoiceLengthMax = 1024;

// Choice lists for SimOptions::choices, as a Recorded source reads them (past the end of the list
// every choice is 0): lengths grow with RapidCheck's size up to `length_max`, indices lie in
// [0, index_max]. Shrinks towards shorter lists and smaller indices, i.e. towards the schedule of
// all 0 choices (always the first runnable rank, the first ready collective).
rc::Gen<std::vector<std::uint64_t>> gen_choices(std::size_t length_max = kGeneratedChoiceLengthMax,
                                                std::uint64_t index_max = kGeneratedChoiceIndexMax);

// Runs `rank_main` under `choices` (options.choices replaced; nothing printed; CHORUS_SIM_SEED
// ignored) and returns the report when no rank failed. With options.seed_from_environment (the
// default) and CHORUS_SIM_REPLAY set, as the replay command in a failure's message sets it, the
// run follows that token instead of `choices`, so rerunning the test with it replays the failure.
// When one did, fails the enclosing RapidCheck property (RC_FAIL, which throws) with a message
// holding every failing rank's error, the replay token and timeline_text of the run. Call it from
// inside a property (RC_GTEST_PROP, rc::check); blocks while the ranks run.
SimReport check_schedule(SimOptions options, const std::vector<std::uint64_t>& choices,
                         const std::function<void()>& rank_main);

// What check_schedules found.
struct ScheduleCheck {
  bool passed = true;        // every generated schedule ran without a rank error
  int schedules_passed = 0;  // schedules that passed before the first failure (or all of them)
  // On a failure, after RapidCheck's shrinking:
  // The minimal choice list found, as the run made its choices: each index within its range
  // (as generated, if the run kept no token: more than SimOptions::choices_record_max choices),
  // trailing zeros dropped (later choices 0).
  std::vector<std::uint64_t> choices;
  std::string replay_token;  // replays that run (SimOptions::replay, CHORUS_SIM_REPLAY)
  std::string message;       // RapidCheck's report: the errors, token and timeline
};

// Checks `rank_main` (with `options`) under `schedules` choice lists that RapidCheck generates
// from `rapidcheck_seed` (so the check is deterministic whatever RC_PARAMS says), shrinking the
// first failing list (with random faults enabled, indices up to kGeneratedFaultChoiceIndexMax).
// With CHORUS_SIM_REPLAY set (and options.seed_from_environment), it runs
// that token once instead and reports it (`choices` stays empty). The program runs
// once per schedule and per shrinking step, so any state it keeps across runs must be reset per
// run. Blocks; not reentrant from inside a rank.
ScheduleCheck check_schedules(const SimOptions& options, const std::function<void()>& rank_main,
                              int schedules = 100, std::uint64_t rapidcheck_seed = 0);

}  // namespace chorus::sim
