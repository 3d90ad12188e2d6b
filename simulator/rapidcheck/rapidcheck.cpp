#include "chorus/sim/rapidcheck.hpp"

#include <rapidcheck.h>

#include <cstdlib>
#include <limits>
#include <sstream>
#include <utility>

#include "chorus/check.hpp"

namespace chorus::sim {
namespace {

// `rank_main` under exactly `choices`: a Recorded source, quiet, whatever CHORUS_SIM_SEED says.
// Only CHORUS_SIM_REPLAY counts (with options.seed_from_environment, as in sim::run): the replay
// command a failure prints sets it, and then every run follows that token instead of the list,
// so the command reproduces the failure.
// The token CHORUS_SIM_REPLAY holds, when `options` read the environment; else empty.
std::string environment_replay(const SimOptions& options) {
  const char* token = std::getenv("CHORUS_SIM_REPLAY");
  return options.seed_from_environment && token != nullptr ? std::string(token) : std::string();
}

SimReport run_choices(SimOptions options, const std::vector<std::uint64_t>& choices,
                      const std::function<void()>& rank_main) {
  const std::string replay = environment_replay(options);
  options.choices = choices;
  options.replay = replay;
  options.fuzz_bytes.reset();
  options.print_failures = false;
  options.seed_from_environment = false;
  return simulate(options, rank_main);
}

// What a failing schedule reports: each failing rank's error, how to replay it (the command
// where the check reads CHORUS_SIM_REPLAY, else the token for SimOptions::replay) and the
// timeline.
std::string failure_message(const SimReport& report, const SimOptions& options) {
  std::ostringstream out;
  out << "the program failed under this schedule:\n";
  for (std::size_t r = 0; r < report.rank_errors.size(); ++r) {
    if (!report.rank_errors[r].empty()) {
      out << "  rank " << r << ": " << report.rank_errors[r] << "\n";
    }
  }
  if (options.seed_from_environment) {
    // The runs themselves do not read the environment (run_choices), so their reports say what
    // to set in SimOptions; this check does read CHORUS_SIM_REPLAY. The command reruns the
    // program's command line when the options give it (SimOptions::command_without_replay), as
    // sim::run's replay command does.
    const std::string command = options.command_without_replay.empty()
                                    ? command_line()
                                    : command_line(options.command_without_replay);
    out << "  replay: "
        << (report.replay_token.empty() ? report.replay_command
                                        : "CHORUS_SIM_REPLAY=" + report.replay_token + command)
        << "\n";
  } else {
    out << "  replay token (SimOptions::replay): " << report.replay_token << "\n";
  }
  out << timeline_text(report);
  return out.str();
}

// Keeps RapidCheck's counterexample of check_schedules: the run that last failed is the
// counterexample when it is a failing test case or a shrink RapidCheck accepted (a shrink it
// discarded leaves the previous one). Prints nothing and leaves RapidCheck's global reproduce
// list alone: check_schedules reports its failures itself.
class CounterexampleListener final : public rc::detail::TestListener {
 public:
  // What the property records before it fails.
  std::vector<std::uint64_t> run_choices;
  std::string run_token;
  // The counterexample so far.
  std::vector<std::uint64_t> choices;
  std::string token;

  void onTestCaseFinished(const rc::detail::CaseDescription& description) override {
    if (description.result.type == rc::detail::CaseResult::Type::Failure) {
      keep_run();
    }
  }
  void onShrinkTried(const rc::detail::CaseDescription& /*shrink*/, bool accepted) override {
    if (accepted) {
      keep_run();
    }
  }
  void onTestFinished(const rc::detail::TestMetadata& /*metadata*/,
                      const rc::detail::TestResult& /*result*/) override {}

 private:
  void keep_run() {
    choices = run_choices;
    token = run_token;
  }
};

}  // namespace

rc::Gen<std::vector<std::uint64_t>> gen_choices(std::size_t length_max, std::uint64_t index_max) {
  CHORUS_CHECK_LT(index_max, std::numeric_limits<std::uint64_t>::max());
  // gen::container's lengths grow with the size; inRange shrinks towards 0 and container towards
  // fewer elements, so shrinking moves towards the all-0 schedule.
  return rc::gen::map(rc::gen::container<std::vector<std::uint64_t>>(
                          rc::gen::inRange<std::uint64_t>(0, index_max + 1)),
                      [length_max](std::vector<std::uint64_t> choices) {
                        if (choices.size() > length_max) {
                          choices.resize(length_max);
                        }
                        return choices;
                      });
}

SimReport check_schedule(SimOptions options, const std::vector<std::uint64_t>& choices,
                         const std::function<void()>& rank_main) {
  SimReport report = run_choices(options, choices, rank_main);
  if (!report.ok()) {
    RC_FAIL(failure_message(report, options));
  }
  return report;
}

ScheduleCheck check_schedules(const SimOptions& options, const std::function<void()>& rank_main,
                              int schedules, std::uint64_t rapidcheck_seed) {
  CHORUS_CHECK_GE(schedules, 1);
  ScheduleCheck check;
  if (!environment_replay(options).empty()) {
    // A failure's replay command: that run, once, instead of generating and shrinking lists
    // that would all replay it (and leave `choices` naming a list the run never followed).
    const SimReport report = run_choices(options, {}, rank_main);
    check.passed = report.ok();
    check.schedules_passed = report.ok() ? 1 : 0;
    if (!report.ok()) {
      check.replay_token = report.replay_token;
      check.message = failure_message(report, options);
    }
    return check;
  }
  CounterexampleListener listener;
  const auto property = [&] {
    const std::vector<std::uint64_t> choices = *gen_choices(
        kGeneratedChoiceLengthMax,
        options.random_faults.enabled() ? kGeneratedFaultChoiceIndexMax : kGeneratedChoiceIndexMax);
    const SimReport report = run_choices(options, choices, rank_main);
    if (!report.ok()) {
      // The choices the run made (each index folded into its range, trailing zeros dropped)
      // where it kept them: RapidCheck shrinks the generated indices, and a large index can stay
      // where no smaller one has the same remainder.
      listener.run_choices = report.replay_token.empty() ? choices : report.choices;
      while (!listener.run_choices.empty() && listener.run_choices.back() == 0) {
        listener.run_choices.pop_back();
      }
      listener.run_token = report.replay_token;
      RC_FAIL(failure_message(report, options));
    }
  };
  rc::detail::TestParams params;
  params.seed = rapidcheck_seed;
  params.maxSuccess = schedules;
  rc::detail::TestMetadata metadata;
  metadata.id = "chorus::sim::check_schedules";
  metadata.description = metadata.id;
  const rc::detail::TestResult result =
      rc::detail::checkTestable(property, metadata, params, listener);
  std::ostringstream message;
  rc::detail::printResultMessage(result, message);
  if (result.is<rc::detail::SuccessResult>()) {
    check.schedules_passed = result.get<rc::detail::SuccessResult>().numSuccess;
    return check;
  }
  check.passed = false;
  check.message = message.str();
  check.choices = std::move(listener.choices);
  check.replay_token = std::move(listener.token);
  if (result.is<rc::detail::FailureResult>()) {
    check.schedules_passed = result.get<rc::detail::FailureResult>().numSuccess;
  }
  return check;
}

}  // namespace chorus::sim
