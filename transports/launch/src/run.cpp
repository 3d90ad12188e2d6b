#include "chorus/run.hpp"

#include <algorithm>
#include <array>
#include <bitset>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/launch_environment.hpp"
#include "chorus/sim/sim.hpp"

#if defined(CHORUS_HAVE_MPI)
#include "chorus/mpi/mpi.hpp"
#endif
#if defined(CHORUS_HAVE_NCCL)
#include "chorus/nccl/nccl.hpp"
#include "nccl_launch_environment.hpp"
#endif

namespace chorus {
namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& value,
                           const std::string& expected) {
  throw InvalidArgument(ErrorContext{-1, "RunOptions::from_args", -1, ""},
                        "flag " + flag + "='" + value + "' is invalid: expected " + expected);
}

// Plain decimal, as every other integer flag of chorus (the examples', `chorus check`'s and
// `chorus launch`'s): digits only, no sign, no leading zero (CLI11 would read "010" as octal
// there), no 0x.
bool plain_decimal(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos &&
         (text.size() == 1 || text.front() != '0');
}

// `text`, which plain_decimal accepted, as a number; nullopt from 2^64 up.
std::optional<std::uint64_t> decimal_value(const std::string& text) {
  errno = 0;
  const unsigned long long parsed = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) {
    return std::nullopt;
  }
  return parsed;
}

// The value of an integer flag: plain decimal below 2^64, else a bad_flag error.
std::uint64_t parse_unsigned(const std::string& flag, const std::string& value) {
  if (!plain_decimal(value)) {
    bad_flag(flag, value, "an unsigned integer in plain decimal (no +, leading zero or 0x)");
  }
  const std::optional<std::uint64_t> parsed = decimal_value(value);
  if (!parsed) {
    bad_flag(flag, value, "an unsigned integer below 2^64");
  }
  return *parsed;
}

// The enum value among `values` whose sim::name is `value`, or a bad_flag error listing them.
template <typename Enum, std::size_t N>
Enum parse_name(const std::string& flag, const std::string& value,
                const std::array<Enum, N>& values) {
  if (const std::optional<Enum> named = sim::named(value, values)) {
    return *named;
  }
  bad_flag(flag, value, "one of " + sim::spelled(values));
}

// The pieces of `value` between separators (split("crash:1:3", ':') -> crash, 1, 3).
std::vector<std::string> split(const std::string& value, char separator) {
  std::vector<std::string> pieces;
  std::string::size_type begin = 0;
  for (;;) {
    const std::string::size_type end = value.find(separator, begin);
    pieces.push_back(value.substr(begin, end - begin));
    if (end == std::string::npos) {
      return pieces;
    }
    begin = end + 1;
  }
}

// --fault=crash:1:3, --fault=delay:0:2:40 (docs/simulator-faults.md). Whether the rank is in the
// world is sim::run's check: --ranks may come later.
sim::Fault parse_fault(const std::string& flag, const std::string& value) {
  const std::string expected =
      "KIND:RANK:OP (KIND one of crash, transport_error, hang; OP the rank's operation number "
      "from 0) or delay:RANK:OP:STEPS";
  const std::vector<std::string> pieces = split(value, ':');
  const std::optional<sim::Fault::Kind> kind =
      pieces.empty() ? std::nullopt : sim::named(pieces[0], sim::kFaultKinds);
  if (!kind || pieces.size() != (*kind == sim::Fault::Kind::Delay ? 4U : 3U)) {
    bad_flag(flag, value, expected);
  }
  const auto number = [&](const std::string& piece) {
    const std::optional<std::uint64_t> parsed =
        plain_decimal(piece) ? decimal_value(piece) : std::nullopt;
    if (!parsed) {
      bad_flag(flag, value, expected + ", each number in plain decimal below 2^64");
    }
    return *parsed;
  };
  const std::uint64_t rank = number(pieces[1]);
  if (rank >= static_cast<std::uint64_t>(sim::kMaxWorldSize)) {
    bad_flag(flag, value, "a rank below " + std::to_string(sim::kMaxWorldSize));
  }
  sim::Fault fault;
  fault.kind = *kind;
  fault.rank = static_cast<int>(rank);
  fault.at_op = number(pieces[2]);
  if (*kind == sim::Fault::Kind::Delay) {
    fault.delay_steps = number(pieces[3]);
    if (fault.delay_steps == 0) {
      bad_flag(flag, value, "a delay of at least 1 step");
    }
  }
  return fault;
}

// --random-faults=crash:1000,hang:500 into `random`: each kind's chance per started operation in
// parts per million, each kind once over all the --random-faults flags (`given`, by
// sim::kFaultKinds index), at most 1000000 in all.
void parse_random_faults(const std::string& flag, const std::string& value,
                         sim::RandomFaults& random, std::bitset<sim::kFaultKinds.size()>& given) {
  const std::string expected = "KIND:PPM[,KIND:PPM...] (KIND one of " +
                               sim::spelled(sim::kFaultKinds) +
                               "; PPM parts per million, 1000000 in all at most)";
  for (const std::string& entry : split(value, ',')) {
    const std::vector<std::string> pieces = split(entry, ':');
    const std::optional<sim::Fault::Kind> kind =
        pieces.size() == 2 ? sim::named(pieces[0], sim::kFaultKinds) : std::nullopt;
    const std::optional<std::uint64_t> ppm =
        kind && plain_decimal(pieces[1]) ? decimal_value(pieces[1]) : std::nullopt;
    if (!ppm) {
      bad_flag(flag, value, expected);
    }
    const auto index = static_cast<std::size_t>(
        std::find(sim::kFaultKinds.begin(), sim::kFaultKinds.end(), *kind) -
        sim::kFaultKinds.begin());
    if (given.test(index)) {
      bad_flag(flag, value, expected + ", each kind once (over every --random-faults)");
    }
    given.set(index);
    const std::uint64_t total = std::uint64_t{random.crash_ppm} + random.transport_error_ppm +
                                random.hang_ppm + random.delay_ppm +
                                std::min<std::uint64_t>(*ppm, 1'000'001);
    if (total > 1'000'000) {
      bad_flag(flag, value, expected);
    }
    (*kind == sim::Fault::Kind::Crash            ? random.crash_ppm
     : *kind == sim::Fault::Kind::TransportError ? random.transport_error_ppm
     : *kind == sim::Fault::Kind::Hang           ? random.hang_ppm
                                       : random.delay_ppm) = static_cast<std::uint32_t>(*ppm);
  }
}

// "(built: sim, mpi)": what this build offers instead.
std::string built_transports() {
  std::string built = "(built: sim";
#if defined(CHORUS_HAVE_MPI)
  built += ", mpi";
#endif
#if defined(CHORUS_HAVE_NCCL)
  built += ", nccl";
#endif
  return built + ")";
}

// --shrink with --check-determinism, refused in the same words by from_args (the flags) and by
// run (RunOptions set in code), as operation `op`.
void refuse_shrink_with_determinism_check(const RunOptions& options, const char* op) {
  if (options.shrink && options.check_determinism) {
    throw InvalidArgument(ErrorContext{-1, op, -1, ""},
                          "--shrink and --check-determinism (RunOptions::shrink and "
                          "check_determinism) together: the check runs the schedule twice as it "
                          "is; shrink a failing run without it");
  }
}

}  // namespace

RunOptions RunOptions::from_args(int argc, char** argv) {
  RunOptions options;
  // Flags that only the simulator reads: another transport refuses them below rather than
  // ignoring them (its world is its launcher's, its schedule the library's).
  std::vector<std::string> simulator_flags;
  const auto note_simulator_flag = [&simulator_flags](const std::string& flag) {
    if (std::find(simulator_flags.begin(), simulator_flags.end(), flag) == simulator_flags.end()) {
      simulator_flags.push_back(flag);
    }
  };
  // The words each replay command's line leaves out: those --seed or --replay took ("--seed=3",
  // or "--seed 3"), and --shrink.
  std::vector<bool> drop_from_seed_command(static_cast<std::size_t>(std::max(argc, 0)), false);
  std::vector<bool> drop_from_replay_command(drop_from_seed_command.size(), false);
  std::bitset<sim::kFaultKinds.size()> random_fault_kinds_given;
  for (int i = 1; i < argc; ++i) {
    const int first_word = i;
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (const auto equals = arg.find('='); arg.rfind("--", 0) == 0 && equals != std::string::npos) {
      value = arg.substr(equals + 1);
      arg = arg.substr(0, equals);
      has_value = true;
    }
    if (arg == "--guard-pages" || arg == "--check-determinism" || arg == "--check-collectives" ||
        arg == "--sim-cuda" || arg == "--shrink") {
      // As `chorus check` takes its switches: alone, or =true, =false, =1, =0.
      const bool on = !has_value || value == "true" || value == "1";
      if (has_value && !on && value != "false" && value != "0") {
        bad_flag(arg, value, "no value (a switch), or true, false, 1 or 0");
      }
      (arg == "--guard-pages"         ? options.guard_pages
       : arg == "--check-determinism" ? options.check_determinism
       : arg == "--sim-cuda"          ? options.sim_cuda
       : arg == "--shrink"            ? options.shrink
                                      : options.check_collectives) = on;
      if (arg != "--check-collectives" && on) {  // a switch turned off asks for nothing
        note_simulator_flag(arg);
      }
      if (arg == "--shrink") {
        // Not in the replay commands: a replay reruns the failing (or the shrunk) schedule once,
        // not the shrinking's up to 2,000 runs again.
        drop_from_seed_command[static_cast<std::size_t>(first_word)] = true;
        drop_from_replay_command[static_cast<std::size_t>(first_word)] = true;
      }
      continue;
    }
    const bool known = arg == "--transport" || arg == "--ranks" || arg == "--seed" ||
                       arg == "--timeout-ms" || arg == "--timeline" || arg == "--trace" ||
                       arg == "--strategy" || arg == "--pct-depth" || arg == "--pct-steps" ||
                       arg == "--reduction-order" || arg == "--allocator" || arg == "--replay" ||
                       arg == "--fault" || arg == "--random-faults" || arg == "--max-faults" ||
                       arg == "--liveness-steps";
    if (!known) {
      options.args.push_back(argv[i]);
      continue;
    }
    if (arg != "--transport" && arg != "--seed" && arg != "--timeout-ms") {
      note_simulator_flag(arg);
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        bad_flag(arg, "", "a value");
      }
      value = argv[++i];
    }
    if (arg == "--seed" || arg == "--replay") {
      std::vector<bool>& words =
          arg == "--seed" ? drop_from_seed_command : drop_from_replay_command;
      for (int word = first_word; word <= i; ++word) {
        words[static_cast<std::size_t>(word)] = true;
      }
    }
    if (arg == "--transport") {
      if (value != "sim" && value != "mpi" && value != "nccl") {
        bad_flag(arg, value, "one of sim, mpi, nccl");
      }
      options.transport = value;
    } else if (arg == "--ranks") {
      const std::uint64_t ranks = parse_unsigned(arg, value);
      if (ranks < 1 || ranks > static_cast<std::uint64_t>(sim::kMaxWorldSize)) {
        bad_flag(arg, value, "1 to " + std::to_string(sim::kMaxWorldSize));
      }
      options.ranks = static_cast<int>(ranks);
    } else if (arg == "--seed") {
      options.seed = parse_unsigned(arg, value);
    } else if (arg == "--timeline" || arg == "--trace") {
      if (value.empty()) {
        bad_flag(arg, value, "a file path");
      }
      (arg == "--timeline" ? options.timeline_path : options.trace_path) = value;
    } else if (arg == "--strategy") {
      options.strategy = parse_name(arg, value, sim::kStrategies);
    } else if (arg == "--pct-depth") {
      const std::uint64_t depth = parse_unsigned(arg, value);
      if (depth < 1 || depth > 3) {
        bad_flag(arg, value, "1, 2 or 3");
      }
      options.pct_depth = static_cast<int>(depth);
    } else if (arg == "--pct-steps") {
      const std::uint64_t steps = parse_unsigned(arg, value);
      if (steps == 0) {
        bad_flag(arg, value, "at least 1 (scheduling decisions)");
      }
      options.pct_steps = steps;
    } else if (arg == "--reduction-order") {
      options.reduction_order = parse_name(arg, value, sim::kReductionOrders);
    } else if (arg == "--allocator") {
      options.allocator = parse_name(arg, value, sim::kAllocatorPolicies);
    } else if (arg == "--fault") {
      options.faults.push_back(parse_fault(arg, value));
    } else if (arg == "--random-faults") {
      parse_random_faults(arg, value, options.random_faults, random_fault_kinds_given);
    } else if (arg == "--max-faults" || arg == "--liveness-steps") {
      const std::uint64_t count = parse_unsigned(arg, value);
      if (count == 0) {
        bad_flag(arg, value,
                 arg == "--max-faults" ? "at least 1 (faults a run may draw)"
                                       : "at least 1 (scheduling decisions)");
      }
      (arg == "--max-faults" ? options.random_faults.max_faults : options.liveness_steps) = count;
    } else if (arg == "--replay") {
      if (value.empty()) {
        bad_flag(arg, value, "a replay token (chorus-replay:...)");
      }
      if (value.starts_with("chorus-check:")) {
        bad_flag(arg, value,
                 "a simulator replay token (chorus-replay:...); this one is a property case's "
                 "(chorus-check:...), which `chorus replay <token>` or a property program's "
                 "--replay-case reruns");
      }
      options.replay = value;
    } else {
      constexpr std::uint64_t kTimeoutMsMax = std::uint64_t{1000} * 60 * 60 * 24 * 365;
      const std::uint64_t milliseconds = parse_unsigned(arg, value);
      if (milliseconds == 0 || milliseconds > kTimeoutMsMax) {
        bad_flag(arg, value, "1 to " + std::to_string(kTimeoutMsMax) + " (one year)");
      }
      options.timeout = std::chrono::milliseconds(milliseconds);
    }
  }
  refuse_shrink_with_determinism_check(options, "RunOptions::from_args");
  if (options.transport != "sim" && !simulator_flags.empty()) {
    std::string flags;
    for (const std::string& flag : simulator_flags) {
      flags += (flags.empty() ? "" : ", ") + flag;
    }
    throw InvalidArgument(ErrorContext{-1, "RunOptions::from_args", -1, ""},
                          flags +
                              (simulator_flags.size() == 1 ? " is a simulator flag, which"
                                                           : " are simulator flags, which") +
                              " --transport=" + options.transport +
                              " would ignore (its launcher sets the world: mpirun -np N, chorus "
                              "launch -n N)");
  }
  for (int i = 0; i < argc; ++i) {
    if (!drop_from_seed_command[static_cast<std::size_t>(i)]) {
      options.command_without_seed.emplace_back(argv[i]);
    }
    if (!drop_from_replay_command[static_cast<std::size_t>(i)]) {
      options.command_without_replay.emplace_back(argv[i]);
    }
  }
  return options;
}

namespace {

// --shrink: the failing run's schedule reduced to a minimal one that fails the same way
// (sim::shrink), printed with its replay command and per-rank text timeline; the timeline and
// trace files, if asked for, are the minimal run's.
void shrink_and_report(const sim::SimOptions& options, const std::function<void()>& rank_main,
                       const sim::SimReport& failing) {
  if (failing.replay_token.empty()) {
    std::fprintf(stderr,
                 "chorus: --shrink: the run made more choices than the simulator keeps "
                 "(sim::SimOptions::choices_record_max): nothing to shrink\n");
    return;
  }
  std::fprintf(stderr, "chorus: shrinking the failing schedule (%llu decisions)...\n",
               static_cast<unsigned long long>(failing.steps));
  std::fflush(stderr);
  const sim::ShrinkResult shrunk = sim::shrink(options, rank_main, failing);
  if (shrunk.minimal.ok()) {
    // Every attempt failed the same way, but not the last run: the program's runs differ.
    std::fprintf(stderr,
                 "chorus: --shrink: the shrunk schedule passed when run again: the program keeps "
                 "state across runs (each attempt reruns it in this process), so no schedule "
                 "reproduces its failure\n");
    return;
  }
  // Minimal in its choices (fewest, then smallest: every later one the first candidate), not
  // in its decisions, which may be more than the failing run's.
  std::fprintf(stderr,
               "chorus: shrunk to %zu choices (%zu runs tried), a schedule of %llu decisions that "
               "fails the same way:\n  replay: %s\n%s",
               shrunk.choices.size(), shrunk.attempts,
               static_cast<unsigned long long>(shrunk.minimal.steps),
               shrunk.minimal.replay_command.c_str(), shrunk.timeline.c_str());
  std::fflush(stderr);
}

}  // namespace

int run(const RunOptions& options, std::function<void()> rank_main) {
  refuse_shrink_with_determinism_check(options, "chorus::run");  // set in code
  // One process per rank: who this process is comes from its launcher's variables, read (and
  // checked: a malformed value is an InvalidArgument naming it) before any transport starts. MPI
  // finds its rank itself: for it only RANK/WORLD_SIZE are read, to refuse a process that chorus
  // launch or torchrun started, so that a variable MPI never uses (MASTER_PORT, LOCAL_RANK)
  // cannot stop it. NCCL takes everything, the store's address included.
  LaunchEnvironment launched;
  if (options.transport == "mpi") {
    if (const std::optional<TorchrunRank> torchrun = torchrun_rank();
        torchrun && torchrun->world_size > 1) {
      // MPI would start each process as a world of its own: W silent one-rank jobs.
      throw InvalidArgument(
          ErrorContext{torchrun->rank, "chorus::run", -1, ""},
          "transport 'mpi' needs processes started by mpirun (or srun), but this one was started "
          "by chorus launch or torchrun as rank " +
              std::to_string(torchrun->rank) + " of " + std::to_string(torchrun->world_size) +
              " (RANK/WORLD_SIZE): run `mpirun -np " + std::to_string(torchrun->world_size) +
              " ...` instead");
    }
  } else if (options.transport != "sim") {
    launched = launch_environment();
  }
#if defined(CHORUS_HAVE_MPI)
  if (options.transport == "mpi") {
    mpi::MpiRunOptions mpi_options;
    mpi_options.timeout = options.timeout;
    mpi_options.check_collectives = options.check_collectives;
    mpi_options.host_pool_bytes_max = options.host_pool_bytes_max;
    return mpi::run(mpi_options, std::move(rank_main));
  }
#endif
#if defined(CHORUS_HAVE_NCCL)
  if (options.transport == "nccl") {
    // Rank, world size, local rank and the store's address from whichever launcher started
    // this process (torchrun's RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_* in an srun step) and
    // MASTER_ADDR/MASTER_PORT, whose absence is an InvalidArgument naming them. No launcher:
    // nccl::run reads RANK/WORLD_SIZE itself and names the first one missing. Then
    // TransportError "no CUDA device: ..." on a machine without a GPU.
    nccl::NcclRunOptions nccl_options;
    if (launched.found()) {
      nccl_options.environment = detail::nccl_environment(launched);
    }
    nccl_options.timeout = options.timeout;
    nccl_options.check_collectives = options.check_collectives;
    nccl_options.host_pool_bytes_max = options.host_pool_bytes_max;
    return nccl::run(nccl_options, std::move(rank_main));
  }
#endif
  if (options.transport != "sim") {
    throw InvalidArgument(ErrorContext{-1, "chorus::run", -1, ""},
                          "transport '" + options.transport + "' is not built into this chorus " +
                              built_transports());
  }
#if defined(CHORUS_HAVE_MPI)
  if (mpi::launched_by_mpi()) {
    // mpirun -np 4 prog without --transport=mpi: four independent simulations, surely not meant.
    std::fprintf(stderr,
                 "chorus: this process was started by an MPI launcher but runs the simulator "
                 "(--transport=sim): every process simulates its own %d ranks; pass "
                 "--transport=mpi to make each process one rank\n",
                 options.ranks);
  }
#endif
  // The same for `chorus launch -n 4 prog` (or torchrun) without a transport. A malformed
  // variable does not matter to the simulator: no hint then.
  try {
    const LaunchEnvironment environment = launch_environment();
    if (environment.source == LaunchSource::Torchrun && environment.world_size > 1) {
      std::fprintf(stderr,
                   "chorus: this process was started by chorus launch or torchrun as rank %d of "
                   "%d but runs the simulator (--transport=sim): every process simulates its own "
                   "%d ranks; pass the transport that makes each process one rank\n",
                   environment.rank, environment.world_size, options.ranks);
    }
  } catch (const InvalidArgument&) {  // NOLINT(bugprone-empty-catch): a hint only
  }
  sim::SimOptions sim_options;
  sim_options.world_size = options.ranks;
  sim_options.seed = options.seed;
  sim_options.timeout = options.timeout;
  sim_options.timeline_path = options.timeline_path;
  sim_options.trace_path = options.trace_path;
  sim_options.strategy = options.strategy;
  sim_options.pct_depth = options.pct_depth;
  sim_options.pct_steps = options.pct_steps;
  sim_options.reduction_order = options.reduction_order;
  sim_options.allocator = options.allocator;
  sim_options.host_pool_bytes_max = options.host_pool_bytes_max;
  sim_options.guard_pending_outputs = options.guard_pages;
  sim_options.cuda_devices = options.sim_cuda;
  sim_options.faults = options.faults;
  sim_options.random_faults = options.random_faults;
  sim_options.liveness_steps = options.liveness_steps;
  sim_options.replay = options.replay;
  sim_options.command_without_seed = options.command_without_seed;
  sim_options.command_without_replay = options.command_without_replay;
  sim_options.report_on_interrupt = true;  // Note [Interrupt report]: Ctrl-C says where it was
  if (options.check_determinism) {
    const sim::DeterminismCheck check = sim::check_determinism(sim_options, std::move(rank_main));
    if (!check.first.ok()) {
      std::fprintf(stderr, "%s", check.first.to_string().c_str());  // both runs print quietly
    }
    if (!check.deterministic) {
      std::fprintf(stderr, "chorus: determinism check failed: %s\n", check.difference.c_str());
    } else {
      std::fprintf(stderr,
                   "chorus: determinism check passed: two runs took the same %llu decisions "
                   "(schedule hash %016llx) and wrote the same bytes (data hash %016llx)\n",
                   static_cast<unsigned long long>(check.first.steps),
                   static_cast<unsigned long long>(check.first.schedule_hash),
                   static_cast<unsigned long long>(check.first.data_hash));
    }
    return check.deterministic && check.first.ok() && check.second.ok() ? 0 : 1;
  }
  const sim::SimReport report = sim::simulate(sim_options, rank_main);
  if (report.ok() && !report.unwaited.empty()) {
    std::fprintf(stderr, "%s", report.to_string().c_str());  // failures printed already
  }
  if (!report.ok() && options.shrink) {
    shrink_and_report(sim_options, rank_main, report);
  }
  return report.ok() ? 0 : 1;
}

}  // namespace chorus
