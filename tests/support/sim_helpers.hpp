#pragma once

// Helpers shared by the suites that run ranks on the simulator: running ranks quietly, rank lists
// and labels, element types, the scalar reference of Note [Reduction order] (chorus/kernels.hpp),
// bitwise comparison of results, and errors raised on a rank.
//
// The reference folds in group-rank order; integers wrap; Float16/BFloat16 accumulate in float
// and round once; avg = sum / n (integers truncate toward zero); premul_sum = sum of f * x; min
// and max propagate NaN; Bool min = band = and, max = bor = or, bxor = xor.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "chorus/collectives.hpp"
#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/group.hpp"
#include "chorus/half.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/tensor.hpp"
#include "support/expect_error.hpp"

namespace chorus::testing {

// ---------------------------------------------------------------------------------------------
// Running ranks.

// Options for `world_size` ranks on `seed` that print no failure and ignore CHORUS_SIM_SEED.
inline sim::SimOptions quiet_options(int world_size, std::uint64_t seed = 0) {
  sim::SimOptions options;
  options.world_size = world_size;
  options.seed = seed;
  options.print_failures = false;
  options.seed_from_environment = false;
  return options;
}

// Runs `rank_main` once on each of `world_size` simulated ranks, with quiet_options.
inline sim::SimReport run_quietly(int world_size, const std::function<void()>& rank_main,
                                  std::uint64_t seed = 0) {
  return sim::run(quiet_options(world_size, seed), rank_main);
}

// Runs `body` on every rank, catching a chorus::Error per rank (indexed by rank).
inline std::vector<CaughtError> run_catching(int world_size, const std::function<void()>& body,
                                             std::uint64_t seed = 0) {
  std::vector<CaughtError> outcomes(static_cast<std::size_t>(world_size));
  sim::run(quiet_options(world_size, seed), [&] {
    CaughtError& outcome = outcomes[static_cast<std::size_t>(rank())];
    try {
      body();
    } catch (const Error& error) {
      outcome = caught_error(error);
    }
  });
  return outcomes;
}

// ---------------------------------------------------------------------------------------------
// Parameters.

// Always world size 1 and non-powers of two (STYLE "Tests").
inline constexpr int kWorldSizes[] = {1, 2, 3, 4, 8};
// Cross-rank disagreements need two ranks.
inline constexpr int kMultiRankWorldSizes[] = {2, 3, 4, 8};

using SweepParam = std::tuple<int, DType>;

// "W<world size>_<dtype>".
inline std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  return "W" + std::to_string(std::get<0>(info.param)) + "_" +
         std::string(dtype_name(std::get<1>(info.param)));
}

// "W<world size>".
inline std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "W" + std::to_string(info.param);
}

// ---------------------------------------------------------------------------------------------
// Indices, rank lists, shapes.

// `index` as a container index.
inline std::size_t to_index(std::int64_t index) { return static_cast<std::size_t>(index); }

// The calling rank as a container index.
inline std::size_t rank_slot() { return static_cast<std::size_t>(rank()); }

// first, first + 1, ..., first + count - 1.
inline std::vector<int> first_ranks(int count, int first = 0) {
  std::vector<int> ranks;
  for (int r = first; r < first + count; ++r) {
    ranks.push_back(r);
  }
  return ranks;
}

// count - 1, ..., 1, 0.
inline std::vector<int> reversed_ranks(int count) {
  std::vector<int> ranks;
  for (int r = count - 1; r >= 0; --r) {
    ranks.push_back(r);
  }
  return ranks;
}

// The src_dst list in which group rank m sends to m + 1 (mod `size`).
inline std::vector<int> cyclic_shift(int size) {
  std::vector<int> src_dst;
  for (int m = 0; m < size; ++m) {
    src_dst.push_back((m + 1) % size);
  }
  return src_dst;
}

// The position of `r` in `ranks`, or -1.
inline int position_of(const std::vector<int>& ranks, int r) {
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == r) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// How errors name the group of `members` with `tag`: "[0, 1]" or "'tag' [0, 1]".
inline std::string group_label(const std::vector<int>& members, const std::string& tag = "") {
  return ExpandedGroup{tag, members, static_cast<int>(members.size())}.to_string();
}

// How errors name the world of `world_size` ranks.
inline std::string world_label(int world_size) { return group_label(first_ranks(world_size)); }

// The number of elements of `shape`.
inline std::int64_t element_count(const Shape& shape) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) {
    count *= size;
  }
  return count;
}

// The sum of `values` (split sizes).
inline std::int64_t sum_of(const std::vector<std::int64_t>& values) {
  std::int64_t sum = 0;
  for (std::int64_t value : values) {
    sum += value;
  }
  return sum;
}

// `dim` of an `ndim`-d tensor made non-negative (a 0-d tensor counts as 1-d).
inline std::int64_t normalized_dim(std::int64_t dim, std::size_t ndim) {
  const auto n = static_cast<std::int64_t>(std::max<std::size_t>(ndim, 1));
  return dim < 0 ? dim + n : dim;
}

// "[a, b, c]" (a shape, or any list of numbers).
template <class T>
std::string list_text(const std::vector<T>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += (i > 0 ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

// ---------------------------------------------------------------------------------------------
// Element types.

template <class T>
struct ElementType {
  using type = T;
};

// Calls fn(ElementType<T>{}) with the C++ element type T of `dtype`.
template <class Fn>
void visit_element_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Bool:
      return fn(ElementType<bool>{});
    case DType::UInt8:
      return fn(ElementType<std::uint8_t>{});
    case DType::Int8:
      return fn(ElementType<std::int8_t>{});
    case DType::Int32:
      return fn(ElementType<std::int32_t>{});
    case DType::Int64:
      return fn(ElementType<std::int64_t>{});
    case DType::Float16:
      return fn(ElementType<Half>{});
    case DType::BFloat16:
      return fn(ElementType<BFloat16>{});
    case DType::Float32:
      return fn(ElementType<float>{});
    case DType::Float64:
      return fn(ElementType<double>{});
    case DType::Complex64:
      return fn(ElementType<std::complex<float>>{});
    case DType::Complex128:
      return fn(ElementType<std::complex<double>>{});
  }
  ADD_FAILURE() << "unknown dtype " << static_cast<int>(dtype);
}

template <class T>
inline constexpr bool kIsBool = std::is_same_v<T, bool>;
template <class T>
inline constexpr bool kIsInteger = std::is_integral_v<T> && !kIsBool<T>;
template <class T>
inline constexpr bool kIsHalfLike = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <class T>
inline constexpr bool kIsFloating = kIsHalfLike<T> || std::is_floating_point_v<T>;

// value(0), value(1), ..., value(count - 1).
template <class T, class ValueFn>
std::vector<T> values_of(std::int64_t count, ValueFn value) {
  std::vector<T> out;
  for (std::int64_t i = 0; i < count; ++i) {
    out.push_back(value(i));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The scalar reference (Note [Reduction order]).

// The type a floating reduction accumulates in.
template <class T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<Half> {
  using type = float;
};
template <>
struct Accumulator<BFloat16> {
  using type = float;
};

// The reduction of `column` (one element of every member's input, in group-rank order).
template <class T>
T reference_element(const std::vector<T>& column, const ReduceOp& op) {
  using Kind = ReduceOp::Kind;
  const std::size_t n = column.size();
  const Kind kind = op.kind();
  if constexpr (kIsBool<T>) {
    bool acc = column[0];
    for (std::size_t j = 1; j < n; ++j) {
      const bool value = column[j];
      if (kind == Kind::Min || kind == Kind::BAnd) {
        acc = acc && value;
      } else if (kind == Kind::Max || kind == Kind::BOr) {
        acc = acc || value;
      } else if (kind == Kind::BXor) {
        acc = acc != value;
      } else {
        ADD_FAILURE() << "reference: " << op << " on Bool";
      }
    }
    return acc;
  } else if constexpr (kIsInteger<T>) {
    // Unsigned 64-bit arithmetic on the sign-extended values, truncated once: the same residues
    // as wrapping at every step.
    const auto widen = [](T value) {
      return static_cast<std::uint64_t>(static_cast<std::int64_t>(value));
    };
    std::uint64_t acc = widen(column[0]);
    T best = column[0];
    for (std::size_t j = 1; j < n; ++j) {
      const T value = column[j];
      switch (kind) {
        case Kind::Sum:
        case Kind::Avg:
          acc += widen(value);
          break;
        case Kind::Product:
          acc *= widen(value);
          break;
        case Kind::BAnd:
          acc &= widen(value);
          break;
        case Kind::BOr:
          acc |= widen(value);
          break;
        case Kind::BXor:
          acc ^= widen(value);
          break;
        case Kind::Min:
          best = value < best ? value : best;
          break;
        case Kind::Max:
          best = value > best ? value : best;
          break;
        default:
          ADD_FAILURE() << "reference: " << op << " on an integer";
      }
    }
    if (kind == Kind::Min || kind == Kind::Max) {
      return best;
    }
    if (kind == Kind::Avg) {  // the wrapped sum, divided toward zero
      const T sum = static_cast<T>(acc);
      return static_cast<T>(static_cast<std::int64_t>(sum) / static_cast<std::int64_t>(n));
    }
    return static_cast<T>(acc);
  } else if constexpr (kIsFloating<T>) {
    using Acc = typename Accumulator<T>::type;
    const auto factor = static_cast<Acc>(op.premul_factor());
    const auto load = [](T value) { return static_cast<Acc>(value); };
    Acc acc = load(column[0]);
    if (kind == Kind::PremulSum) {
      acc = factor * acc;
    }
    for (std::size_t j = 1; j < n; ++j) {
      const Acc value = load(column[j]);
      switch (kind) {
        case Kind::Sum:
        case Kind::Avg:
          acc = acc + value;
          break;
        case Kind::Product:
          acc = acc * value;
          break;
        case Kind::PremulSum:
          acc = acc + factor * value;
          break;
        case Kind::Min:  // NaN propagates
          if (value < acc || (std::isnan(value) && !std::isnan(acc))) {
            acc = value;
          }
          break;
        case Kind::Max:
          if (value > acc || (std::isnan(value) && !std::isnan(acc))) {
            acc = value;
          }
          break;
        default:
          ADD_FAILURE() << "reference: " << op << " on a floating dtype";
      }
    }
    if (kind == Kind::Avg) {
      acc = acc / static_cast<Acc>(n);
    }
    return T(acc);  // Float16/BFloat16: rounded to nearest even once
  } else {
    using F = typename T::value_type;
    const auto factor = static_cast<F>(op.premul_factor());
    T acc = kind == Kind::PremulSum ? factor * column[0] : column[0];
    for (std::size_t j = 1; j < n; ++j) {
      if (kind == Kind::Sum || kind == Kind::Avg) {
        acc = acc + column[j];
      } else if (kind == Kind::PremulSum) {
        acc = acc + factor * column[j];
      } else {
        ADD_FAILURE() << "reference: " << op << " on a complex dtype";
      }
    }
    if (kind == Kind::Avg) {
      acc = acc / static_cast<F>(n);
    }
    return acc;
  }
}

// The elementwise reduction of `inputs` (one per member, in group-rank order).
template <class T>
std::vector<T> reference_reduce(const std::vector<std::vector<T>>& inputs, const ReduceOp& op) {
  const std::size_t count = inputs.front().size();
  std::vector<T> out;
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<T> column;
    for (const std::vector<T>& input : inputs) {
      column.push_back(input[i]);
    }
    out.push_back(reference_element(column, op));
  }
  return out;
}

// Whether `T` admits `kind` by DESIGN 2.3/2.7, as the tests read the rules: bitwise ops need an
// integer or Bool dtype; complex takes only sum, avg and premul_sum; Bool only min, max, band,
// bor, bxor; premul_sum needs a floating or complex dtype.
template <class T>
bool op_allowed(ReduceOp::Kind kind) {
  using Kind = ReduceOp::Kind;
  if constexpr (kIsBool<T>) {
    return kind == Kind::Min || kind == Kind::Max || kind == Kind::BAnd || kind == Kind::BOr ||
           kind == Kind::BXor;
  } else if constexpr (kIsInteger<T>) {
    return kind != Kind::PremulSum;
  } else if constexpr (kIsFloating<T>) {
    return kind != Kind::BAnd && kind != Kind::BOr && kind != Kind::BXor;
  } else {
    return kind == Kind::Sum || kind == Kind::Avg || kind == Kind::PremulSum;
  }
}

// Every op, premul_sum with a fractional and a negative factor (both exact, so f * x is exact
// whatever precision the factor is applied in).
inline std::vector<ReduceOp> all_ops() {
  return {"sum",
          "avg",
          "product",
          "min",
          "max",
          "band",
          "bor",
          "bxor",
          ReduceOp::premul_sum(0.5),
          ReduceOp::premul_sum(-3.0)};
}

// The ops of all_ops() that `T` admits, in that order.
template <class T>
std::vector<ReduceOp> allowed_ops() {
  std::vector<ReduceOp> out;
  for (const ReduceOp& op : all_ops()) {
    if (op_allowed<T>(op.kind())) {
      out.push_back(op);
    }
  }
  return out;
}

// (outer, size along dim, inner) of a non-empty `shape` around `dim` (non-negative).
inline std::tuple<std::int64_t, std::int64_t, std::int64_t> split_around(const Shape& shape,
                                                                         std::int64_t dim) {
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<std::int64_t>(d) < dim) {
      outer *= shape[d];
    } else if (static_cast<std::int64_t>(d) > dim) {
      inner *= shape[d];
    }
  }
  return {outer, shape[to_index(dim)], inner};
}

// Concatenation of `parts` (each of `shape`, in group-rank order) along `dim` (non-negative); a
// 0-d shape stacks the parts.
template <class T>
std::vector<T> reference_concat(const std::vector<std::vector<T>>& parts, const Shape& shape,
                                std::int64_t dim) {
  std::vector<T> out;
  if (shape.empty()) {
    for (const std::vector<T>& part : parts) {
      out.push_back(part.at(0));
    }
    return out;
  }
  const auto [outer, size, inner] = split_around(shape, dim);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const std::vector<T>& part : parts) {
      for (std::int64_t k = 0; k < size * inner; ++k) {
        out.push_back(part[to_index(o * size * inner + k)]);
      }
    }
  }
  return out;
}

// Chunk `chunk` of `count` equal chunks of `values` (of `shape`) along `dim` (non-negative).
template <class T>
std::vector<T> reference_chunk(const std::vector<T>& values, const Shape& shape, std::int64_t dim,
                               std::int64_t chunk, std::int64_t count) {
  const auto [outer, size, inner] = split_around(shape, dim);
  const std::int64_t block = size / count * inner;
  std::vector<T> out;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t k = 0; k < block; ++k) {
      out.push_back(values[to_index(o * size * inner + chunk * block + k)]);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Results, compared bitwise.

using Bytes = std::vector<std::uint8_t>;

// The bytes of `values` as a tensor of their dtype holds them (Bool: one byte, 0 or 1).
template <class T>
Bytes bytes_of(const std::vector<T>& values) {
  if constexpr (kIsBool<T>) {
    return Bytes(values.begin(), values.end());
  } else {
    Bytes out(values.size() * sizeof(T));
    if (!out.empty()) {
      std::memcpy(out.data(), values.data(), out.size());
    }
    return out;
  }
}

// The bytes of `tensor`'s elements in row-major order (waits for a pending tensor).
inline Bytes tensor_bytes(const Tensor& tensor) {
  const Tensor contiguous = tensor.contiguous();
  Bytes out(contiguous.nbytes());
  if (!out.empty()) {
    std::memcpy(out.data(), contiguous.unsafe_data_ptr(), out.size());
  }
  return out;
}

// A collective's result as read on one rank.
struct Result {
  Shape sizes;
  DType dtype = DType::Float32;
  Bytes bytes;
};

// `tensor` read into a Result (waits for a pending tensor).
inline Result capture(const Tensor& tensor) {
  return Result{tensor.sizes(), tensor.dtype(), tensor_bytes(tensor)};
}

// Runs `issue` on every rank of a `world_size`-rank simulation and captures the outputs it
// returns (all issued before any is read), indexed by rank.
inline std::vector<std::vector<Result>> capture_every_rank(
    int world_size, const std::function<std::vector<Tensor>()>& issue) {
  std::vector<std::vector<Result>> results(static_cast<std::size_t>(world_size));
  run_quietly(world_size, [&] {
    for (const Tensor& output : issue()) {
      results[rank_slot()].push_back(capture(output));
    }
  });
  return results;
}

// Bytes [begin, begin + count) of `bytes` in hexadecimal.
inline std::string hex(const Bytes& bytes, std::size_t begin, std::size_t count) {
  std::ostringstream out;
  for (std::size_t i = begin; i < begin + count && i < bytes.size(); ++i) {
    out << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(bytes[i]);
  }
  return out.str();
}

// `actual` equals `expected` byte for byte; a failure names the first differing element.
inline ::testing::AssertionResult same_bytes(const Bytes& actual, const Bytes& expected,
                                             std::size_t element_size) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual.size() << " bytes, expected " << expected.size();
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i]) {
      const std::size_t element = i / element_size;
      const std::size_t begin = element * element_size;
      return ::testing::AssertionFailure() << "first difference at element " << element
                                           << ": bytes 0x" << hex(actual, begin, element_size)
                                           << ", expected 0x" << hex(expected, begin, element_size);
    }
  }
  return ::testing::AssertionSuccess();
}

// `actual` has `shape`, T's dtype, and the bytes of `expected`.
template <class T>
::testing::AssertionResult matches(const Result& actual, const Shape& shape,
                                   const std::vector<T>& expected) {
  if (actual.sizes != shape) {
    return ::testing::AssertionFailure()
           << "shape " << list_text(actual.sizes) << ", expected " << list_text(shape);
  }
  if (actual.dtype != dtype_of<T>) {
    return ::testing::AssertionFailure()
           << "dtype " << actual.dtype << ", expected " << dtype_of<T>;
  }
  return same_bytes(actual.bytes, bytes_of(expected), element_size(dtype_of<T>));
}

// As above, for a tensor (waits for a pending tensor).
template <class T>
::testing::AssertionResult matches(const Tensor& actual, const Shape& shape,
                                   const std::vector<T>& expected) {
  return matches(capture(actual), shape, expected);
}

// `actual` and `expected` have the same shape, dtype and bytes.
inline ::testing::AssertionResult same_result(const Result& actual, const Result& expected) {
  if (actual.sizes != expected.sizes || actual.dtype != expected.dtype) {
    return ::testing::AssertionFailure()
           << list_text(actual.sizes) << " " << actual.dtype << ", expected "
           << list_text(expected.sizes) << " " << expected.dtype;
  }
  return same_bytes(actual.bytes, expected.bytes, element_size(actual.dtype));
}

// ---------------------------------------------------------------------------------------------
// Errors raised on a rank.

// Where an error raised on a rank must say it happened: always the op; seq and group when set
// (an error in forming the group has no group and no sequence number to name).
struct ErrorSite {
  std::string op;
  std::optional<std::int64_t> seq;
  std::optional<std::string> group;
};

// Runs `statement` on the calling rank, expecting expect_error<E>(statement, fragments) whose
// context names this rank and `site`; with seq and group both set, what() must also start with
// "chorus::<Code>: [rank R] <op> #<seq> on group <group>: " (no " #<seq>" for seq -1, no group
// part for group "").
template <class E = InvalidArgument>
CaughtError expect_error_on_rank(const std::function<void()>& statement,
                                 const std::vector<std::string>& fragments, const ErrorSite& site,
                                 int line = __builtin_LINE()) {
  CaughtError caught = expect_error<E>(statement, fragments, line);
  if (!caught.code.has_value()) {
    return caught;
  }
  EXPECT_EQ(caught.context.rank, rank()) << "line " << line << ": " << caught.what;
  EXPECT_EQ(caught.context.op, site.op) << "line " << line << ": " << caught.what;
  if (site.seq.has_value()) {
    EXPECT_EQ(caught.context.seq, *site.seq) << "line " << line << ": " << caught.what;
  }
  if (site.group.has_value()) {
    EXPECT_EQ(caught.context.group, *site.group) << "line " << line << ": " << caught.what;
  }
  if (site.seq.has_value() && site.group.has_value()) {
    std::string prefix = "chorus::" + std::string(error_code_name(error_code_of<E>())) +
                         ": [rank " + std::to_string(rank()) + "] " + site.op;
    if (*site.seq >= 0) {
      prefix += " #" + std::to_string(*site.seq);
    }
    if (!site.group->empty()) {
      prefix += " on group " + *site.group;
    }
    prefix += ": ";
    EXPECT_EQ(caught.what.rfind(prefix, 0), 0u) << "line " << line << ": \"" << caught.what
                                                << "\" does not start with \"" << prefix << "\"";
  }
  return caught;
}

}  // namespace chorus::testing
