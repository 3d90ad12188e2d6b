// chorus::run and RunOptions::from_args.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/expect_error.hpp"
#include "support/planted_bugs.hpp"
#include "support/scoped_environment.hpp"

namespace chorus {
namespace {

RunOptions parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  static char program[] = "program";
  argv.push_back(program);
  for (std::string& word : words) {
    argv.push_back(word.data());
  }
  return RunOptions::from_args(static_cast<int>(argv.size()), argv.data());
}

TEST(RunOptions, ReadsItsFlagsInBothSpellingsAndKeepsTheRest) {
  const RunOptions options = parse({"--ranks=3", "--user-flag", "--seed", "16", "--transport=sim",
                                    "file.txt", "--timeout-ms=250"});
  EXPECT_EQ(options.ranks, 3);
  EXPECT_EQ(options.seed, 16u);
  EXPECT_EQ(options.transport, "sim");
  EXPECT_EQ(options.timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(options.args, (std::vector<std::string>{"--user-flag", "file.txt"}));
}

// The replay command a failed run prints sets CHORUS_SIM_SEED (or CHORUS_SIM_REPLAY), which
// overrides --seed (or --replay): its command line leaves that flag out, in either spelling.
TEST(RunOptions, KeepsTheCommandLineWithoutItsSeedAndWithoutItsReplayFlags) {
  const RunOptions options = parse({"--seed", "3", "--ranks=2", "--replay=chorus-replay:a",
                                    "--seed=4", "x", "--replay", "chorus-replay:b"});
  EXPECT_EQ(options.command_without_seed,
            (std::vector<std::string>{"program", "--ranks=2", "--replay=chorus-replay:a", "x",
                                      "--replay", "chorus-replay:b"}));
  EXPECT_EQ(options.command_without_replay,
            (std::vector<std::string>{"program", "--seed", "3", "--ranks=2", "--seed=4", "x"}));
}

// A property case's token passed as the simulator's: refused naming what reruns it.
TEST(RunOptions, APropertyCaseTokenIsNotTheSimulatorsReplayToken) {
  const testing::CaughtError caught = testing::expect_error<InvalidArgument>(
      [] { parse({"--replay=chorus-check:4:reduce.all_reduce:8:0:100:5:generated:2:fixed:-:-"}); },
      {"flag --replay='chorus-check:4:", "this one is a property case's (chorus-check:...)",
       "`chorus replay <token>` or a property program's --replay-case"});
  EXPECT_EQ(caught.context.op, "RunOptions::from_args");
}

TEST(RunOptions, ReadsTheTimelineAndTracePaths) {
  const RunOptions options = parse({"--timeline=out.svg", "--trace", "out.json"});
  EXPECT_EQ(options.timeline_path, "out.svg");
  EXPECT_EQ(options.trace_path, "out.json");
  EXPECT_TRUE(options.args.empty());
  EXPECT_THROW(parse({"--timeline="}), InvalidArgument);
}

TEST(RunOptions, ReadsTheSimulatorsExplorationFlags) {
  const RunOptions options =
      parse({"--strategy=pct", "--pct-depth", "3", "--pct-steps=70",
             "--reduction-order=adversarial", "--allocator=lifo", "--guard-pages",
             "--check-determinism", "--sim-cuda", "--replay=chorus-replay:x"});
  EXPECT_EQ(options.strategy, sim::Strategy::Pct);
  EXPECT_EQ(options.pct_depth, 3);
  EXPECT_EQ(options.pct_steps, 70U);
  EXPECT_EQ(options.reduction_order, sim::ReductionOrder::Adversarial);
  EXPECT_EQ(options.allocator, sim::AllocatorPolicy::LifoReuse);
  EXPECT_TRUE(options.guard_pages);
  EXPECT_TRUE(options.check_determinism);
  EXPECT_TRUE(options.sim_cuda);
  EXPECT_EQ(options.replay, "chorus-replay:x");
  EXPECT_TRUE(options.args.empty());

  EXPECT_EQ(parse({"--strategy=portfolio"}).strategy, sim::Strategy::Portfolio);
  EXPECT_EQ(parse({"--reduction-order=tree"}).reduction_order, sim::ReductionOrder::Tree);
  EXPECT_EQ(parse({"--allocator=quarantine"}).allocator, sim::AllocatorPolicy::Quarantine);
  const RunOptions defaults = parse({});
  EXPECT_EQ(defaults.strategy, sim::Strategy::RandomWalk);
  EXPECT_FALSE(defaults.guard_pages);
  EXPECT_FALSE(defaults.check_determinism);
  EXPECT_FALSE(defaults.sim_cuda);

  ::testing::internal::CaptureStderr();
  const std::string message = [] {
    try {
      (void)parse({"--strategy=bfs"});
    } catch (const InvalidArgument& error) {
      return std::string(error.what());
    }
    return std::string();
  }();
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_NE(
      message.find("flag --strategy='bfs' is invalid: expected one of random, pct, portfolio"),
      std::string::npos)
      << message;
  EXPECT_THROW(parse({"--pct-depth=4"}), InvalidArgument);
  EXPECT_THROW(parse({"--pct-depth=0"}), InvalidArgument);
  EXPECT_THROW(parse({"--pct-steps=0"}), InvalidArgument);
  EXPECT_THROW(parse({"--pct-steps=-5"}), InvalidArgument);
  EXPECT_THROW(parse({"--reduction-order=random"}), InvalidArgument);
  EXPECT_THROW(parse({"--allocator=malloc"}), InvalidArgument);
  EXPECT_THROW(parse({"--check-determinism=yes"}), InvalidArgument);
  EXPECT_THROW(parse({"--replay="}), InvalidArgument);
}

TEST(Run, CheckDeterminismPassesADeterministicProgramAndCatchesStateKeptAcrossRuns) {
  RunOptions options;
  options.ranks = 3;
  options.check_determinism = true;
  options.reduction_order = sim::ReductionOrder::Adversarial;
  ::testing::internal::CaptureStderr();
  const int clean = run(options, [] {
    Tensor sum = all_reduce(Tensor::full({2}, rank() + 1), "sum", world());
    EXPECT_EQ(sum.to_vector<float>(), (std::vector<float>{6, 6}));
  });
  const std::string clean_log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(clean, 0);
  EXPECT_NE(clean_log.find("determinism check passed"), std::string::npos) << clean_log;

  int runs = 0;  // state kept across the two runs: the second run sums other values
  ::testing::internal::CaptureStderr();
  const int leaky = run(options, [&runs] {
    if (rank() == 0) {
      ++runs;
    }
    (void)all_reduce(Tensor::full({2}, runs), "sum", world()).to_vector<float>();
  });
  const std::string leaky_log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(leaky, 1);
  EXPECT_NE(leaky_log.find("determinism check failed"), std::string::npos) << leaky_log;
}

// Two runs that fail alike are deterministic, and still a failure.
TEST(Run, CheckDeterminismReturnsOneWhenADeterministicProgramFails) {
  RunOptions options;
  options.ranks = 2;
  options.check_determinism = true;
  ::testing::internal::CaptureStderr();
  const int status = run(options, [] {
    if (rank() == 1) {
      throw std::runtime_error("rank 1 gives up every time");
    }
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  EXPECT_NE(log.find("rank 1 gives up every time"), std::string::npos) << log;
  EXPECT_NE(log.find("determinism check passed"), std::string::npos) << log;
}

TEST(RunOptions, DefaultsAreEightSimulatedRanks) {
  const RunOptions options = parse({});
  EXPECT_EQ(options.transport, "sim");
  EXPECT_EQ(options.ranks, 8);
  EXPECT_EQ(options.seed, 0u);
}

TEST(RunOptions, MalformedValuesAreRejected) {
  EXPECT_THROW(parse({"--ranks=0"}), InvalidArgument);
  EXPECT_THROW(parse({"--ranks=-2"}), InvalidArgument);
  EXPECT_THROW(parse({"--ranks=many"}), InvalidArgument);
  EXPECT_THROW(parse({"--seed=1x"}), InvalidArgument);
  EXPECT_THROW(parse({"--transport=carrier-pigeon"}), InvalidArgument);
  EXPECT_THROW(parse({"--ranks"}), InvalidArgument);
  EXPECT_THROW(parse({"--seed=18446744073709551616"}), InvalidArgument) << "2^64 overflows";
  EXPECT_THROW(parse({"--seed=+5"}), InvalidArgument);
  EXPECT_THROW(parse({"--seed=0x"}), InvalidArgument);
  EXPECT_THROW(parse({"--timeout-ms=0"}), InvalidArgument);
  EXPECT_THROW(parse({"--timeout-ms=99999999999999999"}), InvalidArgument) << "beyond a year";
}

// As every other integer flag of chorus: plain decimal.
TEST(RunOptions, NumbersArePlainDecimal) {
  EXPECT_EQ(parse({"--ranks=10"}).ranks, 10);
  EXPECT_EQ(parse({"--seed=0"}).seed, 0u);
  EXPECT_EQ(parse({"--seed=18446744073709551615"}).seed, 18446744073709551615u);
  for (const char* refused : {"--ranks=010", "--seed=0x1F", "--seed=00", "--seed=", "--seed= 5"}) {
    EXPECT_THROW(parse({refused}), InvalidArgument) << refused;
  }
}

TEST(RunOptions, TheBoundsOfTheRanksAndTheTimeoutAreAccepted) {
  EXPECT_EQ(parse({"--ranks=" + std::to_string(sim::kMaxWorldSize)}).ranks, sim::kMaxWorldSize);
  EXPECT_THROW(parse({"--ranks=" + std::to_string(sim::kMaxWorldSize + 1)}), InvalidArgument);
  // One year.
  EXPECT_EQ(parse({"--timeout-ms=31536000000"}).timeout, std::chrono::milliseconds(31536000000));
  EXPECT_THROW(parse({"--timeout-ms=31536000001"}), InvalidArgument);
}

TEST(RunOptions, ReadsTheFaultFlags) {
  const RunOptions options =
      parse({"--fault=crash:1:3", "--fault", "delay:0:2:40", "--fault=transport_error:2:0",
             "--random-faults=hang:500,transport_error:250", "--max-faults=2",
             "--liveness-steps=1000", "--fault=hang:3:7"});
  EXPECT_EQ(options.faults,
            (std::vector<sim::Fault>{sim::Fault::crash(1, 3), sim::Fault::delay(0, 2, 40),
                                     sim::Fault::transport_error(2, 0), sim::Fault::hang(3, 7)}));
  EXPECT_EQ(options.random_faults.crash_ppm, 0U);
  EXPECT_EQ(options.random_faults.transport_error_ppm, 250U);
  EXPECT_EQ(options.random_faults.hang_ppm, 500U);
  EXPECT_EQ(options.random_faults.delay_ppm, 0U);
  EXPECT_EQ(options.random_faults.max_faults, 2U);
  EXPECT_EQ(options.liveness_steps, 1000U);
  EXPECT_TRUE(options.args.empty());
  EXPECT_EQ(parse({"--random-faults=crash:1000000"}).random_faults.crash_ppm, 1'000'000U);
  const RunOptions defaults = parse({});
  EXPECT_TRUE(defaults.faults.empty());
  EXPECT_FALSE(defaults.random_faults.enabled());
  EXPECT_EQ(defaults.liveness_steps, 0U);

  // Kinds accumulate over --random-faults flags, each kind once.
  const RunOptions twice = parse({"--random-faults=crash:100", "--random-faults=hang:200"});
  EXPECT_EQ(twice.random_faults.crash_ppm, 100U);
  EXPECT_EQ(twice.random_faults.hang_ppm, 200U);

  const std::string fault_form =
      "expected KIND:RANK:OP (KIND one of crash, transport_error, hang; OP the rank's operation "
      "number from 0) or delay:RANK:OP:STEPS";
  const std::string random_form =
      "expected KIND:PPM[,KIND:PPM...] (KIND one of crash, transport_error, hang, delay; PPM "
      "parts per million, 1000000 in all at most)";
  const std::vector<std::pair<std::vector<std::string>, std::string>> refusals = {
      {{"--fault=crash:1"}, "flag --fault='crash:1' is invalid: " + fault_form},
      {{"--fault=explode:1:2"}, "flag --fault='explode:1:2' is invalid: " + fault_form},
      {{"--fault=delay:0:1"}, "flag --fault='delay:0:1' is invalid: " + fault_form},
      {{"--fault=crash:1:2:3"}, "flag --fault='crash:1:2:3' is invalid: " + fault_form},
      {{"--fault="}, "flag --fault='' is invalid: " + fault_form},
      {{"--fault=crash:01:2"},
       "flag --fault='crash:01:2' is invalid: " + fault_form +
           ", each number in plain decimal below 2^64"},
      {{"--fault=crash:1:-2"},
       "flag --fault='crash:1:-2' is invalid: " + fault_form +
           ", each number in plain decimal below 2^64"},
      {{"--fault=crash:1:18446744073709551616"},
       "flag --fault='crash:1:18446744073709551616' is invalid: " + fault_form +
           ", each number in plain decimal below 2^64"},
      {{"--fault=crash:1024:0"},
       "flag --fault='crash:1024:0' is invalid: expected a rank below 1024"},
      {{"--fault=delay:0:1:0"},
       "flag --fault='delay:0:1:0' is invalid: expected a delay of at least 1 step"},
      {{"--random-faults=crash:1000001"},
       "flag --random-faults='crash:1000001' is invalid: " + random_form},
      {{"--random-faults=crash:600000,hang:400001"},
       "flag --random-faults='crash:600000,hang:400001' is invalid: " + random_form},
      {{"--random-faults=crash:600000", "--random-faults=hang:400001"},
       "flag --random-faults='hang:400001' is invalid: " + random_form},
      {{"--random-faults=crash"}, "flag --random-faults='crash' is invalid: " + random_form},
      {{"--random-faults="}, "flag --random-faults='' is invalid: " + random_form},
      {{"--random-faults=crash:5,"}, "flag --random-faults='crash:5,' is invalid: " + random_form},
      {{"--random-faults=crash:5,crash:6"},
       "flag --random-faults='crash:5,crash:6' is invalid: " + random_form +
           ", each kind once (over every --random-faults)"},
      // A kind given at 0 ppm is given all the same.
      {{"--random-faults=crash:0,crash:500"},
       "flag --random-faults='crash:0,crash:500' is invalid: " + random_form +
           ", each kind once (over every --random-faults)"},
      {{"--random-faults=hang:1", "--random-faults=delay:2,hang:3"},
       "flag --random-faults='delay:2,hang:3' is invalid: " + random_form +
           ", each kind once (over every --random-faults)"},
      {{"--max-faults=0"},
       "flag --max-faults='0' is invalid: expected at least 1 (faults a run may draw)"},
      {{"--liveness-steps=0"},
       "flag --liveness-steps='0' is invalid: expected at least 1 (scheduling decisions)"},
      {{"--transport=mpi", "--fault=crash:1:0"},
       "--fault is a simulator flag, which --transport=mpi would ignore (its launcher sets the "
       "world: mpirun -np N, chorus launch -n N)"},
  };
  for (const auto& [words, detail] : refusals) {
    const chorus::testing::CaughtError caught = chorus::testing::expect_error<InvalidArgument>(
        [&words = words] { (void)parse(words); }, {detail});
    EXPECT_EQ(caught.detail, detail) << words.back();
  }
}

// An injected crash ends every rank with RankFailure, not a hang, and the replay command keeps
// the fault: it reruns the same failing run.
TEST(Run, AnInjectedCrashFailsEveryRankAndItsReplayKeepsTheFault) {
  const chorus::testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
  const RunOptions options = parse({"--ranks=3", "--fault=crash:1:1"});
  std::vector<std::string> seen(3);
  ::testing::internal::CaptureStderr();
  const int status = run(options, [&seen] {
    try {
      for (int step = 0; step < 3; ++step) {
        wait_tensor(all_reduce(Tensor::ones({2}), "sum", world()));
      }
      seen[static_cast<std::size_t>(rank())] = "finished";
    } catch (const RankFailure& failure) {
      seen[static_cast<std::size_t>(rank())] = "RankFailure at " +
                                               std::string(failure.context().op) + " #" +
                                               std::to_string(failure.context().seq);
      throw;
    }
  });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  // Rank 1 dies as it starts its operation 1, all_reduce #1 (the error names the operation it
  // crashed at), and its peers' all_reduce #1 fails.
  EXPECT_EQ(seen, (std::vector<std::string>{"RankFailure at all_reduce #1",
                                            "RankFailure at all_reduce #1",
                                            "RankFailure at all_reduce #1"}));
  EXPECT_NE(printed.find("injected fault: crash at rank 1's operation 1"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("replay: CHORUS_SIM_SEED=0 program --ranks=3 --fault=crash:1:1\n"),
            std::string::npos)
      << printed;
}

// A fault drawn from the decision stream: with certainty and at most one, the first operation
// started crashes its rank, and the run fails on every rank.
TEST(Run, ARandomFaultIsDrawnFromTheSchedule) {
  const chorus::testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
  const RunOptions options = parse({"--ranks=2", "--random-faults=crash:1000000"});
  int failures = 0;
  ::testing::internal::CaptureStderr();
  const int status = run(options, [&failures] {
    try {
      wait_tensor(all_reduce(Tensor::ones({2}), "sum", world()));
    } catch (const RankFailure&) {
      ++failures;
      throw;
    }
  });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  EXPECT_EQ(failures, 2);
  EXPECT_NE(printed.find("injected fault: crash at rank "), std::string::npos) << printed;
}

TEST(Run, ReturnsZeroWhenEveryRankSucceeds) {
  RunOptions options;
  options.ranks = 4;
  std::vector<float> seen(4);
  EXPECT_EQ(run(options,
                [&seen] {
                  seen[static_cast<std::size_t>(rank())] =
                      all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
                }),
            0);
  EXPECT_EQ(seen, std::vector<float>(4, 4.0f));
}

// The replay command sets CHORUS_SIM_SEED, which overrides --seed: it reruns the program's
// command line without its --seed.
TEST(Run, ReturnsOneAndPrintsTheReplayWhenARankFails) {
  // The run reads the environment (RunOptions leaves seed_from_environment on): none is set here.
  const chorus::testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
  const RunOptions options = parse({"--ranks=2", "--seed", "5", "a b"});
  ::testing::internal::CaptureStderr();
  const int status = run(options, [] {
    if (rank() == 1) {
      throw std::runtime_error("rank 1 gives up");
    }
  });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  EXPECT_NE(printed.find("rank 1 gives up"), std::string::npos) << printed;
  EXPECT_NE(printed.find("replay: CHORUS_SIM_SEED=5 program --ranks=2 'a b'\n"), std::string::npos)
      << printed;
}

TEST(Run, WritesTheTimelineAndTraceOfAFailingRun) {
  RunOptions options;
  options.ranks = 2;
  options.timeline_path = ::testing::TempDir() + "chorus_run_test.svg";
  options.trace_path = ::testing::TempDir() + "chorus_run_test.json";
  ::testing::internal::CaptureStderr();
  const int status = run(options, [] {
    wait_tensor(all_reduce(Tensor::ones({rank() + 1}), "sum", world()));  // sizes disagree
  });
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  const auto read = [](const std::string& path) {
    std::ifstream file(path);
    return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  };
  const std::string svg = read(options.timeline_path);
  EXPECT_NE(svg.find("<rect class=\"op failed\" data-rank=\"1\""), std::string::npos) << svg;
  EXPECT_NE(read(options.trace_path).find("\"traceEvents\""), std::string::npos);
  std::remove(options.timeline_path.c_str());
  std::remove(options.trace_path.c_str());
}

TEST(Run, ShrinkReducesAFailingScheduleToItsMinimalOneAndPrintsItsReplay) {
  const chorus::testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_SEED", std::nullopt}, {"CHORUS_SIM_REPLAY", std::nullopt}});
  chorus::testing::FirstTickBug bug;
  RunOptions options = parse({"--ranks=2", "--shrink"});
  EXPECT_TRUE(options.shrink);
  // A seed whose schedule runs into the bug (rank 1 ticks first), shrunk to the one choice it
  // needs: run rank 1 first.
  std::string printed;
  for (std::uint64_t seed = 0; seed < 64 && printed.empty(); ++seed) {
    options.seed = seed;
    ::testing::internal::CaptureStderr();
    const int status = run(options, bug.program());
    const std::string output = ::testing::internal::GetCapturedStderr();
    if (status != 0) {
      printed = output;
    }
  }
  ASSERT_FALSE(printed.empty()) << "no seed of 64 ran into the planted bug";
  EXPECT_NE(printed.find("chorus: shrinking the failing schedule ("), std::string::npos) << printed;
  EXPECT_NE(printed.find("chorus: shrunk to 1 choices ("), std::string::npos) << printed;
  EXPECT_NE(printed.find(" decisions that fails the same way:\n  replay: CHORUS_SIM_REPLAY="),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("step  rank 0    rank 1    completes\n0               run\n"),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("rank 1 failed: planted bug: rank 1 ticked first"), std::string::npos)
      << printed;
  // Neither replay command shrinks again: they rerun one schedule.
  EXPECT_EQ(printed.find("--shrink"), std::string::npos) << printed;
  // Its replay command reruns the minimal schedule, which fails the same way.
  const std::string marker = "  replay: CHORUS_SIM_REPLAY=";
  const std::size_t at = printed.rfind(marker);
  ASSERT_NE(at, std::string::npos) << printed;
  const std::size_t begin = at + marker.size();
  RunOptions replay = parse({"--ranks=2"});
  replay.replay = printed.substr(begin, printed.find(' ', begin) - begin);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run(replay, bug.program()), 1);
  const std::string replayed = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(replayed.find("planted bug: rank 1 ticked first"), std::string::npos) << replayed;
  EXPECT_NE(replayed.find("chorus sim: 2 ranks, following a decision list, "), std::string::npos)
      << replayed;

  EXPECT_FALSE(parse({}).shrink);
  chorus::testing::expect_invalid_argument(
      [] {
        (void)parse({"--shrink", "--check-determinism"});
      },
      {"--shrink and --check-determinism (RunOptions::shrink and check_determinism) together"});
  chorus::testing::expect_invalid_argument(
      [] {
        (void)parse({"--shrink", "--transport=mpi"});
      },
      {"--shrink is a simulator flag"});
  RunOptions both;
  both.shrink = true;
  both.check_determinism = true;
  chorus::testing::expect_invalid_argument(
      [&] { (void)run(both, [] {}); },
      {"--shrink and --check-determinism (RunOptions::shrink and check_determinism) together"});
}

TEST(Run, UnbuiltTransportsAreRefusedClearly) {
  std::vector<std::string> names = {"gloo"};
#if !defined(CHORUS_TEST_HAVE_NCCL)
  names.push_back("nccl");
#endif
  for (const std::string& name : names) {
    RunOptions options;
    options.transport = name;
    testing::expect_error<InvalidArgument>([&] { run(options, [] {}); },
                                           {"'" + name + "' is not built"});
  }
}

}  // namespace
}  // namespace chorus
