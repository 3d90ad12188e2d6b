#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/runtime.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "interrupt_report.hpp"
#include "shrink.hpp"
#include "world.hpp"

namespace chorus::sim {
namespace {

// Shell-quotes one argument when it needs it.
std::string quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;#~!") == std::string::npos) {
    return arg;
  }
  std::string out = "'";
  for (char c : arg) {
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return out + "'";
}

// This process's command line, each argument quoted for the shell and preceded by a space.
std::string read_command_line() {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
  std::vector<std::string> words;
  std::string word;
  for (char c : raw) {
    if (c == '\0') {
      words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) {
    words.push_back(std::move(word));
  }
  return command_line(words);
}

// "<assignment> <the command line>": `words` when given, else this process's, which is read once
// per process: it does not change, and reading /proc/self/cmdline (open, read, close) on every
// run was a large part of a short run's fixed cost.
std::string replay_command(const std::string& assignment, const std::vector<std::string>& words) {
  return assignment + (words.empty() ? command_line() : command_line(words));
}

// SimReport::replay_command of a run seeded with `seed` (token empty) or following `token`: the
// command line when the run reads the environment, else what to set in the program, since
// CHORUS_SIM_SEED / CHORUS_SIM_REPLAY would not reach it.
std::string replay_instruction(const SimOptions& options, std::uint64_t seed,
                               const std::string& token) {
  if (options.seed_from_environment) {
    return token.empty()
               ? replay_command("CHORUS_SIM_SEED=" + std::to_string(seed),
                                options.command_without_seed)
               : replay_command("CHORUS_SIM_REPLAY=" + token, options.command_without_replay);
  }
  // Every seeded run's report carries one: made in one string of its final size (the operator+
  // chain allocated twice a run).
  constexpr std::string_view kSeedBefore = "(set SimOptions::seed = ";
  constexpr std::string_view kSeedAfter =
      ": this run does not read CHORUS_SIM_SEED, SimOptions::seed_from_environment is false)";
  constexpr std::string_view kTokenBefore = "(set SimOptions::replay = \"";
  constexpr std::string_view kTokenAfter =
      "\": this run does not read CHORUS_SIM_REPLAY, SimOptions::seed_from_environment is false)";
  char digits[24];
  const std::string_view value =
      token.empty() ? std::string_view(digits, std::to_chars(digits, std::end(digits), seed).ptr)
                    : std::string_view(token);
  const std::string_view before = token.empty() ? kSeedBefore : kTokenBefore;
  const std::string_view after = token.empty() ? kSeedAfter : kTokenAfter;
  std::string instruction;
  instruction.reserve(before.size() + value.size() + after.size());
  instruction.append(before).append(value).append(after);
  return instruction;
}

// The run's replay line, known before it starts, for what ends the process before the run's
// report: a guard-page fault (Note [Guard pages]) and an interrupt (Note [Interrupt report]). A
// seeded run replays from its seed, a run following a replay token from that token; one driven by a
// decision list or by fuzzer bytes from those, which a token made at the fault would only copy.
std::string replay_line_before_run(const SimOptions& options) {
  std::string line = "  replay: ";
  if (!options.replay.empty()) {
    line += replay_instruction(options, 0, options.replay);
  } else if (options.choices) {
    line += "rerun with the same decision list (SimOptions::choices)";
  } else if (options.fuzz_bytes) {
    line += "rerun the fuzzer on the same input";
  } else {
    line += replay_instruction(options, options.seed, "");
  }
  return line + "\n";
}

// A hash as 16 hex digits, as every line that prints one writes it (zeros kept, so the same hash
// is the same text wherever it is printed).
std::string hex64(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// Note [Interrupt report]: published while the run lasts, withdrawn however it ends.
class InterruptReport {
 public:
  // `world` outlives the report and holds its replay line.
  explicit InterruptReport(const detail::SimWorld& world) {
    info_.running_rank = &world.running_rank();
    info_.now_ns = &world.virtual_now();
    info_.replay = world.replay_line().c_str();
    detail::publish_interrupt_info(&info_);
  }
  ~InterruptReport() { detail::withdraw_interrupt_info(&info_); }
  InterruptReport(const InterruptReport&) = delete;
  InterruptReport& operator=(const InterruptReport&) = delete;

 private:
  detail::RunInterruptInfo info_;
};

// InvalidArgument for an enumerated option outside its enumerators (a cast integer) and a PCT
// depth below 1, which the run would otherwise clamp or trip over.
void check_enumerated_options(const SimOptions& options) {
  const auto refuse = [](const std::string& what) {
    throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""}, what);
  };
  const auto beyond = [](auto value, auto last) {
    return static_cast<int>(value) > static_cast<int>(last);
  };
  if (beyond(options.executor, ExecutorKind::Threads)) {
    refuse("SimOptions::executor " + std::to_string(static_cast<int>(options.executor)) +
           " is not an ExecutorKind");
  }
  if (beyond(options.strategy, kStrategies.back())) {
    refuse("SimOptions::strategy " + std::to_string(static_cast<int>(options.strategy)) +
           " is not a Strategy");
  }
  if (beyond(options.allocator, kAllocatorPolicies.back())) {
    refuse("SimOptions::allocator " + std::to_string(static_cast<int>(options.allocator)) +
           " is not an AllocatorPolicy");
  }
  if (beyond(options.reduction_order, kReductionOrders.back())) {
    refuse("SimOptions::reduction_order " +
           std::to_string(static_cast<int>(options.reduction_order)) + " is not a ReductionOrder");
  }
  if (options.strategy == Strategy::Pct &&
      (options.pct_depth < 1 || options.pct_depth > kPctDepthMax)) {
    refuse("SimOptions::pct_depth " + std::to_string(options.pct_depth) +
           " is out of range: PCT's bug depth is 1 to " + std::to_string(kPctDepthMax));
  }
}

// InvalidArgument for a wait timeout that is not positive: every wait would time out at once.
void check_timeout(const SimOptions& options) {
  if (options.timeout.count() <= 0) {
    throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                          "SimOptions::timeout is " + std::to_string(options.timeout.count()) +
                              " ns: a wait's timeout must be positive");
  }
}

// CHORUS_SIM_TIMELINE and CHORUS_SIM_TRACE, where the options read the environment, over the
// options' own paths.
void resolve_output_paths(SimOptions& options) {
  if (!options.seed_from_environment) {
    return;
  }
  if (const char* text = std::getenv("CHORUS_SIM_TIMELINE"); text != nullptr && *text != '\0') {
    options.timeline_path = text;
  }
  if (const char* text = std::getenv("CHORUS_SIM_TRACE"); text != nullptr && *text != '\0') {
    options.trace_path = text;
  }
}

SimOptions effective_options(const SimOptions& options) {
  SimOptions effective = options;
  effective.seed = resolved_seed(options);
  if (options.seed_from_environment) {
    if (const char* text = std::getenv("CHORUS_SIM_REPLAY"); text != nullptr && *text != '\0') {
      effective.replay = text;
    }
  }
  resolve_output_paths(effective);
  if (!effective.timeline_path.empty() || !effective.trace_path.empty()) {
    effective.record_events = true;
  }
  if (!effective.replay.empty()) {
    detail::ReplayToken token = detail::decode_replay_token(effective.replay);
    if (token.world_size != effective.world_size) {
      throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                            "the replay token is for " + std::to_string(token.world_size) +
                                " ranks, but this run has " + std::to_string(effective.world_size));
    }
    if (const std::string shape = detail::run_shape(effective); token.shape != shape) {
      throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                            "the replay token was recorded with run options {" + token.shape +
                                "}, but this run has {" + shape +
                                "}: replay it with the same SimOptions (reduction order, "
                                "allocator, faults, CUDA devices, liveness, timeout, "
                                "max_steps, steps_after_budget)");
    }
    effective.choices = std::move(token.choices);
    effective.fuzz_bytes.reset();
  }
  if (options.executor == ExecutorKind::Auto) {
    if (const char* text = std::getenv("CHORUS_SIM_EXECUTOR"); text != nullptr && *text != '\0') {
      const std::string name = text;
      if (name == "fibers") {
        effective.executor = ExecutorKind::Fibers;
      } else if (name == "threads") {
        effective.executor = ExecutorKind::Threads;
      } else {
        throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                              "CHORUS_SIM_EXECUTOR='" + name + "': expected fibers or threads");
      }
    }
  }
  return effective;
}

// Throws InvalidArgument for a fault plan this world cannot run (SimOptions::faults,
// random_faults).
void check_fault_plan(const SimOptions& options) {
  const auto invalid = [](const std::string& detail) {
    throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""}, detail);
  };
  for (const Fault& fault : options.faults) {
    if (fault.rank < 0 || fault.rank >= options.world_size) {
      invalid("fault '" + fault.to_string() + "' names rank " + std::to_string(fault.rank) +
              ", outside the world of " + std::to_string(options.world_size) + " ranks");
    }
    if (fault.kind == Fault::Kind::Delay && fault.delay_steps > kDelayStepsMax) {
      invalid("fault '" + fault.to_string() + "' delays by more than kDelayStepsMax (" +
              std::to_string(kDelayStepsMax) + ") steps");
    }
    if (fault.kind == Fault::Kind::Delay && fault.delay_steps == 0) {
      invalid("fault '" + fault.to_string() + "' delays by 0 steps: a delay is at least 1 step");
    }
  }
  const RandomFaults& random = options.random_faults;
  const std::uint64_t total = std::uint64_t{random.crash_ppm} + random.transport_error_ppm +
                              random.hang_ppm + random.delay_ppm;
  if (total > 1'000'000) {
    invalid("random fault probabilities add up to " + std::to_string(total) +
            " ppm, above 1000000 (certainty)");
  }
  if (random.enabled() && random.delay_ppm > 0 && random.delay_steps_max == 0) {
    invalid("random delays need RandomFaults::delay_steps_max >= 1");
  }
  if (random.delay_steps_max > kDelayStepsMax) {
    invalid("RandomFaults::delay_steps_max " + std::to_string(random.delay_steps_max) +
            " is above kDelayStepsMax (" + std::to_string(kDelayStepsMax) + ")");
  }
}

// "cannot write the SVG timeline to '<path>': <why>", errno's reason.
[[noreturn]] void cannot_write(const std::string& path, std::string_view what, int error) {
  throw InvalidArgument(
      ErrorContext{-1, "sim::run", -1, ""},
      "cannot write the " + std::string(what) + " to '" + path + "': " + std::strerror(error));
}

// Refuses, before the run, an output file (SimOptions::timeline_path, trace_path) that could not
// be written: found only at the end, the error came after the run's report, and in place of
// `chorus replay`'s verdict. Creates and opens nothing: an existing file must be writable, a new
// one needs a writable directory; anything else that exists (a FIFO, /dev/stdout) is left to the
// write at the end, which opens it once.
void check_writable(const std::string& path, std::string_view what) {
  if (path.empty()) {
    return;
  }
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0) {
    if (S_ISDIR(status.st_mode)) {
      cannot_write(path, what, EISDIR);
    }
    if (S_ISREG(status.st_mode) && ::access(path.c_str(), W_OK) != 0) {
      cannot_write(path, what, errno);
    }
    return;
  }
  if (errno != ENOENT) {
    cannot_write(path, what, errno);
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (::access(parent.empty() ? "." : parent.c_str(), W_OK | X_OK) != 0) {
    cannot_write(path, what, errno);
  }
}

// Writes `text` to `path` (the `what` of check_writable) and leaves `mark` in `report`.
void write_output(const std::string& path, std::string_view what, const std::string& text,
                  std::string_view mark, SimReport& report) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    cannot_write(path, what, errno);
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const int write_error = errno;
  if (std::fclose(file) != 0 || !written) {
    cannot_write(path, what, written ? errno : write_error);
  }
  report.marks[std::string(mark)] += 1;
}

constexpr std::string_view kTimelineFile = "SVG timeline";
constexpr std::string_view kTraceFile = "trace JSON";

// Microseconds, exactly, in plain digits: "600000012.345", never the "6e+08" a stream prints
// for a double (a 10-minute virtual timeout is 6e8 us; events microseconds apart must differ).
std::string format_microseconds(std::chrono::nanoseconds time) {
  const std::int64_t ns = time.count();
  const std::uint64_t magnitude =
      ns < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  std::string text = (ns < 0 ? "-" : "") + std::to_string(magnitude / 1000);
  if (const std::uint64_t fraction = magnitude % 1000; fraction != 0) {
    std::string digits = std::to_string(fraction);
    digits.insert(0, 3 - digits.size(), '0');
    while (digits.back() == '0') {
      digits.pop_back();
    }
    text += "." + digits;
  }
  return text;
}

}  // namespace

std::uint64_t resolved_seed(const SimOptions& options) {
  if (!options.seed_from_environment) {
    return options.seed;
  }
  const char* text = std::getenv("CHORUS_SIM_SEED");
  if (text == nullptr || *text == '\0') {
    return options.seed;
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long seed = std::strtoull(text, &end, 10);  // "010" is ten, not eight
  // strtoull accepts a sign (and wraps "-1") and clamps on overflow: refuse both.
  const bool digits_only = std::isdigit(static_cast<unsigned char>(text[0])) != 0;
  if (end == nullptr || *end != '\0' || !digits_only || errno == ERANGE) {
    throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                          std::string("CHORUS_SIM_SEED='") + text + "' is not an unsigned integer");
  }
  return seed;
}

std::string_view name(Strategy strategy) noexcept {
  switch (strategy) {
    case Strategy::RandomWalk:
      return "random";
    case Strategy::Pct:
      return "pct";
    case Strategy::Portfolio:
      return "portfolio";
  }
  return "unknown";
}

std::string_view name(ReductionOrder order) noexcept {
  switch (order) {
    case ReductionOrder::Fixed:
      return "fixed";
    case ReductionOrder::Ring:
      return "ring";
    case ReductionOrder::Tree:
      return "tree";
    case ReductionOrder::Adversarial:
      return "adversarial";
  }
  return "unknown";
}

std::string_view name(AllocatorPolicy policy) noexcept {
  switch (policy) {
    case AllocatorPolicy::Pooled:
      return "pooled";
    case AllocatorPolicy::LifoReuse:
      return "lifo";
    case AllocatorPolicy::Quarantine:
      return "quarantine";
    case AllocatorPolicy::Random:
      return "random";
  }
  return "unknown";
}

std::string_view name(Fault::Kind kind) noexcept {
  switch (kind) {
    case Fault::Kind::Crash:
      return "crash";
    case Fault::Kind::TransportError:
      return "transport_error";
    case Fault::Kind::Hang:
      return "hang";
    case Fault::Kind::Delay:
      return "delay";
  }
  return "unknown";
}

std::string Fault::to_string() const {
  std::string text = std::string(name(kind)) + " at rank " + std::to_string(rank) +
                     "'s operation " + std::to_string(at_op);
  if (kind == Kind::Delay) {
    text += " by " + std::to_string(delay_steps) + " steps";
  }
  return text;
}

std::string_view event_kind_name(SimEvent::Kind kind) noexcept {
  switch (kind) {
    case SimEvent::Kind::Issue:
      return "issue";
    case SimEvent::Kind::Arrive:
      return "arrive";
    case SimEvent::Kind::Complete:
      return "complete";
    case SimEvent::Kind::WaitBegin:
      return "wait_begin";
    case SimEvent::Kind::WaitEnd:
      return "wait_end";
    case SimEvent::Kind::Drop:
      return "drop";
    case SimEvent::Kind::Finalize:
      return "finalize";
    case SimEvent::Kind::Fail:
      return "fail";
    case SimEvent::Kind::End:
      return "end";
  }
  return "unknown";
}

std::string SimEvent::to_string() const {
  std::ostringstream out;
  out << "step " << step << " t=" << format_microseconds(time) << "us rank " << rank << " "
      << event_kind_name(kind);
  if (kind == SimEvent::Kind::End) {
    out << ": " << detail;
    return out.str();
  }
  out << " ";
  if (owner != rank) {
    out << "rank " << owner << "'s ";
  }
  out << op << " #" << seq << " on " << group << " (" << site.to_string() << ")";
  if (!detail.empty()) {
    out << ": " << detail;
  }
  return out.str();
}

std::string Decision::to_string() const {
  if (kind == Kind::RunRank) {
    return "run rank " + std::to_string(rank);
  }
  return "complete comm " + std::to_string(comm_id) + " #" + std::to_string(seq);
}

bool SimReport::ok() const noexcept { return first_error == nullptr; }

std::string SimReport::choice_source_text() const {
  switch (choice_source) {
    case ChoiceSource::List:
      return "following a decision list";
    case ChoiceSource::FuzzBytes:
      // PCT's priorities and change points still come from the seed (Note [Decision stream]).
      return strategy == Strategy::Pct
                 ? "choices from fuzzer bytes, PCT priorities from seed " + std::to_string(seed)
                 : "choices from fuzzer bytes";
    case ChoiceSource::Seed:
      break;
  }
  return "seed " + std::to_string(seed);
}

std::uint64_t SimReport::mark_count(std::string_view name) const {
  const auto it = marks.find(name);
  return it == marks.end() ? 0 : it->second;
}

std::string SimReport::to_string() const {
  std::ostringstream out;
  out << "chorus sim: " << world_size << " ranks, " << choice_source_text() << ", " << steps
      << " scheduling decisions, " << collectives_completed
      << " collectives completed, virtual time " << format_microseconds(virtual_time)
      << " us, schedule hash " << hex64(schedule_hash) << "\n";
  if (!ops_issued.empty()) {
    out << "  operations issued per rank:";
    for (std::size_t r = 0; r < ops_issued.size(); ++r) {
      out << (r == 0 ? " " : ", ") << r << ": " << ops_issued[r];
    }
    out << "\n";
  }
  if (!events.empty() || events_not_recorded > 0) {
    out << "  " << events.size() << " events recorded";
    if (events_not_recorded > 0) {
      out << " (" << events_not_recorded << " more not recorded)";
    }
    out << "\n";
  }
  for (std::size_t r = 0; r < rank_errors.size(); ++r) {
    if (!rank_errors[r].empty()) {
      out << "  rank " << r << " failed: " << rank_errors[r] << "\n";
    }
  }
  for (const Fault& fault : faults_fired) {
    out << "  injected fault: " << fault.to_string() << "\n";
  }
  if (!stuck_ranks.empty()) {
    out << "  liveness violated by rank(s)";
    for (int r : stuck_ranks) {
      out << " " << r;
    }
    out << "\n";
  }
  if (!unwaited.empty()) {
    // A program that drops results on purpose (the property battery) drops thousands: the
    // first few name the call sites, the count says the rest.
    constexpr std::size_t kListedMax = 16;
    out << "  " << unwaited.size() << " collective(s) never waited:\n";
    for (std::size_t i = 0; i < unwaited.size() && i < kListedMax; ++i) {
      out << "    " << unwaited[i].to_string() << "\n";
    }
    if (unwaited.size() > kListedMax) {
      out << "    ... and " << unwaited.size() - kListedMax << " more\n";
    }
  }
  if (!ok()) {
    out << "  replay: " << replay_command << "\n";
  }
  return out.str();
}

SimReport simulate(const SimOptions& options, std::function<void()> rank_main) {
  const SimOptions effective = effective_options(options);
  if (effective.world_size < 1 || effective.world_size > kMaxWorldSize) {
    throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                          "world_size " + std::to_string(effective.world_size) +
                              " is out of range [1, " + std::to_string(kMaxWorldSize) + "]");
  }
#if defined(CHORUS_ASAN) || defined(CHORUS_TSAN)
  if (effective.guard_pending_outputs) {
    // Note [Guard pages] (guard_pages.hpp): the sanitizer runtime owns SIGSEGV.
    throw InvalidArgument(ErrorContext{-1, "sim::run", -1, ""},
                          "SimOptions::guard_pending_outputs needs the SIGSEGV handler, which "
                          "this build's sanitizer runtime (ASan/TSan) owns; use a build without "
                          "sanitizers for guard mode (poisoned outputs still work here)");
  }
#endif
  check_enumerated_options(effective);
  check_timeout(effective);
  check_fault_plan(effective);
  if (RankContext::current() != nullptr) {
    throw InvalidArgument(ErrorContext{RankContext::current()->rank(), "sim::run", -1, ""},
                          "sim::run cannot be called from inside a rank");
  }
  check_writable(effective.timeline_path, kTimelineFile);
  check_writable(effective.trace_path, kTraceFile);
  // Recycled (Note [Recycled blocks]): a world is larger than glibc's per-thread cache holds, so
  // a fresh one costs a run ~2k instructions of malloc.
  auto world = std::allocate_shared<detail::SimWorld>(
      transport::RecyclingAllocator<detail::SimWorld>{}, effective);
  if (effective.guard_pending_outputs || effective.report_on_interrupt) {
    world->set_replay_line(replay_line_before_run(effective));
  }
  std::optional<InterruptReport> interrupt_report;
  if (effective.report_on_interrupt) {
    interrupt_report.emplace(*world);
  }
  SimReport report = world->run(std::move(rank_main));
  interrupt_report.reset();
  // A seeded run replays from its seed (PCT's priorities come from it too); a run driven by a
  // list or by fuzzer bytes replays from its token, and without one (more choices than
  // SimOptions::choices_record_max) from nothing: its seed would be another run.
  if (report.choice_source == SimReport::ChoiceSource::Seed) {
    report.replay_command = replay_instruction(effective, report.seed, "");
  } else if (!report.replay_token.empty()) {
    report.replay_command = replay_instruction(effective, 0, report.replay_token);
  } else {
    report.replay_command =
        "(none: the run made more choices than SimOptions::choices_record_max, so they were not "
        "kept; raise it to get a replay token)";
  }
  if (!report.ok() && effective.print_failures) {
    std::fprintf(stderr, "%s", report.to_string().c_str());
    std::fflush(stderr);
  }
  if (!effective.timeline_path.empty()) {
    write_output(effective.timeline_path, kTimelineFile, to_svg_timeline(report),
                 "timeline.svg_written", report);
  }
  if (!effective.trace_path.empty()) {
    write_output(effective.trace_path, kTraceFile, to_perfetto_json(report),
                 "timeline.trace_written", report);
  }
  return report;
}

DeterminismCheck check_determinism(const SimOptions& options, std::function<void()> rank_main) {
  SimOptions twice = options;
  twice.hash_data = true;
  twice.print_failures = false;
  DeterminismCheck check;
  check.first = simulate(twice, rank_main);
  check.second = simulate(twice, rank_main);
  const auto differs = [&](const char* what, std::uint64_t a, std::uint64_t b) {
    if (check.deterministic && a != b) {
      check.deterministic = false;
      std::ostringstream out;
      out << what << " differs between two runs with the same options (" << hex64(a) << " vs "
          << hex64(b) << ")";
      check.difference = out.str();
    }
  };
  differs("the decision hash", check.first.schedule_hash, check.second.schedule_hash);
  if (!check.deterministic) {
    // Where the schedules part, when both recorded that far (SimOptions::schedule_record_max):
    // the state that leaked from the first run into the second changed what a rank did there.
    const std::vector<Decision>& a = check.first.schedule;
    const std::vector<Decision>& b = check.second.schedule;
    const auto [at_a, at_b] = std::ranges::mismatch(a, b);
    const std::size_t recorded = twice.schedule_record_max;
    if ((at_a != a.end() || a.size() < recorded) && (at_b != b.end() || b.size() < recorded)) {
      const auto decision = [](const std::vector<Decision>& list, auto at) {
        return at != list.end() ? at->to_string() : std::string("none (the run ended)");
      };
      check.difference += "; the schedules part at decision " + std::to_string(at_a - a.begin()) +
                          ": " + decision(a, at_a) + " vs " + decision(b, at_b);
    }
  }
  differs("the number of decisions", check.first.steps, check.second.steps);
  // Choices beyond the schedule (reduction orders, allocator reuse, faults) are not in the
  // decision hash.
  const std::vector<std::uint64_t>& a = check.first.choices;
  const std::vector<std::uint64_t>& b = check.second.choices;
  if (check.deterministic && a != b) {
    const auto [at_a, at_b] = std::ranges::mismatch(a, b);
    const auto index = static_cast<std::size_t>(at_a - a.begin());
    const auto value = [](const std::vector<std::uint64_t>& list, std::size_t i) {
      return i < list.size() ? std::to_string(list[i]) : std::string("none (the list ended)");
    };
    check.deterministic = false;
    check.difference = "choice " + std::to_string(index) +
                       " differs between two runs with the same options (" + value(a, index) +
                       " vs " + value(b, index) + ")";
  }
  differs("the data hash (bytes of collective outputs)", check.first.data_hash,
          check.second.data_hash);
  if (check.deterministic && check.first.rank_errors != check.second.rank_errors) {
    check.deterministic = false;
    check.difference = "the ranks' errors differ between two runs with the same options";
  }
  return check;
}

namespace {

// "What kind of failure": the failing ranks and the first error's type.
std::string failure_signature(const SimReport& report) {
  std::string signature;
  for (std::size_t r = 0; r < report.rank_errors.size(); ++r) {
    if (!report.rank_errors[r].empty()) {
      signature += std::to_string(r) + ",";
    }
  }
  signature += "|";
  if (report.first_error) {
    try {
      std::rethrow_exception(report.first_error);
    } catch (const Error& error) {
      signature += std::string(error_code_name(error.code()));
    } catch (const std::exception& error) {
      signature += typeid(error).name();
    } catch (...) {
      signature += "unknown";
    }
  }
  return signature;
}

}  // namespace

ShrinkResult shrink(const SimOptions& options, const std::function<void()>& rank_main,
                    const SimReport& failing, std::size_t max_attempts) {
  if (failing.ok()) {
    throw InvalidArgument(ErrorContext{-1, "sim::shrink", -1, ""},
                          "the report is of a run that did not fail: nothing to shrink");
  }
  if (failing.replay_token.empty()) {
    throw InvalidArgument(ErrorContext{-1, "sim::shrink", -1, ""},
                          "the failing run made more choices than "
                          "SimOptions::choices_record_max, so its choices were not kept");
  }
  const std::string wanted = failure_signature(failing);
  SimOptions outputs = options;
  resolve_output_paths(outputs);  // the environment's paths too, before attempts stop reading it
  SimOptions attempt = options;
  attempt.print_failures = false;
  attempt.seed_from_environment = false;
  attempt.replay.clear();
  attempt.fuzz_bytes.reset();
  // Only the minimal run writes the timeline and trace files (below).
  attempt.timeline_path.clear();
  attempt.trace_path.clear();
  ShrinkResult result;
  result.minimal = failing;
  const detail::ShrinkOutcome outcome = detail::shrink_choices(
      failing.choices,
      [&](const std::vector<std::uint64_t>& choices) {
        attempt.choices = choices;
        SimReport report = simulate(attempt, rank_main);
        if (failure_signature(report) != wanted) {
          return false;
        }
        result.minimal = std::move(report);
        return true;
      },
      max_attempts);
  result.choices = outcome.choices;
  result.attempts = outcome.attempts;
  // The report of exactly the minimal list (the last successful attempt may have been another).
  attempt.choices = result.choices;
  attempt.timeline_path = outputs.timeline_path;
  attempt.trace_path = outputs.trace_path;
  attempt.record_events = true;  // for the per-rank story in the timeline (draws no choice)
  result.minimal = simulate(attempt, rank_main);
  result.replay_token =
      detail::encode_replay_token(failing.world_size, detail::run_shape(options), result.choices);
  result.minimal.replay_command = replay_instruction(options, 0, result.replay_token);
  result.timeline = timeline_text(result.minimal);
  return result;
}

std::string command_line() {
  static const std::string line = read_command_line();
  return line;
}

std::string command_line(std::span<const std::string> words) {
  std::string line;
  for (const std::string& word : words) {
    line += ' ';
    line += quote(word);
  }
  return line;
}

std::string timeline_text(const SimReport& report) {
  constexpr int kWidth = 9;
  const auto cell = [](std::string text) {
    text.resize(std::max<std::size_t>(text.size(), kWidth), ' ');
    return text;
  };
  std::ostringstream out;
  out << "step  ";
  for (int r = 0; r < report.world_size; ++r) {
    out << cell("rank " + std::to_string(r)) << " ";
  }
  out << "completes\n";
  for (std::size_t step = 0; step < report.schedule.size(); ++step) {
    const Decision& decision = report.schedule[step];
    std::string line = std::to_string(step);
    line.resize(std::max<std::size_t>(line.size() + 1, 6), ' ');  // wider steps are not cut
    for (int r = 0; r < report.world_size; ++r) {
      const bool runs = decision.kind == Decision::Kind::RunRank && decision.rank == r;
      line += cell(runs ? "run" : "") + " ";
    }
    if (decision.kind == Decision::Kind::CompleteOp) {
      line += "comm " + std::to_string(decision.comm_id) + " #" + std::to_string(decision.seq);
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out << line << "\n";
  }
  if (report.schedule.size() < report.steps) {
    out << "... " << report.steps - report.schedule.size() << " more decisions not recorded\n";
  }
  // With an event log: what each rank did, rank by rank (the first line of each detail).
  for (int r = 0; r < report.world_size && !report.events.empty(); ++r) {
    out << "rank " << r << ":\n";
    for (const SimEvent& event : report.events) {
      if (event.rank == r) {
        const std::string text = event.to_string();
        out << "  " << text.substr(0, text.find('\n')) << "\n";
      }
    }
  }
  for (std::size_t r = 0; r < report.rank_errors.size(); ++r) {
    if (!report.rank_errors[r].empty()) {
      out << "rank " << r << " failed: " << report.rank_errors[r] << "\n";
    }
  }
  return out.str();
}

SimReport run(const SimOptions& options, std::function<void()> rank_main) {
  SimReport report = simulate(options, std::move(rank_main));
  if (report.first_error) {
    std::rethrow_exception(report.first_error);
  }
  return report;
}

}  // namespace chorus::sim
