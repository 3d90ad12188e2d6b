#include "chorus/kernels.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "detail/errors.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CHORUS_KERNELS_HAVE_AVX2 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define CHORUS_KERNELS_HAVE_AVX2 0
#endif

// See Note [Reduction order] in chorus/kernels.hpp for the contract. How it is met here:
//
// - reduce() works through the buffers one block of kBlockElements at a time. Each block is
//   folded into an accumulator array of the accumulation type, source after source in `srcs`
//   order, and then finished (avg divides, 16-bit floats round) and stored. The inner loops run
//   over elements, with no branch on dtype or op inside, so the compiler vectorizes them; the
//   per-element fold order is still exactly srcs[0], srcs[1], ..., and every element of a block
//   is read from every source before it is written, which is what makes an exact alias between
//   dst and a source safe.
// - The 16-bit float conversions are branch-free copies of chorus/half.cpp's reference ones, so
//   that they vectorize too; kernels_test proves the two agree bit for bit on every half and
//   bfloat16 pattern and on a sweep of float patterns.

namespace chorus::kernels {
namespace {

using Kind = ReduceOp::Kind;

// Elements per block: 4 KiB of float accumulator (16 KiB for Complex128), well inside L1.
constexpr std::size_t kBlockElements = 1024;

// ---------------------------------------------------------------------------------------------
// Branch-free 16-bit float conversions (same results as chorus/half.cpp).

// `condition ? if_true : if_false` as mask arithmetic: GCC turns the ternary form of these
// conversions into branches, which stops the element loops from vectorizing.
inline std::uint32_t select_bits(bool condition, std::uint32_t if_true,
                                 std::uint32_t if_false) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

inline float half_to_float_fast(std::uint16_t half) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  // Exponent and mantissa moved to their float positions.
  const std::uint32_t shifted = static_cast<std::uint32_t>(half & 0x7FFFu) << 13;
  const std::uint32_t exponent = shifted & 0x0F80'0000u;
  const std::uint32_t normal = shifted + (112u << 23);  // Rebias 15 -> 127.
  const std::uint32_t quiet = select_bits((shifted & 0x007F'E000u) != 0, 0x0040'0000u, 0u);
  const std::uint32_t special = shifted | 0x7F80'0000u | quiet;  // Inf, or NaN made quiet.
  // Subnormal m * 2^-24: read m as the mantissa of 2^-14 * (1 + m/1024), subtract 2^-14 (exact).
  const float subnormal_value = std::bit_cast<float>(shifted + (113u << 23)) - 0x1p-14f;
  const auto subnormal = std::bit_cast<std::uint32_t>(subnormal_value);
  std::uint32_t magnitude = select_bits(exponent == 0, subnormal, normal);
  magnitude = select_bits(exponent == 0x0F80'0000u, special, magnitude);
  return std::bit_cast<float>(sign | magnitude);
}

inline std::uint16_t float_to_half_fast(float value) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFF'FFFFu;
  // Normal: rebias, then round the 13 dropped bits to nearest even.
  const std::uint32_t rebiased = magnitude - (112u << 23);
  const std::uint32_t normal = (rebiased + 0x0FFFu + ((rebiased >> 13) & 1u)) >> 13;
  // Subnormal: adding 0.5 makes the float's ulp 2^-24, so the FPU's own round-to-nearest-even
  // does the rounding; the low bits are then the half mantissa (0x400 when it rounds up to the
  // smallest normal, which is the right encoding).
  const float aligned = std::bit_cast<float>(magnitude) + 0.5f;
  const auto subnormal = std::bit_cast<std::uint32_t>(aligned) - 0x3F00'0000u;
  const std::uint32_t nan = 0x7E00u | ((magnitude >> 13) & 0x03FFu);
  std::uint32_t result = select_bits(magnitude < 0x3880'0000u, subnormal, normal);
  result = select_bits(magnitude >= 0x477F'F000u, 0x7C00u, result);  // Overflow (>= 65520), inf.
  result = select_bits(magnitude > 0x7F80'0000u, nan, result);
  return static_cast<std::uint16_t>(sign | result);
}

inline float bfloat16_to_float_fast(std::uint16_t bfloat16) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bfloat16) << 16);
}

inline std::uint16_t float_to_bfloat16_fast(float value) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  // Unsigned wrap-around for NaN inputs is harmless: that result is not selected.
  const std::uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<std::uint16_t>(
      select_bits((bits & 0x7FFF'FFFFu) > 0x7F80'0000u, nan, rounded));
}

// ---------------------------------------------------------------------------------------------
// Element tags: storage type in memory, accumulation type, and per-dtype element operations.

// min/max on floating accumulators: a NaN on either side wins (the left one if both are NaN);
// on ties, -0/+0 included, the left operand is kept.
template <class F>
inline F min_propagating_nan(F left, F right) noexcept {
  const bool take_right = right < left || (right != right && left == left);
  return take_right ? right : left;
}
template <class F>
inline F max_propagating_nan(F left, F right) noexcept {
  const bool take_right = right > left || (right != right && left == left);
  return take_right ? right : left;
}

// Bool is stored one byte per value. Loading normalizes any nonzero byte to 1, so every result
// is 0 or 1 even for inputs that were not.
struct BoolTag {
  using Storage = std::uint8_t;
  using Acc = std::uint8_t;
  static constexpr DType kDType = DType::Bool;
  static Acc load(Storage value) noexcept { return static_cast<Acc>(value != 0); }
  static Storage store(Acc value) noexcept { return value; }
  static Acc min(Acc left, Acc right) noexcept { return static_cast<Acc>(left & right); }
  static Acc max(Acc left, Acc right) noexcept { return static_cast<Acc>(left | right); }
};

// Integers accumulate in the unsigned type of the same width, so sums and products wrap modulo
// 2^bits with no undefined behaviour; converting back to the signed type is modular (C++20).
// 8-bit operands promote to int, whose range holds any 8-bit sum or product, and the result is
// cast straight back.
template <class S, DType kD>
struct IntTag {
  using Storage = S;
  using Acc = std::make_unsigned_t<S>;
  static constexpr DType kDType = kD;
  static_assert(sizeof(Acc) == 1 || sizeof(Acc) >= sizeof(unsigned int),
                "a 16-bit product would promote to int and could overflow");
  static Acc load(Storage value) noexcept { return static_cast<Acc>(value); }
  static Storage store(Acc value) noexcept { return static_cast<Storage>(value); }
  static Acc min(Acc left, Acc right) noexcept {
    return static_cast<S>(right) < static_cast<S>(left) ? right : left;
  }
  static Acc max(Acc left, Acc right) noexcept {
    return static_cast<S>(right) > static_cast<S>(left) ? right : left;
  }
  // avg: the wrapped sum, read back as S, divided by n with C++ division (toward zero).
  static Acc divide(Acc sum, std::size_t divisor) noexcept {
    if constexpr (std::is_signed_v<S>) {
      return static_cast<Acc>(static_cast<std::int64_t>(static_cast<S>(sum)) /
                              static_cast<std::int64_t>(divisor));
    } else {
      return static_cast<Acc>(static_cast<std::uint64_t>(sum) / divisor);
    }
  }
};

// Float32 and Float64 accumulate in themselves.
template <class F, DType kD>
struct FloatTag {
  using Storage = F;
  using Acc = F;
  using Real = F;
  static constexpr DType kDType = kD;
  static Acc load(Storage value) noexcept { return value; }
  static Storage store(Acc value) noexcept { return value; }
  static Acc min(Acc left, Acc right) noexcept { return min_propagating_nan(left, right); }
  static Acc max(Acc left, Acc right) noexcept { return max_propagating_nan(left, right); }
};

// Float16 and BFloat16 accumulate in float and round to nearest even once, at the store.
struct HalfTag {
  using Storage = Half;
  using Acc = float;
  using Real = float;
  static constexpr DType kDType = DType::Float16;
  static Acc load(Storage value) noexcept { return half_to_float_fast(value.bits); }
  static Storage store(Acc value) noexcept { return Half::from_bits(float_to_half_fast(value)); }
  static Acc min(Acc left, Acc right) noexcept { return min_propagating_nan(left, right); }
  static Acc max(Acc left, Acc right) noexcept { return max_propagating_nan(left, right); }
};

struct BFloat16Tag {
  using Storage = BFloat16;
  using Acc = float;
  using Real = float;
  static constexpr DType kDType = DType::BFloat16;
  static Acc load(Storage value) noexcept { return bfloat16_to_float_fast(value.bits); }
  static Storage store(Acc value) noexcept {
    return BFloat16::from_bits(float_to_bfloat16_fast(value));
  }
  static Acc min(Acc left, Acc right) noexcept { return min_propagating_nan(left, right); }
  static Acc max(Acc left, Acc right) noexcept { return max_propagating_nan(left, right); }
};

// Complex accumulates in std::complex of its component type; no min/max/product.
template <class F, DType kD>
struct ComplexTag {
  using Storage = std::complex<F>;
  using Acc = std::complex<F>;
  using Real = F;
  static constexpr DType kDType = kD;
  static Acc load(Storage value) noexcept { return value; }
  static Storage store(Acc value) noexcept { return value; }
};

using UInt8Tag = IntTag<std::uint8_t, DType::UInt8>;
using Int8Tag = IntTag<std::int8_t, DType::Int8>;
using Int32Tag = IntTag<std::int32_t, DType::Int32>;
using Int64Tag = IntTag<std::int64_t, DType::Int64>;
using Float32Tag = FloatTag<float, DType::Float32>;
using Float64Tag = FloatTag<double, DType::Float64>;
using Complex64Tag = ComplexTag<float, DType::Complex64>;
using Complex128Tag = ComplexTag<double, DType::Complex128>;

template <class Tag>
inline constexpr bool kIsBoolTag = Tag::kDType == DType::Bool;
template <class Tag>
inline constexpr bool kIsIntegerTag = is_integer(Tag::kDType);
template <class Tag>
inline constexpr bool kIsFloatingTag = is_floating(Tag::kDType);
template <class Tag>
inline constexpr bool kIsComplexTag = is_complex(Tag::kDType);

static_assert(sizeof(HalfTag::Storage) == 2 && sizeof(BFloat16Tag::Storage) == 2);
static_assert(sizeof(Complex64Tag::Storage) == 8 && sizeof(Complex128Tag::Storage) == 16);

// Calls fn(Tag{}) for the tag of `dtype`.
template <class Fn>
void dispatch(DType dtype, Fn&& fn) {
  CHORUS_CHECK_LT(static_cast<int>(dtype), kNumDTypes);
  switch (dtype) {
    case DType::Bool:
      return fn(BoolTag{});
    case DType::UInt8:
      return fn(UInt8Tag{});
    case DType::Int8:
      return fn(Int8Tag{});
    case DType::Int32:
      return fn(Int32Tag{});
    case DType::Int64:
      return fn(Int64Tag{});
    case DType::Float16:
      return fn(HalfTag{});
    case DType::BFloat16:
      return fn(BFloat16Tag{});
    case DType::Float32:
      return fn(Float32Tag{});
    case DType::Float64:
      return fn(Float64Tag{});
    case DType::Complex64:
      return fn(Complex64Tag{});
    case DType::Complex128:
      return fn(Complex128Tag{});
  }
}

// ---------------------------------------------------------------------------------------------
// reduce

// The same rules as ReduceOp::check_dtype (kernels_test checks that they agree), kept here so
// the hot path neither builds strings nor depends on anything but the kind.
constexpr bool op_allowed(Kind kind, DType dtype) noexcept {
  switch (kind) {
    case Kind::Sum:
    case Kind::Avg:
      return dtype != DType::Bool;
    case Kind::Product:
      return dtype != DType::Bool && !is_complex(dtype);
    case Kind::Min:
    case Kind::Max:
      return !is_complex(dtype);
    case Kind::BAnd:
    case Kind::BOr:
    case Kind::BXor:
      return is_integer(dtype) || dtype == DType::Bool;
    case Kind::PremulSum:
      return is_floating(dtype) || is_complex(dtype);
    case Kind::Invalid:
      return false;
  }
  return false;
}

// Note [Folds in one pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Three and four sources (a simulated world of 3 or 4 ranks: every all_reduce's completion) fold
// element by element in one loop, as one and two do: ((s0 (+) s1) (+) s2) (+) s3, the order and
// the Acc values the block passes give (the first pair held as Acc, as acc[i] holds it), so the
// bits are the same. The block passes went through an accumulator on the stack and back: for 4
// sources of 64 floats the AVX2 fold took ~230 instructions, ~150 in one pass (docs/performance.md,
// 2026-12-07 11:10). Four read streams and one write stay within what a core's prefetchers
// follow; five sources and more keep the blocks.

// dst[i] = finish(prepare(s0[i]) (+) prepare(s1[i]) (+) ...), see the top of this file. Up to
// four sources fold in one pass (Note [Folds in one pass]). From five on, the first pass over a
// block folds two sources and the last pass folds the final one or two and stores, and each pair
// between costs one extra pass over an L1-resident block.
// The body of fold_blocks and of its AVX2 build, fold_blocks_avx2, which each inline it:
// always_inline so that even GCC at -O0, which ignores flatten, compiles it into both.
template <class Tag, class Combine, class Prepare, class Finish>
[[gnu::always_inline]] inline void fold_blocks_body(void* dst, const void* const* srcs,
                                                    std::size_t num_srcs, std::size_t count,
                                                    Combine combine, Prepare prepare,
                                                    Finish finish) {
  using Storage = typename Tag::Storage;
  using Acc = typename Tag::Acc;
  CHORUS_CHECK_GE(num_srcs, std::size_t{1});
  auto* out = static_cast<Storage*>(dst);
  const auto source = [srcs](std::size_t j, std::size_t base) {
    return static_cast<const Storage*>(srcs[j]) + base;
  };
  const auto value = [&prepare](const Storage* src, std::size_t i) {
    return prepare(Tag::load(src[i]));
  };
  // Each loop below reads element i of every source it touches before writing out[i], so an
  // exact alias of out with a source is safe in them all.
  if (num_srcs == 1) {
    const Storage* only = source(0, 0);
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = Tag::store(finish(value(only, i)));
    }
    return;
  }
  if (num_srcs == 2) {
    const Storage* first = source(0, 0);
    const Storage* second = source(1, 0);
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = Tag::store(finish(combine(value(first, i), value(second, i))));
    }
    return;
  }
  if (num_srcs == 3) {  // Note [Folds in one pass]
    const Storage* first = source(0, 0);
    const Storage* second = source(1, 0);
    const Storage* third = source(2, 0);
    for (std::size_t i = 0; i < count; ++i) {
      const Acc pair = combine(value(first, i), value(second, i));  // as acc[i] below holds it
      out[i] = Tag::store(finish(combine(pair, value(third, i))));
    }
    return;
  }
  if (num_srcs == 4) {
    const Storage* first = source(0, 0);
    const Storage* second = source(1, 0);
    const Storage* third = source(2, 0);
    const Storage* fourth = source(3, 0);
    for (std::size_t i = 0; i < count; ++i) {
      const Acc pair = combine(value(first, i), value(second, i));
      out[i] = Tag::store(finish(combine(combine(pair, value(third, i)), value(fourth, i))));
    }
    return;
  }
  Acc acc[kBlockElements];
  for (std::size_t base = 0; base < count; base += kBlockElements) {
    const std::size_t length = std::min(kBlockElements, count - base);
    CHORUS_CHECK_LE(length, kBlockElements);
    const Storage* first = source(0, base);
    const Storage* second = source(1, base);
    for (std::size_t i = 0; i < length; ++i) {
      acc[i] = combine(value(first, i), value(second, i));
    }
    // Middle sources two at a time, leaving one or two for the storing pass.
    std::size_t j = 2;
    for (; num_srcs - j > 2; j += 2) {
      const Storage* left = source(j, base);
      const Storage* right = source(j + 1, base);
      for (std::size_t i = 0; i < length; ++i) {
        acc[i] = combine(combine(acc[i], value(left, i)), value(right, i));
      }
    }
    Storage* block_out = out + base;
    if (num_srcs - j == 2) {
      const Storage* left = source(j, base);
      const Storage* right = source(j + 1, base);
      for (std::size_t i = 0; i < length; ++i) {
        block_out[i] =
            Tag::store(finish(combine(combine(acc[i], value(left, i)), value(right, i))));
      }
    } else {
      CHORUS_CHECK_EQ(num_srcs - j, std::size_t{1});
      const Storage* last = source(j, base);
      for (std::size_t i = 0; i < length; ++i) {
        block_out[i] = Tag::store(finish(combine(acc[i], value(last, i))));
      }
    }
  }
}

// [[gnu::flatten]] inlines every call in the body (the tag's load and store, the 16-bit float
// conversions, the op's lambdas; not the checks' failure paths, which are noinline), which the
// loops need to vectorize. Without it, link-time optimisation of a whole program (the release
// preset) left the Float16 conversions as calls: a 1 MiB float16 all_reduce on 2 simulated
// ranks took 5.0 ms, 1.2 ms with it (2026-12-05).
template <class Tag, class Combine, class Prepare, class Finish>
[[gnu::flatten]] void fold_blocks(void* dst, const void* const* srcs, std::size_t num_srcs,
                                  std::size_t count, Combine combine, Prepare prepare,
                                  Finish finish) {
  fold_blocks_body<Tag>(dst, srcs, num_srcs, count, combine, prepare, finish);
}

// Note [Kernel instruction sets] (chorus/kernels.hpp): the same loops compiled for AVX2. Flatten
// inlines fold_blocks_body and everything in it here, so all of it is generated with AVX2's wider
// vectors and its blends (baseline SSE2 has no blend, which is why NaN-propagating min/max gain
// the most). No "fma": with it GCC would contract premul_sum's multiply and add into one
// rounding, and the two builds would no longer agree bit for bit.
#if CHORUS_KERNELS_HAVE_AVX2
template <class Tag, class Combine, class Prepare, class Finish>
[[gnu::flatten, gnu::target("avx2")]] void fold_blocks_avx2(void* dst, const void* const* srcs,
                                                            std::size_t num_srcs, std::size_t count,
                                                            Combine combine, Prepare prepare,
                                                            Finish finish) {
  fold_blocks_body<Tag>(dst, srcs, num_srcs, count, combine, prepare, finish);
}

// Float16 in the AVX2 build converts with F16C's instructions, eight elements each, which GCC
// does not vectorize from HalfTag's bit arithmetic. They give the same bits as
// half_to_float_fast and float_to_half_fast (round to nearest even, NaNs made quiet with their
// payload's top bits kept; every half and every float compared, 2026-12-05) in the default
// rounding mode: float_to_half_fast rounds subnormal results with the FPU, so under another
// MXCSR rounding mode they would differ there. kernels_test checks every half pattern.
[[gnu::target("avx2,f16c")]] inline void widen_halves(float* out, const Half* in,
                                                      std::size_t length) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= length; i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  for (; i < length; ++i) {
    out[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(in[i].bits)));
  }
}

[[gnu::target("avx2,f16c")]] inline void narrow_to_halves(Half* out, const float* in,
                                                          std::size_t length) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= length; i += 8) {
    const __m128i halves = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), halves);
  }
  for (; i < length; ++i) {
    const __m128i half = _mm_cvtps_ph(_mm_set_ss(in[i]), _MM_FROUND_TO_NEAREST_INT);
    out[i] = Half::from_bits(static_cast<std::uint16_t>(_mm_cvtsi128_si32(half)));
  }
}

// fold_blocks for Float16 in the AVX2 build: each source's block is widened to float first, then
// folded in the same order (srcs[0], srcs[1], ...) with the same element functions, then
// narrowed once. Every source of a block is read before the block is written, so an exact alias
// of dst with a source is safe. (BFloat16 stays with fold_blocks_avx2: its shift-and-round
// conversions vectorize inside the fold, which was faster than widening first: 321 against
// 531 us for 8 sources of 1 MiB, 2026-12-05.)
template <class Combine, class Prepare, class Finish>
[[gnu::flatten, gnu::target("avx2,f16c")]] void fold_half_blocks_f16c(
    void* dst, const void* const* srcs, std::size_t num_srcs, std::size_t count, Combine combine,
    Prepare prepare, Finish finish) {
  CHORUS_CHECK_GE(num_srcs, std::size_t{1});
  auto* out = static_cast<Half*>(dst);
  // `next` starts 128 bytes past a multiple of 4 KiB from `acc`: at exactly 4 KiB apart, the
  // loads of next[i] would wait on the stores to acc[i] (4K aliasing: 1.4x slower at 8 sources).
  alignas(64) float blocks[2 * kBlockElements + 32];
  float* acc = blocks;
  float* next = blocks + kBlockElements + 32;
  for (std::size_t base = 0; base < count; base += kBlockElements) {
    const std::size_t length = std::min(kBlockElements, count - base);
    widen_halves(acc, static_cast<const Half*>(srcs[0]) + base, length);
    for (std::size_t i = 0; i < length; ++i) {
      acc[i] = prepare(acc[i]);
    }
    for (std::size_t j = 1; j < num_srcs; ++j) {
      widen_halves(next, static_cast<const Half*>(srcs[j]) + base, length);
      for (std::size_t i = 0; i < length; ++i) {
        acc[i] = combine(acc[i], prepare(next[i]));
      }
    }
    for (std::size_t i = 0; i < length; ++i) {
      acc[i] = finish(acc[i]);
    }
    narrow_to_halves(out + base, acc, length);
  }
}

// BFloat16 to and from float as plain loops, which GCC vectorizes for AVX2 (for convert()).
[[gnu::target("avx2")]] void widen_bfloat16s(float* out, const BFloat16* in,
                                             std::size_t length) noexcept {
  for (std::size_t i = 0; i < length; ++i) {
    out[i] = bfloat16_to_float_fast(in[i].bits);
  }
}

[[gnu::target("avx2")]] void narrow_to_bfloat16s(BFloat16* out, const float* in,
                                                 std::size_t length) noexcept {
  for (std::size_t i = 0; i < length; ++i) {
    out[i] = BFloat16::from_bits(float_to_bfloat16_fast(in[i]));
  }
}

// convert() between a 16-bit float and Float32 in the AVX2 build (MPI's widened 16-bit
// reductions, Tensor::to); false for every other pair. The same bits as convert_typed.
bool convert_sixteen_bit_avx2(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                              std::size_t count) noexcept {
  if (dst_dtype == DType::Float32 && src_dtype == DType::Float16) {
    widen_halves(static_cast<float*>(dst), static_cast<const Half*>(src), count);
  } else if (dst_dtype == DType::Float16 && src_dtype == DType::Float32) {
    narrow_to_halves(static_cast<Half*>(dst), static_cast<const float*>(src), count);
  } else if (dst_dtype == DType::Float32 && src_dtype == DType::BFloat16) {
    widen_bfloat16s(static_cast<float*>(dst), static_cast<const BFloat16*>(src), count);
  } else if (dst_dtype == DType::BFloat16 && src_dtype == DType::Float32) {
    narrow_to_bfloat16s(static_cast<BFloat16*>(dst), static_cast<const float*>(src), count);
  } else {
    return false;
  }
  return true;
}

// The AVX2 build's fold for Tag.
template <class Tag, class Combine, class Prepare, class Finish>
void fold_avx2(void* dst, const void* const* srcs, std::size_t num_srcs, std::size_t count,
               Combine combine, Prepare prepare, Finish finish) {
  if constexpr (std::is_same_v<Tag, HalfTag>) {
    fold_half_blocks_f16c(dst, srcs, num_srcs, count, combine, prepare, finish);
  } else {
    fold_blocks_avx2<Tag>(dst, srcs, num_srcs, count, combine, prepare, finish);
  }
}
#endif

// Whether this CPU runs the AVX2 build: AVX2 and F16C (which every AVX2 CPU has), with the AVX
// registers saved by the OS, which __builtin_cpu_supports checks. Clang 14's
// __builtin_cpu_supports has no "f16c": CPUID leaf 1, ECX bit 29.
bool cpu_runs_avx2_build() noexcept {
#if CHORUS_KERNELS_HAVE_AVX2
  static const bool runs = [] {
    __builtin_cpu_init();
    unsigned eax = 0;
    unsigned ebx = 0;
    unsigned ecx = 0;
    unsigned edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2") != 0;
  }();
  return runs;
#else
  return false;
#endif
}

// The ISA reduce() uses, best_isa() on first use; set_isa() changes it.
std::atomic<Isa>& isa_setting() noexcept {
  static std::atomic<Isa> setting{best_isa()};
  return setting;
}

// Note [Reduction programs] (chorus/kernels.hpp): evaluates `program` block by block. Each
// step runs over a block of elements: a source step loads (and prepares) its block onto a stack
// of partial-result blocks, a combine step folds the top block into the one below it. The
// result is stored only after every source of the block was read, so an exact alias of dst with
// a source is safe. `depth`: the most partial results the program holds at once.
// kF16c (the AVX2 build's Float16 only): a source's block is widened, and the result narrowed,
// with F16C's instructions, as in fold_half_blocks_f16c; the same bits.
template <class Tag, bool kF16c, class Combine, class Prepare, class Finish>
[[gnu::always_inline]] inline void evaluate_program_body(void* dst, const void* const* srcs,
                                                         std::size_t count,
                                                         std::span<const int> program,
                                                         std::size_t depth, Combine combine,
                                                         Prepare prepare, Finish finish) {
  using Storage = typename Tag::Storage;
  using Acc = typename Tag::Acc;
  static_assert(!kF16c || (CHORUS_KERNELS_HAVE_AVX2 && std::is_same_v<Tag, HalfTag>));
  constexpr std::size_t kProgramBlockElements = 256;
  std::vector<Acc> stack(depth * kProgramBlockElements);
  auto* out = static_cast<Storage*>(dst);
  for (std::size_t base = 0; base < count; base += kProgramBlockElements) {
    const std::size_t length = std::min(kProgramBlockElements, count - base);
    std::size_t top = 0;  // partial results on the stack
    for (std::size_t k = 0; k < program.size(); ++k) {
      const int step = program[k];
      if (step == kCombine) {
        CHORUS_CHECK_GE(top, std::size_t{2});
        Acc* left = stack.data() + (top - 2) * kProgramBlockElements;
        const Acc* right = left + kProgramBlockElements;
        for (std::size_t i = 0; i < length; ++i) {
          left[i] = combine(left[i], right[i]);
        }
        --top;
        continue;
      }
      CHORUS_CHECK_LT(top, depth);
      Acc* pushed = stack.data() + top * kProgramBlockElements;
      const Storage* source =
          static_cast<const Storage*>(srcs[static_cast<std::size_t>(step)]) + base;
      // A source that the next step combines at once (a right leaf: every leaf of a left fold
      // but the first) is folded straight into the partial result below it: one pass instead of
      // a push and a combine, with the same operands in the same order.
      const bool combined_next = top >= 1 && k + 1 < program.size() && program[k + 1] == kCombine;
      // Element i of the source: with F16C the block is widened into the free slot first.
#if CHORUS_KERNELS_HAVE_AVX2
      if constexpr (kF16c) {
        widen_halves(pushed, source, length);
      }
#endif
      const auto element = [&](std::size_t i) {
        if constexpr (kF16c) {
          return pushed[i];
        } else {
          return Tag::load(source[i]);
        }
      };
      if (combined_next) {
        Acc* left = pushed - kProgramBlockElements;
        for (std::size_t i = 0; i < length; ++i) {
          left[i] = combine(left[i], prepare(element(i)));
        }
        ++k;  // the combine just done
      } else {
        for (std::size_t i = 0; i < length; ++i) {
          pushed[i] = prepare(element(i));
        }
        ++top;
      }
    }
    CHORUS_CHECK_EQ(top, std::size_t{1});
    if constexpr (kF16c) {
#if CHORUS_KERNELS_HAVE_AVX2
      for (std::size_t i = 0; i < length; ++i) {
        stack[i] = finish(stack[i]);
      }
      narrow_to_halves(out + base, stack.data(), length);
#endif
    } else {
      for (std::size_t i = 0; i < length; ++i) {
        out[base + i] = Tag::store(finish(stack[i]));
      }
    }
  }
}

// The baseline build, flattened as fold_blocks is (so that the tag's conversions and the op's
// lambdas are inlined into the loops).
template <class Tag, class Combine, class Prepare, class Finish>
[[gnu::flatten]] void evaluate_program(void* dst, const void* const* srcs, std::size_t count,
                                       std::span<const int> program, std::size_t depth,
                                       Combine combine, Prepare prepare, Finish finish) {
  evaluate_program_body<Tag, false>(dst, srcs, count, program, depth, combine, prepare, finish);
}

// The AVX2 build (Note [Kernel instruction sets]), F16C's conversions for Float16.
#if CHORUS_KERNELS_HAVE_AVX2
template <class Tag, class Combine, class Prepare, class Finish>
[[gnu::flatten, gnu::target("avx2,f16c")]] void evaluate_program_avx2(
    void* dst, const void* const* srcs, std::size_t count, std::span<const int> program,
    std::size_t depth, Combine combine, Prepare prepare, Finish finish) {
  evaluate_program_body<Tag, std::is_same_v<Tag, HalfTag>>(dst, srcs, count, program, depth,
                                                           combine, prepare, finish);
}
#endif

// Calls run(combine, prepare, finish) with the element functions of `reduce_op` on Tag's
// accumulation type (Note [Reduction order]); `num_srcs` is avg's divisor.
template <class Tag, class Run>
void with_op_functions(std::size_t num_srcs, const ReduceOp& reduce_op, Run run) {
  using Acc = typename Tag::Acc;
  const auto keep = [](Acc value) { return value; };
  const auto add = [](Acc left, Acc right) { return static_cast<Acc>(left + right); };
  constexpr bool kArithmetic = !kIsBoolTag<Tag>;
  constexpr bool kOrdered = !kIsComplexTag<Tag>;
  constexpr bool kBitwise = kIsBoolTag<Tag> || kIsIntegerTag<Tag>;
  constexpr bool kScalable = kIsFloatingTag<Tag> || kIsComplexTag<Tag>;

  switch (reduce_op.kind()) {
    case Kind::Sum:
      if constexpr (kArithmetic) {
        return run(add, keep, keep);
      }
      break;
    case Kind::Avg:
      if constexpr (kIsIntegerTag<Tag>) {
        return run(add, keep, [num_srcs](Acc sum) { return Tag::divide(sum, num_srcs); });
      } else if constexpr (kScalable) {
        const auto divisor = static_cast<typename Tag::Real>(num_srcs);
        return run(add, keep, [divisor](Acc sum) { return static_cast<Acc>(sum / divisor); });
      }
      break;
    case Kind::Product:
      if constexpr (kArithmetic && kOrdered) {
        return run([](Acc left, Acc right) { return static_cast<Acc>(left * right); }, keep, keep);
      }
      break;
    case Kind::Min:
      if constexpr (kOrdered) {
        return run([](Acc left, Acc right) { return Tag::min(left, right); }, keep, keep);
      }
      break;
    case Kind::Max:
      if constexpr (kOrdered) {
        return run([](Acc left, Acc right) { return Tag::max(left, right); }, keep, keep);
      }
      break;
    case Kind::BAnd:
      if constexpr (kBitwise) {
        return run([](Acc left, Acc right) { return static_cast<Acc>(left & right); }, keep, keep);
      }
      break;
    case Kind::BOr:
      if constexpr (kBitwise) {
        return run([](Acc left, Acc right) { return static_cast<Acc>(left | right); }, keep, keep);
      }
      break;
    case Kind::BXor:
      if constexpr (kBitwise) {
        return run([](Acc left, Acc right) { return static_cast<Acc>(left ^ right); }, keep, keep);
      }
      break;
    case Kind::PremulSum:
      if constexpr (kScalable) {
        // The factor is converted once to the accumulation scalar (float for Float16, BFloat16,
        // Float32 and Complex64; double otherwise) and multiplies each input before the sum.
        const auto factor = static_cast<typename Tag::Real>(reduce_op.premul_factor());
        return run(
            add, [factor](Acc value) { return static_cast<Acc>(factor * value); }, keep);
      }
      break;
    case Kind::Invalid:
      break;
  }
  // reduce() checked op_allowed(), which admits exactly the cases handled above.
  detail::check_failed("with_op_functions handles every case op_allowed() admits", __FILE__,
                       __LINE__, detail::format_check_values(reduce_op, Tag::kDType));
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b);
  return a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

// ---------------------------------------------------------------------------------------------
// convert

// Rounds `value` to float with round-to-odd: exact when representable, otherwise the neighbour
// whose last mantissa bit is 1. Rounding that result to a format with at least two fewer bits
// (half: 11, bfloat16: 8, float: 24) to nearest even gives the correctly rounded answer, which a
// plain double -> float -> half chain does not (it can round twice onto a tie).
float double_to_float_round_to_odd(double value) noexcept {
  const auto nearest = static_cast<float>(value);
  if (!std::isfinite(nearest) || static_cast<double>(nearest) == value) {
    return nearest;  // Exact, NaN, or past float's range (then past half's and bfloat16's too).
  }
  auto bits = std::bit_cast<std::uint32_t>(nearest);
  if ((bits & 1u) == 0) {
    // Step one ulp toward `value`, to the other (odd) neighbour; the sign bit is untouched.
    const bool above = std::fabs(static_cast<double>(nearest)) > std::fabs(value);
    bits = above ? bits - 1u : bits + 1u;
  }
  return std::bit_cast<float>(bits);
}

// The same for int64 -> float, done on the integer so no intermediate rounding happens.
float int64_to_float_round_to_odd(std::int64_t value) noexcept {
  const std::uint64_t magnitude = value < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(value)
                                            : static_cast<std::uint64_t>(value);
  constexpr int kFloatSignificandBits = std::numeric_limits<float>::digits;  // 24
  if (magnitude < (std::uint64_t{1} << kFloatSignificandBits)) {
    return static_cast<float>(value);  // Exact.
  }
  const int shift = (64 - std::countl_zero(magnitude)) - kFloatSignificandBits;
  CHORUS_CHECK(shift > 0 && shift <= 64 - kFloatSignificandBits);
  std::uint64_t significand = magnitude >> shift;
  if ((magnitude & ((std::uint64_t{1} << shift) - 1u)) != 0) {
    significand |= 1u;  // Inexact: the odd neighbour.
  }
  const float scaled = std::ldexp(static_cast<float>(significand), shift);  // Both exact.
  return value < 0 ? -scaled : scaled;
}

// float -> integer: truncate toward zero; NaN and values whose truncation S cannot hold give 0.
template <class S>
S floating_to_integer(double value) noexcept {
  constexpr int kDigits = std::numeric_limits<S>::digits;  // Value bits, sign excluded.
  constexpr auto kUpper = static_cast<double>(std::uint64_t{1} << kDigits);  // Exclusive.
  constexpr double kLower = std::is_signed_v<S> ? -kUpper : 0.0;             // Inclusive.
  const double truncated = std::trunc(value);
  if (!(truncated >= kLower && truncated < kUpper)) {
    return 0;
  }
  return static_cast<S>(truncated);
}

// A source element read into one of four carriers: std::int64_t (Bool and integers, exact),
// float (Float16, BFloat16, Float32; exact), double, or std::complex<F>.
template <class Tag>
auto read_element(typename Tag::Storage value) noexcept {
  if constexpr (kIsBoolTag<Tag>) {
    return static_cast<std::int64_t>(value != 0);
  } else if constexpr (kIsIntegerTag<Tag>) {
    return static_cast<std::int64_t>(value);
  } else {
    return Tag::load(value);  // float, double, or complex.
  }
}

template <class T>
struct IsComplex : std::false_type {};
template <class F>
struct IsComplex<std::complex<F>> : std::true_type {};

// Writes a carrier value as an element of Tag.
template <class Tag, class Carrier>
typename Tag::Storage write_element(Carrier value) noexcept {
  using Storage = typename Tag::Storage;
  if constexpr (IsComplex<Carrier>::value) {
    if constexpr (kIsBoolTag<Tag>) {
      return static_cast<Storage>(value.real() != 0 || value.imag() != 0);
    } else if constexpr (kIsComplexTag<Tag>) {
      using F = typename Tag::Real;
      return Storage(static_cast<F>(value.real()), static_cast<F>(value.imag()));
    } else {
      return write_element<Tag>(value.real());  // Complex -> real keeps the real part.
    }
  } else if constexpr (kIsBoolTag<Tag>) {
    return static_cast<Storage>(value != 0);
  } else if constexpr (kIsComplexTag<Tag>) {
    using F = typename Tag::Real;
    return Storage(static_cast<F>(value), F{0});  // Correctly rounded, like Float32/Float64.
  } else if constexpr (kIsIntegerTag<Tag>) {
    if constexpr (std::is_same_v<Carrier, std::int64_t>) {
      return static_cast<Storage>(value);  // Modular, as C++20 integral conversion.
    } else {
      return floating_to_integer<Storage>(static_cast<double>(value));
    }
  } else if constexpr (std::is_same_v<Tag, HalfTag> || std::is_same_v<Tag, BFloat16Tag>) {
    float narrowed = 0.0f;
    if constexpr (std::is_same_v<Carrier, std::int64_t>) {
      narrowed = int64_to_float_round_to_odd(value);
    } else if constexpr (std::is_same_v<Carrier, double>) {
      narrowed = double_to_float_round_to_odd(value);
    } else {
      narrowed = value;
    }
    return Tag::store(narrowed);
  } else {
    return static_cast<Storage>(value);  // To Float32/Float64: one correctly rounded step.
  }
}

template <class DstTag, class SrcTag>
void convert_typed(void* dst, const void* src, std::size_t count) {
  auto* out = static_cast<typename DstTag::Storage*>(dst);
  const auto* in = static_cast<const typename SrcTag::Storage*>(src);
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = write_element<DstTag>(read_element<SrcTag>(in[i]));
  }
}

}  // namespace

namespace {

// Non-null buffers of `count` >= 1 elements that are exact aliases of dst or do not overlap it
// (a partial overlap would read values the reduction already wrote).
void check_buffers(const void* dst, const void* const* srcs, std::size_t num_srcs,
                   std::size_t count, DType dtype) {
  CHORUS_CHECK_GE(count, std::size_t{1});
  const std::size_t size = element_size(dtype);
  CHORUS_CHECK_LE(count, std::numeric_limits<std::size_t>::max() / size);
  const std::size_t bytes = count * size;
  CHORUS_CHECK(dst != nullptr);
  CHORUS_CHECK(srcs != nullptr);
  for (std::size_t j = 0; j < num_srcs; ++j) {
    CHORUS_CHECK(srcs[j] != nullptr);
    if (srcs[j] != dst) {
      CHORUS_CHECK(!overlaps(srcs[j], bytes, dst, bytes));
    }
  }
}

}  // namespace

void reduce(void* dst, const void* const* srcs, std::size_t num_srcs, std::size_t count,
            DType dtype, const ReduceOp& reduce_op) {
  if (!op_allowed(reduce_op.kind(), dtype)) [[unlikely]] {
    detail::check_failed("op_allowed(reduce_op.kind(), dtype)", __FILE__, __LINE__,
                         detail::format_check_values(reduce_op, dtype));
  }
  CHORUS_CHECK_GE(num_srcs, std::size_t{1});
  if (count == 0) {
    return;
  }
  check_buffers(dst, srcs, num_srcs, count, dtype);
  const std::size_t bytes = count * element_size(dtype);

  const Kind kind = reduce_op.kind();
  if (num_srcs == 1 && kind != Kind::Avg && kind != Kind::PremulSum && dtype != DType::Bool) {
    // A fold of one value is that value: copy the bytes (Bool still goes through the kernel, which
    // normalizes its bytes to 0/1).
    if (dst != srcs[0]) {
      std::memcpy(dst, srcs[0], bytes);
    }
    return;
  }
  dispatch(dtype, [&](auto tag) {
    using Tag = decltype(tag);
    with_op_functions<Tag>(num_srcs, reduce_op, [&](auto combine, auto prepare, auto finish) {
#if CHORUS_KERNELS_HAVE_AVX2
      if (isa_setting().load(std::memory_order_relaxed) == Isa::Avx2) {
        return fold_avx2<Tag>(dst, srcs, num_srcs, count, combine, prepare, finish);
      }
#endif
      fold_blocks<Tag>(dst, srcs, num_srcs, count, combine, prepare, finish);
    });
  });
}

const char* isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::Baseline:
      return "baseline";
    case Isa::Avx2:
      return "avx2";
  }
  return "unknown";
}

bool isa_supported(Isa isa) noexcept {
  switch (isa) {
    case Isa::Baseline:
      return true;
    case Isa::Avx2:
      return cpu_runs_avx2_build();
  }
  return false;
}

Isa best_isa() noexcept { return cpu_runs_avx2_build() ? Isa::Avx2 : Isa::Baseline; }

Isa active_isa() noexcept { return isa_setting().load(std::memory_order_relaxed); }

void set_isa(Isa isa) {
  if (isa_supported(isa)) {
    isa_setting().store(isa, std::memory_order_relaxed);
    return;
  }
  const bool cpu_lacks_it = isa == Isa::Avx2 && CHORUS_KERNELS_HAVE_AVX2;
  throw InvalidArgument(detail::make_context("kernels::set_isa"),
                        std::string("instruction set '") + isa_name(isa) +
                            "' is not supported by this " + (cpu_lacks_it ? "CPU" : "build"));
}

void reduce_program(void* dst, const void* const* srcs, std::size_t num_srcs, std::size_t count,
                    DType dtype, const ReduceOp& reduce_op, std::span<const int> program) {
  // The program must be a full binary tree over the sources, each exactly once.
  CHORUS_CHECK_GE(num_srcs, std::size_t{1});
  CHORUS_CHECK_EQ(program.size(), 2 * num_srcs - 1);
  std::vector<bool> seen(num_srcs, false);
  std::size_t top = 0;
  std::size_t depth = 0;
  for (const int step : program) {
    if (step == kCombine) {
      CHORUS_CHECK_GE(top, std::size_t{2});
      --top;
    } else {
      CHORUS_CHECK_GE(step, 0);
      CHORUS_CHECK_LT(static_cast<std::size_t>(step), num_srcs);
      CHORUS_CHECK(!seen[static_cast<std::size_t>(step)]);
      seen[static_cast<std::size_t>(step)] = true;
      depth = std::max(depth, ++top);
    }
  }
  CHORUS_CHECK_EQ(top, std::size_t{1});
  // The same checks as reduce() (and its shortcut for one source): then the evaluation.
  if (num_srcs == 1) {
    return reduce(dst, srcs, num_srcs, count, dtype, reduce_op);
  }
  if (!op_allowed(reduce_op.kind(), dtype)) [[unlikely]] {
    detail::check_failed("op_allowed(reduce_op.kind(), dtype)", __FILE__, __LINE__,
                         detail::format_check_values(reduce_op, dtype));
  }
  if (count == 0) {
    return;
  }
  check_buffers(dst, srcs, num_srcs, count, dtype);
  dispatch(dtype, [&](auto tag) {
    using Tag = decltype(tag);
    with_op_functions<Tag>(num_srcs, reduce_op, [&](auto combine, auto prepare, auto finish) {
#if CHORUS_KERNELS_HAVE_AVX2
      if (isa_setting().load(std::memory_order_relaxed) == Isa::Avx2) {
        return evaluate_program_avx2<Tag>(dst, srcs, count, program, depth, combine, prepare,
                                          finish);
      }
#endif
      evaluate_program<Tag>(dst, srcs, count, program, depth, combine, prepare, finish);
    });
  });
}

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t count) {
  if (count == 0) {
    return;
  }
  CHORUS_CHECK(dst != nullptr);
  CHORUS_CHECK(src != nullptr);
  if (dst_dtype == src_dtype) {
    const std::size_t size = element_size(dst_dtype);
    CHORUS_CHECK_LE(count, std::numeric_limits<std::size_t>::max() / size);
    if (dst != src) {
      std::memmove(dst, src, count * size);
    }
    return;
  }
  // In place is fine when each element is read before it is written, i.e. an exact alias
  // between equal element sizes; anything else would read converted bytes.
  const std::size_t dst_size = element_size(dst_dtype);
  const std::size_t src_size = element_size(src_dtype);
  CHORUS_CHECK_LE(count, std::numeric_limits<std::size_t>::max() / std::max(dst_size, src_size));
  if (dst != src || dst_size != src_size) {
    CHORUS_CHECK(!overlaps(dst, count * dst_size, src, count * src_size));
  }
#if CHORUS_KERNELS_HAVE_AVX2
  if (isa_setting().load(std::memory_order_relaxed) == Isa::Avx2 &&
      convert_sixteen_bit_avx2(dst, dst_dtype, src, src_dtype, count)) {
    return;
  }
#endif
  dispatch(dst_dtype, [&](auto dst_tag) {
    dispatch(src_dtype, [&](auto src_tag) {
      convert_typed<decltype(dst_tag), decltype(src_tag)>(dst, src, count);
    });
  });
}

void fill(void* dst, DType dtype, double value, std::size_t count) {
  if (count == 0) {
    return;
  }
  CHORUS_CHECK(dst != nullptr);
  dispatch(dtype, [&](auto tag) {
    using Tag = decltype(tag);
    const auto element = write_element<Tag>(value);
    std::fill_n(static_cast<typename Tag::Storage*>(dst), count, element);
  });
}

namespace {

// Note [Poison in 64-byte strides]
// The simulator poisons every output before its collective writes it (Note [Buffer checks] in
// simulator/src/world.hpp), 64 floats a time in bench_sim's schedules. std::fill_n of a float NaN
// compiled to one 16-byte store a loop iteration, ~107 instructions for 256 bytes. fill_repeating
// stores four copies of a 16-byte pattern of `value` an iteration (GCC keeps the pattern in a
// register) and the rest element by element: the same bytes, ~45 instructions for 256. Every
// dtype's element size divides 16.
template <class T>
void fill_repeating(T* out, std::size_t count, T value) noexcept {
  static_assert(16 % sizeof(T) == 0);
  unsigned char pattern[16];
  for (std::size_t offset = 0; offset < sizeof(pattern); offset += sizeof(T)) {
    std::memcpy(pattern + offset, &value, sizeof(T));
  }
  auto* bytes = reinterpret_cast<unsigned char*>(out);
  std::size_t left = count * sizeof(T);
  for (; left >= 64; left -= 64, bytes += 64) {
    std::memcpy(bytes, pattern, 16);
    std::memcpy(bytes + 16, pattern, 16);
    std::memcpy(bytes + 32, pattern, 16);
    std::memcpy(bytes + 48, pattern, 16);
  }
  std::fill_n(reinterpret_cast<T*>(bytes), left / sizeof(T), value);
}

}  // namespace

void fill_poison(void* dst, DType dtype, std::size_t count) {
  if (count == 0) {
    return;
  }
  CHORUS_CHECK(dst != nullptr);
  if (dtype == DType::Float32) {
    // The usual dtype, filled without the dispatch's call and jump table (~20 instructions a
    // call); the same bytes as its branch below.
    fill_repeating(static_cast<float*>(dst), count, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  constexpr unsigned char kIntegerPoisonByte = 0xA5;
  dispatch(dtype, [&](auto tag) {
    using Tag = decltype(tag);
    using Storage = typename Tag::Storage;
    auto* out = static_cast<Storage*>(dst);
    if constexpr (kIsBoolTag<Tag> || kIsIntegerTag<Tag>) {
      std::memset(dst, kIntegerPoisonByte, count * sizeof(Storage));
    } else if constexpr (std::is_same_v<Tag, HalfTag>) {
      fill_repeating(out, count, Half::from_bits(0x7E00));
    } else if constexpr (std::is_same_v<Tag, BFloat16Tag>) {
      fill_repeating(out, count, BFloat16::from_bits(0x7FC0));
    } else if constexpr (kIsComplexTag<Tag>) {
      using F = typename Tag::Real;
      const F nan = std::numeric_limits<F>::quiet_NaN();
      fill_repeating(out, count, Storage(nan, nan));
    } else {
      fill_repeating(out, count, std::numeric_limits<Storage>::quiet_NaN());
    }
  });
}

bool values_equal(const void* a, const void* b, DType dtype, std::size_t count) {
  if (count == 0) {
    return true;
  }
  CHORUS_CHECK(a != nullptr);
  CHORUS_CHECK(b != nullptr);
  bool equal = true;
  dispatch(dtype, [&](auto tag) {
    using Tag = decltype(tag);
    const auto* left = static_cast<const typename Tag::Storage*>(a);
    const auto* right = static_cast<const typename Tag::Storage*>(b);
    if constexpr (kIsIntegerTag<Tag>) {
      equal = std::memcmp(a, b, count * sizeof(typename Tag::Storage)) == 0;
    } else {
      // Bool compares truth values; floating and complex use IEEE == on the loaded values
      // (16-bit floats as float), so NaN != NaN and -0 == +0.
      for (std::size_t i = 0; i < count && equal; ++i) {
        equal = Tag::load(left[i]) == Tag::load(right[i]);
      }
    }
  });
  return equal;
}

}  // namespace chorus::kernels
