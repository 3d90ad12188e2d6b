// The `chorus` command: check (run the property battery), replay (rerun a failing case from its
// token), list (the properties), bench (nccl-tests' table for chorus on any transport), launch
// (start N local ranks of a program). See docs/properties.md, docs/bench.md and docs/launch.md.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chorus/chorus.hpp>
#include <chorus/launcher.hpp>
#include <chorus/props/battery.hpp>
#include <chorus/props/bench.hpp>
#include <chorus/props/runner.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace chorus::cli {
namespace {

// A progress bar on a terminal (redrawn in place on stderr), one plain line per property
// otherwise.
class Progress final : public props::Listener {
 public:
  explicit Progress(bool terminal) : terminal_(terminal) {}

  void on_property_start(const props::Property& property, int index, int count) override {
    index_ = index;
    count_ = count;
    name_ = property.name;
    draw(0, 1);
  }
  void on_case(const props::Property& /*property*/, int case_index, int cases) override {
    // Redraw at most ~20 times a property: the cases are fast.
    if (terminal_ && (case_index * 20 / cases != (case_index + 1) * 20 / cases)) {
      draw(case_index + 1, cases);
    }
  }
  void on_shrink(const props::Property& /*property*/, int steps) override {
    if (terminal_) {
      std::fprintf(stderr, "\r\033[K[%d/%d] %s: failed, shrinking (%d steps)", index_ + 1, count_,
                   name_.c_str(), steps);
    }
  }
  void on_property_end(const props::PropertyResult& result) override {
    if (terminal_) {
      std::fprintf(stderr, "\r\033[K");
    }
    std::fprintf(stderr, "[%d/%d] %s: %s (%d cases, %.2f s)\n", index_ + 1, count_,
                 result.name.c_str(), std::string(props::name(result.verdict)).c_str(),
                 result.cases, std::chrono::duration<double>(result.time).count());
  }

 private:
  void draw(int done, int total) const {
    if (!terminal_) {
      return;
    }
    constexpr int kWidth = 30;
    const int filled = total == 0 ? 0 : done * kWidth / total;
    std::fprintf(stderr, "\r\033[K[%d/%d] [%s%s] %s %d/%d", index_ + 1, count_,
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), name_.c_str(),
                 done, total);
  }

  bool terminal_ = false;
  int index_ = 0;
  int count_ = 0;
  std::string name_;
};

struct CheckFlags {
  std::string transport = "sim";
  std::string runner = "simulator";
  int ranks = 8;
  std::uint64_t seed = 0;
  int cases = 100;
  std::string property = "*";
  std::string strategy = "generated";
  int pct_depth = 2;
  std::string reduction_order = "fixed";
  bool check_collectives = false;
  int shrink_runs = 2000;
  std::int64_t timeout_ms = 600'000;  // RunOptions::timeout of lockstep runs
  // The simulator's schedule flags given on the command line (--strategy ...): refused on a real
  // transport, whose schedule is its own.
  std::vector<std::string> schedule_flags_given;
  bool ranks_given = false;   // --ranks on the command line: a real transport's world must match
  bool runner_given = false;  // --runner on the command line: a real transport runs lockstep only
};

// How to start `ranks` ranks of `chorus check` on a real transport.
std::string launch_hint(const std::string& transport, int ranks) {
  const std::string n = std::to_string(ranks);
  return transport == "mpi" ? "mpirun -np " + n + " chorus check --transport mpi"
                            : "chorus launch -n " + n + " chorus check --transport " + transport;
}

// The value `text` names among `values`; `flag`'s IsMember check took nothing else.
template <class Enum, std::size_t N>
Enum parse_enum(const std::string& text, const std::array<Enum, N>& values, const char* flag) {
  if (const std::optional<Enum> value = sim::named(text, values)) {
    return *value;
  }
  throw InvalidArgument({}, std::string("chorus: unknown ") + flag + " '" + text + "'");
}

// The spellings of `values` for CLI11's IsMember, after `extra`.
template <class Enum, std::size_t N>
std::vector<std::string> spellings(const std::array<Enum, N>& values,
                                   std::vector<std::string> extra = {}) {
  for (const Enum value : values) {
    extra.emplace_back(sim::name(value));
  }
  return extra;
}

// The exit status of a check: 0 when every property that ran passed and at least one ran, 1
// when one failed or every selected property was skipped (a run that checked nothing must not
// read as a pass).
int exit_status(const props::CheckReport& report) {
  if (!report.passed()) {
    return 1;
  }
  const bool checked = std::any_of(
      report.results.begin(), report.results.end(),
      [](const props::PropertyResult& result) { return result.verdict == props::Verdict::Passed; });
  return checked ? 0 : 1;
}

// Prints the failures and the table; returns exit_status.
int print_report(const props::CheckReport& report) {
  for (const props::PropertyResult& result : report.results) {
    if (result.verdict == props::Verdict::Failed) {
      std::cout << "\n" << props::failure_report(result);
    }
  }
  std::cout << "\n" << props::summary_table(report);
  const int status = exit_status(report);
  if (status != 0 && report.passed()) {
    std::cout << "chorus check: nothing was checked: every selected property was skipped\n";
  }
  return status;
}

int run_check(const CheckFlags& flags) {
  props::CheckOptions options;
  options.ranks = flags.ranks;
  options.seed = flags.seed;
  options.cases = flags.cases;
  options.pct_depth = flags.pct_depth;
  options.shrink_runs_max = flags.shrink_runs;
  if (flags.strategy != "generated") {
    options.strategy = parse_enum(flags.strategy, sim::kStrategies, "--strategy");
  }
  options.reduction_order =
      parse_enum(flags.reduction_order, sim::kReductionOrders, "--reduction-order");
  // Refused here, before any rank starts, on every runner and transport alike: inside the ranks
  // the lockstep runner's refusal read as every rank failing (status 1).
  props::check_options(options);
  Progress progress(isatty(STDERR_FILENO) != 0);
  options.listener = &progress;
  // Every comma-separated pattern must match a property: a typo among them is refused, not
  // dropped (select names it).
  std::vector<props::Property> properties;
  try {
    properties = props::select(props::battery(), flags.property);
  } catch (const InvalidArgument& error) {
    std::cerr << "chorus check: " << error.detail() << " (chorus list shows them)\n";
    return 2;
  }
  if (flags.transport == "sim" && flags.runner == "simulator") {
    std::cout << "chorus check: " << properties.size() << " properties, " << options.cases
              << " cases each, " << options.ranks << " simulated ranks, seed " << options.seed
              << "\n";
    std::cout.flush();
    return print_report(props::check_on_simulator(properties, options));
  }
  // Lockstep: the same cases on every rank of a transport, verdicts agreed by all-reduce.
  if (flags.transport != "sim" && flags.runner_given && flags.runner == "simulator") {
    std::cerr << "chorus check: --runner simulator runs the battery on simulated ranks only: "
                 "--transport "
              << flags.transport
              << " runs the lockstep runner (leave --runner out, or give --runner lockstep)\n";
    return 2;
  }
  if (flags.transport != "sim" && !flags.schedule_flags_given.empty()) {
    std::cerr << "chorus check: " << flags.schedule_flags_given.front()
              << " chooses the simulator's schedule: only the simulator (--transport sim) takes "
                 "--strategy, --pct-depth and --reduction-order, not "
              << flags.transport << "\n";
    return 2;
  }
  RunOptions run_options = props::lockstep_run_options(properties, options, flags.transport);
  run_options.check_collectives = flags.check_collectives;
  run_options.timeout = std::chrono::milliseconds(flags.timeout_ms);
  // Every rank of a lockstep run holds the same agreed report, so every process (one rank each
  // under mpirun or chorus launch) exits with its verdict; the process of rank 0 prints it.
  std::atomic<int> verdict{0};
  const int status = run(run_options, [&] {
    // A real transport's world comes from its launcher, not --ranks. Every rank sees the same
    // world size, so every rank refuses alike (and none reaches a collective).
    if (flags.transport != "sim" && flags.ranks_given && world_size() != flags.ranks) {
      if (rank() == 0) {
        std::cerr << "chorus check: --ranks " << flags.ranks << " but the " << flags.transport
                  << " world has " << world_size() << (world_size() == 1 ? " rank" : " ranks")
                  << ": its launcher decides the world ("
                  << launch_hint(flags.transport, flags.ranks) << ")\n";
      }
      verdict = 2;
      return;
    }
    if (flags.transport != "sim" && world_size() == 1 && rank() == 0) {
      std::cerr << "chorus check: note: the " << flags.transport
                << " world has one rank, on which most properties pass trivially (no peer to "
                   "disagree with); for more ranks: "
                << launch_hint(flags.transport, 4) << "\n";
    }
    if (rank() == 0) {
      std::cout << "chorus check (lockstep on " << flags.transport << "): " << properties.size()
                << " properties, " << options.cases << " cases each, " << world_size()
                << " ranks, seed " << options.seed;
      if (run_options.transport == "sim") {
        std::cout << ", strategy " << sim::name(run_options.strategy) << ", pct depth "
                  << run_options.pct_depth << ", reduction order "
                  << sim::name(run_options.reduction_order);
      }
      std::cout << "\n";
      std::cout.flush();
    }
    const props::CheckReport report = props::check_in_lockstep(properties, options);
    verdict.store(rank() == 0 ? print_report(report) : exit_status(report));
  });
  return status == 0 ? verdict.load() : 1;
}

int run_replay(const std::string& token, const std::string& trace, const std::string& timeline) {
  sim::SimOptions extra;
  extra.trace_path = trace;
  extra.timeline_path = timeline;
  const props::Replay replayed = props::replay(props::battery(), token, extra);
  std::cout << props::replay_text(replayed, token);
  if (!trace.empty()) {
    std::cout << "trace: " << trace << "\n";
  }
  if (!timeline.empty()) {
    std::cout << "timeline: " << timeline << "\n";
  }
  return replayed.result.verdict == props::Verdict::Failed ? 1 : 0;
}

struct BenchFlags {
  props::BenchOptions options;
  std::string ops = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast";
  std::string min_bytes = "8";
  std::string max_bytes = "256M";
  std::string dtype = "float32";
};

// The comma-separated words of `text`, each trimmed of surrounding blanks ("all_reduce,
// broadcast"), empty ones dropped.
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> words;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::size_t first = text.find_first_not_of(" \t", start);
    if (first < comma) {
      const std::size_t last = text.find_last_not_of(" \t", comma - 1);
      words.push_back(text.substr(first, last - first + 1));
    }
    start = comma + 1;
  }
  return words;
}

DType parse_dtype(const std::string& text) {
  for (const DType dtype : kAllDTypes) {
    std::string name(dtype_name(dtype));
    for (char& c : name) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    if (name == text) {
      return dtype;
    }
  }
  throw InvalidArgument({}, "chorus bench: unknown dtype '" + text + "'");
}

int run_bench(BenchFlags& flags) {
  props::BenchOptions& options = flags.options;
  options.ops = split_commas(flags.ops);
  options.min_bytes = props::parse_bytes(flags.min_bytes);
  options.max_bytes = props::parse_bytes(flags.max_bytes);
  options.dtype = parse_dtype(flags.dtype);
  const props::BenchReport report = props::run_bench(options, std::cout);
  return report.ok ? 0 : 1;
}

int run_list() {
  for (const props::Property& property : props::battery()) {
    std::cout << property.name << (property.needs.simulator_only ? "  [simulator]" : "") << "\n    "
              << property.description << "\n";
  }
  return 0;
}

// `chorus launch [options] -- program args`: the index of the "--" that ends the launcher's
// options (argc when there is none). A "--" after the program is the program's. CLI11's prefix
// command handles everything else (it would take this "--" as an unexpected positional).
int launch_separator(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) != "launch") {
    return argc;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--") {
      return i;
    }
    if (word.empty() || word[0] != '-') {
      return argc;  // the program: everything from here on is its
    }
    if (word == "-n" || word == "--nproc" || word == "--grace-ms") {
      ++i;  // the option's value
    }
  }
  return argc;
}

// CLI11 2.1.2 converts integers with strtoll/strtoull in base 0: "010" reads as 8 and "0x10" as
// 16; it also wraps "-1" into an unsigned option and saturates on overflow. Every integer option
// is therefore plain decimal: an optional '-' (signed types only), then digits without a leading
// zero, within Int. Refused here, before CLI11 converts the text; range checks come after.
template <class Int>
CLI::Validator decimal(std::string description) {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::size_t first_digit = !text.empty() && text.front() == '-' ? 1 : 0;
        Int value{};
        const char* end = text.data() + text.size();
        const auto [last, error] = std::from_chars(text.data(), end, value);
        const bool leading_zero = text.size() > first_digit + 1 && text[first_digit] == '0';
        if (text.empty() || error != std::errc() || last != end || leading_zero) {
          return "'" + text + "' is not a" + (std::is_signed_v<Int> ? " " : "n unsigned ") +
                 std::to_string(sizeof(Int) * 8) + "-bit integer in plain decimal (" +
                 std::to_string(std::numeric_limits<Int>::min()) + " to " +
                 std::to_string(std::numeric_limits<Int>::max()) + "; no +, leading zero or 0x)";
        }
        return {};
      },
      std::move(description));
}

// The description shows in --help after the type: "--ranks INT:DECIMAL=8".
const CLI::Validator kInt = decimal<int>("DECIMAL");
const CLI::Validator kInt64 = decimal<std::int64_t>("DECIMAL");
const CLI::Validator kUnsigned64 = decimal<std::uint64_t>("DECIMAL");

// Switches that take a value: 1 or 0 (CLI11 would read 2, 7 or "yes" as true).
const CLI::Validator kOneOrZero = CLI::IsMember({"0", "1"});
// A flag given bare reaches its validators as "true"; given a value (--flag=2), that value must
// be 1 or 0 like the switches above, or true or false.
const CLI::Validator kFlagOneOrZero(
    [](std::string& text) -> std::string {
      return text == "true" || text == "false" || text == "1" || text == "0"
                 ? ""
                 : "'" + text +
                       "' is not a switch's value: give the flag alone, or =true, =false, =1 or =0";
    },
    "");

// Real-valued options: CLI11 reads them with strtold, which also takes hexadecimal ("0x10" is
// 16), "inf" and "nan". Plain decimal or scientific notation only, and finite.
const CLI::Validator kDecimalNumber(
    [](std::string& text) -> std::string {
      double value = 0;
      const char* end = text.data() + text.size();
      const auto [last, error] =
          std::from_chars(text.data(), end, value, std::chars_format::general);
      if (text.empty() || error != std::errc() || last != end || !std::isfinite(value)) {
        return "'" + text + "' is not a finite number in plain decimal (such as 2, 0.5 or 1e3)";
      }
      return {};
    },
    "DECIMAL");

}  // namespace
}  // namespace chorus::cli

int main(int argc, char** argv) {
  using namespace chorus::cli;  // NOLINT(google-build-using-namespace): main's own helpers
  CLI::App app{
      "chorus: functional collectives, checked. Runs the property battery on the "
      "simulator or a real transport."};
  app.require_subcommand(1);

  CheckFlags flags;
  CLI::App* check = app.add_subcommand("check", "run the property battery");
  check->add_option("--transport", flags.transport, "sim, mpi or nccl")
      ->check(CLI::IsMember({"sim", "mpi", "nccl"}))
      ->capture_default_str();
  check
      ->add_option("--runner", flags.runner,
                   "simulator (RapidCheck shrinks cases and schedules) or lockstep (the real-"
                   "transport runner, here on simulated ranks)")
      ->check(CLI::IsMember({"simulator", "lockstep"}))
      ->capture_default_str();
  check
      ->add_option("--ranks", flags.ranks,
                   "simulated ranks (mpi, nccl: the launcher's world, which --ranks must match)")
      ->check(kInt)
      ->capture_default_str();
  check->add_option("--seed", flags.seed, "decides every case and schedule")
      ->check(kUnsigned64)
      ->capture_default_str();
  check->add_option("--cases", flags.cases, "cases per property")
      ->check(kInt)
      ->capture_default_str();
  check->add_option("--property", flags.property, "glob(s) over property names, comma-separated")
      ->capture_default_str();
  check
      ->add_option("--strategy", flags.strategy,
                   "simulator schedules: generated (RapidCheck choice lists, shrinkable), random, "
                   "pct or portfolio")
      ->check(CLI::IsMember(spellings(chorus::sim::kStrategies, {"generated"})))
      ->capture_default_str();
  check->add_option("--pct-depth", flags.pct_depth, "PCT bug depth (1..3)")
      ->check(kInt)
      ->check(CLI::Range(1, 3))
      ->capture_default_str();
  check->add_option("--reduction-order", flags.reduction_order, "fixed, ring, tree or adversarial")
      ->check(CLI::IsMember(spellings(chorus::sim::kReductionOrders)))
      ->capture_default_str();
  check->add_option("--shrink-runs", flags.shrink_runs, "runs allowed while shrinking a failure")
      ->check(kInt)
      ->capture_default_str();
  check
      ->add_flag("--check-collectives", flags.check_collectives,
                 "mpi, nccl: members compare every operation before starting it (docs/mpi.md, "
                 "docs/nccl.md); the simulator always does")
      ->check(kFlagOneOrZero);
  check
      ->add_option("--timeout-ms", flags.timeout_ms,
                   "lockstep runs (mpi, nccl): how long a wait may take before it throws Timeout")
      ->check(kInt64)
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1000} * 60 * 60 * 24 * 365))
      ->capture_default_str();

  std::string token;
  std::string trace;
  std::string timeline;
  CLI::App* replay = app.add_subcommand("replay", "rerun a failing case from its replay token");
  replay->add_option("token", token, "the token `chorus check` printed")->required();
  replay->add_option("--trace", trace, "write a Chrome/Perfetto trace JSON of the run");
  replay->add_option("--timeline", timeline, "write an SVG timeline of the run");

  CLI::App* list = app.add_subcommand("list", "list the battery's properties");

  BenchFlags bench_flags;
  chorus::props::BenchOptions& bench_options = bench_flags.options;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "time collectives through chorus and print nccl-tests' table (size, count, type, redop, "
      "time, algbw, busbw, #wrong); on the simulator also its all_reduce memory throughput against "
      "a memory-bandwidth probe (docs/bench.md)");
  bench->add_option("--transport", bench_options.transport, "sim, mpi or nccl")
      ->check(CLI::IsMember({"sim", "mpi", "nccl"}))
      ->capture_default_str();
  bench->add_option("-n,--ranks", bench_options.ranks, "simulated ranks")
      ->check(kInt)
      ->capture_default_str();
  bench->add_option("--ops", bench_flags.ops, "comma-separated operations")->capture_default_str();
  bench->add_option("-b,--min-bytes", bench_flags.min_bytes, "smallest size (bytes, K, M, G)")
      ->capture_default_str();
  bench->add_option("-e,--max-bytes", bench_flags.max_bytes, "largest size")->capture_default_str();
  bench->add_option("-f,--step-factor", bench_options.step_factor, "size multiplier per row")
      ->check(kInt64)  // signed, so that -1 is refused by the range below, which names it
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 40))
      ->capture_default_str();
  bench
      ->add_option("-d,--dtype", bench_flags.dtype,
                   "uint8, int8, int32, int64, float16, bfloat16, float32 or float64")
      ->capture_default_str();
  bench->add_option("-o,--op", bench_options.reduce_op, "reduction: sum, prod, max or min")
      ->capture_default_str();
  bench->add_option("--iters", bench_options.iters, "operations per timed batch (0: adaptive)")
      ->check(kInt)
      ->capture_default_str();
  bench->add_option("--batch-ms", bench_options.batch_ms, "adaptive iters: time per batch")
      ->check(kDecimalNumber)
      ->capture_default_str();
  bench->add_option("-w,--warmup", bench_options.warmup, "untimed operations per size")
      ->check(kInt)
      ->capture_default_str();
  bench->add_option("--reps", bench_options.reps, "timed batches per size (the median is shown)")
      ->check(kInt)
      ->capture_default_str();
  bench->add_option("-c,--check", bench_options.check, "count #wrong after timing (1 or 0)")
      ->check(kOneOrZero)
      ->capture_default_str();
  bench
      ->add_flag("--sim-checks", bench_options.sim_checks,
                 "simulator: keep poisoning pending outputs and checksumming inputs")
      ->check(kFlagOneOrZero);
  bench
      ->add_option("--probe", bench_options.memory_probe,
                   "simulator: measure the memory-bandwidth probe (1 or 0)")
      ->check(kOneOrZero)
      ->capture_default_str();
  bench
      ->add_option("--kernels", bench_options.kernels,
                   "reduction kernels' instruction set: auto, baseline or avx2")
      ->check(CLI::IsMember({"auto", "baseline", "avx2"}))
      ->capture_default_str();
  bench
      ->add_option("--reduction-order", bench_options.reduction_order,
                   "simulator: fixed, ring, tree or adversarial")
      ->check(CLI::IsMember(spellings(chorus::sim::kReductionOrders)))
      ->capture_default_str();
  bench->add_option("--seed", bench_options.seed, "simulator schedule seed")
      ->check(kUnsigned64)
      ->capture_default_str();

  chorus::launcher::LaunchOptions launch_options;
  std::int64_t grace_ms = launch_options.grace.count();
  CLI::App* launch = app.add_subcommand(
      "launch",
      "start N local ranks of a program with torchrun's environment (RANK WORLD_SIZE LOCAL_RANK "
      "LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT), a rendezvous store and its CHORUS_STORE_TOKEN: "
      "chorus launch -n N [--] program args...");
  launch->add_option("-n,--nproc", launch_options.ranks, "ranks to start")->check(kInt)->required();
  launch->add_option("--grace-ms", grace_ms, "after SIGTERM, how long a rank has before SIGKILL")
      ->check(kInt64)
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  // Everything from the program on is the program's, flags included.
  launch->prefix_command();

  // CLI11 says only "A subcommand is required" for a mistyped one.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string commands;
    for (const CLI::App* command : app.get_subcommands({})) {
      known = known || command->check_name(argv[1]);
      commands += (commands.empty() ? "" : ", ") + command->get_name();
    }
    if (!known) {
      std::cerr << "chorus: unknown command '" << argv[1] << "' (commands: " << commands
                << "; chorus --help tells more)\n";
      return 2;
    }
  }
  const int separator = launch_separator(argc, argv);
  try {
    app.parse(separator, argv);
  } catch (const CLI::ParseError& error) {
    // app.exit prints the help (--help: status 0) or the error and a hint; a bad flag is 2 like
    // every other refusal (docs/properties.md), not CLI11's own code per kind of error.
    return app.exit(error) == 0 ? 0 : 2;
  }
  flags.ranks_given = check->count("--ranks") > 0;
  flags.runner_given = check->count("--runner") > 0;
  for (const char* flag : {"--strategy", "--pct-depth", "--reduction-order"}) {
    if (check->count(flag) > 0) {
      flags.schedule_flags_given.emplace_back(flag);
    }
  }
  try {
    if (check->parsed()) {
      return run_check(flags);
    }
    if (replay->parsed()) {
      return run_replay(token, trace, timeline);
    }
    if (list->parsed()) {
      return run_list();
    }
    if (bench->parsed()) {
      return run_bench(bench_flags);
    }
    if (launch->parsed()) {
      launch_options.command = launch->remaining();
      if (separator < argc) {
        if (!launch_options.command.empty()) {
          std::cerr << "chorus launch: unexpected '" << launch_options.command.front()
                    << "' before --\n";
          return 2;
        }
        launch_options.command.assign(argv + separator + 1, argv + argc);
      }
      if (launch_options.command.empty()) {
        std::cerr << "chorus launch: no program to run (chorus launch -n N [--] program args...)\n";
        return 2;
      }
      launch_options.grace = std::chrono::milliseconds(grace_ms);
      return chorus::launcher::launch(launch_options);
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
    return 2;
  }
  return 2;
}
