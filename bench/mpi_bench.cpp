// bench_mpi: chorus over MPI against raw MPI on the same buffers, in the same run (issue 7,
// item 4; docs/performance.md, "MPI transport (bench_mpi)").
//
//   mpirun -np N build/release/bench/bench_mpi [--min-bytes=8] [--max-bytes=64M] [--step=2]
//       [--iters=0] [--warmup=3] [--reps=5] [--batch-ms=20]
//       [--ops=all_reduce,all_gather,reduce_scatter,all_to_all] [--raw=blocking|nonblocking]
//
// For each op and size it times `iters` back-to-back operations of chorus (issue, then
// chorus::wait_tensor; a fresh output tensor each time, as a program gets it) and of the raw MPI
// call (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoallv on a duplicate of
// MPI_COMM_WORLD, reading chorus's input tensor and writing a preallocated buffer), alternating
// chorus and raw batches `reps` times (which goes first alternates too) with an MPI_Barrier before
// each batch. A batch's time is the slowest rank's (MPI_MAX); the printed time is the median over
// the reps. Columns follow nccl-tests: size is the larger buffer of one rank in bytes (all_gather:
// the output, reduce_scatter: the input), count its elements (float32), algbw = size / time,
// busbw = algbw * factor (all_reduce 2(n-1)/n, the others (n-1)/n). `#wrong` counts result
// elements that differ from the exact expected value, summed over ranks, for both paths.
// `busbw_ratio` is chorus busbw / raw busbw (= raw time / chorus time): below 1 chorus is slower
// (bench_nccl's `time_ratio` is the other way up, chorus time / raw time).
//
// --iters=0 (the default) picks per size the number of operations that makes a raw batch take
// about --batch-ms (1 to 1000 operations), agreed by all ranks. --raw=nonblocking makes the raw
// path call MPI_I* + MPI_Wait, what chorus calls, to tell chorus's own cost from Open MPI's
// nonblocking algorithms.
//
// Raw MPI calls are safe here: chorus makes its MPI calls only inside its own functions
// (Note [MPI locking]) and nothing else runs on this process, so MPI_THREAD_SERIALIZED holds,
// and a separate communicator keeps the raw traffic from matching chorus's.

#include <mpi.h>

#include <algorithm>
#include <chorus/check.hpp>
#include <chorus/chorus.hpp>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "sweep_flags.hpp"

namespace {

struct BenchOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t step = 2;  // size multiplier between rows
  int iters = 0;         // 0: chosen per size from batch_ms
  int warmup = 3;
  int reps = 5;
  double batch_ms = 20.0;
  // Diagnostic: the raw path issues the nonblocking call (MPI_Iallreduce, ...) and MPI_Wait,
  // the calls chorus makes, instead of the blocking one.
  bool raw_nonblocking = false;
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
};

constexpr int kItersMax = 1000;
constexpr int kRepsMax = 101;

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > start) {
      parts.push_back(text.substr(start, end - start));
    }
    if (comma == std::string::npos) {
      break;
    }
    start = comma + 1;
  }
  return parts;
}

BenchOptions parse_options(const std::vector<std::string>& args) {
  BenchOptions options;
  for (const std::string& arg : args) {
    const auto [key, value] = chorus::bench::split_flag(arg);
    if (chorus::bench::apply_sweep_flag(options, key, value)) {
      continue;
    }
    if (key == "--batch-ms") {
      options.batch_ms = std::stod(value);
    } else if (key == "--raw") {
      if (value != "blocking" && value != "nonblocking") {
        throw std::invalid_argument("--raw=blocking|nonblocking");
      }
      options.raw_nonblocking = value == "nonblocking";
    } else if (key == "--ops") {
      options.ops = split_commas(value);
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "'");
    }
  }
  if (options.min_bytes == 0 || options.min_bytes > options.max_bytes || options.step < 2 ||
      options.iters < 0 || options.iters > kItersMax || options.warmup < 0 || options.reps < 1 ||
      options.reps > kRepsMax || !(options.batch_ms > 0.0)) {
    throw std::invalid_argument(
        "need 0 < min-bytes <= max-bytes, step >= 2, 0 <= iters <= 1000, warmup >= 0, "
        "1 <= reps <= 101, batch-ms > 0");
  }
  return options;
}

// One op under test: how it lays out buffers for a total `count` (nccl-tests' count: elements of
// one rank's larger buffer), how chorus and raw MPI run it, and what every output element must be.
struct OpCase {
  std::string name;
  double bus_factor = 1.0;
  std::size_t in_count = 0;
  std::size_t out_count = 0;
  chorus::Tensor input;
  std::vector<float> raw_output;
  std::vector<int> layout;  // all_to_all: counts and displacements, [counts..., displs...]
  std::function<chorus::Tensor()> run_chorus;
  std::function<void()> run_raw;
  std::function<float(std::size_t)> expected;  // output element i of this rank
};

using Clock = std::chrono::steady_clock;

double elapsed_us(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// MPI_Allreduce(MAX) of one double on `comm`.
double max_over_ranks(double value, MPI_Comm comm) {
  double result = 0.0;
  MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, comm);
  return result;
}

std::int64_t sum_over_ranks(std::int64_t value, MPI_Comm comm) {
  std::int64_t result = 0;
  MPI_Allreduce(&value, &result, 1, MPI_INT64_T, MPI_SUM, comm);
  return result;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

std::int64_t count_wrong(const float* data, const OpCase& op) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < op.out_count; ++i) {
    if (data[i] != op.expected(i)) {
      ++wrong;
    }
  }
  return wrong;
}

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw std::runtime_error(std::string(call) + " failed with MPI error " + std::to_string(code));
  }
}

// Sets up `name` for `count` (a multiple of n where the op splits by rank). Inputs are exact
// small integers ("ones * rank" style), so every expected output is exact in float32.
OpCase make_case(const std::string& name, std::size_t count, int rank, int n, MPI_Comm comm,
                 const chorus::GroupSpec& world, bool nonblocking) {
  const auto un = static_cast<std::size_t>(n);
  const auto frank = static_cast<float>(rank);
  const auto fn = static_cast<float>(n);
  const float rank_sum = fn * (fn - 1.0f) / 2.0f;
  OpCase op;
  op.name = name;
  if (name == "all_reduce") {
    op.bus_factor = 2.0 * (n - 1) / n;
    op.in_count = op.out_count = count;
    op.input = chorus::Tensor::full({static_cast<std::int64_t>(count)}, rank);
    op.expected = [rank_sum](std::size_t) { return rank_sum; };
  } else if (name == "all_gather") {
    op.bus_factor = static_cast<double>(n - 1) / n;
    op.in_count = count / un;
    op.out_count = count;
    op.input = chorus::Tensor::full({static_cast<std::int64_t>(op.in_count)}, rank);
    op.expected = [block = op.in_count](std::size_t i) { return static_cast<float>(i / block); };
  } else if (name == "reduce_scatter") {
    // Input block j holds rank + j * n: this rank's output is rank_sum + rank * n * n.
    op.bus_factor = static_cast<double>(n - 1) / n;
    op.in_count = count;
    op.out_count = count / un;
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i) {
      values[i] = frank + static_cast<float>(i / op.out_count) * fn;
    }
    op.input = chorus::Tensor::from_vector(values);
    op.expected = [value = rank_sum + frank * fn * fn](std::size_t) { return value; };
  } else if (name == "all_to_all") {
    // Block j sent to rank j holds rank * n + j: block i received from rank i holds i * n + rank.
    op.bus_factor = static_cast<double>(n - 1) / n;
    op.in_count = op.out_count = count;
    const std::size_t block = count / un;
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i) {
      values[i] = frank * fn + static_cast<float>(i / block);
    }
    op.input = chorus::Tensor::from_vector(values);
    op.layout.resize(2 * un);
    for (std::size_t peer = 0; peer < un; ++peer) {
      op.layout[peer] = static_cast<int>(block);
      op.layout[un + peer] = static_cast<int>(peer * block);
    }
    op.expected = [block, frank, fn](std::size_t i) {
      return static_cast<float>(i / block) * fn + frank;
    };
  } else {
    throw std::invalid_argument("unknown op '" + name +
                                "' (all_reduce, all_gather, reduce_scatter, all_to_all)");
  }
  op.raw_output.assign(op.out_count, 0.0f);
  const chorus::Tensor input = op.input;
  // The raw call reads chorus's input storage (already materialised, nothing pending on it).
  const auto* in = static_cast<const float*>(input.unsafe_data_ptr());
  float* out = op.raw_output.data();
  const int in_int = static_cast<int>(op.in_count);
  const int out_int = static_cast<int>(op.out_count);
  if (name == "all_reduce") {
    op.run_chorus = [input, &world] { return chorus::all_reduce(input, "sum", world); };
    op.run_raw = [in, out, out_int, comm] {
      check_mpi(MPI_Allreduce(in, out, out_int, MPI_FLOAT, MPI_SUM, comm), "MPI_Allreduce");
    };
    if (nonblocking) {
      op.run_raw = [in, out, out_int, comm] {
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Iallreduce(in, out, out_int, MPI_FLOAT, MPI_SUM, comm, &request),
                  "MPI_Iallreduce");
        check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
      };
    }
  } else if (name == "all_gather") {
    op.run_chorus = [input, &world] { return chorus::all_gather_tensor(input, 0, world); };
    op.run_raw = [in, out, in_int, comm] {
      check_mpi(MPI_Allgather(in, in_int, MPI_FLOAT, out, in_int, MPI_FLOAT, comm),
                "MPI_Allgather");
    };
    if (nonblocking) {
      op.run_raw = [in, out, in_int, comm] {
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Iallgather(in, in_int, MPI_FLOAT, out, in_int, MPI_FLOAT, comm, &request),
                  "MPI_Iallgather");
        check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
      };
    }
  } else if (name == "reduce_scatter") {
    op.run_chorus = [input, &world] {
      return chorus::reduce_scatter_tensor(input, "sum", 0, world);
    };
    op.run_raw = [in, out, out_int, comm] {
      check_mpi(MPI_Reduce_scatter_block(in, out, out_int, MPI_FLOAT, MPI_SUM, comm),
                "MPI_Reduce_scatter_block");
    };
    if (nonblocking) {
      op.run_raw = [in, out, out_int, comm] {
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Ireduce_scatter_block(in, out, out_int, MPI_FLOAT, MPI_SUM, comm, &request),
                  "MPI_Ireduce_scatter_block");
        check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
      };
    }
  } else {
    op.run_chorus = [input, &world] {
      return chorus::all_to_all_single(input, std::nullopt, std::nullopt, world);
    };
    const int* counts = op.layout.data();
    const int* displs = op.layout.data() + n;
    op.run_raw = [in, out, counts, displs, comm] {
      check_mpi(MPI_Alltoallv(in, counts, displs, MPI_FLOAT, out, counts, displs, MPI_FLOAT, comm),
                "MPI_Alltoallv");
    };
    if (nonblocking) {
      op.run_raw = [in, out, counts, displs, comm] {
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Ialltoallv(in, counts, displs, MPI_FLOAT, out, counts, displs, MPI_FLOAT,
                                 comm, &request),
                  "MPI_Ialltoallv");
        check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
      };
    }
  }
  return op;
}

struct Row {
  double chorus_us = 0.0;
  double raw_us = 0.0;
  std::int64_t chorus_wrong = 0;
  std::int64_t raw_wrong = 0;
  int iters = 0;
};

// The element counts (nccl-tests' count) of the sizes min-bytes, min-bytes * step, ... up to
// max-bytes, for op `name` on `ranks` ranks: whole floats, and for every op but all_reduce equal
// blocks per rank. Rounding maps neighbouring sizes onto one count (4 ranks: 8 and 16 bytes are
// both 4 floats); such a count is listed, so measured and printed, once.
std::vector<std::size_t> swept_counts(const BenchOptions& options, const std::string& name,
                                      std::size_t ranks) {
  std::vector<std::size_t> counts;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    std::size_t count = std::max<std::size_t>(bytes / sizeof(float), 1);
    if (name != "all_reduce") {
      count = std::max(count / ranks, std::size_t{1}) * ranks;  // equal blocks, as nccl-tests
    }
    if (counts.empty() || counts.back() != count) {
      counts.push_back(count);
    }
    if (bytes > options.max_bytes / options.step) {
      break;
    }
    bytes *= options.step;
  }
  return counts;
}

// Times `iters` operations of one path after a barrier; the slowest rank's time per op in µs.
double time_batch(bool chorus_path, OpCase& op, int iters, MPI_Comm comm) {
  MPI_Barrier(comm);
  const Clock::time_point start = Clock::now();
  if (chorus_path) {
    for (int i = 0; i < iters; ++i) {
      chorus::wait_tensor(op.run_chorus());
    }
  } else {
    for (int i = 0; i < iters; ++i) {
      op.run_raw();
    }
  }
  return max_over_ranks(elapsed_us(start) / iters, comm);
}

Row measure(OpCase& op, const BenchOptions& options, MPI_Comm comm) {
  Row row;
  // Correctness first (also a warm-up): the raw output starts poisoned.
  std::fill(op.raw_output.begin(), op.raw_output.end(), -1.0f);
  op.run_raw();
  const chorus::Tensor result = chorus::wait_tensor(op.run_chorus());
  CHORUS_CHECK_EQ(static_cast<std::size_t>(result.numel()), op.out_count);
  row.chorus_wrong = sum_over_ranks(count_wrong(result.data_ptr<float>(), op), comm);
  row.raw_wrong = sum_over_ranks(count_wrong(op.raw_output.data(), op), comm);
  for (int i = 0; i < options.warmup; ++i) {
    op.run_raw();
    chorus::wait_tensor(op.run_chorus());
  }
  row.iters = options.iters;
  if (row.iters == 0) {
    // Calibrate on the raw path: the fastest of a few two-op batches (one preempted batch must
    // not shrink every batch of the row to one op); each batch is the slowest rank's.
    constexpr int kCalibrationBatches = 5;
    double per_op_us = time_batch(false, op, 2, comm);
    for (int i = 1; i < kCalibrationBatches; ++i) {
      per_op_us = std::min(per_op_us, time_batch(false, op, 2, comm));
    }
    per_op_us = std::max(per_op_us, 0.05);
    row.iters = std::clamp(static_cast<int>(options.batch_ms * 1000.0 / per_op_us), 1, kItersMax);
  }
  std::vector<double> chorus_times;
  std::vector<double> raw_times;
  for (int rep = 0; rep < options.reps; ++rep) {
    const bool chorus_first = rep % 2 == 0;
    for (const bool chorus_path : {chorus_first, !chorus_first}) {
      (chorus_path ? chorus_times : raw_times)
          .push_back(time_batch(chorus_path, op, row.iters, comm));
    }
  }
  row.chorus_us = median(chorus_times);
  row.raw_us = median(raw_times);
  return row;
}

void bench_rank(const BenchOptions& options) {
  const int rank = chorus::rank();
  const int n = chorus::world_size();
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  const chorus::GroupSpec world(chorus::world());
  const auto un = static_cast<std::size_t>(n);
  if (rank == 0) {
    std::printf(
        "# bench_mpi: %d ranks, float32, sum; reps %d (median), warmup %d, iters %s; raw MPI %s\n",
        n, options.reps, options.warmup,
        options.iters == 0 ? "auto" : std::to_string(options.iters).c_str(),
        options.raw_nonblocking ? "nonblocking (MPI_I* + MPI_Wait)" : "blocking");
    std::printf(
        "# time: us per op (slowest rank); algbw, busbw: GB/s; busbw_ratio: chorus/raw busbw; "
        "+us: chorus - raw\n");
  }
  for (const std::string& name : options.ops) {
    if (rank == 0) {
      std::printf("#\n# %s\n", name.c_str());
      std::printf("# %12s %11s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %11s %9s\n", "size",
                  "count", "iters", "chorus us", "algbw", "busbw", "#wrong", "raw us", "algbw",
                  "busbw", "#wrong", "busbw_ratio", "+us");
    }
    for (const std::size_t count : swept_counts(options, name, un)) {
      OpCase op = make_case(name, count, rank, n, comm, world, options.raw_nonblocking);
      const Row row = measure(op, options, comm);
      if (rank == 0) {
        const double size = static_cast<double>(count * sizeof(float));
        const double chorus_algbw = size / row.chorus_us / 1e3;
        const double raw_algbw = size / row.raw_us / 1e3;
        std::printf("  %12zu %11zu %6d | %10.2f %8.3f %8.3f %6" PRId64
                    " | %10.2f %8.3f %8.3f %6" PRId64 " | %11.3f %9.2f\n",
                    count * sizeof(float), count, row.iters, row.chorus_us, chorus_algbw,
                    chorus_algbw * op.bus_factor, row.chorus_wrong, row.raw_us, raw_algbw,
                    raw_algbw * op.bus_factor, row.raw_wrong, row.raw_us / row.chorus_us,
                    row.chorus_us - row.raw_us);
        std::fflush(stdout);
      }
      if (row.chorus_wrong != 0 || row.raw_wrong != 0) {
        throw std::runtime_error(name + " at " + std::to_string(count * sizeof(float)) +
                                 " bytes: " + std::to_string(row.chorus_wrong) +
                                 " wrong chorus elements, " + std::to_string(row.raw_wrong) +
                                 " wrong raw MPI elements");
      }
    }
  }
  MPI_Comm_free(&comm);
}

}  // namespace

int main(int argc, char** argv) {
  // A benchmark of the MPI transport: --transport=mpi unless given, read by from_args so that it
  // refuses the simulator's flags (--ranks: mpirun -np decides) instead of ignoring them.
  std::vector<char*> args(argv, argv + argc);
  std::string transport = "--transport=mpi";
  if (std::none_of(argv + 1, argv + argc, [](const char* arg) {
        return std::string_view(arg).starts_with("--transport");
      })) {
    args.insert(args.begin() + 1, transport.data());
  }
  chorus::RunOptions run_options;
  try {
    run_options = chorus::RunOptions::from_args(static_cast<int>(args.size()), args.data());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_mpi: %s\n", error.what());
    return 2;
  }
  if (run_options.transport != "mpi") {
    std::fprintf(stderr, "bench_mpi: runs on --transport=mpi only (under mpirun)\n");
    return 2;
  }
  BenchOptions options;
  try {
    options = parse_options(run_options.args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_mpi: %s\n", error.what());
    return 2;
  }
  return chorus::run(run_options, [&options] { bench_rank(options); });
}
