#pragma once

// What the example programs share (examples/*.hpp, docs/examples.md): deterministic small-integer
// data, a small row-major matrix, named results compared bitwise, and the guards that prove an
// example's inputs exact.
//
// Note [Exact example inputs]
// Every example compares what each rank holds with a single-rank reference, bitwise. A sum that
// crosses ranks is computed in an order the transport chooses (the simulator's fixed, ring, tree
// or adversarial orders; NCCL's ring), so it equals the reference's sum bitwise only when every
// order gives the same value: when no partial sum rounds. The examples make sure of that:
// - their data are small integers (and dyadic fractions from power-of-two learning rates);
// - a reference that sums across ranks first proves the sum exact with sums_exactly (any order of
//   addends that are multiples of 2^q, whose absolute values add up to less than 2^(q + digits),
//   is exact: every partial sum is such a multiple below 2^(q + digits)), or, for a matrix
//   product whose terms the ranks add in blocks, with require_exact_product (integer factors
//   whose |A| |B| stays below 2^digits);
// - a reference that cannot prove it throws InexactInputs instead of comparing (a world or step
//   count too large for the example's data), so a wrong result is never blamed on rounding.
// Sums within one rank (a rank's own batch, a block of an inner dimension) are computed by the
// same code in the same order on the rank and in the reference, so they need no proof.

#include <algorithm>
#include <charconv>
#include <chorus/check.hpp>
#include <chorus/chorus.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples {

// The reference could not prove a cross-rank sum exact (Note [Exact example inputs]).
class InexactInputs : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wrong result on some rank: names the rank, the result and the first differing element.
class WrongResult : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An integer in [-bound, bound] from (seed, stream, index): every rank, and the reference,
// computes the same data without communicating. A splitmix64 finaliser over the three words.
inline std::int64_t small_integer(std::uint64_t seed, std::uint64_t stream, std::int64_t index,
                                  std::int64_t bound) {
  CHORUS_CHECK(bound >= 0);
  std::uint64_t h = seed * 0x9e3779b97f4a7c15ull ^ (stream + 1) * 0xd1b54a32d192ed03ull ^
                    static_cast<std::uint64_t>(index) * 0xaef17502108ef2d9ull;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  const auto span = static_cast<std::uint64_t>(2 * bound + 1);
  return static_cast<std::int64_t>(h % span) - bound;
}

// Note [Example devices]
// The examples compute on host vectors, as small programs, and communicate tensors placed on the
// rank's device, as GPU programs do: placed(t) moves a host tensor to chorus::local_device()
// before a collective (the rank's GPU under --transport=nccl), host(t) brings a result back
// before the host reads it. On the simulator and MPI the device is the host and both return the
// tensor itself, so nothing is copied there; on NCCL, and on the simulator with --sim-cuda
// (simulated CUDA devices), every collective of an example runs on CUDA tensors that core
// allocated, and every read is a wait on the stream then a copy.
inline chorus::Tensor placed(const chorus::Tensor& tensor) {
  return tensor.to(chorus::local_device());
}
inline chorus::Tensor host(const chorus::Tensor& tensor) {
  return tensor.to(chorus::Device::cpu());
}

// A rows x cols row-major matrix of float or double: the examples' local compute.
template <class T>
struct Matrix {
  static_assert(std::is_floating_point_v<T>);
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<T> values;

  static Matrix zeros(std::int64_t rows, std::int64_t cols) {
    CHORUS_CHECK(rows >= 0 && cols >= 0);
    return Matrix{rows, cols, std::vector<T>(static_cast<std::size_t>(rows * cols), T{0})};
  }
  // Entries small_integer(seed, stream, i, bound), i the row-major index.
  static Matrix generate(std::uint64_t seed, std::uint64_t stream, std::int64_t rows,
                         std::int64_t cols, std::int64_t bound) {
    Matrix m = zeros(rows, cols);
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      m.values[static_cast<std::size_t>(i)] = static_cast<T>(small_integer(seed, stream, i, bound));
    }
    return m;
  }
  // A copy of a 2-d tensor's values (waits for it).
  static Matrix from(const chorus::Tensor& tensor) {
    CHORUS_CHECK_EQ(tensor.dim(), 2);
    return Matrix{tensor.size(0), tensor.size(1), host(tensor).to_vector<T>()};
  }

  T& at(std::int64_t r, std::int64_t c) {
    CHORUS_CHECK(r >= 0 && r < rows && c >= 0 && c < cols);
    return values[static_cast<std::size_t>(r * cols + c)];
  }
  T at(std::int64_t r, std::int64_t c) const {
    CHORUS_CHECK(r >= 0 && r < rows && c >= 0 && c < cols);
    return values[static_cast<std::size_t>(r * cols + c)];
  }
  // Rows [row, row + count) and columns [col, col + col_count).
  Matrix block(std::int64_t row, std::int64_t row_count, std::int64_t col,
               std::int64_t col_count) const {
    CHORUS_CHECK(row >= 0 && row_count >= 0 && row + row_count <= rows);
    CHORUS_CHECK(col >= 0 && col_count >= 0 && col + col_count <= cols);
    Matrix m = zeros(row_count, col_count);
    for (std::int64_t r = 0; r < row_count; ++r) {
      for (std::int64_t c = 0; c < col_count; ++c) {
        m.at(r, c) = at(row + r, col + c);
      }
    }
    return m;
  }
  Matrix row_block(std::int64_t row, std::int64_t count) const {
    return block(row, count, 0, cols);
  }
  Matrix column_block(std::int64_t col, std::int64_t count) const {
    return block(0, rows, col, count);
  }
  Matrix transposed() const {
    Matrix m = zeros(cols, rows);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        m.at(c, r) = at(r, c);
      }
    }
    return m;
  }
  chorus::Tensor tensor() const { return chorus::Tensor::from_vector(values, {rows, cols}); }
};

// a b, summing the inner dimension in index order.
template <class T>
Matrix<T> matmul(const Matrix<T>& a, const Matrix<T>& b) {
  CHORUS_CHECK_EQ(a.cols, b.rows);
  Matrix<T> out = Matrix<T>::zeros(a.rows, b.cols);
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t k = 0; k < a.cols; ++k) {
      for (std::int64_t j = 0; j < b.cols; ++j) {
        out.at(i, j) += a.at(i, k) * b.at(k, j);
      }
    }
  }
  return out;
}

// The exponent of v's lowest set bit: v is an odd multiple of 2^result. v finite and non-zero.
template <class T>
int lowest_bit_exponent(T v) {
  CHORUS_CHECK(std::isfinite(v) && v != T{0});
  constexpr int kDigits = std::numeric_limits<T>::digits;
  int exponent = 0;
  const T fraction = std::frexp(std::fabs(v), &exponent);  // in [0.5, 1)
  auto mantissa = static_cast<std::uint64_t>(std::ldexp(fraction, kDigits));
  int trailing = 0;
  while ((mantissa & 1u) == 0) {
    mantissa >>= 1;
    ++trailing;
  }
  return exponent - kDigits + trailing;
}

// True when adding `addends` in any order gives the same, exact, value (Note [Exact example
// inputs]). The bound is checked against half the limit so that rounding in the running sum of
// absolute values cannot hide an overflow.
template <class T>
bool sums_exactly(const std::vector<T>& addends) {
  constexpr int kDigits = std::numeric_limits<T>::digits;
  int q = std::numeric_limits<int>::max();
  long double magnitude = 0;
  for (const T v : addends) {
    if (!std::isfinite(v)) {
      return false;
    }
    if (v != T{0}) {
      q = std::min(q, lowest_bit_exponent(v));
      magnitude += std::fabs(static_cast<long double>(v));
    }
  }
  return magnitude == 0 || magnitude < std::ldexp(1.0L, q + kDigits - 1);
}

// Throws InexactInputs unless every element of the sum over `per_rank` (one vector per rank, all
// of one length) is exact in any order.
template <class T>
void require_exact_sum(const std::vector<std::vector<T>>& per_rank, const std::string& what) {
  if (per_rank.empty()) {
    return;
  }
  const std::size_t length = per_rank.front().size();
  std::vector<T> addends(per_rank.size());
  for (std::size_t i = 0; i < length; ++i) {
    for (std::size_t r = 0; r < per_rank.size(); ++r) {
      CHORUS_CHECK_EQ(per_rank[r].size(), length);
      addends[r] = per_rank[r][i];
    }
    if (!sums_exactly(addends)) {
      throw InexactInputs(what + ": element " + std::to_string(i) +
                          " would round in some reduction order (too many ranks or steps for "
                          "this example's exact data)");
    }
  }
}

// Throws InexactInputs unless a b is exact however its inner dimension is split into blocks and
// the blocks added: integer entries, and every element of |a| |b| below 2^digits.
template <class T>
void require_exact_product(const Matrix<T>& a, const Matrix<T>& b, const std::string& what) {
  CHORUS_CHECK_EQ(a.cols, b.rows);
  constexpr long double kLimit =
      static_cast<long double>(std::uint64_t{1} << std::numeric_limits<T>::digits);
  for (const Matrix<T>* m : {&a, &b}) {
    for (const T v : m->values) {
      if (!std::isfinite(v) || std::trunc(v) != v) {
        throw InexactInputs(what + ": a factor is not an integer");
      }
    }
  }
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t j = 0; j < b.cols; ++j) {
      long double magnitude = 0;
      for (std::int64_t k = 0; k < a.cols; ++k) {
        magnitude += std::fabs(static_cast<long double>(a.at(i, k))) *
                     std::fabs(static_cast<long double>(b.at(k, j)));
      }
      if (magnitude >= kLimit) {
        throw InexactInputs(what + ": element (" + std::to_string(i) + ", " + std::to_string(j) +
                            ") may round in some reduction order (too many ranks for this "
                            "example's exact data)");
      }
    }
  }
}

// "8 ranks on sim (seed 0)" or "4 ranks on mpi": the world a program runs on, for its first
// line. The seed is the one the simulator runs: CHORUS_SIM_SEED when set (it wins over --seed).
// Call it on a rank.
inline std::string describe_world(const chorus::RunOptions& options) {
  const int size = chorus::world_size();
  std::string text =
      std::to_string(size) + (size == 1 ? " rank on " : " ranks on ") + options.transport;
  if (options.transport == "sim") {
    chorus::sim::SimOptions sim_options;  // as chorus::run makes them: seed_from_environment
    sim_options.seed = options.seed;
    text += " (seed " + std::to_string(chorus::sim::resolved_seed(sim_options)) + ")";
  }
  return text;
}

// chorus::run, except that an error it throws before any rank runs (an unknown or unavailable
// transport) is printed as "<program>: <message>" and becomes exit status 2.
inline int run_ranks(const char* program, const chorus::RunOptions& options,
                     std::function<void()> rank_main) {
  try {
    return chorus::run(options, std::move(rank_main));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return 2;
  }
}

// A result of an example, by name: what a rank holds (maybe still pending) or what the reference
// says it must hold.
struct Result {
  std::string name;
  chorus::Tensor tensor;
};
using Results = std::vector<Result>;

// "element 5: 3 (0x40400000) != expected 4 (0x40800000)" for the first element where `actual` and
// `expected` differ (same dtype and shape), or "" when they are bitwise equal. Waits on both.
inline std::string first_difference(const chorus::Tensor& actual, const chorus::Tensor& expected) {
  const auto describe = [](const auto& a, const auto& b) -> std::string {
    using Element = typename std::decay_t<decltype(a)>::value_type;
    for (std::size_t i = 0; i < a.size(); ++i) {
      static_assert(sizeof(Element) <= sizeof(std::uint64_t));
      std::uint64_t bits_a = 0;
      std::uint64_t bits_b = 0;
      std::memcpy(&bits_a, &a[i], sizeof(Element));
      std::memcpy(&bits_b, &b[i], sizeof(Element));
      if (bits_a != bits_b) {
        char text[160];
        std::snprintf(text, sizeof(text), "element %zu: %.17g (0x%llx) != expected %.17g (0x%llx)",
                      i, static_cast<double>(a[i]), static_cast<unsigned long long>(bits_a),
                      static_cast<double>(b[i]), static_cast<unsigned long long>(bits_b));
        return text;
      }
    }
    return "";
  };
  switch (expected.dtype()) {
    case chorus::DType::Float32:
      return describe(actual.contiguous().to_vector<float>(),
                      expected.contiguous().to_vector<float>());
    case chorus::DType::Float64:
      return describe(actual.contiguous().to_vector<double>(),
                      expected.contiguous().to_vector<double>());
    case chorus::DType::Int64:
      return describe(actual.contiguous().to_vector<std::int64_t>(),
                      expected.contiguous().to_vector<std::int64_t>());
    default:
      return "element bytes differ";
  }
}

// Throws WrongResult, naming the calling rank, the first result that differs and its first
// differing element, unless `actual` and `expected` hold the same names in the same order with
// the same dtype, shape and bytes. Waits on every result first, so that a failure leaves no
// collective un-waited.
inline void require_bitwise_equal(const Results& actual, const Results& expected) {
  const std::string where = "rank " + std::to_string(chorus::rank()) + ": ";
  std::vector<chorus::Tensor> pending;
  for (const Result& result : actual) {
    pending.push_back(result.tensor);
  }
  chorus::wait_tensors(pending);
  if (actual.size() != expected.size()) {
    throw WrongResult(where + std::to_string(actual.size()) + " results, the reference has " +
                      std::to_string(expected.size()));
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    // Both on the host: results live on the rank's device, and a reference may too (it is
    // built with the same helpers).
    const chorus::Tensor a = host(actual[i].tensor);
    const chorus::Tensor e = host(expected[i].tensor);
    CHORUS_CHECK_EQ(actual[i].name, expected[i].name);
    if (a.dtype() != e.dtype() || a.sizes() != e.sizes()) {
      throw WrongResult(where + actual[i].name + " has dtype/shape " + a.to_string(0) +
                        ", the reference " + e.to_string(0));
    }
    if (!a.bitwise_equal(e)) {
      throw WrongResult(where + actual[i].name + " differs from the single-rank reference at " +
                        first_difference(a, e));
    }
  }
}

// The end of every example program's rank function: compares what the rank holds with the
// reference (require_bitwise_equal), checks that no collective is left pending, then agrees with
// every other rank over world() with one all_reduce, so that on any transport every process
// knows whether all ranks matched. Returns normally on every rank when they all did; otherwise
// throws WrongResult on every rank: a rank that differs with its first difference, the others
// with how many ranks differ. SPMD: every rank calls it.
inline void require_reference_on_every_rank(const Results& actual, const Results& expected) {
  const std::string where = "rank " + std::to_string(chorus::rank()) + ": ";
  std::string failure;
  try {
    require_bitwise_equal(actual, expected);
    if (chorus::work_registry_size() != 0) {
      failure = where + std::to_string(chorus::work_registry_size()) +
                " collectives left pending at the end";
    }
  } catch (const WrongResult& error) {
    failure = error.what();
  }
  const auto differing =
      host(chorus::all_reduce(
               placed(chorus::Tensor::full({1}, failure.empty() ? 0 : 1, chorus::DType::Int64)),
               "sum", chorus::world()))
          .item<std::int64_t>();
  if (!failure.empty()) {
    throw WrongResult(failure);
  }
  if (differing != 0) {
    throw WrongResult(where + "matches the reference, but " + std::to_string(differing) +
                      " other rank(s) do not");
  }
}

// Note [Example flags]
// An example reads its own flags from RunOptions::args, what chorus::RunOptions::from_args left
// of the command line. A flag that takes a value is "--name=value" or "--name value", as
// from_args reads "--ranks 4" (joined_flags). Numbers are plain decimal: a sign, a fraction, a
// 0x or trailing junk is refused naming the flag, never read as far as it goes (std::stoll took
// "3abc" as 3 and "0x10" as 0). An argument the example does not know is refused with its
// synopsis (unknown_argument), which --help prints (help_asked). Errors are
// std::invalid_argument; the examples print them and exit with status 2.

// What every example takes before its own flags (chorus::RunOptions::from_args).
inline constexpr const char* kChorusFlags =
    "[--ranks=N] [--seed=S] [--transport=sim|mpi|nccl] [--timeout-ms=T] [simulator flags: "
    "docs/simulator.md]";

// `args` with each "--name value" of a flag in `valued` joined into "--name=value" (a flag in
// `valued` last, with no value after it, is an error).
inline std::vector<std::string> joined_flags(const std::vector<std::string>& args,
                                             std::initializer_list<std::string_view> valued) {
  std::vector<std::string> joined;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const bool takes_value =
        std::find(valued.begin(), valued.end(), std::string_view(args[i])) != valued.end();
    if (!takes_value) {
      joined.push_back(args[i]);
      continue;
    }
    if (i + 1 == args.size()) {
      throw std::invalid_argument("flag " + args[i] + " is missing its value");
    }
    joined.push_back(args[i] + "=" + args[i + 1]);
    ++i;
  }
  return joined;
}

// Whether `args` holds --help (or -h); then prints the usage, `synopsis` being
// "<program> [chorus flags] [--steps=K] ...", on stdout.
inline bool help_asked(const std::vector<std::string>& args, std::string_view synopsis) {
  if (std::none_of(args.begin(), args.end(),
                   [](const std::string& arg) { return arg == "--help" || arg == "-h"; })) {
    return false;
  }
  std::printf("usage: %.*s\n  chorus flags: %s\n", static_cast<int>(synopsis.size()),
              synopsis.data(), kChorusFlags);
  return true;
}

// The error for an argument the example does not take: names it and shows the usage.
inline std::invalid_argument unknown_argument(const std::string& arg, std::string_view synopsis) {
  return std::invalid_argument("unknown argument " + arg + " (usage: " + std::string(synopsis) +
                               "; --help lists the chorus flags)");
}

// The unsigned decimal value of a flag `arg` ("--data-seed=7") after its `prefix` characters
// (Note [Example flags]).
inline std::uint64_t flag_unsigned(const std::string& arg, std::size_t prefix) {
  const std::string name = arg.substr(0, prefix - 1);
  const std::string text = arg.substr(prefix);
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw std::invalid_argument("flag " + name + "='" + text +
                                "' is invalid: expected an unsigned integer in plain decimal" +
                                (error == std::errc::result_out_of_range ? " below 2^64" : ""));
  }
  return value;
}

// The integer value of a flag `arg` ("--steps=3") after its `prefix` characters, from `minimum`
// to `maximum` (at least 0: no flag of the examples is negative; Note [Example flags]).
inline std::int64_t flag_at_least(const std::string& arg, std::size_t prefix, std::int64_t minimum,
                                  std::int64_t maximum = std::numeric_limits<std::int64_t>::max()) {
  CHORUS_CHECK(minimum >= 0 && minimum <= maximum);
  const std::string name = arg.substr(0, prefix - 1);
  const std::string text = arg.substr(prefix);
  const std::string expected =
      maximum == std::numeric_limits<std::int64_t>::max()
          ? "an integer of at least " + std::to_string(minimum)
          : "an integer from " + std::to_string(minimum) + " to " + std::to_string(maximum);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool too_large = error == std::errc::result_out_of_range;
  if (text.empty() || text[0] == '-' || (error != std::errc() && !too_large) ||
      end != text.data() + text.size()) {
    throw std::invalid_argument("flag " + name + "='" + text + "' is invalid: expected " +
                                expected + " in plain decimal");
  }
  if (too_large || value < minimum || value > maximum) {
    throw std::invalid_argument("flag " + name + "='" + text + "' is invalid: expected " +
                                expected);
  }
  return value;
}

}  // namespace examples
