#include "chorus/props/runner.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <exception>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/runtime.hpp"
#include "chorus/sim/rapidcheck.hpp"

namespace chorus::props {
namespace {

using Clock = std::chrono::steady_clock;

// RapidCheck's nominal largest size: case i of n is generated at size i * kSizeMax / n, and a
// single case at kSizeMax (case_size).
constexpr int kSizeMax = 100;
constexpr std::string_view kTokenPrefix = "chorus-check:4:";
// Format 3 differs from 4 only in a single case's size (0 there): its tokens of more than one
// case replay as they were generated.
constexpr std::string_view kFormat3Prefix = "chorus-check:3:";
// PCT's bug depths the CLI and tokens take (sim::SimOptions::pct_depth itself only needs >= 1).
constexpr int kPctDepthMin = 1;
constexpr int kPctDepthMax = 3;
// Scheduling decisions a lockstep case takes per rank, rounded down: the battery's cases (with
// the verdict's all_reduce) took 73,841 decisions for 14 properties x 100 cases x 8 ranks (6.6
// per rank and case) and 35,423 on 4 ranks (6.3); the reduce.* properties alone take 5.0.
// lockstep_run_options estimates PCT's pct_steps with it.
constexpr std::uint64_t kLockstepStepsPerRankCase = 5;
// Bytes of each rank's failure message the lockstep runner gathers (longer ones are cut).
constexpr std::int64_t kGatheredMessageBytes = 1024;

std::uint64_t splitmix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t hash_name(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : name) {
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  return h;
}

rc::Random case_random(std::uint64_t seed, std::string_view property, int case_index) {
  return rc::Random(
      splitmix(splitmix(seed ^ hash_name(property)) + static_cast<std::uint64_t>(case_index)));
}

// Sizes ramp from 0 towards kSizeMax over the cases, small cases first. A run of one case
// (`--cases 1`, a quick smoke test) runs it at the nominal size, as RapidCheck's last cases are:
// at size 0 it would have drawn the smallest shapes and groups only (format 3 did).
int case_size(int case_index, int cases) {
  CHORUS_CHECK(case_index >= 0 && case_index < cases);
  return cases == 1 ? kSizeMax
                    : static_cast<int>(std::int64_t{case_index} * kSizeMax / std::int64_t{cases});
}

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative matcher with backtracking to the last '*'.
  std::size_t p = 0;
  std::size_t t = 0;
  std::size_t star = std::string_view::npos;
  std::size_t star_text = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') {
    ++p;
  }
  return p == pattern.size();
}

// ---- The simulator's inputs: a case and its schedule.

struct Schedule {
  bool seeded = false;                 // a strategy's seed rather than a choice list
  std::vector<std::uint64_t> choices;  // generated choice list (past its end: 0)
  std::uint64_t seed = 0;
};

void showValue(const Schedule& schedule, std::ostream& out) {
  if (schedule.seeded) {
    out << "schedule seed " << schedule.seed;
    return;
  }
  out << "schedule choices [";
  for (std::size_t i = 0; i < schedule.choices.size(); ++i) {
    out << (i == 0 ? "" : " ") << schedule.choices[i];
  }
  out << "] (then 0)";
}

struct SimInput {
  int world_size = 1;  // generated too: counterexamples shrink to the smallest world
  Case value;
  Schedule schedule;
};

void showValue(const SimInput& input, std::ostream& out) {
  out << input.world_size << " ranks: " << input.value.text() << "\n  ";
  showValue(input.schedule, out);
}

// What executing an input found.
struct Outcome {
  bool passed = true;
  std::string failure;   // every failing rank's error
  std::string timeline;  // simulator only
  std::string sim_token;
  std::uint64_t runs = 1;
  sim::SimReport report;  // replays only: the report of the run that decided the verdict
  int records = 0;        // simulator: Env::record calls in the case's first run, every rank's
};

// The driver of Note [Property runners]: cases, then greedy shrinking of the first failure.
// `execute` runs one input everywhere and returns the verdict every rank agrees on.
// `schedules` is the replay token's schedule field: "generated", a strategy, or "lockstep".
template <class Input, class Execute, class Show>
PropertyResult drive(const Property& property, const CheckOptions& options,
                     std::string_view schedules, const std::function<rc::Gen<Input>()>& generator,
                     Execute&& execute, Show&& show) {
  const Clock::time_point start = Clock::now();
  PropertyResult result;
  result.name = property.name;
  const rc::Gen<Input> gen = generator();
  for (int i = 0; i < options.cases; ++i) {
    if (options.listener != nullptr) {
      options.listener->on_case(property, i, options.cases);
    }
    rc::Shrinkable<Input> current =
        gen(case_random(options.seed, property.name, i), case_size(i, options.cases));
    ++result.cases;
    Input input;
    try {
      input = current.value();
    } catch (const std::exception& error) {
      // Gen::operator() defers a generator's exception to value(): the generator is broken.
      result.verdict = Verdict::Failed;
      result.failure = std::string("  the case generator failed: ") + error.what() + "\n";
      break;
    }
    Outcome outcome = execute(input);
    result.runs += outcome.runs;
    if (outcome.passed) {
      continue;
    }
    // Shrink: the first failing shrink, again and again.
    std::vector<int> path;
    int runs_left = options.shrink_runs_max;
    bool improved = true;
    while (improved && runs_left > 0) {
      improved = false;
      rc::Seq<rc::Shrinkable<Input>> shrinks = current.shrinks();
      int index = 0;
      while (runs_left > 0) {
        rc::Maybe<rc::Shrinkable<Input>> shrink = shrinks.next();
        if (!shrink) {
          break;
        }
        --runs_left;
        Input smaller;
        try {
          smaller = shrink->value();
        } catch (const std::exception&) {
          ++index;  // a shrink the generator cannot produce: skip it
          continue;
        }
        Outcome attempt = execute(smaller);
        result.runs += attempt.runs;
        if (!attempt.passed) {
          current = std::move(*shrink);
          outcome = std::move(attempt);
          path.push_back(index);
          improved = true;
          if (options.listener != nullptr) {
            options.listener->on_shrink(property, static_cast<int>(path.size()));
          }
          break;
        }
        ++index;
      }
    }
    result.verdict = Verdict::Failed;
    result.shrink_steps = static_cast<int>(path.size());
    result.counterexample = show(current.value());
    result.failure = std::move(outcome.failure);
    result.timeline = std::move(outcome.timeline);
    std::ostringstream token;
    token << kTokenPrefix << property.name << ":" << options.ranks << ":" << options.seed << ":"
          << options.cases << ":" << i << ":" << schedules << ":" << options.pct_depth << ":"
          << sim::name(options.reduction_order) << ":";
    if (path.empty()) {
      token << "-";
    }
    for (std::size_t k = 0; k < path.size(); ++k) {
      token << (k == 0 ? "" : ".") << path[k];
    }
    token << ":" << (outcome.sim_token.empty() ? "-" : outcome.sim_token);
    result.replay_token = token.str();
    break;
  }
  result.time = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start);
  return result;
}

// ---- Simulator execution.

std::string rank_failures(const std::vector<std::string>& errors) {
  std::ostringstream out;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) {
      continue;
    }
    // Env's failures name the rank already.
    const std::string prefix = "rank " + std::to_string(r) + ": ";
    out << "  " << (errors[r].rfind(prefix, 0) == 0 ? "" : prefix) << errors[r] << "\n";
  }
  return out.str();
}

void require_registry_empty(Env& env) {
  const std::size_t pending = work_registry_size();
  env.require(pending == 0, "the work registry still holds " + std::to_string(pending) +
                                " pending work(s) when the check returns: a result neither "
                                "waited nor dropped (kept alive past the check?) leaks; every "
                                "result must be waited for or dropped before the check returns");
}

struct SimRun {
  sim::SimReport report;
  std::vector<std::uint64_t> digests;
  int records = 0;  // Env::record calls, every rank's
};

sim::SimOptions simulator_options(const Property& property, const CheckOptions& options,
                                  int world_size) {
  sim::SimOptions sim_options;
  sim_options.world_size = world_size;
  sim_options.print_failures = false;
  sim_options.seed_from_environment = false;
  sim_options.reduction_order = options.reduction_order;
  sim_options.allocator = property.needs.allocator;
  sim_options.wrap_transport = options.wrap_transport;
  return sim_options;
}

void apply_schedule(const Schedule& schedule, const CheckOptions& options,
                    sim::SimOptions& sim_options) {
  if (schedule.seeded) {
    sim_options.seed = schedule.seed;
    sim_options.strategy = options.strategy.value_or(sim::Strategy::RandomWalk);
    sim_options.pct_depth = options.pct_depth;
  } else {
    sim_options.choices = schedule.choices;
  }
}

SimRun simulate_case(const Property& property, const Case& value, sim::SimOptions sim_options) {
  SimRun run;
  run.digests.assign(static_cast<std::size_t>(sim_options.world_size), 0);
  run.report = sim::simulate(sim_options, [&property, &value, &run] {
    Env env(rank());
    property.check(value, env);
    require_registry_empty(env);
    run.digests[static_cast<std::size_t>(rank())] = env.digest();
    run.records += env.records();
  });
  return run;
}

// The other schedules a schedule-independent property must agree with: other strategies and
// every non-default reduction order.
struct Variant {
  sim::Strategy strategy;
  sim::ReductionOrder order;
};
constexpr Variant kVariants[] = {
    {sim::Strategy::RandomWalk, sim::ReductionOrder::Ring},
    {sim::Strategy::Pct, sim::ReductionOrder::Tree},
    {sim::Strategy::RandomWalk, sim::ReductionOrder::Adversarial},
    {sim::Strategy::Pct, sim::ReductionOrder::Adversarial},
};

// What a replay adds to a run: the simulator's own token for the first run (its choices, checked
// against this build and these options), events, trace and timeline files, a planted bug.
struct ReplaySetup {
  std::string sim_token;
  sim::SimOptions extra;
};

void apply_setup(const ReplaySetup& setup, sim::SimOptions& sim_options) {
  sim_options.record_events = true;
  sim_options.timeline_path = setup.extra.timeline_path;
  sim_options.trace_path = setup.extra.trace_path;
  if (setup.extra.wrap_transport) {
    sim_options.wrap_transport = setup.extra.wrap_transport;
  }
}

// Runs `input` (and, for a schedule-independent property, its variants); `setup` for replays.
Outcome execute_on_simulator(const Property& property, const CheckOptions& options,
                             const SimInput& input, const ReplaySetup* setup = nullptr) {
  sim::SimOptions sim_options = simulator_options(property, options, input.world_size);
  apply_schedule(input.schedule, options, sim_options);
  if (setup != nullptr) {
    apply_setup(*setup, sim_options);
    if (!setup->sim_token.empty()) {
      sim_options.choices.reset();
      sim_options.replay = setup->sim_token;
    }
  }
  const bool replaying = setup != nullptr && !setup->sim_token.empty();
  const bool by_pct = input.schedule.seeded && (sim_options.strategy == sim::Strategy::Pct ||
                                                sim_options.strategy == sim::Strategy::Portfolio);
  Outcome outcome;
  // Note [PCT's estimate of a case's length]
  // PCT draws its change points among the first pct_steps decisions; the simulator's default
  // estimate of 256 lies far past a case's 20 to 100 decisions, so most runs never reached one.
  // A case's length is only known by running it: a first run (the default estimate) measures it,
  // and the case then runs again with pct_steps that length. Both come from the case's schedule
  // seed alone, so a token without a simulator token regenerates both; one with a simulator token
  // replays the run that decided and needs no measure. The measuring run is a run of the case
  // like any other: its failure is the case's.
  SimRun run = simulate_case(property, input.value, sim_options);
  if (by_pct && !replaying && run.report.ok() && run.report.strategy == sim::Strategy::Pct) {
    sim_options.pct_steps = std::max<std::uint64_t>(run.report.steps, 1);
    run = simulate_case(property, input.value, sim_options);
    ++outcome.runs;
  }
  outcome.sim_token = run.report.replay_token;
  // A replay keeps the report of the run that decided the verdict.
  const auto decided_by = [&](sim::SimReport& report) {
    if (setup != nullptr) {
      outcome.report = std::move(report);
    }
    return std::move(outcome);
  };
  if (!run.report.ok()) {
    outcome.passed = false;
    outcome.failure = rank_failures(run.report.rank_errors);
    outcome.timeline = sim::timeline_text(run.report);
    return decided_by(run.report);
  }
  if (!property.needs.schedule_independent) {
    return decided_by(run.report);
  }
  outcome.records = run.records;
  // Variant seeds come from the case's schedule, so every case tries other schedules.
  std::uint64_t schedule_hash = splitmix(input.schedule.seed);
  for (const std::uint64_t choice : input.schedule.choices) {
    schedule_hash = splitmix(schedule_hash ^ choice);
  }
  for (std::size_t v = 0; v < std::size(kVariants); ++v) {
    sim::SimOptions variant = simulator_options(property, options, input.world_size);
    if (setup != nullptr) {
      apply_setup(*setup, variant);
    }
    variant.strategy = kVariants[v].strategy;
    variant.pct_depth = options.pct_depth;
    // PCT's change points among the run's real decisions (the first run's count: a replay follows
    // it exactly), not the simulator's default estimate of 256, which a case's 20 to 100
    // decisions seldom reach.
    variant.pct_steps = std::max<std::uint64_t>(run.report.steps, 1);
    variant.reduction_order = kVariants[v].order;
    variant.seed = splitmix(schedule_hash + v + 1);
    SimRun other = simulate_case(property, input.value, variant);
    ++outcome.runs;
    std::ostringstream what;
    what << "under strategy " << sim::name(kVariants[v].strategy) << ", reduction order "
         << sim::name(kVariants[v].order) << ", seed " << variant.seed << ": ";
    if (!other.report.ok()) {
      outcome.passed = false;
      outcome.failure = what.str() + "\n" + rank_failures(other.report.rank_errors);
      outcome.timeline = sim::timeline_text(other.report);
      return decided_by(other.report);
    }
    for (std::size_t r = 0; r < run.digests.size(); ++r) {
      if (run.digests[r] != other.digests[r]) {
        outcome.passed = false;
        std::ostringstream message;
        message << "  rank " << r << ": " << what.str()
                << "the results differ from the first schedule's (digest " << std::hex
                << other.digests[r] << " vs " << run.digests[r] << ")\n";
        outcome.failure = message.str();
        outcome.timeline = sim::timeline_text(other.report);
        return decided_by(other.report);
      }
    }
  }
  return decided_by(run.report);
}

// Half the cases run on the full world (options.ranks), half on a world of any size the
// property allows (the lockstep runner cannot: its world is the transport's); shrinking moves
// towards the smallest. Only for a property the runner does not skip (skip_reason): options.ranks
// is at least its world_size_min, which replay checks for a token too.
std::function<rc::Gen<SimInput>()> simulator_generator(const Property& property,
                                                       const CheckOptions& options) {
  return [&property, &options] {
    rc::Gen<Schedule> schedules =
        options.strategy ? rc::gen::map(rc::gen::arbitrary<std::uint64_t>(),
                                        [](std::uint64_t seed) {
                                          return Schedule{true, {}, seed};
                                        })
                         : rc::gen::map(sim::gen_choices(), [](std::vector<std::uint64_t> choices) {
                             return Schedule{false, std::move(choices), 0};
                           });
    return rc::gen::exec([&property, &options, schedules] {
      SimInput input;
      // k in [0, 2 * span): the upper half is the full world, the lower half every size from
      // the smallest up; k shrinks towards 0, i.e. through smaller worlds to the smallest. Drawn
      // at the nominal size, not the case's: inRange scales its range with the size, which kept
      // the early cases (size i * 100 / cases) on the smallest worlds.
      // A world below world_size_min is one on which the property means nothing (a one-rank
      // "mismatch" returns normally): never drawn, however small options.ranks.
      CHORUS_CHECK_GE(property.needs.world_size_min, 1);
      CHORUS_CHECK_GE(options.ranks, property.needs.world_size_min);
      const int smallest = property.needs.world_size_min;
      const int span = options.ranks - smallest + 1;
      const int k = *rc::gen::resize(kSizeMax, rc::gen::inRange(0, 2 * span));
      input.world_size = k < span ? smallest + k : options.ranks;
      input.value = *property.cases(World{input.world_size});
      input.schedule = *schedules;
      return input;
    });
  };
}

std::string skip_reason(const Property& property, int ranks, bool simulator) {
  if (!simulator && property.needs.simulator_only) {
    return "needs the simulator";
  }
  if (ranks < property.needs.world_size_min) {
    return "needs at least " + std::to_string(property.needs.world_size_min) + " ranks";
  }
  return {};
}

PropertyResult skipped(const Property& property, std::string reason) {
  PropertyResult result;
  result.name = property.name;
  result.verdict = Verdict::Skipped;
  result.skip_reason = std::move(reason);
  return result;
}

template <class RunOne>
CheckReport run_all(const std::vector<Property>& properties, const CheckOptions& options,
                    bool simulator, bool report_progress, RunOne&& run_one) {
  check_options(options);
  const Clock::time_point start = Clock::now();
  CheckReport report;
  Listener* listener = report_progress ? options.listener : nullptr;
  CheckOptions per_property = options;
  per_property.listener = listener;
  for (const Property& property : properties) {
    if (property.name.empty() || property.name.find_first_of(": \t\n") != std::string::npos) {
      throw InvalidArgument({}, "chorus check: property name '" + property.name +
                                    "' is empty or holds ':' or whitespace (replay tokens carry "
                                    "it)");
    }
  }
  for (std::size_t i = 0; i < properties.size(); ++i) {
    const Property& property = properties[i];
    if (listener != nullptr) {
      listener->on_property_start(property, static_cast<int>(i),
                                  static_cast<int>(properties.size()));
    }
    std::string reason = skip_reason(property, options.ranks, simulator);
    PropertyResult result =
        reason.empty() ? run_one(property, per_property) : skipped(property, std::move(reason));
    if (listener != nullptr) {
      listener->on_property_end(result);
    }
    report.results.push_back(std::move(result));
  }
  report.time = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start);
  return report;
}

// ---- Lockstep execution.

// Agrees on the verdict: every rank learns which ranks failed and their messages.
Outcome agree(const std::string& local_failure) {
  std::vector<int> everyone(static_cast<std::size_t>(world_size()));
  for (int r = 0; r < world_size(); ++r) {
    everyone[static_cast<std::size_t>(r)] = r;
  }
  const ProcessGroup verdicts = new_group(everyone, std::string(kVerdictGroupTag));
  const int failed_here = local_failure.empty() ? 0 : 1;
  const Tensor failures = all_reduce(Tensor::full({1}, failed_here, DType::Int32), "sum", verdicts);
  Outcome outcome;
  if (failures.item<std::int32_t>() == 0) {
    return outcome;
  }
  outcome.passed = false;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(kGatheredMessageBytes), 0);
  std::memcpy(bytes.data(), local_failure.data(), std::min(local_failure.size(), bytes.size() - 1));
  const std::vector<std::uint8_t> all =
      all_gather_tensor(Tensor::from_vector(bytes), 0, verdicts).to_vector<std::uint8_t>();
  std::vector<std::string> errors(static_cast<std::size_t>(world_size()));
  for (std::size_t r = 0; r < errors.size(); ++r) {
    const char* text = reinterpret_cast<const char*>(all.data()) +
                       r * static_cast<std::size_t>(kGatheredMessageBytes);
    errors[r] = std::string(text, strnlen(text, static_cast<std::size_t>(kGatheredMessageBytes)));
  }
  outcome.failure = rank_failures(errors);
  return outcome;
}

// While alive, the calling rank's drops get no line in its unwaited report
// (RankContext::list_drops): a property that drops results on purpose (async.registry_cleanup)
// is not reported at the rank's end, as the simulator runner never prints its runs' reports.
class UnlistedDrops {
 public:
  UnlistedDrops() : context_(RankContext::current()) {
    CHORUS_CHECK(context_ != nullptr);
    previous_ = context_->list_drops(false);
  }
  ~UnlistedDrops() { context_->list_drops(previous_); }
  UnlistedDrops(const UnlistedDrops&) = delete;
  UnlistedDrops& operator=(const UnlistedDrops&) = delete;

 private:
  RankContext* context_;
  bool previous_ = true;
};

Outcome execute_in_lockstep(const Property& property, const Case& value) {
  const UnlistedDrops unlisted;
  // Env records failed requirements rather than throwing, so this rank keeps reaching the
  // collectives its peers reach (Env's comment).
  Env env(rank(), Env::OnFailure::Record);
  std::string failure;
  try {
    property.check(value, env);
    require_registry_empty(env);
    if (env.failures() > 0) {
      failure = env.first_failure();
      if (env.failures() > 1) {
        failure += " (and " + std::to_string(env.failures() - 1) + " more)";
      }
    }
  } catch (const std::exception& error) {
    failure = error.what();
    if (failure.empty()) {
      failure = "an exception with an empty message";
    }
  } catch (const rc::detail::CaseResult& result) {
    failure = "a RapidCheck assertion (RC_ASSERT, RC_FAIL) failed: " + result.description;
  } catch (...) {
    failure = "an exception that is not a std::exception";
  }
  if (failure.empty()) {
    return agree(failure);
  }
  // A rank that failed before a collective its peers issued reaches the verdict exchange while
  // they still wait on that collective: the exchange may time out here first (the simulator
  // calls it a CollectiveMismatch: the ranks wait on different groups), and its error must still
  // say why this rank left the property.
  try {
    return agree(failure);
  } catch (const Error& error) {
    throw_error(error.code(), error.context(),
                error.detail() +
                    "; before this verdict exchange, this rank had failed the case: " + failure);
  }
}

// ---- Replay tokens: chorus-check:4:<property>:<ranks>:<seed>:<cases>:<case>:<schedules>:
// <pct depth>:<reduction order>:<shrink path>:<simulator token>

struct Token {
  std::string property;
  int ranks = 0;
  std::uint64_t seed = 0;
  int cases = 0;
  int case_index = 0;
  std::optional<sim::Strategy> strategy;
  bool lockstep = false;  // found by the lockstep runner: the case alone, the all-0 schedule
                          // (replay_note says so wherever the token is printed)
  int pct_depth = 2;
  sim::ReductionOrder order = sim::ReductionOrder::Fixed;
  std::vector<int> path;
  std::string sim_token;
};

[[noreturn]] void bad_token(std::string_view token, std::string_view why) {
  throw InvalidArgument(
      {}, "chorus replay: malformed token '" + std::string(token) + "': " + std::string(why));
}

template <class T>
T parse_number(std::string_view text, std::string_view token, std::string_view field) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    bad_token(token, std::string(field) + " is not a number: '" + std::string(text) + "'");
  }
  return value;
}

// A number in [min, max] (inclusive); `expected` says the range in words.
int parse_in_range(std::string_view text, std::string_view token, std::string_view field,
                   std::int64_t min, std::int64_t max, std::string_view expected) {
  const auto value = parse_number<std::int64_t>(text, token, field);
  if (value < min || value > max) {
    bad_token(token, std::string(field) + " " + std::string(text) + " is out of range (expected " +
                         std::string(expected) + ")");
  }
  return static_cast<int>(value);
}

Token parse_token(std::string_view token) {
  // Older formats name cases this build's generators no longer draw: refused, never replayed as
  // another case. 2: before input forms, tagged and 1-D mesh layouts, choices drawn at the
  // nominal size and PCT runs sized to their case (2026-12-03). 3: a single case at size 0
  // (2026-12-03): only its tokens of one case are refused, below.
  if (token.starts_with("chorus-check:1:") || token.starts_with("chorus-check:2:")) {
    bad_token(token, std::string("it is of format ") + token[13] +
                         ", from an older chorus, which generated cases differently: run chorus "
                         "check again for a token of format 4");
  }
  if (token.starts_with("chorus-replay:")) {
    bad_token(token,
              "it is the simulator's replay token of a program's run, not a property case's "
              "(chorus-check:...): rerun that program with --replay=<token> or with "
              "CHORUS_SIM_REPLAY=<token> set");
  }
  const bool format3 = token.starts_with(kFormat3Prefix);
  if (!format3 && !token.starts_with(kTokenPrefix)) {
    bad_token(token, "it does not start with '" + std::string(kTokenPrefix) + "'");
  }
  static_assert(kFormat3Prefix.size() == kTokenPrefix.size());
  std::string_view rest = token.substr(kTokenPrefix.size());
  std::vector<std::string_view> fields;
  // Ten fields; the last (the simulator's token) holds colons itself.
  for (int i = 0; i < 9; ++i) {
    const std::size_t colon = rest.find(':');
    if (colon == std::string_view::npos) {
      bad_token(token, "too few fields");
    }
    fields.push_back(rest.substr(0, colon));
    rest = rest.substr(colon + 1);
  }
  fields.push_back(rest);
  Token parsed;
  parsed.property = std::string(fields[0]);
  parsed.ranks = parse_in_range(fields[1], token, "ranks", 1, sim::kMaxWorldSize,
                                "1 to " + std::to_string(sim::kMaxWorldSize));
  parsed.seed = parse_number<std::uint64_t>(fields[2], token, "seed");
  parsed.cases =
      parse_in_range(fields[3], token, "cases", 1, std::numeric_limits<int>::max(), "at least 1");
  parsed.case_index = parse_in_range(fields[4], token, "case", 0, parsed.cases - 1,
                                     "0 to " + std::to_string(parsed.cases - 1) + ", below cases");
  if (format3 && parsed.cases == 1) {
    bad_token(token,
              "it is of format 3 with cases 1: format 3 generated a single case at size 0, "
              "format 4 at the nominal size, so it would replay another case: run chorus check "
              "again for a token of format 4");
  }
  if (fields[5] == "lockstep") {
    parsed.lockstep = true;
  } else if (fields[5] != "generated") {
    const std::optional<sim::Strategy> strategy = sim::named(fields[5], sim::kStrategies);
    if (!strategy) {
      bad_token(token, "unknown schedule source '" + std::string(fields[5]) + "'");
    }
    parsed.strategy = strategy;
  }
  parsed.pct_depth =
      parse_in_range(fields[6], token, "pct depth", kPctDepthMin, kPctDepthMax, "1, 2 or 3");
  const std::optional<sim::ReductionOrder> order = sim::named(fields[7], sim::kReductionOrders);
  if (!order) {
    bad_token(token, "unknown reduction order '" + std::string(fields[7]) + "'");
  }
  parsed.order = *order;
  if (fields[8] != "-") {
    std::string_view path = fields[8];
    while (!path.empty()) {
      const std::size_t dot = path.find('.');
      parsed.path.push_back(parse_in_range(path.substr(0, dot), token, "shrink path index", 0,
                                           std::numeric_limits<int>::max(), "at least 0"));
      path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
    }
  }
  if (fields[9] != "-") {
    parsed.sim_token = std::string(fields[9]);
  }
  return parsed;
}

// The `index`-th shrink of `input` (a step of a token's shrink path).
// GCC 12 at -O2 and above reports a -Wmaybe-uninitialized false positive inside rc::Maybe's
// destructor here (the Maybe is always constructed by Seq::next()).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <class T>
rc::Shrinkable<T> nth_shrink(const rc::Shrinkable<T>& input, int index, std::string_view token) {
  rc::Seq<rc::Shrinkable<T>> shrinks = input.shrinks();
  for (int k = 0; k < index; ++k) {
    if (!shrinks.next()) {
      bad_token(token, "its shrink path leaves the generated case's shrinks (another build?)");
    }
  }
  rc::Maybe<rc::Shrinkable<T>> shrink = shrinks.next();
  if (!shrink) {
    bad_token(token, "its shrink path leaves the generated case's shrinks (another build?)");
  }
  return std::move(*shrink);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

std::string_view name(Verdict verdict) noexcept {
  switch (verdict) {
    case Verdict::Passed:
      return "passed";
    case Verdict::Failed:
      return "FAILED";
    case Verdict::Skipped:
      return "skipped";
  }
  return "?";
}

bool CheckReport::passed() const noexcept {
  return std::none_of(results.begin(), results.end(),
                      [](const PropertyResult& r) { return r.verdict == Verdict::Failed; });
}

std::vector<Property> select(const std::vector<Property>& properties, std::string_view glob) {
  // Comma-separated patterns, each trimmed of surrounding blanks ('law.*, async.*').
  std::vector<std::string_view> patterns;
  while (true) {
    const std::size_t comma = glob.find(',');
    std::string_view pattern = glob.substr(0, comma);
    const std::size_t first = pattern.find_first_not_of(" \t");
    pattern = first == std::string_view::npos
                  ? std::string_view()
                  : pattern.substr(first, pattern.find_last_not_of(" \t") - first + 1);
    patterns.push_back(pattern);
    if (comma == std::string_view::npos) {
      break;
    }
    glob = glob.substr(comma + 1);
  }
  // A pattern that matches nothing is a typo, refused even when another pattern matches: it
  // would otherwise drop the properties it meant without a word.
  std::string unmatched;
  for (const std::string_view pattern : patterns) {
    if (std::none_of(properties.begin(), properties.end(), [&](const Property& property) {
          return glob_match(pattern, property.name);
        })) {
      unmatched += std::string(unmatched.empty() ? "" : ", ") + "'" + std::string(pattern) + "'";
    }
  }
  if (!unmatched.empty()) {
    throw InvalidArgument({}, "no property matches " + unmatched);
  }
  std::vector<Property> selected;
  for (const Property& property : properties) {
    if (std::any_of(patterns.begin(), patterns.end(),
                    [&](std::string_view pattern) { return glob_match(pattern, property.name); })) {
      selected.push_back(property);
    }
  }
  CHORUS_CHECK(!selected.empty());
  return selected;
}

void check_options(const CheckOptions& options) {
  if (options.ranks < 1 || options.ranks > 1024) {
    throw InvalidArgument(
        {}, "chorus check: ranks must lie in [1, 1024], got " + std::to_string(options.ranks));
  }
  if (options.cases < 1) {
    throw InvalidArgument(
        {}, "chorus check: cases must be at least 1, got " + std::to_string(options.cases));
  }
  if (options.pct_depth < kPctDepthMin || options.pct_depth > kPctDepthMax) {
    throw InvalidArgument(
        {}, "chorus check: pct_depth must lie in [1, 3], got " + std::to_string(options.pct_depth));
  }
  if (options.shrink_runs_max < 0) {
    throw InvalidArgument({},
                          "chorus check: shrink runs (--shrink-runs) must not be negative, got " +
                              std::to_string(options.shrink_runs_max));
  }
}

CheckReport check_on_simulator(const std::vector<Property>& properties,
                               const CheckOptions& options) {
  return run_all(
      properties, options, /*simulator=*/true, /*report_progress=*/true,
      [](const Property& property, const CheckOptions& per_property) {
        int records = 0;  // in every case's first run: Needs::schedule_independent compares them
        auto execute = [&](const SimInput& input) {
          Outcome outcome = execute_on_simulator(property, per_property, input);
          records += outcome.records;
          return outcome;
        };
        const std::string schedules =
            per_property.strategy ? std::string(sim::name(*per_property.strategy)) : "generated";
        PropertyResult result = drive<SimInput>(
            property, per_property, schedules, simulator_generator(property, per_property), execute,
            [](const SimInput& input) { return rc::toString(input); });
        if (property.needs.schedule_independent && result.verdict == Verdict::Passed &&
            result.cases > 0 && records == 0) {
          // Not a case's failure: a case may record nothing (a world too small for it), but a
          // property none of whose cases recorded anything compared nothing across schedules.
          result.verdict = Verdict::Failed;
          result.failure =
              "  the property is marked Needs::schedule_independent, but no case's check recorded "
              "a result on any rank (Env::record): its runs under other schedules compared "
              "nothing; record the results that must not depend on the schedule\n";
          return result;
        }
        if (result.verdict == Verdict::Failed && !result.replay_token.empty()) {
          // Rerun the minimal input once with events recorded, for its timeline.
          const Replay again = replay({property}, result.replay_token, [&] {
            sim::SimOptions extra;
            extra.wrap_transport = per_property.wrap_transport;
            return extra;
          }());
          if (!again.result.timeline.empty()) {
            result.timeline = again.result.timeline;
          }
        }
        return result;
      });
}

CheckReport check_in_lockstep(const std::vector<Property>& properties,
                              const CheckOptions& options) {
  CheckOptions lockstep = options;
  lockstep.ranks = world_size();
  return run_all(properties, lockstep, /*simulator=*/false, /*report_progress=*/rank() == 0,
                 [](const Property& property, const CheckOptions& per_property) {
                   const World world{per_property.ranks};
                   return drive<Case>(
                       property, per_property, "lockstep", [&] { return property.cases(world); },
                       [&](const Case& value) { return execute_in_lockstep(property, value); },
                       [](const Case& value) { return value.text(); });
                 });
}

RunOptions lockstep_run_options(const std::vector<Property>& properties,
                                const CheckOptions& options, const std::string& transport) {
  RunOptions run_options;
  run_options.transport = transport;
  run_options.ranks = options.ranks;
  run_options.seed = options.seed;
  run_options.strategy = options.strategy.value_or(sim::Strategy::RandomWalk);
  run_options.pct_depth = options.pct_depth;
  run_options.reduction_order = options.reduction_order;
  // The lockstep run is one simulation of every case of every property, tens of thousands of
  // decisions: PCT's default estimate of 256 put every change point in the first property's
  // first cases. The estimate: the cases that run (the properties this runner does not skip)
  // times kLockstepStepsPerRankCase per rank, a figure measured on the battery, rounded down so
  // that the change points fall within the run (shrinking a failure only lengthens it).
  std::uint64_t running = 0;
  for (const Property& property : properties) {
    running += skip_reason(property, options.ranks, /*simulator=*/false).empty() ? 1 : 0;
  }
  run_options.pct_steps = std::max<std::uint64_t>(
      running * static_cast<std::uint64_t>(std::max(options.cases, 0)) *
          static_cast<std::uint64_t>(std::max(options.ranks, 0)) * kLockstepStepsPerRankCase,
      1);
  return run_options;
}

Replay replay(const std::vector<Property>& properties, std::string_view token,
              sim::SimOptions extra) {
  const Token parsed = parse_token(token);
  const auto found = std::find_if(properties.begin(), properties.end(),
                                  [&](const Property& p) { return p.name == parsed.property; });
  if (found == properties.end()) {
    // The program's own list (`chorus list` shows the battery's, not a property program's): its
    // first names, enough to tell whose token this is.
    constexpr std::size_t kNamesShown = 4;
    std::string names;
    for (std::size_t i = 0; i < std::min(properties.size(), kNamesShown); ++i) {
      names += (i == 0 ? "" : ", ") + properties[i].name;
    }
    if (properties.size() > kNamesShown) {
      names += " and " + std::to_string(properties.size() - kNamesShown) + " more";
    }
    throw InvalidArgument({}, "chorus replay: no property named '" + parsed.property +
                                  "' (the properties here: " + names + ")");
  }
  const Property& property = *found;
  CheckOptions options;
  options.ranks = parsed.ranks;
  options.seed = parsed.seed;
  options.cases = parsed.cases;
  options.strategy = parsed.strategy;
  options.pct_depth = parsed.pct_depth;
  options.reduction_order = parsed.order;
  check_options(options);
  // Only a run that did not skip the property made a token for it: chorus check skips it below
  // its world_size_min, and the lockstep runner skips those that need the simulator. Such a
  // token would replay a case no check can draw (a one-rank "mismatch" failed as a false alarm).
  if (parsed.ranks < property.needs.world_size_min) {
    bad_token(token, property.name + " needs at least " +
                         std::to_string(property.needs.world_size_min) +
                         " ranks but the token has " + std::to_string(parsed.ranks) +
                         " (chorus check skips it on fewer)");
  }
  if (parsed.lockstep && property.needs.simulator_only) {
    bad_token(token, property.name +
                         " needs the simulator but the token is from the lockstep runner (which "
                         "skips it)");
  }
  CHORUS_CHECK(skip_reason(property, parsed.ranks, /*simulator=*/!parsed.lockstep).empty());
  const rc::Random random = case_random(options.seed, property.name, parsed.case_index);
  const int size = case_size(parsed.case_index, options.cases);
  SimInput value;
  if (parsed.lockstep) {
    // The lockstep runner generates the case alone (no schedule): follow its path in that tree.
    rc::Shrinkable<Case> input = property.cases(World{options.ranks})(random, size);
    for (const int index : parsed.path) {
      input = nth_shrink(input, index, token);
    }
    value.value = input.value();
    value.world_size = options.ranks;
  } else {
    rc::Shrinkable<SimInput> input = simulator_generator(property, options)()(random, size);
    for (const int index : parsed.path) {
      input = nth_shrink(input, index, token);
    }
    value = input.value();
  }
  ReplaySetup setup;
  setup.sim_token = parsed.sim_token;
  setup.extra = std::move(extra);
  Outcome outcome = execute_on_simulator(property, options, value, &setup);
  Replay result;
  result.report = std::move(outcome.report);
  result.result.name = property.name;
  result.result.cases = 1;
  result.result.runs = outcome.runs;
  result.result.counterexample = parsed.lockstep ? value.value.text() : rc::toString(value);
  result.result.replay_token = std::string(token);
  if (!outcome.passed) {
    result.result.verdict = Verdict::Failed;
    result.result.failure = std::move(outcome.failure);
    result.result.timeline = std::move(outcome.timeline);
  }
  return result;
}

std::string summary_table(const CheckReport& report) {
  std::size_t width = 8;
  for (const PropertyResult& result : report.results) {
    width = std::max(width, result.name.size());
  }
  std::ostringstream out;
  out << std::left << std::setw(static_cast<int>(width)) << "property"
      << "  " << std::right << std::setw(6) << "cases"
      << "  " << std::setw(8) << "runs"
      << "  " << std::setw(9) << "time (s)"
      << "  verdict\n";
  int passed = 0;
  int failed = 0;
  int skipped_count = 0;
  std::uint64_t runs = 0;
  for (const PropertyResult& result : report.results) {
    out << std::left << std::setw(static_cast<int>(width)) << result.name << "  " << std::right
        << std::setw(6) << result.cases << "  " << std::setw(8) << result.runs << "  "
        << std::setw(9) << std::fixed << std::setprecision(2)
        << std::chrono::duration<double>(result.time).count() << "  " << name(result.verdict);
    if (result.verdict == Verdict::Skipped) {
      out << " (" << result.skip_reason << ")";
    }
    out << "\n";
    runs += result.runs;
    passed += result.verdict == Verdict::Passed ? 1 : 0;
    failed += result.verdict == Verdict::Failed ? 1 : 0;
    skipped_count += result.verdict == Verdict::Skipped ? 1 : 0;
  }
  out << passed << " passed, " << failed << " failed, " << skipped_count << " skipped; " << runs
      << " runs in " << std::fixed << std::setprecision(2)
      << std::chrono::duration<double>(report.time).count() << " s\n";
  return out.str();
}

std::string replay_note(std::string_view token) {
  // failure_report calls this on whatever token a PropertyResult holds, and never threw before
  // the note: a token parse_token refuses (say a format-3 token of one case) gets no note.
  bool lockstep = false;
  try {
    lockstep = parse_token(token).lockstep;
  } catch (const Error&) {
    return {};
  }
  if (!lockstep) {
    return {};
  }
  return "a lockstep token replays the case alone on the simulator with choice 0 at every "
         "scheduling decision (and, for a schedule-independent property, its other strategies "
         "and reduction orders), not the lockstep run's own schedule or transport, which it does "
         "not record: a failure that depended on them may not reproduce; rerunning the same "
         "chorus check (same seed, ranks and transport) reproduces it on the simulator, and on "
         "MPI or NCCL may reproduce it (their timing is not replayed)";
}

std::string replay_text(const Replay& replayed, std::string_view token) {
  std::string text =
      "property " + replayed.result.name + "\ncase:\n  " + replayed.result.counterexample + "\n";
  if (replayed.result.verdict == Verdict::Failed) {
    return text + "FAILED:\n" + replayed.result.failure + replayed.result.timeline;
  }
  text += "passed (the failure did not reproduce)\n";
  if (const std::string note = replay_note(token); !note.empty()) {
    text += "note: " + note + "\n";
  }
  return text;
}

std::string failure_report(const PropertyResult& result, std::string_view replay_with) {
  std::ostringstream out;
  out << "property " << result.name << " FAILED";
  if (result.shrink_steps > 0) {
    out << " (shrunk in " << result.shrink_steps << " steps)";
  }
  out << "\nminimal counterexample:\n  " << result.counterexample << "\nerrors:\n"
      << result.failure;
  if (!result.timeline.empty()) {
    out << "timeline of the minimal failing run:\n" << result.timeline;
  }
  out << "replay: " << replay_with << " " << result.replay_token << "\n";
  if (const std::string note = result.replay_token.empty() ? "" : replay_note(result.replay_token);
      !note.empty()) {
    out << "  (" << note << ")\n";
  }
  return out.str();
}

}  // namespace chorus::props
