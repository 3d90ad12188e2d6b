// A user's own property: "my tensor-parallel linear layers equal the single-rank layer", checked
// by chorus's runners on generated shapes and inputs, under generated schedules, with a shrunk
// counterexample when wrong.
//
//   tensor_parallel_property                       # 8 simulated ranks, 100 cases per property
//   tensor_parallel_property --ranks=3 --seed=4
//   tensor_parallel_property --runner=lockstep     # the real-transport runner, on simulated ranks
//   tensor_parallel_property --bug=offset          # a planted indexing bug: fails, shrunk
//   tensor_parallel_property --bug=offset --replay-case <token>   # rerun the minimal case
//
// The layers (Megatron-style):
// - column-parallel: rank r holds columns [r*k, (r+1)*k) of W; y_r = x W_r; all_gather along the
//   last dim gives y = x W on every rank.
// - row-parallel: rank r holds rows [r*k, (r+1)*k) of W and the matching columns of x;
//   all_reduce(sum) of x_r W_r gives y = x W.
// Inputs are small integers, so every order of the sums is exact and results compare bitwise.

#include <charconv>
#include <chorus/chorus.hpp>
#include <chorus/props/runner.hpp>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace chorus;

struct LayerCase {
  std::int64_t rows = 1;     // batch rows of x
  std::int64_t inner = 1;    // x's columns (W's rows) per rank, for row-parallel
  std::int64_t columns = 1;  // W's columns per rank, for column-parallel
  std::uint64_t data_seed = 0;
};

// How RapidCheck (and so the counterexample report) prints a case.
void showValue(const LayerCase& c, std::ostream& out) {
  out << "rows=" << c.rows << " inner/rank=" << c.inner << " columns/rank=" << c.columns
      << " data seed=" << c.data_seed;
}

rc::Gen<LayerCase> gen_layer_case(const props::World&) {
  return rc::gen::build<LayerCase>(
      rc::gen::set(&LayerCase::rows, rc::gen::inRange<std::int64_t>(1, 5)),
      rc::gen::set(&LayerCase::inner, rc::gen::inRange<std::int64_t>(1, 4)),
      rc::gen::set(&LayerCase::columns, rc::gen::inRange<std::int64_t>(1, 4)),
      rc::gen::set(&LayerCase::data_seed, rc::gen::arbitrary<std::uint64_t>()));
}

// A small integer in [-3, 3] from (seed, matrix, index): every rank computes the same matrices.
float entry(std::uint64_t seed, std::uint64_t matrix, std::int64_t index) {
  std::uint64_t h = seed * 0x9e3779b97f4a7c15ull + matrix * 0xbf58476d1ce4e5b9ull +
                    static_cast<std::uint64_t>(index);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return static_cast<float>(static_cast<std::int64_t>(h % 7) - 3);
}

// A rows x cols matrix, row-major, as a [rows, cols] Float32 tensor.
struct Matrix {
  std::int64_t rows;
  std::int64_t cols;
  std::vector<float> values;

  static Matrix generate(std::uint64_t seed, std::uint64_t which, std::int64_t rows,
                         std::int64_t cols) {
    Matrix m{rows, cols, {}};
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      m.values.push_back(entry(seed, which, i));
    }
    return m;
  }
  float at(std::int64_t r, std::int64_t c) const {
    return values[static_cast<std::size_t>(r * cols + c)];
  }
  // Columns [first, first + count).
  Matrix columns(std::int64_t first, std::int64_t count) const {
    Matrix m{rows, count, {}};
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = first; c < first + count; ++c) {
        m.values.push_back(at(r, c));
      }
    }
    return m;
  }
  // Rows [first, first + count).
  Matrix row_block(std::int64_t first, std::int64_t count) const {
    Matrix m{count, cols, {}};
    for (std::int64_t r = first; r < first + count; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        m.values.push_back(at(r, c));
      }
    }
    return m;
  }
  Tensor tensor() const { return Tensor::from_vector(values, {rows, cols}); }
};

Matrix matmul(const Matrix& a, const Matrix& b) {
  Matrix out{a.rows, b.cols, std::vector<float>(static_cast<std::size_t>(a.rows * b.cols), 0.0f)};
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t k = 0; k < a.cols; ++k) {
      for (std::int64_t j = 0; j < b.cols; ++j) {
        out.values[static_cast<std::size_t>(i * b.cols + j)] += a.at(i, k) * b.at(k, j);
      }
    }
  }
  return out;
}

bool planted_offset_bug = false;  // --bug=offset: the last rank takes its neighbour's columns

// ---- The user's layers (the code under test)

Tensor column_parallel(const Matrix& x, const Matrix& w, std::int64_t columns_per_rank) {
  std::int64_t first = rank() * columns_per_rank;
  if (planted_offset_bug && rank() == world_size() - 1 && rank() > 0 && x.rows > 2) {
    first -= columns_per_rank;
  }
  const Matrix local = matmul(x, w.columns(first, columns_per_rank));
  return all_gather_tensor(local.tensor(), 1, world());
}

Tensor row_parallel(const Matrix& x, const Matrix& w, std::int64_t inner_per_rank) {
  const std::int64_t first = rank() * inner_per_rank;
  const Matrix partial =
      matmul(x.columns(first, inner_per_rank), w.row_block(first, inner_per_rank));
  return all_reduce(partial.tensor(), "sum", world());
}

// ---- The properties

props::Property column_parallel_property() {
  return props::make_property<LayerCase>(
      "user.column_parallel_linear",
      "column-parallel linear + all_gather equals the single-rank x W", gen_layer_case,
      [](const LayerCase& c, props::Env& env) {
        const std::int64_t features = c.inner * world_size();
        const Matrix x = Matrix::generate(c.data_seed, 0, c.rows, features);
        const Matrix w = Matrix::generate(c.data_seed, 1, features, c.columns * world_size());
        env.require_bitwise_equal(column_parallel(x, w, c.columns), matmul(x, w).tensor(),
                                  "column-parallel output");
      });
}

props::Property row_parallel_property() {
  return props::make_property<LayerCase>(
      "user.row_parallel_linear", "row-parallel linear + all_reduce equals the single-rank x W",
      gen_layer_case, [](const LayerCase& c, props::Env& env) {
        const std::int64_t features = c.inner * world_size();
        const Matrix x = Matrix::generate(c.data_seed, 0, c.rows, features);
        const Matrix w = Matrix::generate(c.data_seed, 1, features, c.columns);
        env.require_bitwise_equal(row_parallel(x, w, c.inner), matmul(x, w).tensor(),
                                  "row-parallel output");
      });
}

constexpr const char* kUsage =
    "tensor_parallel_property [--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [--cases=N] "
    "[--runner=simulator|lockstep] [--bug=offset] [--replay-case TOKEN]";

// --cases: plain decimal, 0 and up (props::check_options refuses 0 with chorus check's message).
int parse_cases(const std::string& text) {
  int cases = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), cases);
  if (text.empty() || text[0] == '-' || error != std::errc() || end != text.data() + text.size()) {
    throw std::invalid_argument("flag --cases='" + text +
                                "' is invalid: expected an integer from 0 to 2147483647");
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const RunOptions run_options = RunOptions::from_args(argc, argv);
    std::string runner = "simulator";
    std::string replay_case;
    props::CheckOptions options;
    options.ranks = run_options.ranks;
    options.seed = run_options.seed;
    for (std::size_t i = 0; i < run_options.args.size(); ++i) {
      std::string arg = run_options.args[i];
      if ((arg == "--bug" || arg == "--runner" || arg == "--replay-case" || arg == "--cases") &&
          i + 1 < run_options.args.size()) {
        arg += "=" + run_options.args[++i];  // "--cases 40", as from_args reads "--ranks 4"
      }
      if (arg == "--bug=offset") {
        planted_offset_bug = true;
      } else if (arg.rfind("--runner=", 0) == 0) {
        runner = arg.substr(9);
      } else if (arg.rfind("--replay-case=", 0) == 0) {
        replay_case = arg.substr(14);
      } else if (arg.rfind("--cases=", 0) == 0) {
        options.cases = parse_cases(arg.substr(8));
      } else if (arg == "--help" || arg == "-h") {
        std::cout << "usage: " << kUsage << "\n";
        return 0;
      } else {
        std::cerr << "tensor_parallel_property: unknown argument " << arg << " (usage: " << kUsage
                  << ")\n";
        return 2;
      }
    }
    if (runner != "simulator" && runner != "lockstep") {
      std::cerr << "tensor_parallel_property: --runner must be simulator or lockstep\n";
      return 2;
    }
    // Out-of-range options are refused here, once, before any rank starts (exit 2).
    props::check_options(options);
    const std::vector<props::Property> properties = {column_parallel_property(),
                                                     row_parallel_property()};
    if (!replay_case.empty()) {
      const props::Replay replayed = props::replay(properties, replay_case);
      std::cout << props::replay_text(replayed, replay_case);
      return replayed.result.verdict == props::Verdict::Failed ? 1 : 0;
    }
    props::CheckReport report;
    bool prints = true;  // whether this process prints the report
    if (run_options.transport == "sim" && runner == "simulator") {
      report = props::check_on_simulator(properties, options);
    } else {
      // The lockstep runner: the same properties on any transport, every rank in step. Every
      // rank returns the same, agreed, report: each process keeps one of its ranks' (under
      // mpirun its only rank's) for its exit status, and the process of rank 0 prints it.
      std::mutex mutex;
      bool kept = false;
      prints = false;
      const int status = run(run_options, [&] {
        props::CheckReport mine = props::check_in_lockstep(properties, options);
        const std::lock_guard<std::mutex> lock(mutex);
        if (!kept) {
          report = std::move(mine);
          kept = true;
        }
        prints = prints || rank() == 0;
      });
      if (status != 0) {
        return status;
      }
    }
    if (prints) {
      for (const props::PropertyResult& result : report.results) {
        if (result.verdict == props::Verdict::Failed) {
          const std::string replay_with =
              std::string(argv[0]) + (planted_offset_bug ? " --bug=offset" : "") + " --replay-case";
          std::cout << props::failure_report(result, replay_with) << "\n";
        }
      }
      std::cout << props::summary_table(report);
    }
    return report.passed() ? 0 : 1;
  } catch (const std::exception& error) {
    std::cerr << "tensor_parallel_property: " << error.what() << "\n";
    return 2;
  }
}
