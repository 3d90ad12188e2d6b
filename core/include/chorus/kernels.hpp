#pragma once

// CPU element kernels shared by core and the transports that reduce on the host (the simulator,
// MPI's user-defined ops). Contiguous buffers, raw pointers, no waiting: callers own the
// synchronisation.

#include <cstddef>
#include <cstdint>
#include <span>

#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"

namespace chorus::kernels {

// Note [Reduction order]
// dst[i] = srcs[0][i] (+) srcs[1][i] (+) ... (+) srcs[n-1][i], folded left to right in the order
// of `srcs` (callers pass group-rank order; other shapes: Note [Reduction programs]), so every
// rank that runs the same call gets the same bits. Per op:
// - sum, product, min, max, band, bor, bxor: the fold itself.
// - avg: the sum divided by n; integers truncate toward zero (C++ division).
// - premul_sum(f): the sum of f * srcs[j][i].
// Arithmetic: integers wrap modulo 2^bits (computed unsigned: no undefined behaviour); Float16 and
// BFloat16 accumulate in float32 and round to nearest even once, at the end; Float32 accumulates
// in float32, Float64 in double; complex parts likewise. min/max propagate NaN. Bool (bytes 0/1):
// min = band = and, max = bor = or, bxor = xor; results are 0 or 1.
//
// `dst` may be the same pointer as any source (exact alias); partial overlaps are not allowed.
// `reduce_op` must be valid for `dtype` (ReduceOp::check_dtype); violations are CHORUS_CHECKed.
void reduce(void* dst, const void* const* srcs, std::size_t num_srcs, std::size_t count,
            DType dtype, const ReduceOp& reduce_op);

// Note [Reduction programs]
// reduce_program() reduces in an explicit shape instead of the left fold, for callers that model
// other orders (the simulator's ring, tree and adversarial reduction orders). `program` is a
// binary tree in postfix order: a step j >= 0 pushes srcs[j] (times the factor for premul_sum),
// a kCombine step pops the top two partial results and pushes left (+) right, the left operand
// being the one pushed first. Every source appears exactly once, so the program has
// 2 * num_srcs - 1 steps and leaves one value, which is finished as in reduce() (avg divides by
// num_srcs, 16-bit floats round once) and stored. Partial results stay in the accumulation type
// of Note [Reduction order], so the left fold {0, 1, kCombine, 2, kCombine, ...} gives exactly
// reduce()'s bits, and ((s0 + s1) + (s2 + s3)) is {0, 1, kCombine, 2, 3, kCombine, kCombine}.
// Aliasing and op/dtype rules as for reduce(); a malformed program is CHORUS_CHECKed. It works
// on blocks of partial results, so it makes more passes over memory than reduce(): for
// simulation, not for hot paths (docs/performance.md, "Reduction kernels").
inline constexpr int kCombine = -1;
void reduce_program(void* dst, const void* const* srcs, std::size_t num_srcs, std::size_t count,
                    DType dtype, const ReduceOp& reduce_op, std::span<const int> program);

// Converts `count` elements from `src_dtype` to `dst_dtype` (as Tensor::to): 16-bit floats
// round to nearest even; float -> integer truncates toward zero (out-of-range values and NaN give
// 0 rather than undefined behaviour); anything -> Bool is (value != 0); complex -> real keeps
// the real part; real -> complex has a zero imaginary part. Same dtype copies bytes.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t count);

// Fills `count` elements of `dtype` with value `value` converted as by convert() from Float64.
void fill(void* dst, DType dtype, double value, std::size_t count);

// Fills with the poison pattern of pending outputs: quiet NaN for floating and complex dtypes,
// 0xA5 bytes for integers and Bool.
void fill_poison(void* dst, DType dtype, std::size_t count);

// Elementwise equality as torch.equal (floating: IEEE ==, so NaN != NaN and -0 == +0).
bool values_equal(const void* a, const void* b, DType dtype, std::size_t count);

// Note [Kernel instruction sets]
// reduce() has two builds of its loops: one for baseline x86-64 (SSE2), which every CPU runs, and
// one compiled for AVX2, with F16C's conversions for Float16 (GCC and Clang on x86-64 only). The
// process picks AVX2 when the CPU has AVX2 and F16C, and set_isa() can pin either.
// reduce_program() and convert() between Float16 or BFloat16 and Float32 follow the same choice;
// the other conversions and the rest have the baseline build only. Both builds fold in the same
// order with the same operations (no fused multiply-add: "avx2", not "fma"), so in the default
// rounding mode they give the same bits for every input, except the sign and payload of a NaN
// result: IEEE 754 leaves those unspecified when several operands are NaN, and compilers may
// commute the operands of + and *. kernels_test compares the builds on every dtype and op, raw
// bit patterns and every 16-bit pattern included.
// Only the speed differs: reduce() in a 1 MiB all_reduce on 2 simulated ranks, Float16 11x,
// BFloat16 2x, 32- and 64-bit max 1.1-1.3x, their sums about 1.05x; reduce_program() in the
// simulator's tree order, Float16 9x, BFloat16 1.9x, the others 1.1-1.5x (docs/performance.md,
// "Reduction kernels").
enum class Isa : std::uint8_t { Baseline, Avx2 };

// "baseline" or "avx2".
const char* isa_name(Isa isa) noexcept;
// Whether this build has `isa`'s loops and this CPU can run them (Baseline: always).
bool isa_supported(Isa isa) noexcept;
// The fastest instruction set this build and CPU run: what reduce() uses until set_isa().
Isa best_isa() noexcept;
// The instruction set reduce() uses now: best_isa(), unless set_isa() said otherwise.
Isa active_isa() noexcept;
// Pins reduce() to `isa` for the whole process (a property of the CPU, not of a rank), for
// benchmarks and for tests that compare the builds. Throws InvalidArgument naming the ISA when it
// is not supported here. Not to be called while another thread reduces.
void set_isa(Isa isa);

}  // namespace chorus::kernels
