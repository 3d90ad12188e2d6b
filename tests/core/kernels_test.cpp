#include "chorus/kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/half.hpp"
#include "chorus/reduce_op.hpp"
#include "support/kernel_isa.hpp"

namespace chorus::kernels {
namespace {

using chorus::testing::IsaRestorer;
using chorus::testing::supported_isas;

using Kind = ReduceOp::Kind;
using Bytes = std::vector<unsigned char>;

constexpr Kind kAllKinds[] = {Kind::Sum,  Kind::Max, Kind::Min,  Kind::Product,  Kind::Avg,
                              Kind::BAnd, Kind::BOr, Kind::BXor, Kind::PremulSum};
constexpr std::size_t kNumSrcsSweep[] = {1, 2, 3, 4, 8};
// 1024 is the kernel's block length: cover one short block, exact blocks and ragged tails.
constexpr std::size_t kCountSweep[] = {0, 1, 7, 1024, 1025, 2049};
// Not a power of two, so premul_sum exercises the conversion of the factor to float.
constexpr double kPremulFactor = 0.3;
constexpr std::uint64_t kMaxSweepSrcs = 8;

// ---------------------------------------------------------------------------------------------
// Raw element access (memcpy, so any byte buffer can be read as any element type).

template <class T>
T load_at(const Bytes& buffer, std::size_t index) {
  T value;
  std::memcpy(&value, buffer.data() + index * sizeof(T), sizeof(T));
  return value;
}

template <class T>
void store_at(Bytes& buffer, std::size_t index, T value) {
  std::memcpy(buffer.data() + index * sizeof(T), &value, sizeof(T));
}

template <class T>
Bytes bytes_of(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  if (!values.empty()) {
    std::memcpy(out.data(), values.data(), out.size());
  }
  return out;
}

std::vector<const void*> pointers_to(const std::vector<Bytes>& buffers) {
  std::vector<const void*> out;
  out.reserve(buffers.size());
  for (const Bytes& buffer : buffers) {
    out.push_back(buffer.data());
  }
  return out;
}

std::uint16_t bits_of_half(float value) { return float_to_half_bits(value); }
std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }
std::uint64_t bits_of(double value) { return std::bit_cast<std::uint64_t>(value); }

bool is_half_nan(std::uint16_t bits) { return (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0; }
bool is_bfloat16_nan(std::uint16_t bits) {
  return (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0;
}

// ---------------------------------------------------------------------------------------------
// Which ops the tests expect each dtype to take, stated from the ReduceOp::check_dtype doc.

bool expected_allowed(Kind kind, DType dtype) {
  const bool bitwise = kind == Kind::BAnd || kind == Kind::BOr || kind == Kind::BXor;
  if (bitwise) {
    return is_integer(dtype) || dtype == DType::Bool;
  }
  if (is_complex(dtype)) {
    return kind == Kind::Sum || kind == Kind::Avg || kind == Kind::PremulSum;
  }
  if (dtype == DType::Bool) {
    return kind == Kind::Min || kind == Kind::Max;
  }
  if (kind == Kind::PremulSum) {
    return is_floating(dtype);
  }
  return true;
}

ReduceOp make_op(Kind kind) {
  return kind == Kind::PremulSum ? ReduceOp::premul_sum(kPremulFactor) : ReduceOp(kind);
}

// ---------------------------------------------------------------------------------------------
// Reference fold: one element at a time, srcs[0], srcs[1], ... as Note [Reduction order] says.

bool reference_bool(Kind kind, const std::vector<Bytes>& srcs, std::size_t i) {
  std::size_t ones = 0;
  for (const Bytes& src : srcs) {
    ones += src[i] != 0 ? 1 : 0;
  }
  switch (kind) {
    case Kind::Min:
    case Kind::BAnd:
      return ones == srcs.size();
    case Kind::Max:
    case Kind::BOr:
      return ones > 0;
    case Kind::BXor:
      return ones % 2 == 1;
    default:
      ADD_FAILURE() << "no Bool reference for " << reduce_kind_name(kind);
      return false;
  }
}

template <class S>
S reference_integer(Kind kind, const std::vector<Bytes>& srcs, std::size_t i) {
  using U = std::make_unsigned_t<S>;
  U acc = static_cast<U>(load_at<S>(srcs[0], i));
  for (std::size_t j = 1; j < srcs.size(); ++j) {
    const S value = load_at<S>(srcs[j], i);
    const auto bits = static_cast<U>(value);
    switch (kind) {
      case Kind::Sum:
      case Kind::Avg:
        acc = static_cast<U>(acc + bits);
        break;
      case Kind::Product:
        acc = static_cast<U>(acc * bits);
        break;
      case Kind::Min:
        acc = value < static_cast<S>(acc) ? bits : acc;
        break;
      case Kind::Max:
        acc = value > static_cast<S>(acc) ? bits : acc;
        break;
      case Kind::BAnd:
        acc = static_cast<U>(acc & bits);
        break;
      case Kind::BOr:
        acc = static_cast<U>(acc | bits);
        break;
      case Kind::BXor:
        acc = static_cast<U>(acc ^ bits);
        break;
      default:
        ADD_FAILURE() << "no integer reference for " << reduce_kind_name(kind);
    }
  }
  if (kind == Kind::Avg) {
    if constexpr (std::is_signed_v<S>) {
      return static_cast<S>(static_cast<std::int64_t>(static_cast<S>(acc)) /
                            static_cast<std::int64_t>(srcs.size()));
    } else {
      return static_cast<S>(acc / srcs.size());
    }
  }
  return static_cast<S>(acc);
}

// `value(j)` gives source j's element already in the accumulation type F.
template <class F, class ValueOf>
F reference_floating(Kind kind, std::size_t num_srcs, ValueOf value) {
  const auto factor = static_cast<F>(kPremulFactor);
  const auto prepared = [&](std::size_t j) {
    return kind == Kind::PremulSum ? factor * value(j) : value(j);
  };
  F acc = prepared(0);
  for (std::size_t j = 1; j < num_srcs; ++j) {
    const F x = prepared(j);
    switch (kind) {
      case Kind::Sum:
      case Kind::Avg:
      case Kind::PremulSum:
        acc = acc + x;
        break;
      case Kind::Product:
        acc = acc * x;
        break;
      case Kind::Min:
        if (!std::isnan(acc) && (std::isnan(x) || x < acc)) {
          acc = x;
        }
        break;
      case Kind::Max:
        if (!std::isnan(acc) && (std::isnan(x) || x > acc)) {
          acc = x;
        }
        break;
      default:
        ADD_FAILURE() << "no floating reference for " << reduce_kind_name(kind);
    }
  }
  return kind == Kind::Avg ? acc / static_cast<F>(num_srcs) : acc;
}

template <class F>
std::complex<F> reference_complex(Kind kind, const std::vector<Bytes>& srcs, std::size_t i) {
  const auto factor = static_cast<F>(kPremulFactor);
  std::complex<F> acc{};
  for (std::size_t j = 0; j < srcs.size(); ++j) {
    auto x = load_at<std::complex<F>>(srcs[j], i);
    if (kind == Kind::PremulSum) {
      x = factor * x;
    }
    acc = j == 0 ? x : acc + x;
  }
  if (kind == Kind::Avg) {
    acc = acc / static_cast<F>(srcs.size());
  }
  return acc;
}

Bytes reference_reduce(const std::vector<Bytes>& srcs, std::size_t count, DType dtype, Kind kind) {
  Bytes out(count * element_size(dtype));
  const std::size_t n = srcs.size();
  for (std::size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::Bool:
        store_at<std::uint8_t>(out, i, reference_bool(kind, srcs, i) ? 1 : 0);
        break;
      case DType::UInt8:
        store_at(out, i, reference_integer<std::uint8_t>(kind, srcs, i));
        break;
      case DType::Int8:
        store_at(out, i, reference_integer<std::int8_t>(kind, srcs, i));
        break;
      case DType::Int32:
        store_at(out, i, reference_integer<std::int32_t>(kind, srcs, i));
        break;
      case DType::Int64:
        store_at(out, i, reference_integer<std::int64_t>(kind, srcs, i));
        break;
      case DType::Float16:
        store_at(out, i, float_to_half_bits(reference_floating<float>(kind, n, [&](std::size_t j) {
                   return half_bits_to_float(load_at<std::uint16_t>(srcs[j], i));
                 })));
        break;
      case DType::BFloat16:
        store_at(out, i,
                 float_to_bfloat16_bits(reference_floating<float>(kind, n, [&](std::size_t j) {
                   return bfloat16_bits_to_float(load_at<std::uint16_t>(srcs[j], i));
                 })));
        break;
      case DType::Float32:
        store_at(out, i, reference_floating<float>(kind, n, [&](std::size_t j) {
                   return load_at<float>(srcs[j], i);
                 }));
        break;
      case DType::Float64:
        store_at(out, i, reference_floating<double>(kind, n, [&](std::size_t j) {
                   return load_at<double>(srcs[j], i);
                 }));
        break;
      case DType::Complex64:
        store_at(out, i, reference_complex<float>(kind, srcs, i));
        break;
      case DType::Complex128:
        store_at(out, i, reference_complex<double>(kind, srcs, i));
        break;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison: bitwise, except that any NaN matches any NaN. IEEE 754 leaves the payload (and
// sign) of a NaN produced by arithmetic unspecified, and compilers may commute the operands of +.

template <class F>
bool floating_bits_match(F expected, F actual) {
  return bits_of(expected) == bits_of(actual) || (std::isnan(expected) && std::isnan(actual));
}

bool element_matches(DType dtype, const Bytes& expected, const Bytes& actual, std::size_t i) {
  switch (dtype) {
    case DType::Float16: {
      const auto e = load_at<std::uint16_t>(expected, i);
      const auto a = load_at<std::uint16_t>(actual, i);
      return e == a || (is_half_nan(e) && is_half_nan(a));
    }
    case DType::BFloat16: {
      const auto e = load_at<std::uint16_t>(expected, i);
      const auto a = load_at<std::uint16_t>(actual, i);
      return e == a || (is_bfloat16_nan(e) && is_bfloat16_nan(a));
    }
    case DType::Float32:
      return floating_bits_match(load_at<float>(expected, i), load_at<float>(actual, i));
    case DType::Float64:
      return floating_bits_match(load_at<double>(expected, i), load_at<double>(actual, i));
    case DType::Complex64:
      return floating_bits_match(load_at<float>(expected, 2 * i), load_at<float>(actual, 2 * i)) &&
             floating_bits_match(load_at<float>(expected, 2 * i + 1),
                                 load_at<float>(actual, 2 * i + 1));
    case DType::Complex128:
      return floating_bits_match(load_at<double>(expected, 2 * i),
                                 load_at<double>(actual, 2 * i)) &&
             floating_bits_match(load_at<double>(expected, 2 * i + 1),
                                 load_at<double>(actual, 2 * i + 1));
    default: {
      const std::size_t size = element_size(dtype);
      return std::memcmp(expected.data() + i * size, actual.data() + i * size, size) == 0;
    }
  }
}

std::string hex_element(DType dtype, const Bytes& buffer, std::size_t i) {
  std::ostringstream out;
  const std::size_t size = element_size(dtype);
  out << "0x";
  for (std::size_t b = size; b-- > 0;) {  // Little-endian: most significant byte last.
    out << std::hex << std::setw(2) << std::setfill('0') << int{buffer[i * size + b]};
  }
  return out.str();
}

::testing::AssertionResult same_elements(DType dtype, const Bytes& expected, const Bytes& actual,
                                         std::size_t count) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << expected.size() << " vs " << actual.size();
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!element_matches(dtype, expected, actual, i)) {
      return ::testing::AssertionFailure()
             << dtype << " element " << i << ": expected " << hex_element(dtype, expected, i)
             << ", got " << hex_element(dtype, actual, i);
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Deterministic inputs.

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer.
  x += 0x9E37'79B9'7F4A'7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D0'49BB'1331'11EBull;
  return x ^ (x >> 31);
}

// A float with a full random mantissa, exponent in [-8, 7] and random sign, so that sums round
// and a different fold order would show.
template <class F>
F random_real(std::uint64_t h) {
  using Bits = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  constexpr int kMantissaBits = std::numeric_limits<F>::digits - 1;
  constexpr int kBias = std::numeric_limits<F>::max_exponent - 1;
  const auto mantissa = static_cast<Bits>(h & ((Bits{1} << kMantissaBits) - 1));
  const auto exponent = static_cast<Bits>(kBias - 8) + static_cast<Bits>((h >> 56) & 15);
  const Bits sign = (h >> 63) != 0 ? Bits{1} << (sizeof(F) * 8 - 1) : 0;
  return std::bit_cast<F>(static_cast<Bits>(sign | (exponent << kMantissaBits) | mantissa));
}

// A finite 16-bit float of moderate magnitude: exponent field in [8, 23] (2^-7 .. 2^8).
std::uint16_t random_half_bits(std::uint64_t h) {
  const std::uint64_t exponent = 8 + ((h >> 20) & 15);
  return static_cast<std::uint16_t>(((h >> 63) << 15) | (exponent << 10) | (h & 0x3FF));
}
std::uint16_t random_bfloat16_bits(std::uint64_t h) {
  const std::uint64_t exponent = 127 - 8 + ((h >> 20) & 15);
  return static_cast<std::uint16_t>(((h >> 63) << 15) | (exponent << 7) | (h & 0x7F));
}

// One source buffer. About one floating element in 97 is NaN, to run NaN through every op.
Bytes make_source(DType dtype, std::size_t count, std::uint64_t seed) {
  Bytes out(count * element_size(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = mix(seed * 0x1'0000'0000ull + i);
    const std::uint64_t h2 = mix(h);
    const bool nan = h2 % 97 == 0;
    switch (dtype) {
      case DType::Bool:
        store_at<std::uint8_t>(out, i, static_cast<std::uint8_t>(h & 1));
        break;
      case DType::UInt8:
        store_at(out, i, static_cast<std::uint8_t>(h));
        break;
      case DType::Int8:
        store_at(out, i, static_cast<std::int8_t>(static_cast<std::uint8_t>(h)));
        break;
      case DType::Int32:
        store_at(out, i, static_cast<std::int32_t>(static_cast<std::uint32_t>(h)));
        break;
      case DType::Int64:
        store_at(out, i, static_cast<std::int64_t>(h));
        break;
      case DType::Float16:
        store_at(out, i, nan ? std::uint16_t{0x7E00} : random_half_bits(h));
        break;
      case DType::BFloat16:
        store_at(out, i, nan ? std::uint16_t{0x7FC0} : random_bfloat16_bits(h));
        break;
      case DType::Float32:
        store_at(out, i, nan ? std::numeric_limits<float>::quiet_NaN() : random_real<float>(h));
        break;
      case DType::Float64:
        store_at(out, i, nan ? std::numeric_limits<double>::quiet_NaN() : random_real<double>(h));
        break;
      case DType::Complex64:
        store_at(out, i, std::complex<float>(random_real<float>(h), random_real<float>(h2)));
        break;
      case DType::Complex128:
        store_at(out, i, std::complex<double>(random_real<double>(h), random_real<double>(h2)));
        break;
    }
  }
  return out;
}

std::vector<Bytes> make_sources(DType dtype, std::size_t num_srcs, std::size_t count,
                                std::uint64_t salt) {
  std::vector<Bytes> out;
  for (std::size_t j = 0; j < num_srcs; ++j) {
    out.push_back(make_source(dtype, count, salt * kMaxSweepSrcs * 16 + j));
  }
  return out;
}

Bytes run_reduce(const std::vector<Bytes>& srcs, std::size_t count, DType dtype,
                 const ReduceOp& op) {
  Bytes out(count * element_size(dtype), 0xCD);  // Not a valid result pattern for most dtypes.
  const std::vector<const void*> pointers = pointers_to(srcs);
  reduce(out.data(), pointers.data(), pointers.size(), count, dtype, op);
  return out;
}

// ---------------------------------------------------------------------------------------------
// The sweep: every dtype x every op it takes x num_srcs x count.

struct ReduceCase {
  DType dtype;
  Kind kind;
};

// GoogleTest finds this by name to print parameters.
// NOLINTNEXTLINE(readability-identifier-naming)
void PrintTo(const ReduceCase& reduce_case, std::ostream* out) {
  *out << reduce_case.dtype << " " << reduce_kind_name(reduce_case.kind);
}

std::vector<ReduceCase> valid_reduce_cases() {
  std::vector<ReduceCase> out;
  for (const DType dtype : kAllDTypes) {
    for (const Kind kind : kAllKinds) {
      if (expected_allowed(kind, dtype)) {
        out.push_back({dtype, kind});
      }
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<ReduceCase>& info) {
  std::string out(dtype_name(info.param.dtype));
  out += "_";
  out += reduce_kind_name(info.param.kind);
  return out;
}

class KernelsReduceSweep : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(KernelsReduceSweep, MatchesReferenceFold) {
  const auto [dtype, kind] = GetParam();
  std::uint64_t salt = 1;
  for (const std::size_t num_srcs : kNumSrcsSweep) {
    for (const std::size_t count : kCountSweep) {
      SCOPED_TRACE(::testing::Message() << "num_srcs " << num_srcs << ", count " << count);
      const std::vector<Bytes> srcs = make_sources(dtype, num_srcs, count, salt++);
      const Bytes expected = reference_reduce(srcs, count, dtype, kind);
      ASSERT_TRUE(
          same_elements(dtype, expected, run_reduce(srcs, count, dtype, make_op(kind)), count));
    }
  }
}

// In every instruction set (Note [Kernel instruction sets]).
TEST_P(KernelsReduceSweep, DstMayAliasAnySource) {
  const auto [dtype, kind] = GetParam();
  const IsaRestorer restorer;
  constexpr std::size_t kCount = 2049;
  for (const Isa isa : supported_isas()) {
    set_isa(isa);
    // 3 and 4 fold in one pass, as 1 and 2 do; 5 in blocks (Note [Folds in one pass]).
    for (const std::size_t num_srcs :
         {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5}}) {
      for (std::size_t alias = 0; alias < num_srcs; ++alias) {
        SCOPED_TRACE(::testing::Message() << isa_name(isa) << ", num_srcs " << num_srcs
                                          << ", dst is srcs[" << alias << "]");
        std::vector<Bytes> srcs = make_sources(dtype, num_srcs, kCount, 1000 + alias);
        const Bytes expected = reference_reduce(srcs, kCount, dtype, kind);
        const std::vector<const void*> pointers = pointers_to(srcs);
        reduce(srcs[alias].data(), pointers.data(), num_srcs, kCount, dtype, make_op(kind));
        ASSERT_TRUE(same_elements(dtype, expected, srcs[alias], kCount));
      }
    }
  }
}

// {0, 1, kCombine, 2, kCombine, ...}: reduce()'s own order (Note [Reduction programs]).
std::vector<int> left_fold_program(std::size_t num_srcs) {
  std::vector<int> program = {0};
  for (std::size_t j = 1; j < num_srcs; ++j) {
    program.push_back(static_cast<int>(j));
    program.push_back(kCombine);
  }
  return program;
}

// {0, 1, kCombine, 2, 3, kCombine, kCombine, ...}: the left subtree takes the largest power of
// two below the count (the simulator's tree order). Mixes pushed leaves with ones combined at
// once.
std::vector<int> pairwise_tree_program(std::size_t begin, std::size_t end) {
  if (end - begin == 1) {
    return {static_cast<int>(begin)};
  }
  const std::size_t left = std::bit_floor(end - begin - 1);
  std::vector<int> program = pairwise_tree_program(begin, begin + left);
  const std::vector<int> right = pairwise_tree_program(begin + left, end);
  program.insert(program.end(), right.begin(), right.end());
  program.push_back(kCombine);
  return program;
}

// {0, 1, ..., n-1, kCombine, ...}: every source pushed before any combine, the deepest stack.
std::vector<int> right_deep_program(std::size_t num_srcs) {
  std::vector<int> program;
  for (std::size_t j = 0; j < num_srcs; ++j) {
    program.push_back(static_cast<int>(j));
  }
  program.insert(program.end(), num_srcs - 1, kCombine);
  return program;
}

// The program shapes the instruction-set comparisons run.
std::vector<std::vector<int>> test_programs(std::size_t num_srcs) {
  return {pairwise_tree_program(0, num_srcs), right_deep_program(num_srcs)};
}

Bytes run_program(const std::vector<Bytes>& srcs, std::size_t count, DType dtype,
                  const ReduceOp& op, const std::vector<int>& program) {
  Bytes out(count * element_size(dtype), 0xCD);
  const std::vector<const void*> pointers = pointers_to(srcs);
  reduce_program(out.data(), pointers.data(), pointers.size(), count, dtype, op, program);
  return out;
}

// In every instruction set, against reduce() in the same one.
TEST_P(KernelsReduceSweep, LeftFoldProgramGivesReducesBits) {
  const auto [dtype, kind] = GetParam();
  const IsaRestorer restorer;
  std::uint64_t salt = 500;
  for (const Isa isa : supported_isas()) {
    set_isa(isa);
    for (const std::size_t num_srcs : kNumSrcsSweep) {
      for (const std::size_t count : kCountSweep) {
        SCOPED_TRACE(::testing::Message()
                     << isa_name(isa) << ", num_srcs " << num_srcs << ", count " << count);
        std::vector<Bytes> srcs = make_sources(dtype, num_srcs, count, salt++);
        const Bytes expected = run_reduce(srcs, count, dtype, make_op(kind));
        const std::vector<const void*> pointers = pointers_to(srcs);
        const std::vector<int> program = left_fold_program(num_srcs);
        ASSERT_TRUE(same_elements(dtype, expected,
                                  run_program(srcs, count, dtype, make_op(kind), program), count));
        // In place: dst is the last source.
        reduce_program(srcs.back().data(), pointers.data(), num_srcs, count, dtype, make_op(kind),
                       program);
        ASSERT_TRUE(same_elements(dtype, expected, srcs.back(), count));
      }
    }
  }
}

// Tree programs write over any source as they write elsewhere, in every instruction set.
TEST_P(KernelsReduceSweep, ProgramsMayWriteOverAnySource) {
  const auto [dtype, kind] = GetParam();
  const IsaRestorer restorer;
  constexpr std::size_t kCount = 1025;  // a ragged last block
  for (const Isa isa : supported_isas()) {
    set_isa(isa);
    for (const std::size_t num_srcs : {std::size_t{2}, std::size_t{5}}) {
      for (const std::vector<int>& program : test_programs(num_srcs)) {
        const std::vector<Bytes> srcs = make_sources(dtype, num_srcs, kCount, 3000 + num_srcs);
        const Bytes expected = run_program(srcs, kCount, dtype, make_op(kind), program);
        for (std::size_t alias = 0; alias < num_srcs; ++alias) {
          SCOPED_TRACE(::testing::Message() << isa_name(isa) << ", num_srcs " << num_srcs
                                            << ", dst is srcs[" << alias << "]");
          std::vector<Bytes> written = srcs;
          const std::vector<const void*> pointers = pointers_to(written);
          reduce_program(written[alias].data(), pointers.data(), num_srcs, kCount, dtype,
                         make_op(kind), program);
          ASSERT_TRUE(same_elements(dtype, expected, written[alias], kCount));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndOps, KernelsReduceSweep,
                         ::testing::ValuesIn(valid_reduce_cases()), case_name);

// ---------------------------------------------------------------------------------------------
// Note [Kernel instruction sets]: every instruction set gives the baseline's bits (a NaN result
// may differ in sign and payload, as element_matches allows).

// A source whose floating elements are raw random bit patterns: NaNs with every payload
// (signalling ones included), infinities, subnormals and magnitudes that overflow when summed.
// Integers and Bool as make_source.
Bytes make_raw_source(DType dtype, std::size_t count, std::uint64_t seed) {
  if (!is_floating(dtype) && !is_complex(dtype)) {
    return make_source(dtype, count, seed);
  }
  Bytes out(count * element_size(dtype));
  for (std::size_t b = 0; b < out.size(); b += sizeof(std::uint64_t)) {
    const std::uint64_t h = mix(seed * 0x1'0000'0000ull + b);
    std::memcpy(out.data() + b, &h, std::min(sizeof(h), out.size() - b));
  }
  return out;
}

class KernelsIsa : public ::testing::TestWithParam<ReduceCase> {
 private:
  IsaRestorer restorer_;
};

// The builds differ most where the compiler vectorizes (the release presets, whose CI stages run
// this executable too); at -O0 both run the same scalar loops in different encodings.
TEST_P(KernelsIsa, Avx2GivesTheBaselinesBits) {
  if (!isa_supported(Isa::Avx2)) {
    GTEST_SKIP() << "this CPU or build has no AVX2 kernels";
  }
  const auto [dtype, kind] = GetParam();
  std::uint64_t salt = 7000;
  // 31: a tail shorter than one AVX2 vector of every element size after the vector loop.
  for (const std::size_t num_srcs : kNumSrcsSweep) {
    for (const std::size_t count :
         {std::size_t{1}, std::size_t{31}, std::size_t{1024}, std::size_t{2049}}) {
      for (const bool raw : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "num_srcs " << num_srcs << ", count " << count
                                          << (raw ? ", raw bit patterns" : ""));
        std::vector<Bytes> srcs;
        for (std::size_t j = 0; j < num_srcs; ++j) {
          srcs.push_back(raw ? make_raw_source(dtype, count, salt * kMaxSweepSrcs + j)
                             : make_source(dtype, count, salt * kMaxSweepSrcs + j));
        }
        ++salt;
        set_isa(Isa::Baseline);
        const Bytes expected = run_reduce(srcs, count, dtype, make_op(kind));
        const std::vector<std::vector<int>> programs = test_programs(num_srcs);
        std::vector<Bytes> expected_programs;
        for (const std::vector<int>& program : programs) {
          expected_programs.push_back(run_program(srcs, count, dtype, make_op(kind), program));
        }
        set_isa(Isa::Avx2);
        ASSERT_TRUE(
            same_elements(dtype, expected, run_reduce(srcs, count, dtype, make_op(kind)), count));
        for (std::size_t p = 0; p < programs.size(); ++p) {
          ASSERT_TRUE(same_elements(dtype, expected_programs[p],
                                    run_program(srcs, count, dtype, make_op(kind), programs[p]),
                                    count))
              << "reduce_program, program " << p << " of test_programs";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndOps, KernelsIsa, ::testing::ValuesIn(valid_reduce_cases()),
                         case_name);

// Every 16-bit pattern alone (avg and premul_sum of one source convert it there and
// back) and against a spread of partners, so each conversion path (subnormal, normal, overflow to
// infinity, NaN made quiet) and each rounding tie meets both builds.
TEST(KernelsIsaSixteenBit, Avx2GivesTheBaselinesBitsOnEveryPattern) {
  if (!isa_supported(Isa::Avx2)) {
    GTEST_SKIP() << "this CPU or build has no AVX2 kernels";
  }
  const IsaRestorer restorer;
  constexpr std::size_t kPatterns = 0x10000;
  Bytes every(kPatterns * 2);
  for (std::size_t i = 0; i < kPatterns; ++i) {
    store_at(every, i, static_cast<std::uint16_t>(i));
  }
  for (const DType dtype : {DType::Float16, DType::BFloat16}) {
    for (const Kind kind : {Kind::Sum, Kind::Avg, Kind::Product, Kind::Max, Kind::PremulSum}) {
      for (const std::uint64_t partner_seed : {1u, 2u, 3u}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << reduce_kind_name(kind)
                                          << ", partner seed " << partner_seed);
        const std::vector<Bytes> srcs = {every, make_raw_source(dtype, kPatterns, partner_seed),
                                         make_source(dtype, kPatterns, partner_seed)};
        for (const std::size_t num_srcs : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
          const std::vector<Bytes> used(srcs.begin(),
                                        srcs.begin() + static_cast<std::ptrdiff_t>(num_srcs));
          set_isa(Isa::Baseline);
          const Bytes expected = run_reduce(used, kPatterns, dtype, make_op(kind));
          set_isa(Isa::Avx2);
          const Bytes actual = run_reduce(used, kPatterns, dtype, make_op(kind));
          ASSERT_TRUE(same_elements(dtype, expected, actual, kPatterns)) << "num_srcs " << num_srcs;
          const std::vector<int> tree = pairwise_tree_program(0, num_srcs);
          set_isa(Isa::Baseline);
          const Bytes expected_tree = run_program(used, kPatterns, dtype, make_op(kind), tree);
          set_isa(Isa::Avx2);
          ASSERT_TRUE(same_elements(dtype, expected_tree,
                                    run_program(used, kPatterns, dtype, make_op(kind), tree),
                                    kPatterns))
              << "reduce_program, num_srcs " << num_srcs;
          if (num_srcs == 1) {
            // One source: no two NaNs meet, so even a NaN's bits are fixed (its conversions
            // alone: made quiet, payload kept); sum, product and max copy without converting.
            ASSERT_TRUE(expected == actual) << "a NaN's sign or payload differs";
          }
        }
      }
    }
  }
}

TEST(KernelsIsaChoice, PrefersAvx2WhereSupportedAndRefusesWhatIsNot) {
  const Isa initial = active_isa();
  const IsaRestorer restorer;
  EXPECT_TRUE(isa_supported(Isa::Baseline));
  EXPECT_STREQ(isa_name(Isa::Baseline), "baseline");
  EXPECT_STREQ(isa_name(Isa::Avx2), "avx2");
  // The first use chose AVX2 if it could (nothing in this binary pins the ISA for good).
  EXPECT_EQ(best_isa(), isa_supported(Isa::Avx2) ? Isa::Avx2 : Isa::Baseline);
  EXPECT_EQ(initial, best_isa());
  set_isa(Isa::Baseline);
  EXPECT_EQ(active_isa(), Isa::Baseline);
  try {
    set_isa(static_cast<Isa>(7));
    ADD_FAILURE() << "set_isa accepted an instruction set outside the enumerators";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(
        std::string(error.what()).find("instruction set 'unknown' is not supported by this build"),
        std::string::npos)
        << error.what();
  }
  EXPECT_EQ(active_isa(), Isa::Baseline);  // A refused choice changes nothing.
}

TEST(Kernels, SweepCoversExactlyWhatCheckDtypeAllows) {
  for (const DType dtype : kAllDTypes) {
    for (const Kind kind : kAllKinds) {
      EXPECT_EQ(expected_allowed(kind, dtype), make_op(kind).check_dtype(dtype).empty())
          << dtype << " " << reduce_kind_name(kind);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Crafted reductions.

template <class T>
std::vector<T> reduce_values(DType dtype, const ReduceOp& op,
                             const std::vector<std::vector<T>>& columns) {
  std::vector<Bytes> srcs;
  srcs.reserve(columns.size());
  for (const auto& column : columns) {
    srcs.push_back(bytes_of(column));
  }
  const std::size_t count = columns.front().size();
  const Bytes out = run_reduce(srcs, count, dtype, op);
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = load_at<T>(out, i);
  }
  return values;
}

TEST(Kernels, IntegerSumWraps) {
  using I8 = std::int8_t;
  using I32 = std::int32_t;
  using I64 = std::int64_t;
  EXPECT_EQ(reduce_values<I8>(DType::Int8, Kind::Sum, {{127, -128}, {1, -1}}),
            (std::vector<I8>{-128, 127}));
  EXPECT_EQ(reduce_values<std::uint8_t>(DType::UInt8, Kind::Sum, {{255, 200}, {1, 100}}),
            (std::vector<std::uint8_t>{0, 44}));
  EXPECT_EQ(reduce_values<I32>(DType::Int32, Kind::Sum, {{std::numeric_limits<I32>::max()}, {1}}),
            (std::vector<I32>{std::numeric_limits<I32>::min()}));
  EXPECT_EQ(
      reduce_values<I64>(DType::Int64, Kind::Sum, {{std::numeric_limits<I64>::min()}, {-1}, {2}}),
      (std::vector<I64>{std::numeric_limits<I64>::min() + 1}));  // Wraps down, then up.
}

TEST(Kernels, IntegerProductWraps) {
  EXPECT_EQ(reduce_values<std::int8_t>(DType::Int8, Kind::Product, {{16, -128}, {16, -1}}),
            (std::vector<std::int8_t>{0, -128}));
  EXPECT_EQ(reduce_values<std::uint8_t>(DType::UInt8, Kind::Product, {{255}, {255}}),
            (std::vector<std::uint8_t>{1}));  // 65025 mod 256.
  EXPECT_EQ(reduce_values<std::int32_t>(DType::Int32, Kind::Product, {{65536}, {65536}}),
            (std::vector<std::int32_t>{0}));
  EXPECT_EQ(
      reduce_values<std::int64_t>(DType::Int64, Kind::Product, {{std::int64_t{1} << 62}, {4}, {3}}),
      (std::vector<std::int64_t>{0}));
}

TEST(Kernels, IntegerAvgTruncatesTowardZero) {
  EXPECT_EQ(reduce_values<std::int32_t>(DType::Int32, Kind::Avg, {{-7, 7, -1}, {0, 0, 0}}),
            (std::vector<std::int32_t>{-3, 3, 0}));
  EXPECT_EQ(reduce_values<std::int32_t>(DType::Int32, Kind::Avg, {{-7}, {0}, {0}}),
            (std::vector<std::int32_t>{-2}));
  EXPECT_EQ(reduce_values<std::int64_t>(DType::Int64, Kind::Avg, {{-9}, {0}, {0}, {0}}),
            (std::vector<std::int64_t>{-2}));
  // The sum wraps first (-129 -> 127), then divides.
  EXPECT_EQ(reduce_values<std::int8_t>(DType::Int8, Kind::Avg, {{-128}, {-1}}),
            (std::vector<std::int8_t>{63}));
  // UInt8 divides unsigned: (255 + 3) mod 256 = 2, / 2 = 1.
  EXPECT_EQ(reduce_values<std::uint8_t>(DType::UInt8, Kind::Avg, {{255}, {3}}),
            (std::vector<std::uint8_t>{1}));
}

TEST(Kernels, MinMaxComparesSignedIntegersAsSigned) {
  EXPECT_EQ(reduce_values<std::int8_t>(DType::Int8, Kind::Min, {{-1, 5}, {1, -128}}),
            (std::vector<std::int8_t>{-1, -128}));
  EXPECT_EQ(reduce_values<std::int8_t>(DType::Int8, Kind::Max, {{-1, 5}, {1, -128}}),
            (std::vector<std::int8_t>{1, 5}));
  EXPECT_EQ(reduce_values<std::uint8_t>(DType::UInt8, Kind::Max, {{255}, {1}}),
            (std::vector<std::uint8_t>{255}));
}

TEST(Kernels, FloatingMinMaxPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const DType dtype : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    for (const Kind kind : {Kind::Min, Kind::Max}) {
      for (std::size_t nan_at = 0; nan_at < 3; ++nan_at) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " " << reduce_kind_name(kind) << " NaN at " << nan_at);
        std::vector<Bytes> srcs;
        for (std::size_t j = 0; j < 3; ++j) {
          const float value = j == nan_at ? nan : static_cast<float>(j) - 1.0f;
          Bytes buffer(element_size(dtype));
          convert(buffer.data(), dtype, &value, DType::Float32, 1);
          srcs.push_back(buffer);
        }
        const Bytes out = run_reduce(srcs, 1, dtype, kind);
        float result = 0.0f;
        convert(&result, DType::Float32, out.data(), dtype, 1);
        EXPECT_TRUE(std::isnan(result));
      }
    }
  }
  EXPECT_EQ(reduce_values<float>(DType::Float32, Kind::Min, {{3.0f}, {-1.0f}, {2.0f}}),
            (std::vector<float>{-1.0f}));
  EXPECT_EQ(reduce_values<double>(DType::Float64, Kind::Max, {{3.0}, {-1.0}, {4.5}}),
            (std::vector<double>{4.5}));
}

TEST(Kernels, FloatingMinMaxTiesKeepTheEarlierSource) {
  // -0 == +0, so the earlier source wins: deterministic for a given source order. Two sources
  // and three take different paths through the kernel.
  const std::vector<float> min_two =
      reduce_values<float>(DType::Float32, Kind::Min, {{0.0f, -0.0f}, {-0.0f, 0.0f}});
  EXPECT_EQ(bits_of(min_two[0]), bits_of(0.0f));
  EXPECT_EQ(bits_of(min_two[1]), bits_of(-0.0f));
  const std::vector<float> min_three = reduce_values<float>(
      DType::Float32, Kind::Min, {{0.0f, -0.0f, 5.0f}, {-0.0f, 0.0f, 5.0f}, {5.0f, 5.0f, -0.0f}});
  EXPECT_EQ(bits_of(min_three[0]), bits_of(0.0f));
  EXPECT_EQ(bits_of(min_three[1]), bits_of(-0.0f));
  EXPECT_EQ(bits_of(min_three[2]), bits_of(-0.0f));  // 5, 5, -0: -0 is the minimum.
  const std::vector<double> max_three =
      reduce_values<double>(DType::Float64, Kind::Max, {{-0.0}, {0.0}, {-1.0}});
  EXPECT_EQ(bits_of(max_three[0]), bits_of(-0.0));
}

TEST(Kernels, FloatingMinMaxKeepTheEarlierNaN) {
  // When several inputs are NaN the earliest one's bits come through, on every kernel path.
  const auto first_nan = std::bit_cast<float>(0x7FC0'0001u);
  const auto second_nan = std::bit_cast<float>(0xFFC0'0002u);
  for (const Kind kind : {Kind::Min, Kind::Max}) {
    for (std::size_t num_srcs = 2; num_srcs <= 5; ++num_srcs) {
      SCOPED_TRACE(::testing::Message() << reduce_kind_name(kind) << ", num_srcs " << num_srcs);
      std::vector<std::vector<float>> columns(num_srcs, std::vector<float>{1.0f});
      columns[num_srcs - 2][0] = first_nan;
      columns[num_srcs - 1][0] = second_nan;
      EXPECT_EQ(bits_of(reduce_values<float>(DType::Float32, kind, columns)[0]), 0x7FC0'0001u);
      columns[0][0] = second_nan;  // Now the earliest NaN is the one in srcs[0].
      if (num_srcs > 2) {
        EXPECT_EQ(bits_of(reduce_values<float>(DType::Float32, kind, columns)[0]), 0xFFC0'0002u);
      }
    }
  }
}

TEST(Kernels, PremulSumScalesEachInputBeforeSumming) {
  EXPECT_EQ(
      reduce_values<float>(DType::Float32, ReduceOp::premul_sum(0.5), {{1.0f}, {2.0f}, {3.0f}}),
      (std::vector<float>{3.0f}));
  // The factor is rounded to float once: 1 * float(0.1), not float(1 * 0.1) computed otherwise.
  EXPECT_EQ(reduce_values<float>(DType::Float32, ReduceOp::premul_sum(0.1), {{1.0f}}),
            (std::vector<float>{0.1f}));
  EXPECT_EQ(reduce_values<double>(DType::Float64, ReduceOp::premul_sum(0.1), {{1.0}, {2.0}}),
            (std::vector<double>{0.1 * 1.0 + 0.1 * 2.0}));
  using C64 = std::complex<float>;
  EXPECT_EQ(reduce_values<C64>(DType::Complex64, ReduceOp::premul_sum(2.0),
                               {{C64(1.0f, 2.0f)}, {C64(3.0f, -1.0f)}}),
            (std::vector<C64>{C64(8.0f, 2.0f)}));
  EXPECT_EQ(reduce_values<std::uint16_t>(DType::Float16, ReduceOp::premul_sum(0.5),
                                         {{bits_of_half(1.0f)}, {bits_of_half(2.0f)}}),
            (std::vector<std::uint16_t>{bits_of_half(1.5f)}));
}

// avg divides each part of a complex sum by the real count: a negative zero keeps its sign and an
// infinite part leaves the other part finite (a division by the complex (n, 0) would give +0 and
// NaN there).
TEST(Kernels, ComplexAvgDividesEachPartByTheCount) {
  const float inf = std::numeric_limits<float>::infinity();
  using C64 = std::complex<float>;
  const std::vector<C64> c64 =
      reduce_values<C64>(DType::Complex64, Kind::Avg,
                         {{C64(-0.0f, 1.0f), C64(inf, 1.0f)}, {C64(-0.0f, 3.0f), C64(1.0f, 3.0f)}});
  EXPECT_EQ(bits_of(c64[0].real()), bits_of(-0.0f));
  EXPECT_EQ(c64[0].imag(), 2.0f);
  EXPECT_EQ(bits_of(c64[1].real()), bits_of(inf));
  EXPECT_EQ(c64[1].imag(), 2.0f);
  using C128 = std::complex<double>;
  const std::vector<C128> c128 =
      reduce_values<C128>(DType::Complex128, Kind::Avg, {{C128(-0.0, -4.0)}, {C128(-0.0, 1.0)}});
  EXPECT_EQ(bits_of(c128[0].real()), bits_of(-0.0));
  EXPECT_EQ(c128[0].imag(), -1.5);
}

TEST(Kernels, SixteenBitFloatsRoundOnceAtTheEnd) {
  // Rounding after each step would give 2048 + 1 -> 2048 (tie to even), + 1 -> 2048.
  EXPECT_EQ(reduce_values<std::uint16_t>(
                DType::Float16, Kind::Sum,
                {{bits_of_half(2048.0f)}, {bits_of_half(1.0f)}, {bits_of_half(1.0f)}}),
            (std::vector<std::uint16_t>{bits_of_half(2050.0f)}));
  const auto bf16 = [](float value) { return float_to_bfloat16_bits(value); };
  EXPECT_EQ(reduce_values<std::uint16_t>(DType::BFloat16, Kind::Sum,
                                         {{bf16(256.0f)}, {bf16(1.0f)}, {bf16(1.0f)}}),
            (std::vector<std::uint16_t>{bf16(258.0f)}));
  // The final rounding is to nearest even: 2048 + 1 alone is a tie.
  EXPECT_EQ(reduce_values<std::uint16_t>(DType::Float16, Kind::Sum,
                                         {{bits_of_half(2048.0f)}, {bits_of_half(1.0f)}}),
            (std::vector<std::uint16_t>{bits_of_half(2048.0f)}));
  EXPECT_EQ(reduce_values<std::uint16_t>(DType::Float16, Kind::Avg,
                                         {{bits_of_half(1.0f)}, {bits_of_half(2.0f)}}),
            (std::vector<std::uint16_t>{bits_of_half(1.5f)}));
  // Overflow of the final rounding gives infinity.
  EXPECT_EQ(reduce_values<std::uint16_t>(DType::Float16, Kind::Sum,
                                         {{bits_of_half(65504.0f)}, {bits_of_half(16.0f)}}),
            (std::vector<std::uint16_t>{0x7C00}));
}

// Runs reduce_program over one-element sources.
template <class T>
T reduce_one_by_program(DType dtype, const ReduceOp& op, const std::vector<T>& values,
                        const std::vector<int>& program) {
  std::vector<const void*> pointers;
  for (const T& value : values) {
    pointers.push_back(&value);
  }
  T out{};
  reduce_program(&out, pointers.data(), values.size(), 1, dtype, op, program);
  return out;
}

TEST(KernelsProgram, CombinesInTheProgramsShape) {
  // Sums that depend on the order: 1e8f absorbs a 1 (float spacing there is 8).
  const std::vector<float> values = {1e8f, 1.0f, -1e8f, 1.0f};
  const std::vector<int> pairwise = {0, 1, kCombine, 2, 3, kCombine, kCombine};
  const std::vector<int> reversed = {3, 2, kCombine, 1, kCombine, 0, kCombine};
  const std::vector<int> cancelling_first = {0, 2, kCombine, 1, kCombine, 3, kCombine};
  EXPECT_EQ(reduce_one_by_program(DType::Float32, Kind::Sum, values, left_fold_program(4)), 1.0f);
  EXPECT_EQ(reduce_one_by_program(DType::Float32, Kind::Sum, values, pairwise), 0.0f);
  EXPECT_EQ(reduce_one_by_program(DType::Float32, Kind::Sum, values, reversed), 0.0f);
  EXPECT_EQ(reduce_one_by_program(DType::Float32, Kind::Sum, values, cancelling_first), 2.0f);
  // avg divides the tree's sum by the number of sources once; premul_sum scales each leaf once.
  EXPECT_EQ(reduce_one_by_program(DType::Float32, Kind::Avg, values, cancelling_first), 0.5f);
  EXPECT_EQ(
      reduce_one_by_program(DType::Float32, ReduceOp::premul_sum(0.5), values, cancelling_first),
      1.0f);
  EXPECT_EQ(reduce_one_by_program(DType::Int32, Kind::Avg, std::vector<std::int32_t>{7, -2, 4},
                                  {2, 0, kCombine, 1, kCombine}),
            3);
  // 16-bit floats keep partial results in float: 2048 + (1 + 1) = 2050, and (2048 + 1) + 1 too.
  const std::vector<std::uint16_t> halves = {bits_of_half(2048.0f), bits_of_half(1.0f),
                                             bits_of_half(1.0f)};
  EXPECT_EQ(reduce_one_by_program(DType::Float16, Kind::Sum, halves, {0, 1, 2, kCombine, kCombine}),
            bits_of_half(2050.0f));
}

// The left operand of every combine is the partial result pushed first, whether the right one
// was pushed or, as a leaf combined at once, folded in directly: max keeps the left of a -0/+0
// tie, and the left of two NaNs.
TEST(KernelsProgram, LeftOperandIsThePartialResultPushedFirst) {
  const IsaRestorer restorer;
  const float nan_a = std::bit_cast<float>(0x7FC0'0001u);
  const float nan_b = std::bit_cast<float>(0x7FC0'0002u);
  const auto bits = [](float value) { return std::bit_cast<std::uint32_t>(value); };
  for (const Isa isa : supported_isas()) {
    set_isa(isa);
    SCOPED_TRACE(isa_name(isa));
    const std::vector<float> zeros = {-0.0f, 0.0f, 0.0f};
    EXPECT_EQ(bits(reduce_one_by_program(DType::Float32, Kind::Max, zeros,
                                         {0, 1, kCombine, 2, kCombine})),
              bits(-0.0f));
    EXPECT_EQ(bits(reduce_one_by_program(DType::Float32, Kind::Max, zeros,
                                         {1, 0, kCombine, 2, kCombine})),
              bits(0.0f));
    // Leaf 0 pushed, then (2, 1) combined below it: -0 stays on the left throughout.
    EXPECT_EQ(bits(reduce_one_by_program(DType::Float32, Kind::Max, zeros,
                                         {0, 2, 1, kCombine, kCombine})),
              bits(-0.0f));
    const std::vector<float> nans = {nan_a, nan_b};
    EXPECT_EQ(bits(reduce_one_by_program(DType::Float32, Kind::Max, nans, {0, 1, kCombine})),
              bits(nan_a));
    EXPECT_EQ(bits(reduce_one_by_program(DType::Float32, Kind::Max, nans, {1, 0, kCombine})),
              bits(nan_b));
    // Float16 in the AVX2 build widens and narrows with F16C: the same tie rule.
    const std::vector<std::uint16_t> half_zeros = {0x8000, 0x0000};
    EXPECT_EQ(reduce_one_by_program(DType::Float16, Kind::Max, half_zeros, {0, 1, kCombine}),
              0x8000);
    EXPECT_EQ(reduce_one_by_program(DType::Float16, Kind::Max, half_zeros, {1, 0, kCombine}),
              0x0000);
  }
}

// A program of one source is the left fold of one source, so it gives reduce()'s bits: a copy, in
// which even a signalling NaN stays as it is (a 16-bit float widened and narrowed again would come
// back quiet).
TEST(KernelsProgram, OneSourceCopiesBitsAsReduceDoes) {
  const IsaRestorer restorer;
  for (const Isa isa : supported_isas()) {
    set_isa(isa);
    SCOPED_TRACE(isa_name(isa));
    EXPECT_EQ(
        reduce_one_by_program(DType::Float16, Kind::Sum, std::vector<std::uint16_t>{0x7C01}, {0}),
        0x7C01);
    EXPECT_EQ(
        reduce_one_by_program(DType::BFloat16, Kind::Max, std::vector<std::uint16_t>{0xFF81}, {0}),
        0xFF81);
    EXPECT_EQ(reduce_values<std::uint16_t>(DType::Float16, Kind::Sum, {{0x7C01}}),
              (std::vector<std::uint16_t>{0x7C01}));
  }
}

TEST(KernelsProgramDeathTest, RejectsMalformedPrograms) {
  const std::vector<float> values = {1.0f, 2.0f};
  const auto run = [&](const std::vector<int>& program) {
    (void)reduce_one_by_program(DType::Float32, Kind::Sum, values, program);
  };
  EXPECT_DEATH(run({0, 0, kCombine}), "seen");      // a source twice
  EXPECT_DEATH(run({0, 1}), "program.size");        // no combine
  EXPECT_DEATH(run({0, kCombine, 1}), "top");       // combine of one value
  EXPECT_DEATH(run({0, 2, kCombine}), "num_srcs");  // no such source
}

TEST(Kernels, BoolOpsGiveZeroOrOne) {
  using B = std::uint8_t;
  // Every combination of three inputs, one per element.
  const std::vector<B> a = {0, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<B> b = {0, 0, 1, 1, 0, 0, 1, 1};
  const std::vector<B> c = {0, 1, 0, 1, 0, 1, 0, 1};
  const std::vector<B> all = {0, 0, 0, 0, 0, 0, 0, 1};
  const std::vector<B> any = {0, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<B> parity = {0, 1, 1, 0, 1, 0, 0, 1};
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::Min, {a, b, c}), all);
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::BAnd, {a, b, c}), all);
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::Max, {a, b, c}), any);
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::BOr, {a, b, c}), any);
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::BXor, {a, b, c}), parity);
  // Bytes other than 0/1 read as true, and results are normalized, even for one source.
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::BXor, {{2, 2}, {1, 0}}), (std::vector<B>{0, 1}));
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::BAnd, {{2, 0xFF}, {4, 0}}), (std::vector<B>{1, 0}));
  EXPECT_EQ(reduce_values<B>(DType::Bool, Kind::Max, {{0, 7}}), (std::vector<B>{0, 1}));
}

TEST(Kernels, SingleSourceCopiesBits) {
  // A NaN with a payload survives a one-source fold bit for bit.
  const auto payload_nan = std::bit_cast<float>(0x7FA0'1234u);
  const std::vector<float> out =
      reduce_values<float>(DType::Float32, Kind::Sum, {{payload_nan, -0.0f, 1.5f}});
  EXPECT_EQ(bits_of(out[0]), 0x7FA0'1234u);
  EXPECT_EQ(bits_of(out[1]), bits_of(-0.0f));
  EXPECT_EQ(out[2], 1.5f);
  EXPECT_EQ(reduce_values<std::int32_t>(DType::Int32, Kind::Avg, {{-7, 9}}),
            (std::vector<std::int32_t>{-7, 9}));
  EXPECT_EQ(reduce_values<float>(DType::Float32, ReduceOp::premul_sum(2.0), {{1.5f}}),
            (std::vector<float>{3.0f}));
}

TEST(Kernels, ZeroCountTouchesNothing) {
  const void* srcs[] = {nullptr, nullptr};
  reduce(nullptr, srcs, 2, 0, DType::Float32, Kind::Sum);
  convert(nullptr, DType::Int8, nullptr, DType::Float64, 0);
  fill(nullptr, DType::Float16, 1.0, 0);
  fill_poison(nullptr, DType::Complex128, 0);
  EXPECT_TRUE(values_equal(nullptr, nullptr, DType::Float32, 0));
}

TEST(KernelsDeathTest, RejectsOpsTheDtypeDoesNotTake) {
  float buffer[4] = {};
  const void* srcs[] = {buffer, buffer};
  EXPECT_DEATH(reduce(buffer, srcs, 2, 1, DType::Bool, Kind::Sum), "op_allowed");
  EXPECT_DEATH(reduce(buffer, srcs, 2, 1, DType::Float32, Kind::BXor), "op_allowed");
  EXPECT_DEATH(reduce(buffer, srcs, 2, 1, DType::Complex64, Kind::Max), "op_allowed");
  EXPECT_DEATH(reduce(buffer, srcs, 2, 1, DType::Int32, ReduceOp::premul_sum(2.0)), "op_allowed");
  EXPECT_DEATH(reduce(buffer, srcs, 2, 1, DType::Float32, ReduceOp("no_such_op")), "op_allowed");
}

TEST(KernelsDeathTest, RejectsNoSourcesAndPartialOverlap) {
  float buffer[8] = {};
  const void* srcs[] = {buffer + 1};
  EXPECT_DEATH(reduce(buffer, srcs, 0, 4, DType::Float32, Kind::Sum), "num_srcs");
  EXPECT_DEATH(reduce(buffer, srcs, 1, 4, DType::Float32, Kind::Sum), "overlaps");
  // convert: a wider destination over its own source.
  EXPECT_DEATH(convert(buffer, DType::Float64, buffer, DType::Float32, 4), "overlaps");
}

// Buffers that touch without sharing a byte do not overlap: a destination right before or right
// after its sources in one allocation is allowed.
TEST(Kernels, AdjacentBuffersDoNotOverlap) {
  std::vector<float> buffer = {0.0f, 0.0f, 1.5f, -2.0f, 0.0f, 0.0f};
  const void* middle[] = {buffer.data() + 2, buffer.data() + 2};
  reduce(buffer.data(), middle, 2, 2, DType::Float32, Kind::Sum);
  reduce(buffer.data() + 4, middle, 2, 2, DType::Float32, Kind::Max);
  EXPECT_EQ(buffer, (std::vector<float>{3.0f, -4.0f, 1.5f, -2.0f, 1.5f, -2.0f}));
  std::vector<std::int32_t> integers = {7, -1, 0, 0};
  convert(integers.data() + 2, DType::Float32, integers.data(), DType::Int32, 2);
  std::vector<float> converted(2);
  std::memcpy(converted.data(), integers.data() + 2, 2 * sizeof(float));
  EXPECT_EQ(converted, (std::vector<float>{7.0f, -1.0f}));
}

TEST(KernelsConvert, InPlaceBetweenEqualSizes) {
  std::vector<std::int32_t> values = {-3, 0, 7, 1 << 30};
  convert(values.data(), DType::Float32, values.data(), DType::Int32, values.size());
  std::vector<float> as_float(values.size());
  std::memcpy(as_float.data(), values.data(), values.size() * sizeof(float));
  EXPECT_EQ(as_float, (std::vector<float>{-3.0f, 0.0f, 7.0f, 0x1p30f}));
}

// ---------------------------------------------------------------------------------------------
// convert

// The correctly rounded 16-bit pattern of a finite double, found by bisection over the positive
// patterns with midpoints computed exactly in double (11 or 8 significant bits need no more).
std::uint16_t round_double_to_16(double value, bool bfloat) {
  const auto decode = [&](std::uint16_t bits) {
    return static_cast<double>(bfloat ? bfloat16_bits_to_float(bits) : half_bits_to_float(bits));
  };
  const std::uint16_t max_finite = bfloat ? 0x7F7F : 0x7BFF;
  const std::uint16_t infinity = bfloat ? 0x7F80 : 0x7C00;
  // Where infinity would sit if the exponent range went on: 2^16 or 2^128.
  const double beyond_max = bfloat ? std::ldexp(1.0, 128) : 65536.0;
  const auto sign = static_cast<std::uint16_t>(std::signbit(value) ? 0x8000 : 0);
  const double magnitude = std::fabs(value);
  std::uint16_t low = 0;  // Largest pattern with decode(low) <= magnitude.
  std::uint16_t high = max_finite;
  if (magnitude >= decode(max_finite)) {
    low = max_finite;
  } else {
    while (high - low > 1) {
      const auto mid = static_cast<std::uint16_t>((low + high) / 2);
      (decode(mid) <= magnitude ? low : high) = mid;
    }
  }
  const double low_value = decode(low);
  if (low_value == magnitude) {
    return static_cast<std::uint16_t>(sign | low);
  }
  const auto next = static_cast<std::uint16_t>(low + 1);
  const double next_value = next == infinity ? beyond_max : decode(next);
  const double midpoint = (low_value + next_value) / 2;
  std::uint16_t rounded = next;
  if (magnitude < midpoint || (magnitude == midpoint && (low & 1) == 0)) {
    rounded = low;
  }
  return static_cast<std::uint16_t>(sign | rounded);
}

// In every instruction set (Note [Kernel instruction sets]: AVX2 converts 16-bit floats itself).
TEST(KernelsConvert, SixteenBitToFloatMatchesHalfFunctionsOnEveryPattern) {
  const IsaRestorer restorer;
  std::vector<std::uint16_t> patterns(0x10000);
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    patterns[i] = static_cast<std::uint16_t>(i);
  }
  for (const Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    std::vector<float> out(patterns.size());
    convert(out.data(), DType::Float32, patterns.data(), DType::Float16, patterns.size());
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      ASSERT_EQ(bits_of(out[i]), bits_of(half_bits_to_float(patterns[i]))) << std::hex << i;
    }
    convert(out.data(), DType::Float32, patterns.data(), DType::BFloat16, patterns.size());
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      ASSERT_EQ(bits_of(out[i]), bits_of(bfloat16_bits_to_float(patterns[i]))) << std::hex << i;
    }
  }
}

TEST(KernelsConvert, FloatToSixteenBitMatchesHalfFunctions) {
  std::vector<float> inputs;
  // A stride through every float pattern (NaNs, infinities and subnormals included)...
  for (std::uint64_t bits = 0; bits <= 0xFFFF'FFFFull; bits += 16381) {
    inputs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  }
  // ... and every half rounding boundary, one float ulp either side.
  for (std::uint16_t low = 0; low < 0x7C00; ++low) {
    const float mid =
        (half_bits_to_float(low) + half_bits_to_float(static_cast<std::uint16_t>(low + 1))) / 2.0f;
    for (const float value : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      inputs.push_back(value);
      inputs.push_back(-value);
    }
  }
  const IsaRestorer restorer;
  for (const Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    std::vector<std::uint16_t> half(inputs.size());
    std::vector<std::uint16_t> bfloat(inputs.size());
    convert(half.data(), DType::Float16, inputs.data(), DType::Float32, inputs.size());
    convert(bfloat.data(), DType::BFloat16, inputs.data(), DType::Float32, inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      ASSERT_EQ(half[i], float_to_half_bits(inputs[i])) << std::hex << bits_of(inputs[i]);
      ASSERT_EQ(bfloat[i], float_to_bfloat16_bits(inputs[i])) << std::hex << bits_of(inputs[i]);
    }
  }
}

TEST(KernelsConvert, DoubleToSixteenBitRoundsOnce) {
  // Rounding through float first would land on a tie and round down to even.
  const std::vector<double> inputs = {
      1.0 + 0x1p-11 + 0x1p-40,  // Half: just above the 1 | 1 + 2^-10 tie.
      0x1p-25 + 0x1p-60,        // Half: just above the 0 | 2^-24 tie (subnormal).
      1.0 + 0x1p-8 + 0x1p-30,   // BFloat16: just above the 1 | 1 + 2^-7 tie.
      -(1.0 + 0x1p-11 + 0x1p-40), 65519.999999, 65520.0, 0.1, -1e-300, 1e300,
  };
  std::vector<std::uint16_t> half(inputs.size());
  std::vector<std::uint16_t> bfloat(inputs.size());
  convert(half.data(), DType::Float16, inputs.data(), DType::Float64, inputs.size());
  convert(bfloat.data(), DType::BFloat16, inputs.data(), DType::Float64, inputs.size());
  EXPECT_EQ(half[0], 0x3C01);
  EXPECT_EQ(half[1], 0x0001);
  EXPECT_EQ(bfloat[2], 0x3F81);
  EXPECT_EQ(half[3], 0xBC01);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(half[i], round_double_to_16(inputs[i], false)) << inputs[i];
    EXPECT_EQ(bfloat[i], round_double_to_16(inputs[i], true)) << inputs[i];
  }
  // Random doubles across the half range, against the bisection reference.
  std::vector<double> random(20000);
  for (std::size_t i = 0; i < random.size(); ++i) {
    const std::uint64_t h = mix(i);
    const auto mantissa = h & ((std::uint64_t{1} << 52) - 1);
    const std::uint64_t exponent = 1023 - 26 + (h >> 52) % 43;
    random[i] = std::bit_cast<double>((h & (std::uint64_t{1} << 63)) | (exponent << 52) | mantissa);
  }
  half.resize(random.size());
  bfloat.resize(random.size());
  convert(half.data(), DType::Float16, random.data(), DType::Float64, random.size());
  convert(bfloat.data(), DType::BFloat16, random.data(), DType::Float64, random.size());
  for (std::size_t i = 0; i < random.size(); ++i) {
    ASSERT_EQ(half[i], round_double_to_16(random[i], false)) << random[i];
    ASSERT_EQ(bfloat[i], round_double_to_16(random[i], true)) << random[i];
  }
}

TEST(KernelsConvert, Int64ToSixteenBitRoundsOnce) {
  const std::int64_t two40 = std::int64_t{1} << 40;
  const std::int64_t tie = two40 + (std::int64_t{1} << 32);  // 2^40 | 2^40 + 2^33 in bfloat16.
  const std::vector<std::int64_t> inputs = {
      tie + 1, tie, tie - 1, -(tie + 1), 65519, 65520, std::numeric_limits<std::int64_t>::max()};
  std::vector<std::uint16_t> bfloat(inputs.size());
  std::vector<std::uint16_t> half(inputs.size());
  convert(bfloat.data(), DType::BFloat16, inputs.data(), DType::Int64, inputs.size());
  convert(half.data(), DType::Float16, inputs.data(), DType::Int64, inputs.size());
  EXPECT_EQ(bfloat[0], 0x5381);  // Float first would give the tie 2^40 + 2^32, then 0x5380.
  EXPECT_EQ(bfloat[1], 0x5380);
  EXPECT_EQ(bfloat[2], 0x5380);
  EXPECT_EQ(bfloat[3], 0xD381);
  EXPECT_EQ(half[4], 0x7BFF);
  EXPECT_EQ(half[5], 0x7C00);
  EXPECT_EQ(bfloat[6], 0x5F00);  // 2^63 - 1 rounds to 2^63.
  EXPECT_EQ(half[6], 0x7C00);
}

TEST(KernelsConvert, FloatToIntegerTruncatesAndZeroesWhatDoesNotFit) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> inputs = {3.9f,   -3.9f,  -0.5f,        2147483648.0f, -2147483648.0f,
                                     255.9f, 256.0f, -1.0f,        nan,           inf,
                                     -inf,   1e20f,  2147483520.0f};
  std::vector<std::int32_t> i32(inputs.size());
  std::vector<std::uint8_t> u8(inputs.size());
  std::vector<std::int8_t> i8(inputs.size());
  std::vector<std::int64_t> i64(inputs.size());
  convert(i32.data(), DType::Int32, inputs.data(), DType::Float32, inputs.size());
  convert(u8.data(), DType::UInt8, inputs.data(), DType::Float32, inputs.size());
  convert(i8.data(), DType::Int8, inputs.data(), DType::Float32, inputs.size());
  convert(i64.data(), DType::Int64, inputs.data(), DType::Float32, inputs.size());
  EXPECT_EQ(i32, (std::vector<std::int32_t>{3, -3, 0, 0, std::numeric_limits<std::int32_t>::min(),
                                            255, 256, -1, 0, 0, 0, 0, 2147483520}));
  EXPECT_EQ(u8, (std::vector<std::uint8_t>{3, 0, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(i8, (std::vector<std::int8_t>{3, -3, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(i64, (std::vector<std::int64_t>{3, -3, 0, 2147483648, -2147483648, 255, 256, -1, 0, 0,
                                            0, 0, 2147483520}));
  // The edges of Int64: -2^63 fits, 2^63 does not.
  const std::vector<double> edges = {-0x1p63, 0x1p63, std::nextafter(0x1p63, 0.0)};
  std::vector<std::int64_t> edge_out(edges.size());
  convert(edge_out.data(), DType::Int64, edges.data(), DType::Float64, edges.size());
  EXPECT_EQ(edge_out, (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), 0,
                                                 std::int64_t{0x7FFF'FFFF'FFFF'FC00}}));
}

TEST(KernelsConvert, IntegerToIntegerWraps) {
  const std::vector<std::int32_t> inputs = {300, -1, -129, 65536 + 7};
  std::vector<std::uint8_t> u8(inputs.size());
  std::vector<std::int8_t> i8(inputs.size());
  convert(u8.data(), DType::UInt8, inputs.data(), DType::Int32, inputs.size());
  convert(i8.data(), DType::Int8, inputs.data(), DType::Int32, inputs.size());
  EXPECT_EQ(u8, (std::vector<std::uint8_t>{44, 255, 127, 7}));
  EXPECT_EQ(i8, (std::vector<std::int8_t>{44, -1, 127, 7}));
}

TEST(KernelsConvert, ComplexAndBool) {
  using C64 = std::complex<float>;
  const std::vector<C64> complex_in = {C64(1.5f, -2.0f), C64(0.0f, 1.0f), C64(0.0f, 0.0f),
                                       C64(-3.75f, 0.0f)};
  std::vector<float> real(complex_in.size());
  std::vector<std::uint8_t> truth(complex_in.size());
  std::vector<std::int32_t> integer(complex_in.size());
  std::vector<std::complex<double>> wide(complex_in.size());
  convert(real.data(), DType::Float32, complex_in.data(), DType::Complex64, complex_in.size());
  convert(truth.data(), DType::Bool, complex_in.data(), DType::Complex64, complex_in.size());
  convert(integer.data(), DType::Int32, complex_in.data(), DType::Complex64, complex_in.size());
  convert(wide.data(), DType::Complex128, complex_in.data(), DType::Complex64, complex_in.size());
  EXPECT_EQ(real, (std::vector<float>{1.5f, 0.0f, 0.0f, -3.75f}));
  EXPECT_EQ(truth, (std::vector<std::uint8_t>{1, 1, 0, 1}));
  EXPECT_EQ(integer, (std::vector<std::int32_t>{1, 0, 0, -3}));
  EXPECT_EQ(wide[0], std::complex<double>(1.5, -2.0));

  const std::vector<std::int8_t> small = {-5, 0, 7};
  std::vector<C64> complex_out(small.size());
  convert(complex_out.data(), DType::Complex64, small.data(), DType::Int8, small.size());
  EXPECT_EQ(complex_out, (std::vector<C64>{C64(-5.0f, 0.0f), C64(0.0f, 0.0f), C64(7.0f, 0.0f)}));

  // Anything -> Bool is value != 0: NaN is true, -0 is false.
  const std::vector<float> floats = {std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.25f};
  std::vector<std::uint8_t> float_truth(floats.size());
  convert(float_truth.data(), DType::Bool, floats.data(), DType::Float32, floats.size());
  EXPECT_EQ(float_truth, (std::vector<std::uint8_t>{1, 0, 1}));
  // Bool bytes other than 0/1 read as true.
  const std::vector<std::uint8_t> bools = {0, 1, 2};
  std::vector<double> from_bool(bools.size());
  convert(from_bool.data(), DType::Float64, bools.data(), DType::Bool, bools.size());
  EXPECT_EQ(from_bool, (std::vector<double>{0.0, 1.0, 1.0}));
}

TEST(KernelsConvert, SameDtypeCopiesBytes) {
  const std::vector<std::uint32_t> bits = {0x7FA0'1234u, 0x8000'0000u, 0x3F80'0000u};
  std::vector<std::uint32_t> out(bits.size());
  convert(out.data(), DType::Float32, bits.data(), DType::Float32, bits.size());
  EXPECT_EQ(out, bits);
  const std::vector<std::uint16_t> half = {0x7C01};  // A signalling NaN stays as it is.
  std::vector<std::uint16_t> half_out(1);
  convert(half_out.data(), DType::Float16, half.data(), DType::Float16, 1);
  EXPECT_EQ(half_out[0], 0x7C01);
}

// Every (source, destination) pair on crafted values: each source value is exact in its dtype,
// and the expectation is derived from the rules in kernels.hpp.
struct Crafted {
  double real;
  double imag;
};

std::vector<Crafted> crafted_values(DType dtype) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  switch (dtype) {
    case DType::Bool:
      return {{0, 0}, {1, 0}};
    case DType::UInt8:
      return {{0, 0}, {1, 0}, {200, 0}, {255, 0}};
    case DType::Int8:
      return {{0, 0}, {1, 0}, {-1, 0}, {-128, 0}, {127, 0}, {100, 0}};
    case DType::Int32:
      return {{0, 0}, {-1, 0}, {300, 0}, {-300, 0}, {2147483647, 0}, {-2147483648.0, 0}};
    case DType::Int64:
      return {{0, 0}, {-1, 0}, {300, 0}, {0x1p40, 0}, {-0x1p62, 0}};
    case DType::Float16:
      return {{0, 0},   {-0.0, 0}, {2.5, 0},  {-2.5, 0}, {65504, 0},  {-0.5, 0},
              {288, 0}, {inf, 0},  {-inf, 0}, {nan, 0},  {0x1p-24, 0}};
    case DType::BFloat16:
      return {{0, 0}, {-2.5, 0}, {256, 0}, {-0x1p100, 0}, {inf, 0}, {nan, 0}, {0x1p-133, 0}};
    case DType::Float32:
    case DType::Float64:
      return {{0, 0},   {-0.0, 0},   {3.75, 0},     {-3.75, 0}, {255.5, 0},
              {256, 0}, {0x1p31, 0}, {-0x1p31, 0},  {1e10, 0},  {-0.5, 0},
              {nan, 0}, {-inf, 0},   {0x1p-100, 0}, {288, 0}};
    case DType::Complex64:
    case DType::Complex128:
      return {{0, 0}, {0, 1}, {-2.5, 7}, {300, -1}, {nan, 0}, {0x1p40, 0}};
  }
  return {};
}

Bytes encode(DType dtype, Crafted value) {
  Bytes out(element_size(dtype));
  switch (dtype) {
    case DType::Bool:
      store_at<std::uint8_t>(out, 0, value.real != 0 || value.imag != 0 ? 1 : 0);
      break;
    case DType::UInt8:
      store_at(out, 0, static_cast<std::uint8_t>(static_cast<std::int64_t>(value.real)));
      break;
    case DType::Int8:
      store_at(out, 0, static_cast<std::int8_t>(static_cast<std::int64_t>(value.real)));
      break;
    case DType::Int32:
      store_at(out, 0, static_cast<std::int32_t>(static_cast<std::int64_t>(value.real)));
      break;
    case DType::Int64:
      store_at(out, 0, static_cast<std::int64_t>(value.real));
      break;
    case DType::Float16:
      store_at(
          out, 0,
          std::isnan(value.real) ? std::uint16_t{0x7E00} : round_double_to_16(value.real, false));
      break;
    case DType::BFloat16:
      store_at(
          out, 0,
          std::isnan(value.real) ? std::uint16_t{0x7FC0} : round_double_to_16(value.real, true));
      break;
    case DType::Float32:
      store_at(out, 0, static_cast<float>(value.real));
      break;
    case DType::Float64:
      store_at(out, 0, value.real);
      break;
    case DType::Complex64:
      store_at(out, 0,
               std::complex<float>(static_cast<float>(value.real), static_cast<float>(value.imag)));
      break;
    case DType::Complex128:
      store_at(out, 0, std::complex<double>(value.real, value.imag));
      break;
  }
  return out;
}

// What convert() must give for `value` (exact in `src`) converted to `dst`.
Bytes expected_conversion(DType src, DType dst, Crafted value) {
  if (dst == DType::Bool) {
    return encode(dst, {value.real != 0 || value.imag != 0 ? 1.0 : 0.0, 0});
  }
  if (is_integer(dst)) {
    const bool from_integer = is_integer(src) || src == DType::Bool;
    std::int64_t integer = 0;
    if (from_integer) {
      integer = static_cast<std::int64_t>(value.real);
    } else {
      const double truncated = std::trunc(value.real);
      const bool is_unsigned = dst == DType::UInt8;
      const int digits = dst == DType::UInt8   ? 8
                         : dst == DType::Int8  ? 7
                         : dst == DType::Int32 ? 31
                                               : 63;
      const double upper = std::ldexp(1.0, digits);
      const double lower = is_unsigned ? 0.0 : -upper;
      integer = truncated >= lower && truncated < upper ? static_cast<std::int64_t>(truncated) : 0;
    }
    // Modular narrowing from the int64, written as the test's own arithmetic.
    const std::size_t bits = element_size(dst) * 8;
    const std::uint64_t mask = bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
    const std::uint64_t narrowed = static_cast<std::uint64_t>(integer) & mask;
    Bytes out(element_size(dst));
    std::memcpy(out.data(), &narrowed, out.size());  // Little-endian host.
    return out;
  }
  if (is_complex(dst)) {
    return encode(dst, {value.real, is_complex(src) ? value.imag : 0.0});
  }
  return encode(dst, {value.real, 0});  // Floating: the real part, correctly rounded.
}

// One test per source dtype (to every destination), to keep the number of CTest entries small.
class KernelsConvertFrom : public ::testing::TestWithParam<DType> {};

TEST_P(KernelsConvertFrom, EveryDestinationFollowsTheConversionRules) {
  const DType src = GetParam();
  for (const DType dst : kAllDTypes) {
    for (const Crafted value : crafted_values(src)) {
      SCOPED_TRACE(::testing::Message() << src << " -> " << dst << ", value " << value.real << " + "
                                        << value.imag << "i");
      const Bytes input = encode(src, value);
      Bytes out(element_size(dst), 0xCD);
      convert(out.data(), dst, input.data(), src, 1);
      const Bytes expected = src == dst ? input : expected_conversion(src, dst, value);
      ASSERT_TRUE(same_elements(dst, expected, out, 1));
    }
  }
}

std::string source_name(const ::testing::TestParamInfo<DType>& param_info) {
  return std::string(dtype_name(param_info.param));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, KernelsConvertFrom, ::testing::ValuesIn(kAllDTypes),
                         source_name);

// ---------------------------------------------------------------------------------------------
// fill, fill_poison, values_equal

TEST(KernelsFill, ConvertsTheValueAsFromFloat64) {
  std::vector<std::uint16_t> half(3, 0);
  fill(half.data(), DType::Float16, 0.1, half.size());
  EXPECT_EQ(half, (std::vector<std::uint16_t>(3, 0x2E66)));
  std::vector<std::int32_t> i32(5, 0);
  fill(i32.data(), DType::Int32, -2.7, i32.size());
  EXPECT_EQ(i32, (std::vector<std::int32_t>(5, -2)));
  std::vector<std::uint8_t> u8(2, 9);
  fill(u8.data(), DType::UInt8, 300.0, u8.size());  // Out of range: 0.
  EXPECT_EQ(u8, (std::vector<std::uint8_t>(2, 0)));
  std::vector<std::uint8_t> truth(2, 0);
  fill(truth.data(), DType::Bool, 0.5, truth.size());
  EXPECT_EQ(truth, (std::vector<std::uint8_t>(2, 1)));
  std::vector<std::complex<float>> complex(2);
  fill(complex.data(), DType::Complex64, 1.5, complex.size());
  EXPECT_EQ(complex, (std::vector<std::complex<float>>(2, {1.5f, 0.0f})));
  std::vector<std::int64_t> i64(1, 5);
  fill(i64.data(), DType::Int64, std::numeric_limits<double>::quiet_NaN(), i64.size());
  EXPECT_EQ(i64[0], 0);
  std::vector<double> f64(2049, 0.0);
  fill(f64.data(), DType::Float64, -0.0, f64.size());
  for (const double value : f64) {
    ASSERT_EQ(bits_of(value), bits_of(-0.0));
  }
}

TEST(KernelsFill, PoisonPatterns) {
  for (const DType dtype : kAllDTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    constexpr std::size_t kCount = 5;
    Bytes out(kCount * element_size(dtype), 0);
    fill_poison(out.data(), dtype, kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      switch (dtype) {
        case DType::Float16:
          EXPECT_EQ(load_at<std::uint16_t>(out, i), 0x7E00);
          break;
        case DType::BFloat16:
          EXPECT_EQ(load_at<std::uint16_t>(out, i), 0x7FC0);
          break;
        case DType::Float32:
          EXPECT_EQ(load_at<std::uint32_t>(out, i), 0x7FC0'0000u);
          break;
        case DType::Complex64:
          EXPECT_EQ(load_at<std::uint32_t>(out, 2 * i), 0x7FC0'0000u);
          EXPECT_EQ(load_at<std::uint32_t>(out, 2 * i + 1), 0x7FC0'0000u);
          break;
        case DType::Float64:
          EXPECT_EQ(load_at<std::uint64_t>(out, i), 0x7FF8'0000'0000'0000ull);
          break;
        case DType::Complex128:
          EXPECT_EQ(load_at<std::uint64_t>(out, 2 * i), 0x7FF8'0000'0000'0000ull);
          EXPECT_EQ(load_at<std::uint64_t>(out, 2 * i + 1), 0x7FF8'0000'0000'0000ull);
          break;
        default:
          for (std::size_t b = 0; b < element_size(dtype); ++b) {
            EXPECT_EQ(out[i * element_size(dtype) + b], 0xA5);
          }
      }
    }
  }
}

// Note [Poison in 64-byte strides]: the bulk of a fill goes 64 bytes a step, the rest element by
// element. Every length around those steps, from an address one element past the buffer's
// start, fills every element with the one-element pattern above and writes nothing past the end.
TEST(KernelsFill, PoisonFillsEveryElementAndNothingPastTheEnd) {
  constexpr unsigned char kUntouched = 0x11;
  for (const DType dtype : kAllDTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const std::size_t size = element_size(dtype);
    Bytes pattern(size, 0);
    fill_poison(pattern.data(), dtype, 1);
    for (std::size_t count = 0; count <= 200; ++count) {
      SCOPED_TRACE(::testing::Message() << "count " << count);
      Bytes out((count + 3) * size, kUntouched);
      fill_poison(out.data() + size, dtype, count);
      for (std::size_t b = 0; b < out.size(); ++b) {
        const bool inside = b >= size && b < (count + 1) * size;
        ASSERT_EQ(out[b], inside ? pattern[b % size] : kUntouched) << "byte " << b;
      }
    }
  }
}

TEST(KernelsValuesEqual, FollowsIeeeEquality) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a = {1.0f, 0.0f};
  const std::vector<float> b = {1.0f, -0.0f};
  EXPECT_TRUE(values_equal(a.data(), b.data(), DType::Float32, 2));  // -0 == +0.
  const std::vector<float> with_nan = {nan};
  EXPECT_FALSE(values_equal(with_nan.data(), with_nan.data(), DType::Float32, 1));  // NaN != NaN.
  const std::vector<double> d1 = {1.0, 2.0, 3.0};
  const std::vector<double> d2 = {1.0, 2.0, 3.5};
  EXPECT_TRUE(values_equal(d1.data(), d2.data(), DType::Float64, 2));
  EXPECT_FALSE(values_equal(d1.data(), d2.data(), DType::Float64, 3));

  // 16-bit floats compare as float: +-0 equal, NaN unequal even to the same bits.
  const std::vector<std::uint16_t> zeros = {0x0000, 0x7E00};
  const std::vector<std::uint16_t> negative_zeros = {0x8000, 0x7E00};
  EXPECT_TRUE(values_equal(zeros.data(), negative_zeros.data(), DType::Float16, 1));
  EXPECT_FALSE(values_equal(zeros.data(), negative_zeros.data(), DType::Float16, 2));
  EXPECT_TRUE(values_equal(zeros.data(), negative_zeros.data(), DType::BFloat16, 1));
  const std::vector<std::uint16_t> bf_nan = {0x7FC0};
  EXPECT_FALSE(values_equal(bf_nan.data(), bf_nan.data(), DType::BFloat16, 1));

  using C64 = std::complex<float>;
  const std::vector<C64> c1 = {C64(0.0f, 1.0f)};
  const std::vector<C64> c2 = {C64(-0.0f, 1.0f)};
  const std::vector<C64> c_nan = {C64(1.0f, nan)};
  EXPECT_TRUE(values_equal(c1.data(), c2.data(), DType::Complex64, 1));
  EXPECT_FALSE(values_equal(c_nan.data(), c_nan.data(), DType::Complex64, 1));

  const std::vector<std::int32_t> i1 = {1, -2, 3};
  const std::vector<std::int32_t> i2 = {1, -2, 4};
  EXPECT_TRUE(values_equal(i1.data(), i2.data(), DType::Int32, 2));
  EXPECT_FALSE(values_equal(i1.data(), i2.data(), DType::Int32, 3));
  const std::vector<std::uint8_t> truth1 = {1, 0};
  const std::vector<std::uint8_t> truth2 = {2, 0};  // Both true.
  EXPECT_TRUE(values_equal(truth1.data(), truth2.data(), DType::Bool, 2));
}

// Every element counts, not only the last: a difference before an equal last element is found.
TEST(KernelsValuesEqual, ADifferenceBeforeTheLastElementIsUnequal) {
  const std::vector<float> a = {1.0f, 2.0f};
  const std::vector<float> b = {1.5f, 2.0f};
  EXPECT_FALSE(values_equal(a.data(), b.data(), DType::Float32, 2));
  const std::vector<std::uint16_t> half_a = {bits_of_half(1.0f), bits_of_half(2.0f)};
  const std::vector<std::uint16_t> half_b = {bits_of_half(-1.0f), bits_of_half(2.0f)};
  EXPECT_FALSE(values_equal(half_a.data(), half_b.data(), DType::Float16, 2));
  const std::vector<std::uint8_t> truth_a = {1, 0};
  const std::vector<std::uint8_t> truth_b = {0, 0};
  EXPECT_FALSE(values_equal(truth_a.data(), truth_b.data(), DType::Bool, 2));
  using C128 = std::complex<double>;
  const std::vector<C128> c_a = {C128(0.0, 1.0), C128(3.0, 0.0)};
  const std::vector<C128> c_b = {C128(0.0, -1.0), C128(3.0, 0.0)};
  EXPECT_FALSE(values_equal(c_a.data(), c_b.data(), DType::Complex128, 2));
}

}  // namespace
}  // namespace chorus::kernels
