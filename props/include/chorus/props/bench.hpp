#pragma once

// Note [chorus bench]
// `chorus bench` times collectives through chorus on any transport and prints nccl-tests'
// table: for each op and size, the time per operation, algbw = size / time, busbw = algbw times
// the op's bus factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
// broadcast 1), and #wrong, the elements that differ from the exact result on crafted inputs,
// summed over ranks. Sizes are nccl-tests' too: the larger buffer of one rank in bytes
// (all_gather: the output, reduce_scatter: the input), rounded down to a whole number of elements
// per rank; a size with no element is skipped.
//
// Every rank runs the same loop inside chorus::run (or sim::run): for each op and size, `warmup`
// operations, then `reps` batches of `iters` operations (issue, then wait: one output tensor per
// operation, as a program gets it), each batch after a world barrier (a waited 1-element
// all_reduce). By default `iters` adapts per size so that a batch takes about `batch_ms` (1 to
// 1000 operations, from the warmup's slowest rank), so that small sizes are not dominated by the
// batch's start. A batch's time is the slowest rank's; the table shows the median batch divided
// by `iters`. After timing, one more operation's result is compared with the expected values.
//
// On the simulator all ranks share this process's one thread, so the time per operation is what
// the whole world costs; the table adds the time per rank (time / N). For all_reduce it also
// measures (from 64 KiB, below which everything sits in cache), in the same run and on the same
// thread, the machine's memory bandwidth with a probe
// that copies N input buffers of the size into N outputs (the least traffic any all_reduce of N
// ranks in one memory has: read every input once, write every output once) and prints the
// simulator's all_reduce throughput over those same 2 N size bytes as a fraction of the probe's.
// The probe's batches alternate with the simulator's (rank 0 runs one after each timed batch,
// while the other ranks wait at a barrier), and the fraction is the median of the per-batch
// ratios, so a shared machine's drifting bandwidth affects both sides alike.
// By default the simulator skips its buffer checks while benchmarking (poisoned pending outputs
// and input checksums, SimOptions::check_buffers), which triple the memory traffic and which no
// real transport has; `--sim-checks` keeps them, to see what they cost.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/dtype.hpp"

namespace chorus::transport {
class Transport;
}

namespace chorus::props {

struct BenchOptions {
  std::string transport = "sim";  // sim, mpi or nccl (chorus::run)
  int ranks = 8;                  // simulator world size (others: from the launcher)
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "broadcast"};
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{256} << 20;
  std::size_t step_factor = 2;  // size multiplier between rows (>= 2)
  DType dtype = DType::Float32;
  std::string reduce_op = "sum";  // sum, prod, max or min
  int iters = 0;  // operations per timed batch; 0: adaptive, batches of about batch_ms
  double batch_ms = 20;
  int warmup = 5;
  int reps = 5;
  bool check = true;  // count #wrong after timing
  // The reduction kernels' instruction set (Note [Kernel instruction sets]): auto (the best this
  // CPU runs), baseline or avx2. Set for the whole process before anything runs.
  std::string kernels = "auto";
  // Simulator only.
  bool sim_checks = false;   // keep poisoning and input checksums on (SimOptions::check_buffers)
  bool memory_probe = true;  // the all_reduce memory-bandwidth comparison
  std::uint64_t seed = 0;
  // The order of every reduction (SimOptions::reduction_order): fixed, ring, tree or
  // adversarial; other transports take only fixed, their library's own order.
  std::string reduction_order = "fixed";
  // Simulator only, a test hook (SimOptions::wrap_transport): plant a transport bug that #wrong
  // must count.
  std::function<std::shared_ptr<transport::Transport>(std::shared_ptr<transport::Transport>)>
      wrap_transport;
};

struct BenchRow {
  std::string op;
  std::size_t bytes = 0;   // nccl-tests' size
  std::int64_t count = 0;  // elements of that buffer
  int iters = 0;           // operations per timed batch
  double time_us = 0;      // per operation (median batch / iters)
  double algbw_gbps = 0;   // GB/s, 1e9 bytes
  double busbw_gbps = 0;
  std::int64_t wrong = -1;  // -1: not checked
  // Simulator all_reduce with the probe; 0 when not measured.
  double memory_gbps = 0;  // 2 N bytes / time_us
  double probe_gbps = 0;   // the same bytes / the probe's time
  double of_probe = 0;     // median over batches of the probe's time / the simulator's
};

struct BenchReport {
  int ranks = 0;
  std::vector<BenchRow> rows;
  // Every rank ran to the end, a row was measured and no row had a wrong element. On a real
  // transport every process (one rank each) reaches the same verdict, from the agreed #wrong.
  bool ok = false;
  // Simulator only: the named marks its run passed (SimReport::marks), "reduction.tree" and the
  // like.
  std::map<std::string, std::uint64_t, std::less<>> sim_marks;
};

// Parses "64K", "8M", "1G" or a plain number of bytes; throws InvalidArgument.
std::size_t parse_bytes(const std::string& text);

// Runs the benchmark and prints the table to `out` as rows complete (rank 0 only on a real
// transport). Throws InvalidArgument for bad options (unknown op, dtype or reduce op, a reduce
// op the dtype has not). Call it outside any rank.
BenchReport run_bench(const BenchOptions& options, std::ostream& out);

}  // namespace chorus::props
