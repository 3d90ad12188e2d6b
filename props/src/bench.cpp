// `chorus bench`: nccl-tests' table for chorus on any transport (Note [chorus bench]).

#include "chorus/props/bench.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <chorus/check.hpp>
#include <chorus/chorus.hpp>
#include <chorus/kernels.hpp>
#include <chorus/sim/sim.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

namespace chorus::props {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kAdaptiveItersMax = 1000;
// The longest adaptive batch (BenchOptions::batch_ms): a minute.
constexpr double kBatchMsMax = 60'000;
// The largest step factor: one row past the smallest size already exceeds max_bytes' 1 TiB.
constexpr std::size_t kStepFactorMax = std::size_t{1} << 40;
// Below this the probe's buffers and the simulator's sit in L1/L2: no memory bandwidth to compare.
constexpr std::size_t kProbeBytesMin = std::size_t{64} << 10;

constexpr std::string_view kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                     "broadcast"};
constexpr std::string_view kReduceOps[] = {"sum", "prod", "max", "min"};
// The dtypes whose crafted inputs and results are exact (Crafted).
constexpr DType kDTypes[] = {DType::UInt8,   DType::Int8,     DType::Int32,   DType::Int64,
                             DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};

[[noreturn]] void invalid(const std::string& detail) {
  throw InvalidArgument({}, "chorus bench: " + detail);
}

bool reduces(std::string_view op) { return op == "all_reduce" || op == "reduce_scatter"; }

double bus_factor(std::string_view op, int n) {
  if (n <= 1) {
    return op == "broadcast" ? 1.0 : 0.0;
  }
  const double ranks = n;
  if (op == "all_reduce") {
    return 2.0 * (ranks - 1) / ranks;
  }
  if (op == "broadcast") {
    return 1.0;
  }
  return (ranks - 1) / ranks;
}

// One op at one size on a world of n: the element counts of one rank's buffers.
struct Shape1d {
  std::int64_t input = 0;
  std::int64_t output = 0;
  std::int64_t block = 0;  // per-rank block of all_gather, reduce_scatter, all_to_all
  std::int64_t count() const { return std::max(input, output); }
};

Shape1d shape_for(std::string_view op, std::size_t bytes, int n, std::size_t element) {
  const auto total = static_cast<std::int64_t>(bytes / element);
  if (op == "all_reduce" || op == "broadcast") {
    return {total, total, total};
  }
  const std::int64_t block = total / n;
  if (op == "all_gather") {
    return {block, block * n, block};
  }
  if (op == "reduce_scatter") {
    return {block * n, block, block};
  }
  return {block * n, block * n, block};  // all_to_all
}

// The largest integer `dtype` holds exactly, within its range.
double exact_limit(DType dtype) {
  switch (dtype) {
    case DType::UInt8:
      return 255;
    case DType::Int8:
      return 127;
    case DType::Float16:
      return 2048;
    case DType::BFloat16:
      return 256;
    case DType::Int32:
      return 2147483647.0;
    case DType::Float32:
      return 16777216.0;
    default:
      return 9007199254740992.0;  // Int64 and Float64: 2^53, where double arithmetic stays exact
  }
}

// The crafted inputs: small integers, different per rank and element, whose reductions stay
// exact in the dtype at any world size: ranks from `contributing_` on give the reduction's
// identity (0 for sum, 1 for prod), so a sum stays under 4 * contributing_ and a product under
// 2^contributing_, both within exact_limit(dtype).
class Crafted {
 public:
  Crafted(std::string_view reduce_op, DType dtype, int n)
      : sum_(reduce_op == "sum"), prod_(reduce_op == "prod"), max_(reduce_op == "max") {
    const double limit = exact_limit(dtype);
    contributing_ = n;
    if (sum_) {
      // Clamped as a double: limit / 4 is 2^51 for Int64 and Float64, past int's range.
      contributing_ = static_cast<int>(std::min(static_cast<double>(n), std::floor(limit / 4)));
    } else if (prod_) {
      contributing_ = std::min(n, static_cast<int>(std::floor(std::log2(limit))));
    }
    // Every value depends on (rank + index) % 4 only, so the reduction over ranks depends on
    // index % 4 only.
    for (std::int64_t residue = 0; residue < 4; ++residue) {
      double result = value(0, residue);
      for (int rank = 1; rank < n; ++rank) {
        result = combine(result, value(rank, residue));
      }
      reduced_[static_cast<std::size_t>(residue)] = result;
    }
  }

  double value(int rank, std::int64_t index) const {
    if (rank >= contributing_) {
      return sum_ ? 0.0 : 1.0;
    }
    return prod_ ? 1.0 + static_cast<double>((rank + index) % 2)
                 : 1.0 + static_cast<double>((rank + index) % 4);
  }
  double reduced(std::int64_t index) const { return reduced_[static_cast<std::size_t>(index % 4)]; }

 private:
  double combine(double a, double b) const {
    if (sum_) {
      return a + b;
    }
    if (prod_) {
      return a * b;
    }
    return max_ ? std::max(a, b) : std::min(a, b);
  }

  bool sum_;
  bool prod_;
  bool max_;
  int contributing_ = 0;
  std::array<double, 4> reduced_{};
};

double exchanged(int from, int to, std::int64_t index) {  // all_to_all: from's block for `to`
  return 1.0 + static_cast<double>((from * 3 + to * 5 + index) % 7);
}

std::vector<double> input_values(std::string_view op, const Crafted& crafted, int me,
                                 const Shape1d& shape) {
  std::vector<double> values(static_cast<std::size_t>(shape.input));
  for (std::int64_t i = 0; i < shape.input; ++i) {
    values[static_cast<std::size_t>(i)] =
        op == "all_to_all" ? exchanged(me, static_cast<int>(i / shape.block), i % shape.block)
                           : crafted.value(me, i);
  }
  return values;
}

std::vector<double> expected_values(std::string_view op, const Crafted& crafted, int me,
                                    const Shape1d& shape) {
  std::vector<double> values(static_cast<std::size_t>(shape.output));
  for (std::int64_t i = 0; i < shape.output; ++i) {
    const std::int64_t block = shape.block == 0 ? 0 : i / shape.block;
    const std::int64_t within = shape.block == 0 ? 0 : i % shape.block;
    double expected = 0;
    if (op == "all_reduce") {
      expected = crafted.reduced(i);
    } else if (op == "broadcast") {
      expected = crafted.value(0, i);
    } else if (op == "all_gather") {
      expected = crafted.value(static_cast<int>(block), within);
    } else if (op == "reduce_scatter") {
      expected = crafted.reduced(me * shape.block + i);
    } else {
      expected = exchanged(static_cast<int>(block), me, within);
    }
    values[static_cast<std::size_t>(i)] = expected;
  }
  return values;
}

// nccl-tests' "prod" is chorus's "product".
ReduceOp reduce_op_of(const std::string& name) {
  return ReduceOp::parse(name == "prod" ? "product" : name);
}

Tensor issue(std::string_view op, const Tensor& input, const ReduceOp& reduce_op) {
  if (op == "all_reduce") {
    return all_reduce(input, reduce_op, world());
  }
  if (op == "all_gather") {
    return all_gather_tensor(input, 0, world());
  }
  if (op == "reduce_scatter") {
    return reduce_scatter_tensor(input, reduce_op, 0, world());
  }
  if (op == "all_to_all") {
    return all_to_all_single(input, std::nullopt, std::nullopt, world());
  }
  return broadcast(input, 0, world());
}

void barrier() { wait_tensor(all_reduce(Tensor::ones({1}), "sum", world())); }

// Every rank's values of `local`, reduced with `reduce_op` (a waited Float64 all_reduce).
std::vector<double> agree(const std::vector<double>& local, const char* reduce_op) {
  return wait_tensor(all_reduce(Tensor::from_vector(local), reduce_op, world()))
      .to_vector<double>();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// Elements of `result` that differ from `expected` (converted to the result's dtype first).
std::int64_t count_wrong(const Tensor& result, const std::vector<double>& expected) {
  const std::vector<double> got = result.to(DType::Float64).to_vector<double>();
  const std::vector<double> want =
      Tensor::from_vector(expected).to(result.dtype()).to(DType::Float64).to_vector<double>();
  std::int64_t wrong = static_cast<std::int64_t>(
      got.size() > want.size() ? got.size() - want.size() : want.size() - got.size());
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    // NaN (a poisoned or unwritten float) is wrong too: NaN != anything.
    wrong += got[i] == want[i] ? 0 : 1;
  }
  return wrong;
}

// The memory-bandwidth probe: copies n buffers of `bytes` into n others, the traffic every
// all_reduce of n ranks in one memory needs at least. Its batches run between the simulator's,
// so both see the same machine (a shared one's bandwidth drifts within seconds).
class Probe {
 public:
  Probe(int n, std::size_t bytes)
      : inputs_(static_cast<std::size_t>(n)), outputs_(static_cast<std::size_t>(n)), bytes_(bytes) {
    for (std::size_t r = 0; r < inputs_.size(); ++r) {
      inputs_[r].assign(bytes, static_cast<unsigned char>(r + 1));
      outputs_[r].assign(bytes, 0);  // touched: no page faults timed
    }
    pass();
    if (std::memcmp(outputs_.back().data(), inputs_.back().data(), bytes) != 0) {
      throw std::logic_error("chorus bench: the memory probe's copy is wrong");
    }
  }

  // Seconds per pass over `iters` passes.
  double batch(int iters) {
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      pass();
    }
    return std::chrono::duration<double>(Clock::now() - start).count() / iters;
  }

 private:
  void pass() {
    for (std::size_t r = 0; r < inputs_.size(); ++r) {
      std::memcpy(outputs_[r].data(), inputs_[r].data(), bytes_);
    }
  }

  std::vector<std::vector<unsigned char>> inputs_;
  std::vector<std::vector<unsigned char>> outputs_;
  std::size_t bytes_;
};

// Operations per timed batch so that a batch takes about options.batch_ms, from the warmup's time
// per operation (the slowest rank's, so that every rank runs the same number).
int adaptive_iters(const BenchOptions& options, Clock::duration warmup, int operations) {
  const double per_op = std::chrono::duration<double>(warmup).count() / operations;
  const double slowest = agree({per_op}, "max").front();
  if (slowest <= 0) {
    return kAdaptiveItersMax;
  }
  const double iters = std::round(options.batch_ms * 1e-3 / slowest);
  return static_cast<int>(std::clamp(iters, 1.0, static_cast<double>(kAdaptiveItersMax)));
}

std::string format_number(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

class Table {
 public:
  Table(std::ostream& out, bool simulator) : out_(out), simulator_(simulator) {}

  void header(const BenchOptions& options, int n) const {
    out_ << "# chorus bench: transport " << options.transport << ", " << n << " ranks, "
         << dtype_name(options.dtype) << ", " << options.reduce_op << ", iters "
         << (options.iters > 0
                 ? std::to_string(options.iters)
                 : "adaptive (batches of ~" + format_number(options.batch_ms) + " ms)")
         << ", warmup " << options.warmup << ", median of " << options.reps << " batches"
         << (options.transport == "sim"
                 ? std::string(options.sim_checks ? ", simulator buffer checks on"
                                                  : ", simulator buffer checks off") +
                       ", reduction order " + options.reduction_order
                 : "")
         << ", kernels " << kernels::isa_name(kernels::active_isa()) << "\n#\n";
    out_ << "# " << std::setw(12) << "size" << std::setw(12) << "count" << std::setw(10) << "type"
         << std::setw(7) << "redop" << std::setw(12) << "time" << std::setw(9) << "algbw"
         << std::setw(9) << "busbw" << std::setw(8) << "#wrong";
    if (simulator_) {
      out_ << std::setw(10) << "per rank" << std::setw(9) << "memory" << std::setw(9) << "probe"
           << std::setw(10) << "of probe";
    }
    out_ << "\n# " << std::setw(12) << "(B)" << std::setw(12) << "(elements)" << std::setw(10) << ""
         << std::setw(7) << "" << std::setw(12) << "(us)" << std::setw(9) << "(GB/s)"
         << std::setw(9) << "(GB/s)" << std::setw(8) << "";
    if (simulator_) {
      out_ << std::setw(10) << "(us)" << std::setw(9) << "(GB/s)" << std::setw(9) << "(GB/s)";
    }
    out_ << "\n";
  }

  void op(std::string_view name) const { out_ << "# " << name << "\n"; }

  void row(const BenchRow& row, std::string_view type, std::string_view redop, int n) const {
    std::ostringstream line;
    line << std::fixed << "  " << std::setw(12) << row.bytes << std::setw(12) << row.count
         << std::setw(10) << type << std::setw(7) << redop << std::setw(12) << std::setprecision(2)
         << row.time_us << std::setw(9) << row.algbw_gbps << std::setw(9) << row.busbw_gbps
         << std::setw(8);
    if (row.wrong < 0) {
      line << "N/A";
    } else {
      line << row.wrong;
    }
    if (simulator_) {
      line << std::setw(10) << std::setprecision(3) << row.time_us / n;
      if (row.probe_gbps > 0) {
        line << std::setprecision(2) << std::setw(9) << row.memory_gbps << std::setw(9)
             << row.probe_gbps << std::setw(10) << row.of_probe;
      }
    }
    out_ << line.str() << "\n";
    out_.flush();
  }

 private:
  std::ostream& out_;
  bool simulator_;
};

// BenchOptions::reduction_order as the simulator's enumerator.
sim::ReductionOrder chosen_order(const std::string& name) {
  const std::optional<sim::ReductionOrder> order = sim::named(name, sim::kReductionOrders);
  if (!order) {
    invalid("unknown reduction order '" + name + "' (" + sim::spelled(sim::kReductionOrders) + ")");
  }
  return *order;
}

void validate(const BenchOptions& options) {
  if (options.ops.empty()) {
    invalid("no op to benchmark (--ops names none)");
  }
  for (auto op = options.ops.begin(); op != options.ops.end(); ++op) {
    if (std::find(std::begin(kOps), std::end(kOps), *op) == std::end(kOps)) {
      invalid("unknown op '" + *op +
              "' (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast)");
    }
    if (std::find(options.ops.begin(), op, *op) != op) {
      invalid("op '" + *op + "' is listed twice (its table would be printed twice)");
    }
  }
  if (std::find(std::begin(kReduceOps), std::end(kReduceOps), options.reduce_op) ==
      std::end(kReduceOps)) {
    invalid("unknown reduce op '" + options.reduce_op + "' (sum, prod, max, min)");
  }
  if (std::find(std::begin(kDTypes), std::end(kDTypes), options.dtype) == std::end(kDTypes)) {
    invalid("dtype " + std::string(dtype_name(options.dtype)) +
            " is not benchmarked (UInt8, Int8, Int32, Int64, Float16, BFloat16, Float32, Float64)");
  }
  if (options.min_bytes == 0 || options.min_bytes > options.max_bytes) {
    invalid("sizes must satisfy 0 < min-bytes <= max-bytes, got min-bytes " +
            std::to_string(options.min_bytes) + " and max-bytes " +
            std::to_string(options.max_bytes));
  }
  if (options.max_bytes > (std::size_t{1} << 40)) {
    invalid("max-bytes is larger than 1 TiB");
  }
  if (options.transport == "sim" && (options.ranks < 1 || options.ranks > sim::kMaxWorldSize)) {
    invalid("--ranks must be between 1 and " + std::to_string(sim::kMaxWorldSize));
  }
  if (options.step_factor < 2 || options.step_factor > kStepFactorMax) {
    invalid("the step factor must lie in [2, 2^40], got " + std::to_string(options.step_factor));
  }
  if (options.iters < 0 || options.reps < 1 || options.warmup < 0) {
    invalid("iters and warmup must be at least 0, reps at least 1");
  }
  // Written so that NaN fails too (every comparison with it is false).
  if (!(options.batch_ms > 0 && options.batch_ms <= kBatchMsMax)) {
    invalid("batch-ms must lie in (0, 60000], got " + format_number(options.batch_ms));
  }
  if (options.kernels != "auto" && options.kernels != kernels::isa_name(kernels::Isa::Baseline) &&
      options.kernels != kernels::isa_name(kernels::Isa::Avx2)) {
    invalid("unknown kernels '" + options.kernels + "' (auto, baseline, avx2)");
  }
  (void)chosen_order(options.reduction_order);
  if (options.transport != "sim" && options.reduction_order != "fixed") {
    invalid("reduction order '" + options.reduction_order + "' is the simulator's: transport " +
            options.transport + " reduces in its library's own order (fixed only)");
  }
}

// BenchOptions::kernels as the instruction set to pin (kernels::set_isa refuses avx2 where this
// CPU or build lacks it, naming which).
kernels::Isa chosen_isa(const std::string& name) {
  if (name == "auto") {
    return kernels::best_isa();
  }
  return name == kernels::isa_name(kernels::Isa::Avx2) ? kernels::Isa::Avx2
                                                       : kernels::Isa::Baseline;
}

}  // namespace

std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  unsigned long long value = 0;
  // stoull takes a sign and leading spaces (and wraps "-1"): digits first only.
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0])) == 0) {
    invalid("bad size '" + text + "' (a number of bytes, optionally with K, M or G)");
  }
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    invalid("bad size '" + text + "' (a number of bytes, optionally with K, M or G)");
  }
  const std::string suffix = text.substr(used);
  int shift = 0;
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty()) {
    invalid("bad size '" + text + "' (a number of bytes, optionally with K, M or G)");
  }
  if (value > (std::numeric_limits<std::size_t>::max() >> shift)) {
    invalid("size '" + text + "' is too large");
  }
  return static_cast<std::size_t>(value) << shift;
}

BenchReport run_bench(const BenchOptions& options, std::ostream& out) {
  validate(options);
  kernels::set_isa(chosen_isa(options.kernels));
  std::vector<std::size_t> sizes;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;
       bytes *= options.step_factor) {
    sizes.push_back(bytes);
    if (bytes > options.max_bytes / options.step_factor) {
      break;
    }
  }
  const bool simulator = options.transport == "sim";
  const std::size_t element = element_size(options.dtype);
  const std::string type(dtype_name(options.dtype));
  const Table table(out, simulator);
  const ReduceOp reduce_op = reduce_op_of(options.reduce_op);
  BenchReport report;
  bool completed = false;
  // The verdict's inputs, kept on every process: on a real transport each process is one rank,
  // and its exit status must agree with the verdict rank 0 prints. Every rank can reach it, since
  // a row's #wrong is agreed by all ranks; on the simulator (one process) rank 0 keeps them.
  std::int64_t rows_measured = 0;
  std::int64_t wrong_agreed = 0;
  bool finished = false;

  const auto rank_main = [&] {
    const int n = world_size();
    const int me = rank();
    const Crafted crafted(options.reduce_op, options.dtype, n);
    const bool printer = me == 0;
    const bool keeps_verdict = printer || !simulator;
    if (printer) {
      report.ranks = n;
      table.header(options, n);
    }
    for (const std::string& op : options.ops) {
      if (printer) {
        table.op(op);
      }
      for (const std::size_t bytes : sizes) {
        const Shape1d shape = shape_for(op, bytes, n, element);
        if (shape.count() == 0) {
          continue;
        }
        const Tensor input =
            Tensor::from_vector(input_values(op, crafted, me, shape)).to(options.dtype);
        // Adaptive iters are sized from the warmup, so it runs at least once then.
        const int warmup = options.iters > 0 ? options.warmup : std::max(options.warmup, 1);
        const auto warmup_start = Clock::now();
        for (int i = 0; i < warmup; ++i) {
          wait_tensor(issue(op, input, reduce_op));
        }
        const int iters = options.iters > 0
                              ? options.iters
                              : adaptive_iters(options, Clock::now() - warmup_start, warmup);
        const std::size_t row_bytes = static_cast<std::size_t>(shape.count()) * element;
        const bool probing =
            simulator && options.memory_probe && op == "all_reduce" && row_bytes >= kProbeBytesMin;
        std::optional<Probe> probe;
        if (probing && printer) {
          probe.emplace(n, row_bytes);
        }
        std::vector<double> batches;
        std::vector<double> probe_batches;  // seconds per pass, rank 0
        for (int rep = 0; rep < options.reps; ++rep) {
          barrier();
          const auto start = Clock::now();
          for (int i = 0; i < iters; ++i) {
            wait_tensor(issue(op, input, reduce_op));
          }
          batches.push_back(std::chrono::duration<double>(Clock::now() - start).count());
          if (probing) {
            // Every rank has its batch's end time; the others wait here while rank 0, holding
            // the simulator's one thread, runs the probe's batch.
            barrier();
            if (probe) {
              probe_batches.push_back(probe->batch(iters));
            }
          }
        }
        probe.reset();
        batches = agree(batches, "max");  // a batch takes as long as its slowest rank

        BenchRow row;
        row.op = op;
        row.count = shape.count();
        row.bytes = row_bytes;
        row.iters = iters;
        row.time_us = median(batches) / iters * 1e6;
        row.algbw_gbps = static_cast<double>(row.bytes) / (row.time_us * 1e3);
        row.busbw_gbps = row.algbw_gbps * bus_factor(op, n);
        if (!probe_batches.empty()) {
          const double moved = 2.0 * n * static_cast<double>(row.bytes);
          row.probe_gbps = moved / median(probe_batches) / 1e9;
          row.memory_gbps = moved / (row.time_us * 1e3);
          std::vector<double> ratios;  // per batch: the probe's time over the simulator's
          for (std::size_t rep = 0; rep < probe_batches.size(); ++rep) {
            ratios.push_back(probe_batches[rep] / (batches[rep] / iters));
          }
          row.of_probe = median(ratios);
        }
        if (options.check) {
          const Tensor result = wait_tensor(issue(op, input, reduce_op));
          const auto wrong =
              static_cast<double>(count_wrong(result, expected_values(op, crafted, me, shape)));
          row.wrong = static_cast<std::int64_t>(agree({wrong}, "sum").front());
        }
        if (keeps_verdict) {
          ++rows_measured;
          wrong_agreed += std::max<std::int64_t>(row.wrong, 0);
        }
        if (printer) {
          table.row(row, type, reduces(op) ? std::string_view(options.reduce_op) : "none", n);
          report.rows.push_back(row);
        }
      }
    }
    if (printer) {
      completed = true;
    }
    if (keeps_verdict) {
      finished = true;
    }
  };

  // Room in each rank's pool for two outputs of the largest size, so that no timed operation
  // pays first touch of a fresh block (a 64 MiB output costs ~4x its all_reduce on the simulator).
  const std::size_t pool_bytes = std::max(RankOptions{}.host_pool_bytes_max, 2 * options.max_bytes);
  int status = 0;
  if (simulator) {
    sim::SimOptions sim_options;
    sim_options.world_size = options.ranks;
    sim_options.seed = options.seed;
    sim_options.seed_from_environment = false;
    sim_options.executor = sim::ExecutorKind::Fibers;
    sim_options.check_buffers = options.sim_checks;
    sim_options.reduction_order = chosen_order(options.reduction_order);
    sim_options.host_pool_bytes_max = pool_bytes;
    sim_options.wrap_transport = options.wrap_transport;
    try {
      const sim::SimReport sim_report = sim::run(sim_options, rank_main);
      status = sim_report.ok() ? 0 : 1;
      report.sim_marks = sim_report.marks;
    } catch (const Error& error) {
      out << "chorus bench: " << error.what() << "\n";
      status = 1;
    }
  } else {
    RunOptions run_options;
    run_options.transport = options.transport;
    run_options.ranks = options.ranks;
    run_options.seed = options.seed;
    run_options.host_pool_bytes_max = pool_bytes;
    status = run(run_options, rank_main);
  }

  std::int64_t wrong = 0;
  bool unchecked = false;
  for (const BenchRow& row : report.rows) {
    wrong += std::max<std::int64_t>(row.wrong, 0);
    unchecked = unchecked || row.wrong < 0;
  }
  // Every size skipped (no row) must not read as a pass either.
  report.ok = status == 0 && finished && rows_measured > 0 && wrong_agreed == 0;
  if (!completed) {
    return report;  // not the printing rank (or it failed: the error is printed)
  }
  CHORUS_CHECK_EQ(wrong, wrong_agreed);
  CHORUS_CHECK_EQ(static_cast<std::int64_t>(report.rows.size()), rows_measured);
  if (report.rows.empty()) {
    std::size_t needed = std::numeric_limits<std::size_t>::max();
    for (const std::string& op : options.ops) {
      const bool whole = op == "all_reduce" || op == "broadcast";
      needed = std::min(needed, whole ? element : element * static_cast<std::size_t>(report.ranks));
    }
    out << "chorus bench: nothing was measured: no size benchmarked (" << options.min_bytes
        << " to " << options.max_bytes << " bytes) holds one " << type << " element"
        << (needed > element ? " per rank" : "") << " for these ops on " << report.ranks
        << (report.ranks == 1 ? " rank" : " ranks") << ", which takes " << needed
        << " bytes: raise --max-bytes\n";
    return report;
  }
  out << "# wrong elements: " << wrong << (unchecked ? " (some rows unchecked)" : "")
      << (report.ok ? " OK" : " FAILED") << "\n";
  if (simulator && report.ranks > 0) {
    // Issue 8's simulator targets, as measured in this run.
    double smallest = -1;
    double worst_fraction = -1;
    double best_fraction = -1;
    for (const BenchRow& row : report.rows) {
      if (row.op != "all_reduce") {
        continue;
      }
      if (smallest < 0) {
        smallest = row.time_us / report.ranks;
        out << "# simulator: " << row.bytes << "-byte all_reduce: " << std::fixed
            << std::setprecision(3) << smallest << " us per rank (" << report.ranks << " ranks)\n";
      }
      if (row.probe_gbps > 0 && row.bytes >= (std::size_t{1} << 20)) {
        const double fraction = row.of_probe;
        worst_fraction = worst_fraction < 0 ? fraction : std::min(worst_fraction, fraction);
        best_fraction = std::max(best_fraction, fraction);
      }
    }
    if (worst_fraction >= 0) {
      out << "# simulator: all_reduce from 1 MiB: " << std::fixed << std::setprecision(2)
          << worst_fraction << " to " << best_fraction << " of the memory probe\n";
    }
  }
  return report;
}

}  // namespace chorus::props
