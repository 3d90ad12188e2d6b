// `chorus bench` (Note [chorus bench]): nccl-tests' rows with exact sizes, counts and bus factors,
// #wrong that counts a planted wrong element, crafted inputs exact in every benchmarked dtype, and
// clear refusals of bad options.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <chorus/kernels.hpp>
#include <chorus/props/bench.hpp>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "props/planted_transport.hpp"
#include "support/expect_error.hpp"
#include "support/forwarding_transport.hpp"
#include "support/kernel_isa.hpp"

namespace chorus::props {
namespace {

using testing::plant;
using testing::PlantedBug;

BenchOptions quick(int ranks) {
  BenchOptions options;
  options.ranks = ranks;
  options.max_bytes = std::size_t{64} << 10;
  options.iters = 2;
  options.warmup = 1;
  options.reps = 1;
  return options;
}

TEST(Bench, RowsFollowNcclTestsSizesCountsAndBusFactors) {
  std::ostringstream out;
  const BenchReport report = run_bench(quick(4), out);
  EXPECT_TRUE(report.ok) << out.str();
  EXPECT_EQ(report.ranks, 4);
  std::map<std::string, std::vector<const BenchRow*>> by_op;
  for (const BenchRow& row : report.rows) {
    by_op[row.op].push_back(&row);
    EXPECT_EQ(row.wrong, 0) << row.op << " " << row.bytes;
    EXPECT_EQ(row.iters, 2);
    EXPECT_GT(row.time_us, 0.0);
    // Bitwise: bytes / (µs * 1e3) is GB/s, and the bus factors on 4 ranks (nccl-tests's
    // 2(n-1)/n, 1 and (n-1)/n) are exact in binary.
    EXPECT_EQ(row.algbw_gbps, static_cast<double>(row.bytes) / (row.time_us * 1e3));
    const double factor = row.op == "all_reduce" ? 1.5 : row.op == "broadcast" ? 1.0 : 0.75;
    EXPECT_EQ(row.busbw_gbps, row.algbw_gbps * factor) << row.op;
    EXPECT_EQ(row.bytes, static_cast<std::size_t>(row.count) * 4);
    // The probe runs for all_reduce from 64 KiB only.
    EXPECT_EQ(row.probe_gbps > 0, row.op == "all_reduce" && row.bytes == 65536) << row.op;
    EXPECT_EQ(row.of_probe > 0, row.probe_gbps > 0) << row.op;
  }
  // all_reduce and broadcast: 8 B to 64 KiB, 14 rows. The others need a whole element per rank:
  // 8 B is 2 floats, none for each of 4 ranks, so they start at 16 B.
  ASSERT_EQ(by_op["all_reduce"].size(), 14u);
  ASSERT_EQ(by_op["broadcast"].size(), 14u);
  ASSERT_EQ(by_op["all_gather"].size(), 13u);
  ASSERT_EQ(by_op["reduce_scatter"].size(), 13u);
  ASSERT_EQ(by_op["all_to_all"].size(), 13u);
  EXPECT_EQ(by_op["all_reduce"].front()->count, 2);
  EXPECT_EQ(by_op["all_gather"].front()->count, 4);
  EXPECT_EQ(by_op["all_gather"].back()->count, 16384);
  const std::string text = out.str();
  EXPECT_NE(text.find("#wrong"), std::string::npos) << text;
  EXPECT_NE(text.find("of probe"), std::string::npos) << text;
  EXPECT_NE(text.find("# wrong elements: 0 OK"), std::string::npos) << text;
  EXPECT_NE(text.find("# simulator: 8-byte all_reduce: "), std::string::npos) << text;
}

TEST(Bench, WrongCountsTheElementsAPlantedTransportBugGetsWrong) {
  // Rank 1 contributes 1 too much in the last element of each all_reduce of at least 4 elements:
  // that element is wrong on all 4 ranks in those rows, and nothing else is.
  BenchOptions options = quick(4);
  options.max_bytes = 64;
  options.wrap_transport = plant(PlantedBug::WrongLastContribution, 1);
  std::ostringstream out;
  const BenchReport report = run_bench(options, out);
  EXPECT_FALSE(report.ok);
  int flagged = 0;
  for (const BenchRow& row : report.rows) {
    const bool buggy = row.op == "all_reduce" && row.count >= 4;
    EXPECT_EQ(row.wrong, buggy ? 4 : 0) << row.op << " " << row.bytes;
    flagged += buggy ? 1 : 0;
  }
  EXPECT_EQ(flagged, 3);  // 16, 32 and 64 bytes
  EXPECT_NE(out.str().find("# wrong elements: 12 FAILED"), std::string::npos) << out.str();
}

// One bench run of `dtype` and `reduce_op` on `options`: every rank finished, no wrong element.
void expect_exact(BenchOptions options, DType dtype, const char* reduce_op) {
  options.dtype = dtype;
  options.reduce_op = reduce_op;
  options.iters = 1;
  options.warmup = 0;
  std::ostringstream out;
  const BenchReport report = run_bench(options, out);
  EXPECT_TRUE(report.ok) << dtype_name(dtype) << " " << reduce_op << "\n" << out.str();
  EXPECT_FALSE(report.rows.empty());
}

TEST(Bench, CraftedInputsAreExactInEveryDTypeAndReduction) {
  BenchOptions options = quick(3);
  options.max_bytes = 256;
  for (const DType dtype : {DType::UInt8, DType::Int8, DType::Int32, DType::Int64, DType::Float16,
                            DType::BFloat16, DType::Float64}) {
    for (const char* reduce_op : {"sum", "prod", "max", "min"}) {
      expect_exact(options, dtype, reduce_op);
    }
  }
}

// Records the send buffer of each collective of the benchmarked dtype with at least 2 elements
// (the bench's own barriers and agreements send 1), per op and rank.
struct SentInputs {
  DType dtype = DType::Float32;
  std::mutex mutex;
  std::map<std::pair<std::string, int>, std::vector<std::vector<unsigned char>>> sends;

  void record(const char* op, int rank, const transport::Buffer& send) {
    if (send.dtype != dtype || send.count < 2) {
      return;
    }
    const auto* bytes = static_cast<const unsigned char*>(send.data);
    const std::lock_guard lock(mutex);
    sends[{op, rank}].emplace_back(bytes, bytes + send.nbytes());
  }
};

class RecordingComm final : public testing::ForwardingComm {
 public:
  RecordingComm(std::shared_ptr<transport::Comm> inner, std::shared_ptr<SentInputs> sent, int rank)
      : ForwardingComm(std::move(inner)), sent_(std::move(sent)), rank_(rank) {}

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override {
    sent_->record("all_reduce", rank_, send);
    return ForwardingComm::all_reduce(send, recv, reduce_op, info);
  }
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override {
    sent_->record("all_gather", rank_, send);
    return ForwardingComm::all_gather(send, recv, info);
  }
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op,
                                                  const transport::OpInfo& info) override {
    sent_->record("reduce_scatter", rank_, send);
    return ForwardingComm::reduce_scatter(send, recv, reduce_op, info);
  }
  std::shared_ptr<transport::Work> all_to_all(const transport::Buffer& send,
                                              const std::vector<std::size_t>& send_counts,
                                              const transport::Buffer& recv,
                                              const std::vector<std::size_t>& recv_counts,
                                              const transport::OpInfo& info) override {
    sent_->record("all_to_all", rank_, send);
    return ForwardingComm::all_to_all(send, send_counts, recv, recv_counts, info);
  }
  std::shared_ptr<transport::Work> broadcast(const transport::Buffer& send,
                                             const transport::Buffer& recv, int root,
                                             const transport::OpInfo& info) override {
    if (group_rank() == root) {  // send is read on the root only
      sent_->record("broadcast", rank_, send);
    }
    return ForwardingComm::broadcast(send, recv, root, info);
  }

 private:
  std::shared_ptr<SentInputs> sent_;
  int rank_;
};

class RecordingTransport final : public testing::ForwardingTransport {
 public:
  RecordingTransport(std::shared_ptr<transport::Transport> inner, std::shared_ptr<SentInputs> sent)
      : ForwardingTransport(std::move(inner)), sent_(std::move(sent)) {}
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override {
    return std::make_shared<RecordingComm>(ForwardingTransport::create_comm(tag, ranks), sent_,
                                           rank());
  }

 private:
  std::shared_ptr<SentInputs> sent_;
};

// The element of `bytes` at `index`, `element` bytes wide.
std::vector<unsigned char> element_bytes(const std::vector<unsigned char>& bytes,
                                         std::size_t element, std::size_t index) {
  const auto first = bytes.begin() + static_cast<std::ptrdiff_t>(index * element);
  return {first, first + static_cast<std::ptrdiff_t>(element)};
}

// #wrong means something only if the crafted inputs do: in every dtype, each op's input on each
// rank has no zero element (so a transport that drops data or delivers zeros is counted) and
// differs from the other ranks' (so one that mixes up ranks' blocks is). 2^53 / 4 once overflowed
// int for Int64 and Float64 sums: every input and expected value was 0.
TEST(Bench, CraftedInputsAreNonZeroAndDifferPerRankInEveryDType) {
  BenchOptions options = quick(3);
  options.min_bytes = 48;  // 2 elements per rank even for 8-byte dtypes on 3 ranks
  options.max_bytes = 48;
  options.iters = 1;
  options.warmup = 0;
  for (const DType dtype : {DType::UInt8, DType::Int8, DType::Int32, DType::Int64, DType::Float16,
                            DType::BFloat16, DType::Float32, DType::Float64}) {
    auto sent = std::make_shared<SentInputs>();
    sent->dtype = dtype;
    options.dtype = dtype;
    options.wrap_transport = [sent](std::shared_ptr<transport::Transport> inner) {
      return std::make_shared<RecordingTransport>(std::move(inner), sent);
    };
    std::ostringstream out;
    const BenchReport report = run_bench(options, out);
    ASSERT_TRUE(report.ok) << dtype_name(dtype) << "\n" << out.str();
    const std::size_t element = element_size(dtype);
    const std::vector<unsigned char> zero(element, 0);
    for (const std::string op :
         {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}) {
      const int ranks = op == "broadcast" ? 1 : 3;  // broadcast reads its root's input only
      std::vector<std::vector<unsigned char>> first_send(static_cast<std::size_t>(ranks));
      for (int r = 0; r < ranks; ++r) {
        const auto& sends = sent->sends[{op, r}];
        ASSERT_FALSE(sends.empty()) << dtype_name(dtype) << " " << op << " rank " << r;
        for (const std::vector<unsigned char>& bytes : sends) {
          std::size_t zeros = 0;
          for (std::size_t i = 0; i < bytes.size() / element; ++i) {
            zeros += element_bytes(bytes, element, i) == zero ? 1 : 0;
          }
          EXPECT_EQ(zeros, 0u) << dtype_name(dtype) << " " << op << " rank " << r << ": of "
                               << bytes.size() / element << " elements";
        }
        first_send[static_cast<std::size_t>(r)] = sends.front();
      }
      for (int r = 1; r < ranks; ++r) {
        EXPECT_NE(first_send[static_cast<std::size_t>(r)], first_send[0])
            << dtype_name(dtype) << " " << op << ": ranks 0 and " << r << " send the same input";
      }
    }
  }
}

// On 64 ranks an Int8 product of 1s and 2s would wrap (past 6 twos), an Int8 sum of 1..4 too
// (past 31 ranks), a Float16 or BFloat16 one would leave the exact integers: Crafted makes the
// ranks past what the dtype holds contribute the identity, so every result stays exact.
TEST(Bench, CraftedInputsStayExactOnManyRanks) {
  BenchOptions options = quick(64);
  options.ops = {"all_reduce", "reduce_scatter"};
  options.min_bytes = 64;
  options.max_bytes = 128;
  for (const DType dtype : {DType::UInt8, DType::Int8, DType::Float16, DType::BFloat16}) {
    for (const char* reduce_op : {"sum", "prod"}) {
      expect_exact(options, dtype, reduce_op);
    }
  }
}

// A run whose every size is skipped (no whole element per rank) measured nothing: it fails and
// says why, rather than printing an empty table as a pass.
TEST(Bench, NothingMeasuredFailsAndSaysWhy) {
  BenchOptions options = quick(8);
  options.ops = {"all_gather", "reduce_scatter"};
  options.min_bytes = 8;
  options.max_bytes = 16;
  std::ostringstream out;
  const BenchReport report = run_bench(options, out);
  EXPECT_FALSE(report.ok) << out.str();
  EXPECT_EQ(report.ranks, 8);
  EXPECT_TRUE(report.rows.empty());
  EXPECT_NE(out.str().find("chorus bench: nothing was measured: no size benchmarked (8 to 16 "
                           "bytes) holds one Float32 element per rank for these ops on 8 ranks, "
                           "which takes 32 bytes: raise --max-bytes\n"),
            std::string::npos)
      << out.str();
  EXPECT_EQ(out.str().find("OK"), std::string::npos) << out.str();
  // One op that fits is enough.
  options.ops = {"all_gather", "all_reduce"};
  const BenchReport some = run_bench(options, out);
  EXPECT_TRUE(some.ok);
  EXPECT_EQ(some.rows.size(), 2u);  // all_reduce at 8 and 16 bytes
}

TEST(Bench, SizesParseWithSuffixes) {
  EXPECT_EQ(parse_bytes("8"), 8u);
  EXPECT_EQ(parse_bytes("64K"), std::size_t{65536});
  EXPECT_EQ(parse_bytes("256M"), std::size_t{256} << 20);
  EXPECT_EQ(parse_bytes("1g"), std::size_t{1} << 30);
  EXPECT_THROW(parse_bytes("lots"), InvalidArgument);
  EXPECT_THROW(parse_bytes("5Q"), InvalidArgument);
  // 2^34 G is 2^64 bytes: refused, not wrapped to 0.
  testing::expect_invalid_argument([] { (void)parse_bytes("17179869184G"); },
                                   {"size '17179869184G' is too large"});
  EXPECT_EQ(parse_bytes("17179869183G"), std::size_t{17179869183} << 30);
}

TEST(Bench, KernelsPinTheReductionsInstructionSet) {
  const testing::IsaRestorer restorer;
  BenchOptions options = quick(2);
  options.ops = {"all_reduce"};
  options.dtype = DType::BFloat16;
  options.max_bytes = 4096;
  options.memory_probe = false;
  options.kernels = "baseline";
  std::ostringstream baseline_out;
  EXPECT_TRUE(run_bench(options, baseline_out).ok) << baseline_out.str();
  EXPECT_EQ(kernels::active_isa(), kernels::Isa::Baseline);
  EXPECT_NE(baseline_out.str().find(", kernels baseline\n"), std::string::npos)
      << baseline_out.str();
  EXPECT_NE(baseline_out.str().find("# wrong elements: 0 OK"), std::string::npos)
      << baseline_out.str();
  // auto goes back to the best this CPU runs.
  options.kernels = "auto";
  std::ostringstream auto_out;
  EXPECT_TRUE(run_bench(options, auto_out).ok) << auto_out.str();
  const kernels::Isa best = kernels::best_isa();
  EXPECT_EQ(best, kernels::isa_supported(kernels::Isa::Avx2) ? kernels::Isa::Avx2
                                                             : kernels::Isa::Baseline);
  EXPECT_EQ(kernels::active_isa(), best);
  EXPECT_NE(auto_out.str().find(std::string(", kernels ") + kernels::isa_name(best) + "\n"),
            std::string::npos)
      << auto_out.str();
}

TEST(Bench, BadOptionsAreRefusedBeforeAnythingRuns) {
  const auto refused = [](BenchOptions options, const std::string& why) {
    std::ostringstream out;
    testing::expect_invalid_argument([&] { (void)run_bench(options, out); }, {why});
    EXPECT_EQ(out.str(), "");
  };
  BenchOptions options = quick(2);
  options.ops = {"all_reduce", "gossip"};
  refused(options, "chorus bench: unknown op 'gossip'");
  options = quick(2);
  options.reduce_op = "avg";
  refused(options, "unknown reduce op 'avg'");
  options = quick(2);
  options.dtype = DType::Bool;
  refused(options, "dtype Bool is not benchmarked");
  options = quick(2);
  options.ranks = 0;
  refused(options, "--ranks must be between 1 and 1024");
  options = quick(2);
  options.min_bytes = 1024;
  options.max_bytes = 8;
  refused(options,
          "sizes must satisfy 0 < min-bytes <= max-bytes, got min-bytes 1024 and "
          "max-bytes 8");
  options = quick(2);
  options.ops = {"all_reduce", "broadcast", "all_reduce"};
  refused(options, "chorus bench: op 'all_reduce' is listed twice");
  // Options that used to be taken and benchmark nothing or garbage.
  options = quick(2);
  options.ops = {};
  refused(options, "chorus bench: no op to benchmark (--ops names none)");
  options = quick(2);
  options.batch_ms = std::numeric_limits<double>::quiet_NaN();
  refused(options, "batch-ms must lie in (0, 60000], got nan");
  options = quick(2);
  options.batch_ms = std::numeric_limits<double>::infinity();
  refused(options, "batch-ms must lie in (0, 60000], got inf");
  options = quick(2);
  options.batch_ms = 0;
  refused(options, "batch-ms must lie in (0, 60000], got 0");
  options = quick(2);
  options.step_factor = std::numeric_limits<std::size_t>::max();  // what "-1" wrapped to
  refused(options, "the step factor must lie in [2, 2^40], got 18446744073709551615");
  options = quick(2);
  options.kernels = "avx512";
  refused(options, "unknown kernels 'avx512' (auto, baseline, avx2)");
  options = quick(2);
  options.reduction_order = "sideways";
  refused(options, "unknown reduction order 'sideways' (fixed, ring, tree, adversarial)");
  options = quick(2);
  options.max_bytes = (std::size_t{1} << 40) + 1;
  refused(options, "chorus bench: max-bytes is larger than 1 TiB");
  options = quick(2);
  options.step_factor = 1;  // one size, again and again
  refused(options, "the step factor must lie in [2, 2^40], got 1");
  options = quick(2);
  options.iters = -1;
  refused(options, "iters and warmup must be at least 0, reps at least 1");
  options = quick(2);
  options.transport = "mpi";
  options.reduction_order = "tree";
  refused(options,
          "reduction order 'tree' is the simulator's: transport mpi reduces in its "
          "library's own order (fixed only)");
}

// Each order reaches the simulator (its mark counts the run's reductions, and no other order's
// mark appears), and the crafted inputs stay exact in every order.
TEST(Bench, ReductionOrderPicksTheSimulatorsOrder) {
  const std::vector<std::string> orders = {"fixed", "ring", "tree", "adversarial"};
  for (const std::string& order : orders) {
    SCOPED_TRACE(order);
    BenchOptions options = quick(4);
    options.ops = {"all_reduce", "reduce_scatter"};
    options.max_bytes = 4096;
    options.memory_probe = false;
    options.dtype = DType::Float16;
    options.reduction_order = order;
    std::ostringstream out;
    const BenchReport report = run_bench(options, out);
    EXPECT_TRUE(report.ok) << out.str();
    EXPECT_NE(out.str().find(", reduction order " + order + ", kernels "), std::string::npos)
        << out.str();
    for (const std::string& other : orders) {
      const auto mark = report.sim_marks.find("reduction." + other);
      if (other == order) {
        ASSERT_NE(mark, report.sim_marks.end());
        EXPECT_GT(mark->second, 0u);
      } else {
        EXPECT_EQ(mark, report.sim_marks.end()) << other;
      }
    }
  }
}

TEST(Bench, SizesWithASignOrSpaceAreRefused) {
  testing::expect_invalid_argument([] { (void)parse_bytes("-1"); }, {"bad size '-1'"});
  testing::expect_invalid_argument([] { (void)parse_bytes("+8"); }, {"bad size '+8'"});
  testing::expect_invalid_argument([] { (void)parse_bytes(" 8"); }, {"bad size ' 8'"});
  testing::expect_invalid_argument([] { (void)parse_bytes(""); }, {"bad size ''"});
}

// Without --check no row is counted (#wrong N/A), and the verdict line says some rows went
// unchecked.
TEST(Bench, UncheckedRowsSayNAAndTheVerdictSaysSo) {
  BenchOptions options = quick(2);
  options.ops = {"all_reduce"};
  options.max_bytes = 16;
  options.check = false;
  std::ostringstream out;
  const BenchReport report = run_bench(options, out);
  EXPECT_TRUE(report.ok) << out.str();
  ASSERT_EQ(report.rows.size(), 2u);  // 8 and 16 bytes
  for (const BenchRow& row : report.rows) {
    EXPECT_EQ(row.wrong, -1);
  }
  EXPECT_NE(out.str().find("# wrong elements: 0 (some rows unchecked) OK\n"), std::string::npos)
      << out.str();
}

// On one rank nothing crosses a bus but a broadcast's bytes: busbw is algbw for broadcast, 0 for
// the others (nccl-tests' factors at n = 1).
TEST(Bench, OneRanksBusFactorsAreOneForBroadcastAndZeroOtherwise) {
  BenchOptions options = quick(1);
  options.ops = {"broadcast", "all_reduce"};
  options.max_bytes = 16;
  std::ostringstream out;
  const BenchReport report = run_bench(options, out);
  EXPECT_TRUE(report.ok) << out.str();
  ASSERT_EQ(report.rows.size(), 4u);
  for (const BenchRow& row : report.rows) {
    EXPECT_EQ(row.busbw_gbps, row.op == "broadcast" ? row.algbw_gbps : 0.0) << row.op;
  }
}

// Adaptive iters (iters 0) are sized from the warmup, which then runs once even when warmup is 0
// (timing no operation made the time per operation 0 / 0, and every batch 1 operation long):
// batches of a minute hold more than one 16-byte all_reduce, up to the adaptive maximum of 1000
// (1 only if that all_reduce took 40 s).
TEST(Bench, AdaptiveItersWithoutWarmupStillTimeTheWarmup) {
  constexpr int kAdaptiveItersMax = 1000;  // bench.cpp's
  BenchOptions options = quick(2);
  options.ops = {"all_reduce"};
  options.max_bytes = 16;
  options.iters = 0;
  options.warmup = 0;
  options.batch_ms = 60'000;
  std::ostringstream out;
  const BenchReport report = run_bench(options, out);
  EXPECT_TRUE(report.ok) << out.str();
  ASSERT_EQ(report.rows.size(), 2u);
  for (const BenchRow& row : report.rows) {
    EXPECT_GT(row.iters, 1) << row.bytes;
    EXPECT_LE(row.iters, kAdaptiveItersMax) << row.bytes;
  }
}

}  // namespace
}  // namespace chorus::props
