#pragma once

// chorus::run — one entry point for every transport: the same rank function runs on the
// simulator, under mpirun or on NCCL, chosen by flags.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chorus/sim/sim.hpp"

namespace chorus {

struct RunOptions {
  // "sim" (N ranks in this process, deterministic), "mpi" or "nccl".
  std::string transport = "sim";
  // World size for the simulator (other transports take it from their launcher).
  int ranks = 8;
  // Seed of the simulator's schedule.
  std::uint64_t seed = 0;
  // How long a wait may take before it throws Timeout (virtual time on the simulator).
  std::chrono::nanoseconds timeout = std::chrono::minutes(10);
  // Simulator only: write the run's SVG timeline / Chrome trace JSON here at its end, failing or
  // not (sim::SimOptions::timeline_path, trace_path; docs/simulator-timeline.md).
  std::string timeline_path;
  std::string trace_path;
  // Simulator only (docs/simulator.md): how schedules are explored, reductions ordered and
  // storages allocated; a replay token to follow; run twice and compare (sim::check_determinism).
  sim::Strategy strategy = sim::Strategy::RandomWalk;
  int pct_depth = 2;
  // PCT's estimate of the run's length in scheduling decisions (sim::SimOptions::pct_steps; 0:
  // the simulator's default). A run's report prints its real length ("steps").
  std::uint64_t pct_steps = 0;
  sim::ReductionOrder reduction_order = sim::ReductionOrder::Fixed;
  sim::AllocatorPolicy allocator = sim::AllocatorPolicy::Pooled;
  bool guard_pages = false;
  bool check_determinism = false;
  // Simulator only: a failing run's schedule is shrunk (sim::shrink) to a minimal one that fails
  // the same way, printed with its replay command and per-rank text timeline. The rank function
  // runs again for each attempt (up to 2,000), in this process: state it keeps across runs must
  // start afresh each run. Not with check_determinism.
  bool shrink = false;
  // Simulator only: each rank poses as the owner of cuda:<rank> (sim::SimOptions::cuda_devices),
  // so a program that places its tensors on local_device() runs them as device tensors.
  bool sim_cuda = false;
  // MPI and NCCL: members compare each operation before starting it, so ranks that issue
  // different collectives get CollectiveMismatch instead of a hang (docs/mpi.md, "Checking
  // collectives"; docs/nccl.md). The simulator always checks.
  bool check_collectives = false;
  // Bytes of freed host storage each rank keeps for reuse (RankOptions::host_pool_bytes_max).
  // Outputs larger than this come fresh from the heap every time, paying first touch of every
  // page; `chorus bench` raises it to keep its largest outputs.
  std::size_t host_pool_bytes_max = std::size_t{64} << 20;
  // Simulator only (docs/simulator-faults.md): faults injected into the run, named (--fault) or
  // drawn from its decision stream (--random-faults, --max-faults), and the liveness phase's
  // budget of scheduling decisions once faults stop (0: off). After a fault every rank ends with
  // a typed error (RankFailure, TransportError, Timeout, Aborted, Deadlock), never hangs.
  std::vector<sim::Fault> faults;
  sim::RandomFaults random_faults;
  std::uint64_t liveness_steps = 0;
  std::string replay;
  // Arguments from_args did not consume, in order (argv[0] excluded), for the program.
  std::vector<std::string> args;
  // Simulator only: the command line from_args read (argv[0] first) without its --seed flags, and
  // without its --replay flags, which the replay command printed for a failed run overrides with
  // CHORUS_SIM_SEED or CHORUS_SIM_REPLAY (sim::SimOptions::command_without_seed). Empty: that
  // command reruns the process's command line whole.
  std::vector<std::string> command_without_seed;
  std::vector<std::string> command_without_replay;

  // Reads --transport=sim|mpi|nccl, --ranks=N, --seed=S, --timeout-ms=T, --timeline=out.svg,
  // --trace=out.json, --strategy=random|pct|portfolio, --pct-depth=1..3,
  // --pct-steps=K, --reduction-order=fixed|ring|tree|adversarial,
  // --allocator=pooled|lifo|quarantine|random,
  // --fault=KIND:RANK:OP (KIND crash, transport_error or hang; repeatable) or
  // --fault=delay:RANK:OP:STEPS, --random-faults=KIND:PPM[,KIND:PPM...] (KIND crash,
  // transport_error, hang or delay, each once over every --random-faults; parts per million per
  // started operation), --max-faults=N,
  // --liveness-steps=N,
  // --replay=<token> (also as two words, "--ranks 4") and the switches --guard-pages,
  // --check-determinism, --check-collectives, --sim-cuda and --shrink (alone, or =true, =false,
  // =1, =0);
  // everything else lands in `args`; the command lines without --seed and without --replay (both
  // without --shrink: a replay reruns one schedule) are kept for the replay command. Throws
  // InvalidArgument for a malformed value, and for a simulator-only flag (all but --transport,
  // --seed, --timeout-ms, --check-collectives) with
  // --transport=mpi or nccl, which would ignore it.
  static RunOptions from_args(int argc, char** argv);
};

// Runs `rank_main` on every rank of the chosen transport. Returns 0 when every rank returned
// normally (and, with check_determinism, both runs agreed), 1 otherwise (the error, and for the
// simulator the seed and a replay command, are printed to stderr). Works never waited are reported
// on stderr with their call sites. Throws InvalidArgument for an unknown or unavailable transport.
// What each transport reads of its launcher's environment (<chorus/launch_environment.hpp>)
// before it starts; a malformed variable it reads throws InvalidArgument naming it.
// --transport=nccl reads all of it (launch_environment()) and takes its rank, world size, local
// rank (the CUDA device) and store address (MASTER_ADDR, MASTER_PORT) from it whichever launcher
// set it — `chorus launch`, torchrun, Open MPI's mpirun or Slurm's srun — and throws
// InvalidArgument naming MASTER_ADDR or MASTER_PORT when a recognised launcher's job left one
// unset (with no launcher variables at all, nccl::run names the missing RANK or WORLD_SIZE),
// before it looks for a GPU. --transport=mpi reads only RANK and WORLD_SIZE (torchrun_rank()),
// MPI finding its rank itself: in a process started by `chorus launch` or torchrun (WORLD_SIZE >
// 1) it throws InvalidArgument rather than run W separate one-rank MPI worlds, and a variable MPI
// does not use (MASTER_PORT, LOCAL_RANK, ...) is never read, malformed or not. The simulator
// reads the launcher's variables only for a hint on stderr in such a process (each process would
// simulate a whole world), and ignores malformed ones.
int run(const RunOptions& options, std::function<void()> rank_main);

}  // namespace chorus
