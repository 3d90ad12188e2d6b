// all_to_all_single, broadcast, reduce, permute_tensor, the in-place forms, and the dtype lowering
// of Note [Lowering] (core/src/collectives.cpp), on the simulator at world sizes 1, 2, 3, 4 and 8
// (DESIGN 2.3, 2.4, 2.7).
//
// Inputs are exact per-rank values (r * 100 + i for the data movers, small integers and powers of
// two for the reductions, each folded into what its dtype carries exactly). Every expected value
// is computed here from the inputs alone, by a scalar reference that follows Note [Reduction
// order] (chorus/kernels.hpp), and results are compared bitwise: no tolerance appears anywhere.
// The suites are prefixed `Surface` because this file links into one binary with
// collectives_test.cpp.

#include <gtest/gtest.h>

#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/collectives.hpp"
#include "chorus/error.hpp"
#include "chorus/group.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/tensor.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using Kind = ReduceOp::Kind;

using testing::allowed_ops;
using testing::Bytes;
using testing::capture_every_rank;
using testing::cyclic_shift;
using testing::element_count;
using testing::ErrorSite;
using testing::expect_error_on_rank;
using testing::first_ranks;
using testing::kIsBool;
using testing::kIsHalfLike;
using testing::kIsInteger;
using testing::kMultiRankWorldSizes;
using testing::kWorldSizes;
using testing::list_text;
using testing::matches;
using testing::normalized_dim;
using testing::position_of;
using testing::rank_slot;
using testing::reference_chunk;
using testing::reference_concat;
using testing::reference_reduce;
using testing::Result;
using testing::reversed_ranks;
using testing::run_quietly;
using testing::sum_of;
using testing::sweep_name;
using testing::SweepParam;
using testing::tensor_bytes;
using testing::to_index;
using testing::values_of;
using testing::visit_element_type;
using testing::world_label;
using testing::world_name;

// Schedules tried for the cross-rank failures, whose detection depends on arrival order.
constexpr std::uint64_t kSurfaceSeeds = 6;

// `rows` rows of `tail`.
Shape rows_of(std::int64_t rows, const Shape& tail) {
  Shape shape = {rows};
  shape.insert(shape.end(), tail.begin(), tail.end());
  return shape;
}

// ---------------------------------------------------------------------------------------------
// Inputs.

// Rank `r`'s element `i` for the data movers: key = r * 100 + i, carried exactly. The 8-bit
// types and BFloat16 (8-bit significand) take the key modulo 256, so their values are distinct
// within a rank and across the first ranks; complex parts differ in value and sign.
template <class T>
T moved_value(int r, std::int64_t i) {
  EXPECT_LT(i, 100) << "moved_value keys must stay distinct";
  const std::int64_t key = r * 100 + i;
  if constexpr (kIsBool<T>) {
    return key % 3 == 0;
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    return static_cast<T>(key % 256);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    return static_cast<T>(key % 256 - 128);
  } else if constexpr (kIsInteger<T>) {
    return static_cast<T>(key);
  } else if constexpr (std::is_same_v<T, Half>) {
    return Half(static_cast<float>(key));  // below 2^11: exact
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16(static_cast<float>(key % 256));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(key) + T(0.25);
  } else {
    using F = typename T::value_type;
    return T(static_cast<F>(key) + F(0.25), -static_cast<F>(key) - F(0.5));
  }
}

template <class T>
std::vector<T> moved_values(int r, std::int64_t count, std::int64_t first = 0) {
  return values_of<T>(count, [&](std::int64_t i) { return moved_value<T>(r, first + i); });
}

// Every value is a power of two or 0.25 apart from one, so every sum (multiples of 0.25 below
// 2^6), product (powers of two) and premul_sum with the factors used here is exact in every
// floating dtype, BFloat16 included: the reference and the library agree bit for bit whatever
// the accumulation precision.
constexpr double kReduceTable[] = {1.0, 2.0, -1.0, 0.5, -2.0, -0.5, 0.25};

double reduce_table(std::int64_t key) { return kReduceTable[to_index(key % 7)]; }

// Rank `r`'s element `i` for the reductions.
template <class T>
T reduced_value(int r, std::int64_t i) {
  if constexpr (kIsBool<T>) {
    if (i % 4 == 0) {
      return true;  // true on every rank: and gives true
    }
    if (i % 4 == 1) {
      return false;  // false on every rank: or gives false
    }
    return (r * 3 + i) % 5 < 3;
  } else if constexpr (kIsInteger<T>) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<T>((r * 3 + i) % 7 - 3);
    } else {
      return static_cast<T>((r * 3 + i) % 5 + 1);  // products wrap for UInt8
    }
  } else if constexpr (kIsHalfLike<T>) {
    return T(static_cast<float>(reduce_table(r * 3 + i)));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(reduce_table(r * 3 + i));
  } else {
    using F = typename T::value_type;
    return T(static_cast<F>(reduce_table(r * 3 + i)), static_cast<F>(reduce_table(r * 5 + i + 2)));
  }
}

template <class T>
std::vector<T> reduced_values(int r, std::int64_t count) {
  return values_of<T>(count, [&](std::int64_t i) { return reduced_value<T>(r, i); });
}

template <class T>
std::vector<T> zeros_of(std::int64_t count) {
  return std::vector<T>(to_index(count), T{});
}

// How an input of rows is laid out in memory; its logical values are the same in every layout.
enum class RowLayout { Contiguous, Transposed, Narrowed };

std::string_view layout_text(RowLayout layout) {
  switch (layout) {
    case RowLayout::Contiguous:
      return "contiguous";
    case RowLayout::Transposed:
      return "transposed";
    case RowLayout::Narrowed:
      return "narrowed";
  }
  return "?";
}

// Rank `from`'s input of `rows` rows of `tail` whose row-major element e is moved_value(from, e).
// The strided layouts need a 1-d tail {cols}: Transposed is the transpose of a [cols, rows] base,
// Narrowed the middle columns of a [rows, cols + 2] base.
template <class T>
Tensor rows_input(int from, std::int64_t rows, const Shape& tail, RowLayout layout) {
  const std::int64_t row = element_count(tail);
  if (layout == RowLayout::Contiguous) {
    return Tensor::from_vector<T>(moved_values<T>(from, rows * row), rows_of(rows, tail));
  }
  EXPECT_EQ(tail.size(), 1u);
  const std::int64_t cols = tail.at(0);
  std::vector<T> base;
  if (layout == RowLayout::Transposed) {
    for (std::int64_t c = 0; c < cols; ++c) {
      for (std::int64_t r = 0; r < rows; ++r) {
        base.push_back(moved_value<T>(from, r * cols + c));
      }
    }
    return Tensor::from_vector<T>(base, {cols, rows}).transpose(0, 1);
  }
  const T filler = moved_value<T>(from, 99);
  for (std::int64_t r = 0; r < rows; ++r) {
    base.push_back(filler);
    for (std::int64_t c = 0; c < cols; ++c) {
      base.push_back(moved_value<T>(from, r * cols + c));
    }
    base.push_back(filler);
  }
  return Tensor::from_vector<T>(base, {rows, cols + 2}).narrow(1, 1, cols);
}

// ---------------------------------------------------------------------------------------------
// The scalar reference (tests/support/sim_helpers.hpp) over every rank's input.

// The fold over ranks 0..world_size-1 of reduced_values(r, count).
template <class T>
std::vector<T> fold_ranks(int world_size, std::int64_t count, const ReduceOp& op) {
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < world_size; ++r) {
    inputs.push_back(reduced_values<T>(r, count));
  }
  return reference_reduce(inputs, op);
}

// ---------------------------------------------------------------------------------------------
// Errors.

// A valid all_to_all on the world: proves the ranks still pair up. Element j of rank r's input
// is r * 100 + j, so rank r receives j * 100 + r from rank j.
void expect_world_pairs_up() {
  const int w = world_size();
  const int me = rank();
  std::vector<std::int64_t> mine;
  std::vector<std::int64_t> expected;
  for (int j = 0; j < w; ++j) {
    mine.push_back(me * 100 + j);
    expected.push_back(j * 100 + me);
  }
  const Tensor out =
      all_to_all_single(Tensor::from_vector(mine), std::nullopt, std::nullopt, world());
  EXPECT_EQ(out.to_vector<std::int64_t>(), expected) << "rank " << me;
}

// What a rank saw: "ok" or the error code's name, and what().
struct Outcome {
  std::string type;
  std::string what;
};

Outcome outcome_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return Outcome{std::string(error_code_name(error.code())), error.what()};
  } catch (const std::exception& error) {
    return Outcome{"std::exception", error.what()};
  }
  return Outcome{"ok", ""};
}

// =============================================================================================
// all_to_all_single

// Rows group rank `from` sends to group rank `to`.
using RowsFn = std::function<std::int64_t(int from, int to)>;

struct AllToAllCase {
  std::string name;
  bool equal = false;  // both split lists absent; `rows` is then constant
  RowsFn rows;
  Shape tail;
  RowLayout layout = RowLayout::Contiguous;
};

std::vector<AllToAllCase> all_to_all_cases() {
  const RowsFn two = [](int, int) { return std::int64_t{2}; };
  const RowsFn none = [](int, int) { return std::int64_t{0}; };
  const RowsFn uneven = [](int from, int to) { return std::int64_t{(from + 2 * to + 1) % 4}; };
  const RowsFn uneven_small = [](int from, int to) { return std::int64_t{(from + 2 * to) % 3}; };
  // Rank 0 sends nothing and receives nothing: its input and output are [0, 3].
  const RowsFn around_rank0 = [](int from, int to) {
    return from == 0 || to == 0 ? std::int64_t{0} : std::int64_t{1 + (from + to) % 2};
  };
  return {
      {"equal_1d", true, two, {}, RowLayout::Contiguous},
      {"equal_rows3", true, two, {3}, RowLayout::Contiguous},
      {"equal_empty", true, none, {3}, RowLayout::Contiguous},
      {"uneven_1d", false, uneven, {}, RowLayout::Contiguous},
      {"uneven_rows3", false, uneven, {3}, RowLayout::Contiguous},
      {"uneven_rows2x2", false, uneven_small, {2, 2}, RowLayout::Contiguous},
      {"zero_rows_around_rank0", false, around_rank0, {3}, RowLayout::Contiguous},
      {"all_zero_rows", false, none, {3}, RowLayout::Contiguous},
      {"equal_transposed", true, two, {3}, RowLayout::Transposed},
      {"uneven_transposed", false, uneven, {3}, RowLayout::Transposed},
      {"uneven_narrowed", false, uneven, {3}, RowLayout::Narrowed},
  };
}

std::vector<std::int64_t> input_splits(const RowsFn& rows, int from, int world_size) {
  std::vector<std::int64_t> splits;
  for (int to = 0; to < world_size; ++to) {
    splits.push_back(rows(from, to));
  }
  return splits;
}

std::vector<std::int64_t> output_splits(const RowsFn& rows, int to, int world_size) {
  std::vector<std::int64_t> splits;
  for (int from = 0; from < world_size; ++from) {
    splits.push_back(rows(from, to));
  }
  return splits;
}

// What group rank `to` receives: block `to` of every rank's input, in group-rank order.
template <class T>
std::vector<T> all_to_all_expected(const AllToAllCase& c, int to, int world_size) {
  const std::int64_t row = element_count(c.tail);
  std::vector<T> out;
  for (int from = 0; from < world_size; ++from) {
    std::int64_t first = 0;
    for (int k = 0; k < to; ++k) {
      first += c.rows(from, k);
    }
    const std::vector<T> block = moved_values<T>(from, c.rows(from, to) * row, first * row);
    out.insert(out.end(), block.begin(), block.end());
  }
  return out;
}

class SurfaceAllToAll : public ::testing::TestWithParam<SweepParam> {};

TEST_P(SurfaceAllToAll, RankJReceivesBlockJOfEveryRankInGroupRankOrder) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    const std::vector<AllToAllCase> cases = all_to_all_cases();
    const std::vector<std::vector<Result>> seen = capture_every_rank(w, [&] {
      const int me = rank();
      std::vector<Tensor> outputs;  // all issued before any is read
      for (const AllToAllCase& c : cases) {
        const std::vector<std::int64_t> in_splits = input_splits(c.rows, me, w);
        const Tensor input = rows_input<T>(me, sum_of(in_splits), c.tail, c.layout);
        if (c.layout != RowLayout::Contiguous && input.size(0) > 1) {
          EXPECT_FALSE(input.is_contiguous()) << c.name;
        }
        if (c.equal) {
          outputs.push_back(all_to_all_single(input, std::nullopt, std::nullopt, world()));
        } else {
          outputs.push_back(
              all_to_all_single(input, output_splits(c.rows, me, w), in_splits, world()));
        }
      }
      return outputs;
    });
    for (int r = 0; r < w; ++r) {
      const auto& mine = seen[static_cast<std::size_t>(r)];
      ASSERT_EQ(mine.size(), cases.size()) << "rank " << r;
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const AllToAllCase& c = cases[k];
        const Shape shape = rows_of(sum_of(output_splits(c.rows, r, w)), c.tail);
        EXPECT_TRUE(matches(mine[k], shape, all_to_all_expected<T>(c, r, w)))
            << "rank " << r << ", " << c.name;
      }
    }
  });
}

// The input is only read, in every layout, including after the result has been read.
TEST_P(SurfaceAllToAll, InputIsNeverModified) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      const int me = rank();
      for (const AllToAllCase& c : all_to_all_cases()) {
        const std::vector<std::int64_t> in_splits = input_splits(c.rows, me, w);
        const Tensor input = rows_input<T>(me, sum_of(in_splits), c.tail, c.layout);
        const Tensor output =
            c.equal ? all_to_all_single(input, std::nullopt, std::nullopt, world())
                    : all_to_all_single(input, output_splits(c.rows, me, w), in_splits, world());
        EXPECT_TRUE(matches(output, rows_of(sum_of(output_splits(c.rows, me, w)), c.tail),
                            all_to_all_expected<T>(c, me, w)))
            << "rank " << me << ", " << c.name;
        EXPECT_TRUE(matches(input, rows_of(sum_of(in_splits), c.tail),
                            moved_values<T>(me, sum_of(in_splits) * element_count(c.tail))))
            << "rank " << me << ", " << c.name;
      }
    });
  });
}

// Note [Reused count lists]: a rank refills one pair of count lists for every all_to_all_single,
// whatever its group's size and splits. Uneven splits on 4 ranks, an even split on a pair, an
// even split on 4 ranks and the uneven one again, all issued before any is read.
TEST(SurfaceAllToAll, CountListsAreRefilledForEachGroupSizeAndSplit) {
  constexpr int kWorld = 4;
  std::vector<std::vector<std::vector<std::int32_t>>> seen(kWorld);
  run_quietly(kWorld, [&] {
    const int me = rank();
    const auto rows = [me](int count) {
      std::vector<std::int32_t> values(static_cast<std::size_t>(count));
      for (int k = 0; k < count; ++k) {
        values[static_cast<std::size_t>(k)] = me * 100 + k;
      }
      return Tensor::from_vector(values);
    };
    // Rank me sends j + 1 rows to rank j, so it receives me + 1 rows from every rank.
    const std::vector<std::int64_t> uneven_in = {1, 2, 3, 4};
    const std::vector<std::int64_t> uneven_out(kWorld, me + 1);
    const int first = me / 2 * 2;
    std::vector<Tensor> outputs;
    outputs.push_back(all_to_all_single(rows(10), uneven_out, uneven_in, world()));
    outputs.push_back(all_to_all_single(rows(2), std::nullopt, std::nullopt, {first, first + 1}));
    outputs.push_back(all_to_all_single(rows(4), std::nullopt, std::nullopt, world()));
    outputs.push_back(all_to_all_single(rows(10), uneven_out, uneven_in, world()));
    for (const Tensor& output : outputs) {
      seen[static_cast<std::size_t>(me)].push_back(output.to_vector<std::int32_t>());
    }
  });
  for (int me = 0; me < kWorld; ++me) {
    std::vector<std::int32_t> uneven;  // from each rank i, its rows [me(me+1)/2, +me+1)
    for (int i = 0; i < kWorld; ++i) {
      for (int k = 0; k <= me; ++k) {
        uneven.push_back(i * 100 + me * (me + 1) / 2 + k);
      }
    }
    const int first = me / 2 * 2;
    const int g = me % 2;
    const std::vector<std::int32_t> pair = {first * 100 + g, (first + 1) * 100 + g};
    const std::vector<std::int32_t> even = {me, 100 + me, 200 + me, 300 + me};
    const auto& mine = seen[static_cast<std::size_t>(me)];
    ASSERT_EQ(mine.size(), 4u) << "rank " << me;
    EXPECT_EQ(mine[0], uneven) << "rank " << me;
    EXPECT_EQ(mine[1], pair) << "rank " << me;
    EXPECT_EQ(mine[2], even) << "rank " << me;
    EXPECT_EQ(mine[3], uneven) << "rank " << me;
  }
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceAllToAll,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

// =============================================================================================
// broadcast

class SurfaceBroadcast : public ::testing::TestWithParam<SweepParam> {};

constexpr RowLayout kRowLayouts[] = {RowLayout::Contiguous, RowLayout::Transposed,
                                     RowLayout::Narrowed};

TEST_P(SurfaceBroadcast, EveryRankGetsTheSourcesInputForEverySource) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    const std::vector<std::vector<Result>> seen = capture_every_rank(w, [&] {
      std::vector<Tensor> outputs;
      for (int src = 0; src < w; ++src) {
        for (RowLayout layout : kRowLayouts) {
          outputs.push_back(broadcast(rows_input<T>(rank(), 2, {3}, layout), src, world()));
        }
      }
      return outputs;
    });
    for (int r = 0; r < w; ++r) {
      const auto& mine = seen[static_cast<std::size_t>(r)];
      ASSERT_EQ(mine.size(), static_cast<std::size_t>(w) * 3) << "rank " << r;
      std::size_t k = 0;
      for (int src = 0; src < w; ++src) {
        for (RowLayout layout : kRowLayouts) {
          EXPECT_TRUE(matches(mine[k++], {2, 3}, moved_values<T>(src, 6)))
              << "rank " << r << ", src " << src << ", " << layout_text(layout);
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceBroadcast,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

// src indexes the group's ranks, not the world's: in the reversed world group, src 0 is the
// last global rank.
TEST(SurfaceBroadcastGroups, SrcIsAGroupRankOfAReorderedGroup) {
  for (int w : kWorldSizes) {
    const std::vector<int> reversed = reversed_ranks(w);
    run_quietly(w, [&] {
      const Tensor input = Tensor::from_vector(moved_values<std::int32_t>(rank(), 4));
      EXPECT_EQ(broadcast(input, 0, reversed).to_vector<std::int32_t>(),
                moved_values<std::int32_t>(w - 1, 4))
          << "W" << w << " rank " << rank();
      EXPECT_EQ(broadcast(input, w - 1, reversed).to_vector<std::int32_t>(),
                moved_values<std::int32_t>(0, 4))
          << "W" << w << " rank " << rank();
    });
  }
}

// =============================================================================================
// reduce

class SurfaceReduce : public ::testing::TestWithParam<SweepParam> {};

TEST_P(SurfaceReduce, DestinationGetsTheReductionAndEveryOtherRankExactZeros) {
  const int w = std::get<0>(GetParam());
  const Shape shape = {2, 4};
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    const std::vector<ReduceOp> ops = allowed_ops<T>();
    const std::vector<std::vector<Result>> seen = capture_every_rank(w, [&] {
      std::vector<Tensor> outputs;
      for (const ReduceOp& op : ops) {
        for (int dst = 0; dst < w; ++dst) {
          const Tensor input = Tensor::from_vector(reduced_values<T>(rank(), 8), shape);
          outputs.push_back(reduce(input, op, dst, world()));
        }
      }
      return outputs;
    });
    for (int r = 0; r < w; ++r) {
      const auto& mine = seen[static_cast<std::size_t>(r)];
      ASSERT_EQ(mine.size(), ops.size() * static_cast<std::size_t>(w)) << "rank " << r;
      std::size_t k = 0;
      for (const ReduceOp& op : ops) {
        const std::vector<T> reduced = fold_ranks<T>(w, 8, op);
        for (int dst = 0; dst < w; ++dst) {
          EXPECT_TRUE(matches(mine[k++], shape, r == dst ? reduced : zeros_of<T>(8)))
              << "rank " << r << ", " << op << ", dst " << dst;
        }
      }
    }
  });
}

TEST_P(SurfaceReduce, NonContiguousInputsReduceTheirLogicalValues) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    const ReduceOp op = allowed_ops<T>().front();
    run_quietly(w, [&] {
      // [3, 4] base, transposed to [4, 3]: logical element (a, b) is base element b * 4 + a.
      const Tensor input =
          Tensor::from_vector(reduced_values<T>(rank(), 12), {3, 4}).transpose(0, 1);
      const Tensor output = reduce(input, op, w - 1, world());
      std::vector<std::vector<T>> logical;
      for (int r = 0; r < w; ++r) {
        const std::vector<T> base = reduced_values<T>(r, 12);
        std::vector<T> values;
        for (std::int64_t a = 0; a < 4; ++a) {
          for (std::int64_t b = 0; b < 3; ++b) {
            values.push_back(base[to_index(b * 4 + a)]);
          }
        }
        logical.push_back(values);
      }
      EXPECT_TRUE(matches(output, {4, 3},
                          rank() == w - 1 ? reference_reduce(logical, op) : zeros_of<T>(12)))
          << "rank " << rank() << ", " << op;
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceReduce,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

// =============================================================================================
// permute_tensor

struct PermuteCase {
  std::string name;
  std::function<int(int m, int w)> destination;  // of group rank m, or -1
  RowLayout layout = RowLayout::Contiguous;
};

std::vector<PermuteCase> permute_cases() {
  return {
      {"cyclic_shift", [](int m, int w) { return (m + 1) % w; }},
      {"cyclic_shift_back", [](int m, int w) { return (m + w - 1) % w; }},
      {"identity", [](int m, int) { return m; }},
      {"reversal", [](int m, int w) { return w - 1 - m; }},
      // Rank 0 receives nothing (zeros); the last rank sends nowhere.
      {"chain_without_wrap", [](int m, int w) { return m + 1 < w ? m + 1 : -1; }},
      // Every even rank receives nothing; every odd rank sends nowhere.
      {"evens_to_odds", [](int m, int w) { return m % 2 == 0 && m + 1 < w ? m + 1 : -1; }},
      {"nobody_sends", [](int, int) { return -1; }},
      {"cyclic_shift_transposed", [](int m, int w) { return (m + 1) % w; }, RowLayout::Transposed},
      {"reversal_narrowed", [](int m, int w) { return w - 1 - m; }, RowLayout::Narrowed},
  };
}

// The src_dst list in which group rank m sends to m + 1 and the last sends nowhere: group rank 0
// receives nothing.
std::vector<int> chain_to_next(int w) {
  std::vector<int> src_dst;
  for (int m = 0; m < w; ++m) {
    src_dst.push_back(m + 1 < w ? m + 1 : -1);
  }
  return src_dst;
}

std::vector<int> src_dst_of(const PermuteCase& c, int w) {
  std::vector<int> src_dst;
  for (int m = 0; m < w; ++m) {
    src_dst.push_back(c.destination(m, w));
  }
  return src_dst;
}

class SurfacePermute : public ::testing::TestWithParam<SweepParam> {};

TEST_P(SurfacePermute, EachRankGetsItsSourcesInputOrZerosWhenNobodySendsToIt) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    const std::vector<PermuteCase> cases = permute_cases();
    const std::vector<std::vector<Result>> seen = capture_every_rank(w, [&] {
      std::vector<Tensor> outputs;
      for (const PermuteCase& c : cases) {
        const std::vector<int> src_dst = src_dst_of(c, w);
        outputs.push_back(
            permute_tensor(rows_input<T>(rank(), 2, {3}, c.layout), src_dst, world()));
        EXPECT_EQ(src_dst, src_dst_of(c, w)) << "the caller's vector is never modified";
      }
      return outputs;
    });
    for (int n = 0; n < w; ++n) {
      const auto& mine = seen[static_cast<std::size_t>(n)];
      ASSERT_EQ(mine.size(), cases.size()) << "rank " << n;
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const std::vector<int> src_dst = src_dst_of(cases[k], w);
        std::vector<T> expected = zeros_of<T>(6);
        for (int m = 0; m < w; ++m) {
          if (src_dst[static_cast<std::size_t>(m)] == n) {
            expected = moved_values<T>(m, 6);
          }
        }
        EXPECT_TRUE(matches(mine[k], {2, 3}, expected)) << "rank " << n << ", " << cases[k].name;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfacePermute,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

// =============================================================================================
// In-place forms

class SurfaceInPlace : public ::testing::TestWithParam<SweepParam> {};

TEST_P(SurfaceInPlace, AllReduceInPlaceOnAContiguousTensorReusesItsStorage) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      for (const ReduceOp& op : allowed_ops<T>()) {
        Tensor tensor = Tensor::from_vector(reduced_values<T>(rank(), 8), {2, 4});
        const Tensor alias = tensor;  // shares the storage
        void* const before = tensor.unsafe_data_ptr();
        Tensor& returned = all_reduce_inplace(tensor, op, world());
        EXPECT_EQ(&returned, &tensor);
        EXPECT_EQ(tensor.unsafe_data_ptr(), before) << op;
        EXPECT_TRUE(tensor.shares_storage(alias));
        EXPECT_FALSE(tensor.is_pending()) << op;
        EXPECT_EQ(work_registry_size(), 0u) << op;
        EXPECT_TRUE(matches(alias, {2, 4}, fold_ranks<T>(w, 8, op))) << "rank " << rank() << op;
      }
      // A contiguous view with a storage offset: rows 0 and 3 of the base stay as they were.
      const ReduceOp op = allowed_ops<T>().front();
      const Tensor base = Tensor::from_vector(reduced_values<T>(rank(), 8), {4, 2});
      Tensor middle = base.narrow(0, 1, 2);
      ASSERT_TRUE(middle.is_contiguous());
      void* const before = middle.unsafe_data_ptr();
      all_reduce_inplace(middle, op, world());
      EXPECT_EQ(middle.unsafe_data_ptr(), before);
      std::vector<T> expected = reduced_values<T>(rank(), 8);
      const std::vector<T> reduced = fold_ranks<T>(w, 8, op);
      for (std::size_t i = 2; i < 6; ++i) {
        expected[i] = reduced[i];
      }
      EXPECT_TRUE(matches(base, {4, 2}, expected)) << "rank " << rank();
    });
  });
}

TEST_P(SurfaceInPlace, AllReduceInPlaceOnAStridedViewLeavesTheRestOfTheBaseUntouched) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      for (const ReduceOp& op : allowed_ops<T>()) {
        // Columns 1..3 of a [4, 5] base, transposed to [3, 4].
        const Tensor base = Tensor::from_vector(reduced_values<T>(rank(), 20), {4, 5});
        void* const before = base.unsafe_data_ptr();
        Tensor view = base.narrow(1, 1, 3).transpose(0, 1);
        ASSERT_FALSE(view.is_contiguous());
        Tensor& returned = all_reduce_inplace(view, op, world());
        EXPECT_EQ(&returned, &view);
        EXPECT_EQ(view.sizes(), (Shape{3, 4}));
        EXPECT_FALSE(base.is_pending());
        EXPECT_EQ(work_registry_size(), 0u);
        EXPECT_EQ(base.unsafe_data_ptr(), before);
        std::vector<T> expected = reduced_values<T>(rank(), 20);
        const std::vector<T> reduced = fold_ranks<T>(w, 20, op);
        for (std::int64_t a = 0; a < 4; ++a) {
          for (std::int64_t c = 1; c <= 3; ++c) {
            expected[to_index(a * 5 + c)] = reduced[to_index(a * 5 + c)];
          }
        }
        EXPECT_TRUE(matches(base, {4, 5}, expected)) << "rank " << rank() << ", " << op;

        // One column (stride 5) of a fresh base.
        const Tensor other = Tensor::from_vector(reduced_values<T>(rank(), 20), {4, 5});
        Tensor column = other.select(1, 4);
        all_reduce_inplace(column, op, world());
        std::vector<T> column_expected = reduced_values<T>(rank(), 20);
        for (std::int64_t a = 0; a < 4; ++a) {
          column_expected[to_index(a * 5 + 4)] = reduced[to_index(a * 5 + 4)];
        }
        EXPECT_TRUE(matches(other, {4, 5}, column_expected)) << "rank " << rank() << ", " << op;
      }
    });
  });
}

TEST_P(SurfaceInPlace, AllGatherInPlaceFillsTheCallersOutputAlongEveryDim) {
  const int w = std::get<0>(GetParam());
  const std::vector<std::pair<Shape, std::int64_t>> cases = {
      {{2, 3, 2}, 0}, {{2, 3, 2}, 1}, {{2, 3, 2}, 2}, {{2, 3, 2}, -1}, {{2, 3, 2}, -3},
      {{5}, 0},       {{}, 0},        {{}, -1},       {{0, 3}, 1}};
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      for (const auto& [shape, dim] : cases) {
        const std::int64_t d = normalized_dim(dim, shape.size());
        Shape result = shape.empty() ? Shape{w} : shape;
        if (!shape.empty()) {
          result[to_index(d)] *= w;
        }
        const Tensor input =
            Tensor::from_vector(moved_values<T>(rank(), element_count(shape)), shape);
        Tensor output = Tensor::zeros(result, dtype_of<T>);
        void* const before = output.unsafe_data_ptr();
        Tensor& returned = all_gather_tensor_inplace(output, input, world(), "", dim);
        EXPECT_EQ(&returned, &output);
        EXPECT_EQ(output.unsafe_data_ptr(), before);
        EXPECT_FALSE(output.is_pending());
        EXPECT_EQ(work_registry_size(), 0u);
        std::vector<std::vector<T>> parts;
        for (int r = 0; r < w; ++r) {
          parts.push_back(moved_values<T>(r, element_count(shape)));
        }
        EXPECT_TRUE(matches(output, result, reference_concat(parts, shape, d)))
            << "rank " << rank() << ", input " << list_text(shape) << ", dim " << dim;
      }
    });
  });
}

TEST_P(SurfaceInPlace, ReduceScatterInPlaceFillsTheCallersOutputAlongEveryDim) {
  const int w = std::get<0>(GetParam());
  const std::vector<std::pair<Shape, std::int64_t>> cases = {
      {{2 * w, 3}, 0}, {{3, 2 * w}, 1}, {{3, 2 * w}, -1}, {{2, w, 2}, 1}, {{w}, 0}, {{w, 0}, 0}};
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      for (const ReduceOp& op : allowed_ops<T>()) {
        for (const auto& [shape, dim] : cases) {
          const std::int64_t d = normalized_dim(dim, shape.size());
          Shape result = shape;
          result[to_index(d)] /= w;
          const std::int64_t count = element_count(shape);
          const Tensor input = Tensor::from_vector(reduced_values<T>(rank(), count), shape);
          Tensor output = Tensor::zeros(result, dtype_of<T>);
          void* const before = output.unsafe_data_ptr();
          Tensor& returned = reduce_scatter_tensor_inplace(output, input, op, world(), dim);
          EXPECT_EQ(&returned, &output);
          EXPECT_EQ(output.unsafe_data_ptr(), before);
          EXPECT_FALSE(output.is_pending());
          EXPECT_EQ(work_registry_size(), 0u);
          const std::vector<T> expected =
              reference_chunk(fold_ranks<T>(w, count, op), shape, d, rank(), w);
          EXPECT_TRUE(matches(output, result, expected))
              << "rank " << rank() << ", " << op << ", input " << list_text(shape) << ", dim "
              << dim;
        }
      }
    });
  });
}

// The caller's output may be a strided view: the result lands in its elements and the rest of
// the base is untouched.
TEST_P(SurfaceInPlace, GatherAndScatterWriteThroughAStridedOutputView) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      const int me = rank();
      const T filler = moved_value<T>(me, 99);
      // Base [3, cols + 2]; the output is its middle columns, transposed: output (j, c) is base
      // (c, j + 1).
      const auto strided_output = [&](std::int64_t cols) {
        const Tensor base =
            Tensor::from_vector(std::vector<T>(to_index(3 * (cols + 2)), filler), {3, cols + 2});
        return std::pair{base, base.narrow(1, 1, cols).transpose(0, 1)};
      };
      const auto expected_base = [&](std::int64_t cols, const std::vector<T>& result) {
        std::vector<T> out(to_index(3 * (cols + 2)), filler);
        for (std::int64_t c = 0; c < 3; ++c) {
          for (std::int64_t j = 0; j < cols; ++j) {
            out[to_index(c * (cols + 2) + j + 1)] = result[to_index(j * 3 + c)];
          }
        }
        return out;
      };

      auto [gather_base, gather_output] = strided_output(2 * w);
      ASSERT_FALSE(gather_output.is_contiguous());
      const Tensor input = Tensor::from_vector(moved_values<T>(me, 6), {2, 3});
      all_gather_tensor_inplace(gather_output, input, world());
      EXPECT_FALSE(gather_base.is_pending());
      std::vector<std::vector<T>> parts;
      for (int r = 0; r < w; ++r) {
        parts.push_back(moved_values<T>(r, 6));
      }
      EXPECT_TRUE(matches(gather_base, {3, 2 * w + 2},
                          expected_base(2 * w, reference_concat(parts, {2, 3}, 0))))
          << "rank " << me;

      const ReduceOp op = allowed_ops<T>().front();
      auto [scatter_base, scatter_output] = strided_output(2);
      ASSERT_FALSE(scatter_output.is_contiguous());
      const Tensor big = Tensor::from_vector(reduced_values<T>(me, 6 * w), {2 * w, 3});
      reduce_scatter_tensor_inplace(scatter_output, big, op, world());
      EXPECT_FALSE(scatter_base.is_pending());
      const std::vector<T> mine =
          reference_chunk(fold_ranks<T>(w, 6 * w, op), {2 * w, 3}, 0, me, w);
      EXPECT_TRUE(matches(scatter_base, {3, 4}, expected_base(2, mine))) << "rank " << me << op;
      EXPECT_EQ(work_registry_size(), 0u);
    });
  });
}

// NCCL's in-place pattern: all_gather's input is the caller's own slice of the output, and
// reduce_scatter's output is the caller's own slice of the input.
TEST_P(SurfaceInPlace, InputAndOutputMayOverlapAsInNcclsInPlacePattern) {
  const int w = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    run_quietly(w, [&] {
      const int me = rank();
      std::vector<T> initial = zeros_of<T>(6 * w);
      const std::vector<T> mine = moved_values<T>(me, 6);
      for (std::size_t i = 0; i < 6; ++i) {
        initial[6 * rank_slot() + i] = mine[i];
      }
      Tensor gathered = Tensor::from_vector(initial, {2 * w, 3});
      const Tensor slice = gathered.narrow(0, 2 * me, 2);
      all_gather_tensor_inplace(gathered, slice, world());
      std::vector<std::vector<T>> parts;
      for (int r = 0; r < w; ++r) {
        parts.push_back(moved_values<T>(r, 6));
      }
      EXPECT_TRUE(matches(gathered, {2 * w, 3}, reference_concat(parts, {2, 3}, 0)))
          << "rank " << me;

      const ReduceOp op = allowed_ops<T>().front();
      const Tensor input = Tensor::from_vector(reduced_values<T>(me, 6 * w), {2 * w, 3});
      Tensor own = input.narrow(0, 2 * me, 2);
      reduce_scatter_tensor_inplace(own, input, op, world());
      const std::vector<T> reduced = fold_ranks<T>(w, 6 * w, op);
      EXPECT_TRUE(matches(own, {2, 3}, reference_chunk(reduced, {2 * w, 3}, 0, me, w)))
          << "rank " << me << ", " << op;
      std::vector<T> whole = reduced_values<T>(me, 6 * w);
      for (std::size_t i = 0; i < 6; ++i) {
        whole[6 * rank_slot() + i] = reduced[6 * rank_slot() + i];
      }
      EXPECT_TRUE(matches(input, {2 * w, 3}, whole)) << "rank " << me << ", " << op;
      EXPECT_EQ(work_registry_size(), 0u);
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceInPlace,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

// =============================================================================================
// Note [Lowering]: complex travels as pairs of reals, Bool as UInt8.

template <class F>
auto bits_of(F value) {
  using Bits = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  static_assert(sizeof(Bits) == sizeof(F));
  Bits bits = 0;
  std::memcpy(&bits, &value, sizeof(F));
  return bits;
}

// Real and imaginary parts compared bitwise, each on its own.
template <class C>
void expect_parts(const Tensor& actual, const std::vector<C>& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), dtype_of<C>) << what;
  const std::vector<C> got = actual.to_vector<C>();
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(bits_of(got[i].real()), bits_of(expected[i].real()))
        << what << ": real part of element " << i << " is " << got[i].real() << ", expected "
        << expected[i].real();
    EXPECT_EQ(bits_of(got[i].imag()), bits_of(expected[i].imag()))
        << what << ": imaginary part of element " << i << " is " << got[i].imag() << ", expected "
        << expected[i].imag();
  }
}

template <class C>
void check_complex_through_every_collective(int w) {
  const std::vector<ReduceOp> ops = {"sum", "avg", ReduceOp::premul_sum(0.5),
                                     ReduceOp::premul_sum(-3.0)};
  run_quietly(w, [&] {
    const int me = rank();
    const std::string where = std::string(dtype_name(dtype_of<C>)) + " rank " + std::to_string(me);
    const std::int64_t count = 2 * w;
    const Tensor x = Tensor::from_vector(reduced_values<C>(me, count), {w, 2});
    for (const ReduceOp& op : ops) {
      const std::string name = where + " " + op.to_string();
      const std::vector<C> reduced = fold_ranks<C>(w, count, op);
      expect_parts(all_reduce(x, op, world()), reduced, name + " all_reduce");
      expect_parts(reduce_scatter_tensor(x, op, 0, world()),
                   reference_chunk(reduced, {w, 2}, 0, me, w), name + " reduce_scatter");
      expect_parts(reduce(x, op, w - 1, world()), me == w - 1 ? reduced : zeros_of<C>(count),
                   name + " reduce");
      Tensor copy = x.clone();
      expect_parts(all_reduce_inplace(copy, op, world()), reduced, name + " all_reduce_inplace");
    }
    const Tensor m = Tensor::from_vector(moved_values<C>(me, count), {w, 2});
    std::vector<std::vector<C>> parts;
    std::vector<C> received;
    for (int r = 0; r < w; ++r) {
      parts.push_back(moved_values<C>(r, count));
      const std::vector<C> block = moved_values<C>(r, 2, 2 * me);
      received.insert(received.end(), block.begin(), block.end());
    }
    expect_parts(all_gather_tensor(m, 0, world()), reference_concat(parts, {w, 2}, 0),
                 where + " all_gather");
    expect_parts(all_gather_tensor(m, 1, world()), reference_concat(parts, {w, 2}, 1),
                 where + " all_gather dim 1");
    expect_parts(all_to_all_single(m, std::nullopt, std::nullopt, world()), received,
                 where + " all_to_all");
    expect_parts(broadcast(m, w - 1, world()), moved_values<C>(w - 1, count), where + " broadcast");
    expect_parts(permute_tensor(m, cyclic_shift(w), world()),
                 moved_values<C>((me + w - 1) % w, count), where + " permute_tensor");
  });
}

class SurfaceLowering : public ::testing::TestWithParam<int> {};

TEST_P(SurfaceLowering, ComplexSumAvgAndPremulSumAndDataMoversKeepBothPartsExact) {
  check_complex_through_every_collective<std::complex<float>>(GetParam());
  check_complex_through_every_collective<std::complex<double>>(GetParam());
}

TEST_P(SurfaceLowering, ComplexRejectsMaxMinProductAndBitwiseOps) {
  const int w = GetParam();
  const std::string group = world_label(w);
  run_quietly(w, [&] {
    for (DType dtype : {DType::Complex64, DType::Complex128}) {
      const std::string name(dtype_name(dtype));
      for (const char* op : {"max", "min", "product", "band", "bor", "bxor"}) {
        const bool bitwise = op[0] == 'b';
        const std::vector<std::string> words = {
            "reduce_op " + std::string(op) + " is not supported for dtype " + name,
            bitwise ? "bitwise ops need an integer or Bool dtype"
                    : "complex dtypes take only sum, avg and premul_sum"};
        const Tensor x =
            Tensor::from_vector(moved_values<std::complex<double>>(rank(), 2 * w), {2 * w})
                .to(dtype);
        const Bytes x_bytes = tensor_bytes(x);
        Tensor output = Tensor::zeros({2}, dtype);
        expect_error_on_rank([&] { (void)all_reduce(x, op, world()); }, words,
                             {"all_reduce", 0, group});
        expect_error_on_rank([&] { (void)reduce_scatter_tensor(x, op, 0, world()); }, words,
                             {"reduce_scatter_tensor", 0, group});
        expect_error_on_rank([&] { (void)reduce(x, op, 0, world()); }, words, {"reduce", 0, group});
        expect_error_on_rank([&] { (void)all_reduce_coalesced({x}, op, world()); }, words,
                             {"all_reduce_coalesced", 0, group});
        Tensor target = x.clone();
        expect_error_on_rank([&] { all_reduce_inplace(target, op, world()); }, words,
                             {"all_reduce_inplace", 0, group});
        expect_error_on_rank([&] { reduce_scatter_tensor_inplace(output, x, op, world()); }, words,
                             {"reduce_scatter_tensor_inplace", 0, group});
        EXPECT_EQ(tensor_bytes(target), x_bytes) << "a rejected in-place call wrote";
        EXPECT_EQ(tensor_bytes(x), x_bytes);
      }
    }
    expect_world_pairs_up();
  });
}

TEST_P(SurfaceLowering, BoolMinMaxAndBitwiseOpsAreAndOrXorOverZeroAndOne) {
  const int w = GetParam();
  const std::int64_t count = 4 * w;
  run_quietly(w, [&] {
    const int me = rank();
    const Tensor x = Tensor::from_vector(reduced_values<bool>(me, count), {count});
    for (const char* name : {"min", "max", "band", "bor", "bxor"}) {
      const ReduceOp op(name);
      // Independently of reference_element(): and for min/band, or for max/bor, xor (odd count) for
      // bxor.
      std::vector<bool> expected;
      for (std::int64_t i = 0; i < count; ++i) {
        int trues = 0;
        for (int r = 0; r < w; ++r) {
          trues += reduced_value<bool>(r, i) ? 1 : 0;
        }
        const Kind kind = op.kind();
        expected.push_back(kind == Kind::Min || kind == Kind::BAnd  ? trues == w
                           : kind == Kind::Max || kind == Kind::BOr ? trues > 0
                                                                    : trues % 2 == 1);
      }
      EXPECT_EQ(expected, fold_ranks<bool>(w, count, op)) << "the two references agree";
      EXPECT_TRUE(matches(all_reduce(x, op, world()), {count}, expected)) << name << " rank " << me;
      EXPECT_TRUE(matches(reduce_scatter_tensor(x, op, 0, world()), {4},
                          reference_chunk(expected, {count}, 0, me, w)))
          << name << " rank " << me;
      EXPECT_TRUE(matches(reduce(x, op, 0, world()), {count},
                          me == 0 ? expected : std::vector<bool>(to_index(count), false)))
          << name << " rank " << me;
      Tensor copy = x.clone();
      all_reduce_inplace(copy, op, world());
      EXPECT_TRUE(matches(copy, {count}, expected)) << name << " rank " << me;
    }
  });
}

TEST_P(SurfaceLowering, BoolBytesOtherThanZeroAndOneCountAsTrue) {
  // Bool memory from from_blob (or DLPack) may hold any nonzero byte for true. On the wire Bool
  // is UInt8 (Note [Lowering]): bxor of bytes 2 and 1 was 3 (true; the Bool answer is false), and
  // bor/max of 2 and 1 was byte 2. Every result byte is now 0 or 1 and the logical answer.
  const int w = GetParam();
  run_quietly(w, [&] {
    const int me = rank();
    // Column 0: true on every rank, as byte 2 on rank 0 and 1 elsewhere; column 1: true as byte
    // 2 on every rank; column 2: byte 255 on rank 0 only; column 3: false everywhere.
    Bytes bytes = {static_cast<unsigned char>(me == 0 ? 2 : 1), 2,
                   static_cast<unsigned char>(me == 0 ? 255 : 0), 0};
    const Tensor x = Tensor::from_blob(bytes.data(), {4}, DType::Bool);
    const Bytes parity = {static_cast<unsigned char>(w % 2), static_cast<unsigned char>(w % 2), 1,
                          0};
    const Bytes all_and = {1, 1, static_cast<unsigned char>(w == 1), 0};
    const Bytes any_or = {1, 1, 1, 0};
    for (const auto& [name, expected] : {std::pair<const char*, Bytes>{"bxor", parity},
                                         {"bor", any_or},
                                         {"max", any_or},
                                         {"band", all_and},
                                         {"min", all_and}}) {
      EXPECT_EQ(tensor_bytes(all_reduce(x, name, world())), expected) << name << " rank " << me;
      EXPECT_EQ(tensor_bytes(reduce(x, name, 0, world())), me == 0 ? expected : Bytes(4, 0))
          << name << " rank " << me;
      // Not contiguous: staged through a copy, then sent as 0/1 all the same.
      const Tensor transposed =
          Tensor::from_blob(bytes.data(), {2, 2}, DType::Bool).transpose(0, 1);
      EXPECT_EQ(tensor_bytes(all_reduce(transposed, name, world())),
                (Bytes{expected[0], expected[2], expected[1], expected[3]}))
          << name << " rank " << me;
    }
    // In place: the caller's bytes become the 0/1 result.
    Bytes target = bytes;
    Tensor in_place = Tensor::from_blob(target.data(), {4}, DType::Bool);
    all_reduce_inplace(in_place, "bxor", world());
    EXPECT_EQ(target, parity) << "rank " << me;
    // The input itself is not rewritten by the functional form.
    EXPECT_EQ(bytes[1], 2) << "rank " << me;
  });
}

TEST_P(SurfaceLowering, BoolRejectsSumAvgProductAndPremulSum) {
  const int w = GetParam();
  const std::string group = world_label(w);
  run_quietly(w, [&] {
    const Tensor x = Tensor::from_vector(reduced_values<bool>(rank(), w), {w});
    Tensor output = Tensor::zeros({1}, DType::Bool);
    for (const ReduceOp& op :
         {ReduceOp("sum"), ReduceOp("avg"), ReduceOp("product"), ReduceOp::premul_sum(2.0)}) {
      const std::vector<std::string> words = {
          "reduce_op " + op.to_string() + " is not supported for dtype Bool",
          "Bool takes only min, max, band, bor and bxor"};
      expect_error_on_rank([&] { (void)all_reduce(x, op, world()); }, words,
                           {"all_reduce", 0, group});
      expect_error_on_rank([&] { (void)reduce_scatter_tensor(x, op, 0, world()); }, words,
                           {"reduce_scatter_tensor", 0, group});
      expect_error_on_rank([&] { (void)reduce(x, op, 0, world()); }, words, {"reduce", 0, group});
      Tensor target = x.clone();
      expect_error_on_rank([&] { all_reduce_inplace(target, op, world()); }, words,
                           {"all_reduce_inplace", 0, group});
      expect_error_on_rank([&] { reduce_scatter_tensor_inplace(output, x, op, world()); }, words,
                           {"reduce_scatter_tensor_inplace", 0, group});
    }
    expect_world_pairs_up();
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceLowering, ::testing::ValuesIn(kWorldSizes), world_name);

// =============================================================================================
// Scalars, empty tensors, and groups whose ranks are not the world's.

class SurfaceShapes : public ::testing::TestWithParam<SweepParam> {};

TEST_P(SurfaceShapes, ScalarsAndEmptyTensorsMoveAndReduceLikeAnyOther) {
  const int w = std::get<0>(GetParam());
  const std::vector<Shape> shapes = {{}, {0}, {2, 0}, {1, 1, 1}};
  visit_element_type(std::get<1>(GetParam()), [&](auto element) {
    using T = typename decltype(element)::type;
    const ReduceOp op = allowed_ops<T>().back();
    const std::vector<int> chain = chain_to_next(w);
    run_quietly(w, [&] {
      const int me = rank();
      for (const Shape& shape : shapes) {
        const std::int64_t count = element_count(shape);
        const std::string where = "rank " + std::to_string(me) + ", " + list_text(shape);
        const Tensor moved = Tensor::from_vector(moved_values<T>(me, count), shape);
        const Tensor reduced_input = Tensor::from_vector(reduced_values<T>(me, count), shape);
        const Tensor b = broadcast(moved, w - 1, world());
        const Tensor r = reduce(reduced_input, op, 0, world());
        const Tensor p = permute_tensor(moved, chain, world());
        EXPECT_TRUE(matches(b, shape, moved_values<T>(w - 1, count))) << where;
        EXPECT_TRUE(matches(r, shape, me == 0 ? fold_ranks<T>(w, count, op) : zeros_of<T>(count)))
            << where << ", " << op;
        EXPECT_TRUE(
            matches(p, shape, me == 0 ? zeros_of<T>(count) : moved_values<T>(me - 1, count)))
            << where;
      }
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceShapes,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

class SurfaceGroups : public ::testing::TestWithParam<int> {};

// Splits, src_dst, src and dst are in group ranks. On the reversed world (group rank g is global
// rank w - 1 - g) and on the world without rank 0 (group rank g is global rank g + 1, while rank
// 0 stays out), every block must still come from and go to the right member.
TEST_P(SurfaceGroups, SplitsDestinationsAndRootsAreGroupRanks) {
  const int w = GetParam();
  std::vector<std::vector<int>> groups = {reversed_ranks(w)};
  if (w > 1) {
    groups.push_back(first_ranks(w - 1, 1));  // without rank 0
  }
  const RowsFn rows = [](int from, int to) { return std::int64_t{(from + 2 * to + 1) % 4}; };
  run_quietly(w, [&] {
    const int me = rank();
    for (const std::vector<int>& members : groups) {
      const int size = static_cast<int>(members.size());
      const int mine = position_of(members, me);  // my group rank
      if (mine < 0) {
        continue;  // not a member: stays out
      }
      const auto global = [&](int g) { return members[static_cast<std::size_t>(g)]; };

      // all_to_all: each member's input holds its global rank's values.
      const std::vector<std::int64_t> in_splits = input_splits(rows, mine, size);
      const std::vector<std::int64_t> out_splits = output_splits(rows, mine, size);
      const Tensor input =
          rows_input<std::int32_t>(me, sum_of(in_splits), {3}, RowLayout::Contiguous);
      std::vector<std::int32_t> received;
      for (int from = 0; from < size; ++from) {
        std::int64_t first = 0;
        for (int k = 0; k < mine; ++k) {
          first += rows(from, k);
        }
        const std::vector<std::int32_t> block =
            moved_values<std::int32_t>(global(from), rows(from, mine) * 3, first * 3);
        received.insert(received.end(), block.begin(), block.end());
      }
      EXPECT_TRUE(matches(all_to_all_single(input, out_splits, in_splits, members),
                          {sum_of(out_splits), 3}, received))
          << "rank " << me;

      // permute_tensor: a cyclic shift in group ranks.
      const std::vector<int> shift = cyclic_shift(size);
      const Tensor mine_values = Tensor::from_vector(moved_values<std::int32_t>(me, 4));
      EXPECT_TRUE(matches(permute_tensor(mine_values, shift, members), {4},
                          moved_values<std::int32_t>(global((mine + size - 1) % size), 4)))
          << "rank " << me;

      // broadcast from group rank 0 and reduce to group rank 0: its global rank is members[0].
      EXPECT_TRUE(matches(broadcast(mine_values, 0, members), {4},
                          moved_values<std::int32_t>(global(0), 4)))
          << "rank " << me;
      std::vector<std::int32_t> sum(4, 0);
      for (int g = 0; g < size; ++g) {
        const std::vector<std::int32_t> values = moved_values<std::int32_t>(global(g), 4);
        for (std::size_t i = 0; i < 4; ++i) {
          sum[i] += values[i];
        }
      }
      EXPECT_TRUE(matches(reduce(mine_values, "sum", 0, members), {4},
                          mine == 0 ? sum : std::vector<std::int32_t>(4, 0)))
          << "rank " << me;
    }
    EXPECT_EQ(work_registry_size(), 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceGroups, ::testing::ValuesIn(kWorldSizes), world_name);

// =============================================================================================
// Invalid arguments (DESIGN 2.3, 2.6, 2.7): each names rank, op, sequence number and group, and
// consumes no sequence number.

class SurfaceErrors : public ::testing::TestWithParam<int> {};

TEST_P(SurfaceErrors, AllToAllRejectsBadSplitLists) {
  const int w = GetParam();
  const std::string group = world_label(w);
  const ErrorSite where{"all_to_all_single", 0, group};
  const auto n = static_cast<std::size_t>(w);
  const std::string ws = std::to_string(w);
  run_quietly(w, [&] {
    const Tensor x = Tensor::zeros({2 * w, 3}, DType::Int32);
    const std::vector<std::int64_t> twos(n, 2);
    expect_error_on_rank([&] { (void)all_to_all_single(x, twos, std::nullopt, world()); },
                         {"only output_split_sizes was given",
                          "pass both split lists, or neither for the equal split"},
                         where);
    expect_error_on_rank([&] { (void)all_to_all_single(x, std::nullopt, twos, world()); },
                         {"only input_split_sizes was given"}, where);

    std::vector<std::int64_t> negative_in = twos;
    negative_in[0] = -1;
    if (w > 1) {
      negative_in[n - 1] += 3;  // still sums to 2w: only the sign is wrong
    }
    expect_error_on_rank([&] { (void)all_to_all_single(x, twos, negative_in, world()); },
                         {"input_split_sizes [", "has a negative entry at 0"}, where);
    std::vector<std::int64_t> negative_out = twos;
    negative_out[n - 1] = -2;
    expect_error_on_rank(
        [&] { (void)all_to_all_single(x, negative_out, twos, world()); },
        {"output_split_sizes [", "has a negative entry at " + std::to_string(w - 1)}, where);

    std::vector<std::int64_t> one_more = twos;
    one_more[0] = 3;
    expect_error_on_rank([&] { (void)all_to_all_single(x, twos, one_more, world()); },
                         {"input_split_sizes [", "sum to " + std::to_string(2 * w + 1),
                          "but the input has " + std::to_string(2 * w) + " rows along dim 0"},
                         where);

    std::vector<std::int64_t> too_long = twos;
    too_long.push_back(0);
    expect_error_on_rank(
        [&] { (void)all_to_all_single(x, twos, too_long, world()); },
        {"input_split_sizes [",
         "has " + std::to_string(w + 1) + " entries: expected one per group rank (" + ws + ")"},
        where);
    expect_error_on_rank(
        [&] { (void)all_to_all_single(x, too_long, twos, world()); },
        {"output_split_sizes [", "entries: expected one per group rank (" + ws + ")"}, where);
    expect_error_on_rank(
        [&] { (void)all_to_all_single(x, std::vector<std::int64_t>{}, twos, world()); },
        {"output_split_sizes [] has 0 entries"}, where);

    const Tensor scalar = Tensor::full({}, 1.0, DType::Int32);
    expect_error_on_rank(
        [&] { (void)all_to_all_single(scalar, std::nullopt, std::nullopt, world()); },
        {"input is 0-d", "all_to_all_single splits dimension 0"}, where);
    expect_error_on_rank(
        [&] {
          (void)all_to_all_single(scalar, std::vector<std::int64_t>(n, 0),
                                  std::vector<std::int64_t>(n, 0), world());
        },
        {"input is 0-d"}, where);
    if (w > 1) {
      const Tensor odd = Tensor::zeros({2 * w + 1, 3}, DType::Int32);
      expect_error_on_rank(
          [&] { (void)all_to_all_single(odd, std::nullopt, std::nullopt, world()); },
          {"input size " + std::to_string(2 * w + 1) +
               " along dim 0 is not divisible by the group size " + ws,
           "no split sizes given"},
          where);
    }
    expect_world_pairs_up();
  });
}

TEST_P(SurfaceErrors, BroadcastAndReduceRejectRootsOutsideTheGroup) {
  const int w = GetParam();
  const std::string group = world_label(w);
  run_quietly(w, [&] {
    const Tensor x = Tensor::ones({3}, DType::Int64);
    const std::string range = "expected [0, " + std::to_string(w - 1) + "]";
    for (int root : {-1, w, w + 7}) {
      const std::string root_text = std::to_string(root);
      expect_error_on_rank(
          [&] { (void)broadcast(x, root, world()); },
          {"src " + root_text + " is not a group rank", range, "not a global rank"},
          {"broadcast", 0, group});
      expect_error_on_rank([&] { (void)reduce(x, "sum", root, world()); },
                           {"dst " + root_text + " is not a group rank", range},
                           {"reduce", 0, group});
    }
    expect_world_pairs_up();
  });
}

TEST_P(SurfaceErrors, PermuteRejectsRepeatedOutOfRangeAndMisSizedDestinations) {
  const int w = GetParam();
  const std::string group = world_label(w);
  const ErrorSite where{"permute_tensor", 0, group};
  const std::string ws = std::to_string(w);
  run_quietly(w, [&] {
    const Tensor x = Tensor::ones({2}, DType::Float32);
    const std::vector<int> identity = first_ranks(w);
    if (w > 1) {
      std::vector<int> repeated = identity;
      repeated[1] = 0;
      expect_error_on_rank([&] { (void)permute_tensor(x, repeated, world()); },
                           {"group ranks 0 and 1 both send to 0", "destinations must be distinct"},
                           where);
      const std::vector<int> all_last(static_cast<std::size_t>(w), w - 1);
      expect_error_on_rank([&] { (void)permute_tensor(x, all_last, world()); },
                           {"both send to " + std::to_string(w - 1)}, where);
    }
    std::vector<int> past_end = identity;
    past_end[0] = w;
    expect_error_on_rank(
        [&] { (void)permute_tensor(x, past_end, world()); },
        {"group rank 0 sends to " + ws + ", which is not a group rank", "or -1 for nowhere"},
        where);
    std::vector<int> below = identity;
    below.back() = -2;
    expect_error_on_rank(
        [&] { (void)permute_tensor(x, below, world()); },
        {"group rank " + std::to_string(w - 1) + " sends to -2, which is not a group rank"}, where);
    std::vector<int> too_long = identity;
    too_long.push_back(-1);
    expect_error_on_rank(
        [&] { (void)permute_tensor(x, too_long, world()); },
        {"has " + std::to_string(w + 1) + " entries: expected one per group rank (" + ws + ")"},
        where);
    expect_error_on_rank([&] { (void)permute_tensor(x, {}, world()); },
                         {"src_dst [] has 0 entries"}, where);
    expect_world_pairs_up();
  });
}

TEST_P(SurfaceErrors, InPlaceFormsRejectOutputsOfTheWrongShapeOrDType) {
  const int w = GetParam();
  const std::string group = world_label(w);
  const std::string ws = std::to_string(w);
  run_quietly(w, [&] {
    const Tensor input = Tensor::from_vector(moved_values<std::int32_t>(rank(), 6 * w), {2 * w, 3});
    const auto untouched = [&](Tensor& output) {
      const Bytes before = tensor_bytes(output);
      return [&output, before] { EXPECT_EQ(tensor_bytes(output), before) << "output written"; };
    };
    const std::string gathered = list_text(Shape{2 * w * w, 3});
    const ErrorSite gather{"all_gather_tensor_inplace", 0, group};
    for (const Shape& wrong :
         {Shape{2 * w * w + 1, 3}, Shape{2 * w, 3 * w}, Shape{6 * w * w}, Shape{2 * w * w, 3, 1}}) {
      if (wrong == Shape{2 * w * w, 3}) {
        continue;  // {2w, 3w} is the result shape at w = 1
      }
      Tensor output = Tensor::full(wrong, 7.0, DType::Int32);
      const auto check = untouched(output);
      expect_error_on_rank(
          [&] { all_gather_tensor_inplace(output, input, world()); },
          {"output shape " + list_text(wrong) + " does not match the result shape " + gathered},
          gather);
      check();
    }
    {
      Tensor output = Tensor::full({2 * w * w, 3}, 7.0, DType::Int64);
      const auto check = untouched(output);
      expect_error_on_rank([&] { all_gather_tensor_inplace(output, input, world()); },
                           {"output dtype Int64 does not match the input dtype Int32"}, gather);
      check();
    }
    const ErrorSite scatter{"reduce_scatter_tensor_inplace", 0, group};
    // [3, 2] has the result's element count at w = 1, but not its shape.
    for (const Shape& wrong : {Shape{3, 2}, Shape{2 * w, 3}, Shape{2, 3, 1}, Shape{6}}) {
      if (wrong == Shape{2, 3}) {
        continue;  // {2w, 3} is the result shape at w = 1
      }
      Tensor output = Tensor::full(wrong, 7.0, DType::Int32);
      const auto check = untouched(output);
      expect_error_on_rank(
          [&] { reduce_scatter_tensor_inplace(output, input, "sum", world()); },
          {"output shape " + list_text(wrong) + " does not match the result shape [2, 3]"},
          scatter);
      check();
    }
    {
      Tensor output = Tensor::full({2, 3}, 7.0, DType::Float32);
      const auto check = untouched(output);
      expect_error_on_rank([&] { reduce_scatter_tensor_inplace(output, input, "sum", world()); },
                           {"output dtype Float32 does not match the input dtype Int32"}, scatter);
      check();
    }
    {
      Tensor undefined;
      expect_error_on_rank([&] { all_gather_tensor_inplace(undefined, input, world()); },
                           {"output is an undefined tensor"}, gather);
      expect_error_on_rank([&] { reduce_scatter_tensor_inplace(undefined, input, "sum", world()); },
                           {"output is an undefined tensor"}, scatter);
      Tensor output = Tensor::zeros({2 * w * w, 3}, DType::Int32);
      expect_error_on_rank([&] { all_gather_tensor_inplace(output, input, world(), "", 2); },
                           {"gather_dim 2 is out of range for a 2-d input"}, gather);
      expect_error_on_rank(
          [&] { reduce_scatter_tensor_inplace(output, input, "sum", world(), -3); },
          {"scatter_dim -3 is out of range for a 2-d input"}, scatter);
      if (w > 1) {
        const Tensor odd = Tensor::zeros({2 * w + 1, 3}, DType::Int32);
        expect_error_on_rank([&] { reduce_scatter_tensor_inplace(output, odd, "sum", world()); },
                             {"input size " + std::to_string(2 * w + 1) +
                              " along scatter_dim 0 is not divisible by the group size " + ws},
                             scatter);
      }
    }
    expect_world_pairs_up();
  });
}

// Only some ranks make bad calls (of every new op, in between valid ones): the valid collectives
// on all ranks still pair up and give the right results.
TEST_P(SurfaceErrors, RejectedCallsOnSomeRanksConsumeNoSequenceNumber) {
  const int w = GetParam();
  const std::string group = world_label(w);
  const auto n = static_cast<std::size_t>(w);
  run_quietly(w, [&] {
    const int me = rank();
    const Tensor x = Tensor::from_vector(moved_values<std::int64_t>(me, 2 * w), {2 * w});
    const auto bad_calls = [&](std::int64_t seq) {
      expect_error_on_rank(
          [&] {
            (void)all_to_all_single(x, std::vector<std::int64_t>(n, 2), std::nullopt, world());
          },
          {"only output_split_sizes"}, {"all_to_all_single", seq, group});
      expect_error_on_rank([&] { (void)broadcast(x, w, world()); }, {"src"},
                           {"broadcast", seq, group});
      expect_error_on_rank([&] { (void)reduce(x, "sum", -1, world()); }, {"dst"},
                           {"reduce", seq, group});
      expect_error_on_rank([&] { (void)permute_tensor(x, std::vector<int>(n + 1, -1), world()); },
                           {"entries"}, {"permute_tensor", seq, group});
      Tensor wrong = Tensor::zeros({1}, DType::Int64);
      expect_error_on_rank([&] { all_gather_tensor_inplace(wrong, x, world()); }, {"output shape"},
                           {"all_gather_tensor_inplace", seq, group});
      expect_error_on_rank([&] { reduce_scatter_tensor_inplace(wrong, x, "sum", world(), 0); },
                           {"output shape"}, {"reduce_scatter_tensor_inplace", seq, group});
    };
    if (me == 0) {
      bad_calls(0);
    }
    // seq 0: an uneven all_to_all.
    const AllToAllCase c = all_to_all_cases()[3];  // uneven_1d
    const std::vector<std::int64_t> in_splits = input_splits(c.rows, me, w);
    const Tensor input = rows_input<std::int64_t>(me, sum_of(in_splits), {}, RowLayout::Contiguous);
    EXPECT_TRUE(matches(all_to_all_single(input, output_splits(c.rows, me, w), in_splits, world()),
                        {sum_of(output_splits(c.rows, me, w))},
                        all_to_all_expected<std::int64_t>(c, me, w)))
        << "rank " << me;
    if (me % 2 == 1 || me == w - 1) {
      bad_calls(1);
      bad_calls(1);
    }
    // seq 1 .. 3.
    EXPECT_EQ(broadcast(x, w - 1, world()).to_vector<std::int64_t>(),
              moved_values<std::int64_t>(w - 1, 2 * w));
    EXPECT_EQ(permute_tensor(x, cyclic_shift(w), world()).to_vector<std::int64_t>(),
              moved_values<std::int64_t>((me + w - 1) % w, 2 * w));
    const Tensor sum = reduce(x, "sum", 0, world());
    if (me == 0) {
      std::vector<std::int64_t> expected(2 * n, 0);
      for (int r = 0; r < w; ++r) {
        for (std::size_t i = 0; i < 2 * n; ++i) {
          expected[i] += r * 100 + static_cast<std::int64_t>(i);
        }
      }
      EXPECT_EQ(sum.to_vector<std::int64_t>(), expected);
    } else {
      EXPECT_EQ(sum.to_vector<std::int64_t>(), std::vector<std::int64_t>(2 * n, 0));
    }
    if (me == w - 1) {
      bad_calls(4);
    }
    expect_world_pairs_up();  // seq 4
    EXPECT_EQ(work_registry_size(), 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceErrors, ::testing::ValuesIn(kWorldSizes), world_name);

// =============================================================================================
// Cross-rank disagreement (DESIGN 2.7): CollectiveMismatch on the ranks that see it,
// CollectiveMismatch or Aborted on the others, never a hang. Each rank catches its own error.

class SurfaceMismatch : public ::testing::TestWithParam<int> {};

// The outcome of `body` on every rank, for each seed.
std::vector<std::vector<Outcome>> outcomes_per_seed(int w, const std::function<void()>& body) {
  std::vector<std::vector<Outcome>> all;
  for (std::uint64_t seed = 0; seed < kSurfaceSeeds; ++seed) {
    std::vector<Outcome> outcomes(static_cast<std::size_t>(w));
    run_quietly(
        w,
        [&] {
          outcomes[rank_slot()] = outcome_of(body);
          EXPECT_EQ(work_registry_size(), 0u) << "a failed wait leaves no pending work";
        },
        seed);
    all.push_back(outcomes);
  }
  return all;
}

// Checks the outcomes of every seed of `op` #0 on the world: the ranks below `mismatching_below`
// got CollectiveMismatch and every other rank CollectiveMismatch or Aborted; each
// CollectiveMismatch names its rank, the op and the group, and holds every one of `words`.
// Returns the number of CollectiveMismatch outcomes of each seed.
std::vector<int> expect_mismatch_or_aborted(const std::vector<std::vector<Outcome>>& all,
                                            int mismatching_below, const std::string& op,
                                            const std::vector<std::string>& words) {
  std::vector<int> mismatches;
  for (std::size_t seed = 0; seed < all.size(); ++seed) {
    const int w = static_cast<int>(all[seed].size());
    mismatches.push_back(0);
    for (int r = 0; r < w; ++r) {
      const Outcome& outcome = all[seed][static_cast<std::size_t>(r)];
      const std::string context = "seed " + std::to_string(seed) + " rank " + std::to_string(r) +
                                  ": " + outcome.type + " " + outcome.what;
      if (r < mismatching_below) {
        EXPECT_EQ(outcome.type, "CollectiveMismatch") << context;
      } else {
        EXPECT_TRUE(outcome.type == "CollectiveMismatch" || outcome.type == "Aborted") << context;
      }
      if (outcome.type == "CollectiveMismatch") {
        ++mismatches.back();
        std::vector<std::string> expected = {"[rank " + std::to_string(r) + "] " + op +
                                             " #0 on group " + world_label(w)};
        expected.insert(expected.end(), words.begin(), words.end());
        for (const std::string& word : expected) {
          EXPECT_NE(outcome.what.find(word), std::string::npos)
              << "lacks '" << word << "': " << context;
        }
      }
    }
  }
  return mismatches;
}

TEST_P(SurfaceMismatch, AllToAllCountsThatDisagreeAcrossRanksAreACollectiveMismatch) {
  const int w = GetParam();
  const auto n = static_cast<std::size_t>(w);
  // Every rank sends one row to every rank, but rank 1 expects two rows from rank 0: rank 0's
  // input_split_sizes[1] (1) != rank 1's output_split_sizes[0] (2).
  const auto body = [&] {
    std::vector<std::int64_t> out(n, 1);
    if (rank() == 1) {
      out[0] = 2;
    }
    const Tensor input = Tensor::from_vector(moved_values<std::int32_t>(rank(), w));
    wait_tensor(all_to_all_single(input, out, std::vector<std::int64_t>(n, 1), world()));
  };
  expect_mismatch_or_aborted(outcomes_per_seed(w, body), 2, "all_to_all_single",
                             {"all_to_all counts disagree", "rank 0 sends 1 elements to rank 1",
                              "rank 1 expects 2 from rank 0"});
}

TEST_P(SurfaceMismatch, BroadcastWithDifferentSrcOnTwoRanksIsACollectiveMismatchNamingRoot) {
  const int w = GetParam();
  // Rank 0 says src 0; every other rank says src 1.
  const auto body = [&] {
    const int src = rank() == 0 ? 0 : 1;
    wait_tensor(broadcast(Tensor::ones({4}, DType::Float32), src, world()));
  };
  const auto all = outcomes_per_seed(w, body);
  const std::vector<int> mismatches =
      expect_mismatch_or_aborted(all, 0, "broadcast", {"root=0", "root=1"});
  for (std::size_t seed = 0; seed < all.size(); ++seed) {
    EXPECT_GE(mismatches[seed], 1) << "seed " << seed;
    EXPECT_EQ(all[seed][0].type, "CollectiveMismatch")
        << "seed " << seed << ": " << all[seed][0].what;
  }
}

TEST_P(SurfaceMismatch, PermuteWithDifferentSrcDstOnTwoRanksIsACollectiveMismatch) {
  const int w = GetParam();
  // Rank 0 believes it sends to rank 1; every other rank believes nobody sends anywhere.
  const auto body = [&] {
    std::vector<int> src_dst(static_cast<std::size_t>(w), -1);
    if (rank() == 0) {
      src_dst[0] = 1;
    }
    wait_tensor(permute_tensor(Tensor::ones({2}, DType::Int32), src_dst, world()));
  };
  expect_mismatch_or_aborted(outcomes_per_seed(w, body), 2, "permute_tensor",
                             {"all_to_all counts disagree", "rank 0 sends 2 elements to rank 1",
                              "rank 1 expects 0 from rank 0"});
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceMismatch, ::testing::ValuesIn(kMultiRankWorldSizes),
                         world_name);

// =============================================================================================
// Async semantics of the new ops (DESIGN 2.4, 2.7).

class SurfaceAsync : public ::testing::TestWithParam<int> {};

TEST_P(SurfaceAsync, NewOpsArePendingUntilWaitedAndTheirViewsNeverWait) {
  const int w = GetParam();
  const auto n = static_cast<std::size_t>(w);
  run_quietly(w, [&] {
    const int me = rank();
    const Tensor x = Tensor::from_vector(moved_values<std::int32_t>(me, 2 * w), {w, 2});
    const std::vector<int> chain = chain_to_next(w);
    std::vector<Tensor> results;
    results.push_back(all_to_all_single(x, std::nullopt, std::nullopt, world()));
    results.push_back(broadcast(x, w - 1, world()));
    results.push_back(reduce(x, "sum", 0, world()));
    results.push_back(permute_tensor(x, chain, world()));
    for (std::size_t k = 0; k < results.size(); ++k) {
      EXPECT_TRUE(results[k].is_pending()) << "result " << k << " rank " << me;
    }
    EXPECT_EQ(work_registry_size(), results.size());

    // Views share the pending state and never wait.
    for (const Tensor& result : results) {
      const std::vector<Tensor> views = {result.narrow(0, 0, 1), result.select(1, 1),
                                         result.transpose(0, 1), result.view({2 * w}),
                                         result.flatten(),       result.chunk(w, 0).front()};
      for (const Tensor& view : views) {
        EXPECT_TRUE(view.is_pending());
      }
      EXPECT_TRUE(result.is_pending());
    }
    EXPECT_EQ(work_registry_size(), results.size());

    // The all_to_all through a view.
    const Tensor row = results[0].select(0, 0);
    EXPECT_TRUE(wait_tensor(row).shares_storage(results[0]));
    EXPECT_FALSE(results[0].is_pending());
    EXPECT_FALSE(row.is_pending());
    EXPECT_EQ(work_registry_size(), 3u);
    // The broadcast directly, twice (idempotent).
    EXPECT_TRUE(wait_tensor(results[1]).shares_storage(results[1]));
    EXPECT_FALSE(results[1].is_pending());
    wait_tensor(results[1]);
    EXPECT_EQ(work_registry_size(), 2u);
    // The reduce through a data access.
    const std::vector<std::int32_t> reduced = results[2].to_vector<std::int32_t>();
    EXPECT_FALSE(results[2].is_pending());
    EXPECT_EQ(work_registry_size(), 1u);
    // The permute (pending even on rank 0, which receives nothing) through wait_tensors.
    EXPECT_TRUE(results[3].is_pending());
    wait_tensors({results[3], results[3].narrow(0, 0, 1)});
    EXPECT_FALSE(results[3].is_pending());
    EXPECT_EQ(work_registry_size(), 0u);

    std::vector<std::int32_t> received;
    std::vector<std::int32_t> sum(2 * n, 0);
    for (int r = 0; r < w; ++r) {
      const std::vector<std::int32_t> all = moved_values<std::int32_t>(r, 2 * w);
      received.push_back(all[2 * rank_slot()]);
      received.push_back(all[2 * rank_slot() + 1]);
      for (std::size_t i = 0; i < 2 * n; ++i) {
        sum[i] += all[i];
      }
    }
    EXPECT_EQ(results[0].to_vector<std::int32_t>(), received);
    EXPECT_EQ(results[1].to_vector<std::int32_t>(), moved_values<std::int32_t>(w - 1, 2 * w));
    EXPECT_EQ(reduced, me == 0 ? sum : std::vector<std::int32_t>(2 * n, 0));
    EXPECT_EQ(
        results[3].to_vector<std::int32_t>(),
        me == 0 ? std::vector<std::int32_t>(2 * n, 0) : moved_values<std::int32_t>(me - 1, 2 * w));
    EXPECT_EQ(x.to_vector<std::int32_t>(), moved_values<std::int32_t>(me, 2 * w))
        << "the input is never modified";
  });
}

TEST_P(SurfaceAsync, UnwaitedResultsCountOnePerCallUntilTheyAreWaited) {
  const int w = GetParam();
  run_quietly(w, [&] {
    const Tensor x = Tensor::ones({w}, DType::Int64);
    std::vector<Tensor> results;
    for (int i = 0; i < 3; ++i) {
      results.push_back(all_to_all_single(x, std::nullopt, std::nullopt, world()));
      EXPECT_EQ(work_registry_size(), results.size());
      results.push_back(broadcast(x, 0, world()));
      EXPECT_EQ(work_registry_size(), results.size());
      results.push_back(reduce(x, "max", w - 1, world()));
      EXPECT_EQ(work_registry_size(), results.size());
      results.push_back(
          permute_tensor(x, std::vector<int>(static_cast<std::size_t>(w), -1), world()));
      EXPECT_EQ(work_registry_size(), results.size());
    }
    for (std::size_t k = results.size(); k-- > 0;) {  // newest first
      wait_tensor(results[k]);
      EXPECT_EQ(work_registry_size(), k);
    }
  });
}

// broadcast reads only the source's input, so only the source waits for a pending input.
TEST_P(SurfaceAsync, BroadcastReadsAndSoWaitsOnlyTheSourcesInput) {
  const int w = GetParam();
  run_quietly(w, [&] {
    const int me = rank();
    const int src = w - 1;
    const Tensor pending = all_reduce(Tensor::full({3}, me + 1, DType::Int64), "sum", world());
    ASSERT_TRUE(pending.is_pending());
    const Tensor out = broadcast(pending, src, world());
    EXPECT_EQ(pending.is_pending(), me != src) << "rank " << me;
    EXPECT_EQ(work_registry_size(), me != src ? 2u : 1u) << "rank " << me;
    EXPECT_EQ(out.to_vector<std::int64_t>(), std::vector<std::int64_t>(3, w * (w + 1) / 2));
    EXPECT_EQ(wait_tensor(pending).to_vector<std::int64_t>(),
              std::vector<std::int64_t>(3, w * (w + 1) / 2));
    EXPECT_EQ(work_registry_size(), 0u);
  });
}

// The in-place forms wait before they return, even when their tensors are themselves pending
// results of earlier collectives.
TEST_P(SurfaceAsync, InPlaceFormsReturnWithNothingPendingEvenOnPendingTensors) {
  const int w = GetParam();
  run_quietly(w, [&] {
    const int me = rank();
    const Tensor x = Tensor::full({2 * w}, me + 1, DType::Int64);
    Tensor pending = broadcast(x, w - 1, world());  // w everywhere
    ASSERT_TRUE(pending.is_pending());
    all_reduce_inplace(pending, "sum", world());
    EXPECT_FALSE(pending.is_pending());
    EXPECT_EQ(work_registry_size(), 0u);
    EXPECT_EQ(pending.to_vector<std::int64_t>(), std::vector<std::int64_t>(2 * to_index(w), w * w));

    Tensor output = all_gather_tensor(x, 0, world());  // pending, of the result shape
    const Tensor second = Tensor::full({2 * w}, 10 * (me + 1), DType::Int64);
    ASSERT_TRUE(output.is_pending());
    all_gather_tensor_inplace(output, second, world());
    EXPECT_FALSE(output.is_pending());
    EXPECT_EQ(work_registry_size(), 0u);
    std::vector<std::int64_t> gathered;
    for (int r = 0; r < w; ++r) {
      for (int i = 0; i < 2 * w; ++i) {
        gathered.push_back(10 * (r + 1));
      }
    }
    EXPECT_EQ(output.to_vector<std::int64_t>(), gathered);

    Tensor scattered = reduce_scatter_tensor(x, "sum", 0, world());  // pending, [2]
    const Tensor input = permute_tensor(x, std::vector<int>(static_cast<std::size_t>(w), -1),
                                        world());  // pending zeros
    ASSERT_TRUE(scattered.is_pending());
    ASSERT_TRUE(input.is_pending());
    reduce_scatter_tensor_inplace(scattered, input, "sum", world());
    EXPECT_FALSE(scattered.is_pending());
    EXPECT_FALSE(input.is_pending());
    EXPECT_EQ(work_registry_size(), 0u);
    EXPECT_EQ(scattered.to_vector<std::int64_t>(), std::vector<std::int64_t>(2, 0));
  });
}

INSTANTIATE_TEST_SUITE_P(Surface, SurfaceAsync, ::testing::ValuesIn(kWorldSizes), world_name);

}  // namespace
}  // namespace chorus
