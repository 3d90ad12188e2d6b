// The functional collectives' results and argument validation (DESIGN 2.3, 2.7), on the
// simulator at world sizes 1, 2, 3, 4 and 8.
//
// Every expected value is computed here, independently of the library, by the scalar reference of
// tests/support/sim_helpers.hpp, which follows Note [Reduction order] (chorus/kernels.hpp): fold
// in group-rank order, integers wrap, Float16/BFloat16 accumulate in float and round once, avg =
// sum / n (integers truncate toward zero), premul_sum = sum of f * x. Inputs are exact per-rank
// values and results are compared bitwise, so no tolerance appears anywhere. Element 0 of
// Float32/Float64/complex inputs is order-sensitive (2^24 or 2^53 on one rank, 1 on the others),
// so a reduction in any other order than group-rank order changes the bits.

#include "chorus/collectives.hpp"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/group.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/tensor.hpp"
#include "chorus/trace.hpp"
#include "support/narrowed_transport.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using testing::Accumulator;
using testing::all_ops;
using testing::allowed_ops;
using testing::Bytes;
using testing::capture;
using testing::capture_every_rank;
using testing::element_count;
using testing::ErrorSite;
using testing::expect_error_on_rank;
using testing::first_ranks;
using testing::group_label;
using testing::kIsBool;
using testing::kIsFloating;
using testing::kIsHalfLike;
using testing::kIsInteger;
using testing::kWorldSizes;
using testing::list_text;
using testing::matches;
using testing::normalized_dim;
using testing::op_allowed;
using testing::position_of;
using testing::rank_slot;
using testing::reference_chunk;
using testing::reference_concat;
using testing::reference_reduce;
using testing::Result;
using testing::reversed_ranks;
using testing::run_quietly;
using testing::same_result;
using testing::sweep_name;
using testing::SweepParam;
using testing::tensor_bytes;
using testing::to_index;
using testing::values_of;
using testing::visit_element_type;
using testing::world_name;

using Kind = ReduceOp::Kind;

// ---------------------------------------------------------------------------------------------
// Inputs: exact per-rank values.

// Every value, every product of up to 8 of them, and every sum is exact in float and in the
// 8-bit significand of BFloat16 for the values alone (products round once, at the store, in both
// the library and the reference).
constexpr std::array<double, 9> kFloatTable = {1.5, -0.25, 2.0, 0.5, -1.25, 3.0, 0.75, -2.5, 1.0};

// 2^24 (2^53): adding 1 to it rounds back to it, so element 0 (this on one rank, 1 on the
// others) is order-sensitive.
template <class F>
constexpr F kOrderSensitiveBig = F{0};
template <>
constexpr float kOrderSensitiveBig<float> = 16777216.0f;
template <>
constexpr double kOrderSensitiveBig<double> = 9007199254740992.0;

double table_value(std::int64_t key) { return kFloatTable[to_index(key % 9)]; }

// Rank `r`'s element `index` for the reductions. `big_rank` holds the order-sensitive element 0
// of Float32/Float64/complex inputs.
template <class T>
T input_value(int r, std::int64_t index, int big_rank = 0) {
  if constexpr (kIsBool<T>) {
    if (index % 4 == 0) {
      return true;  // all ranks true: band/min give true
    }
    if (index % 4 == 1) {
      return false;  // all ranks false: bor/max give false
    }
    return (r * 3 + index) % 5 < 3;
  } else if constexpr (kIsInteger<T>) {
    if (index % 13 == 12) {  // sums and products wrap
      return static_cast<T>(std::numeric_limits<T>::max() - r);
    }
    if constexpr (std::is_signed_v<T>) {
      return static_cast<T>((r * 3 + index) % 7 - 3);
    } else {
      return static_cast<T>((r * 3 + index) % 5 + 1);
    }
  } else if constexpr (kIsHalfLike<T>) {
    return T(static_cast<float>(table_value(r * 3 + index)));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (index == 0) {
      return r == big_rank ? kOrderSensitiveBig<T> : T{1};
    }
    return static_cast<T>(table_value(r * 3 + index));
  } else {
    using F = typename T::value_type;
    if (index == 0) {
      return r == big_rank ? T(kOrderSensitiveBig<F>, -kOrderSensitiveBig<F>) : T(1, -1);
    }
    return T(static_cast<F>(table_value(r * 3 + index)),
             static_cast<F>(table_value(r * 5 + index + 4)));
  }
}

// Rank `r`'s element `index` for the data movers: distinct over every (rank, index < 32) pair for
// world sizes up to 8 (modulo 256 for the 8-bit types), except for Bool.
template <class T>
T distinct_value(int r, std::int64_t index) {
  const std::int64_t key = r * 32 + index;
  if constexpr (kIsBool<T>) {
    return (r + index) % 3 == 0;
  } else if constexpr (kIsInteger<T>) {
    return static_cast<T>(key);  // modular for the 8-bit types
  } else if constexpr (kIsHalfLike<T>) {
    return T(static_cast<float>(key % 256));  // exact in the 8-bit significand of BFloat16
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(key);
  } else {
    using F = typename T::value_type;
    return T(static_cast<F>(key), static_cast<F>(-index - 1));
  }
}

template <class T>
std::vector<T> input_values(int r, std::int64_t count, int big_rank = 0) {
  return values_of<T>(count, [&](std::int64_t i) { return input_value<T>(r, i, big_rank); });
}

template <class T>
std::vector<T> distinct_values(int r, std::int64_t count) {
  return values_of<T>(count, [&](std::int64_t i) { return distinct_value<T>(r, i); });
}

template <class T>
Tensor make_tensor(const std::vector<T>& values, const Shape& shape) {
  return Tensor::from_vector<T>(values, shape);
}

// A non-contiguous view of a [rows, cols] base tensor whose element k is value(k), with the
// view's values in row-major order.
enum class Layout { Transposed, Narrowed, Selected };

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::Transposed:
      return "transposed";
    case Layout::Narrowed:
      return "narrowed";
    case Layout::Selected:
      return "selected";
  }
  return "?";
}

// The view's shape and logical values, row-major, computed without the library's views.
template <class T>
struct Logical {
  Shape shape;
  std::vector<T> values;
};

template <class T, class ValueFn>
Logical<T> strided_logical(Layout layout, std::int64_t rows, std::int64_t cols, ValueFn value) {
  Logical<T> out;
  switch (layout) {
    case Layout::Transposed:  // view[b][a] = base[a][b]
      out.shape = {cols, rows};
      for (std::int64_t b = 0; b < cols; ++b) {
        for (std::int64_t a = 0; a < rows; ++a) {
          out.values.push_back(value(a * cols + b));
        }
      }
      break;
    case Layout::Narrowed:  // view[a][c] = base[a][c + 1]
      out.shape = {rows, cols - 2};
      for (std::int64_t a = 0; a < rows; ++a) {
        for (std::int64_t c = 0; c < cols - 2; ++c) {
          out.values.push_back(value(a * cols + c + 1));
        }
      }
      break;
    case Layout::Selected:  // view[a] = base[a][1]
      out.shape = {rows};
      for (std::int64_t a = 0; a < rows; ++a) {
        out.values.push_back(value(a * cols + 1));
      }
      break;
  }
  return out;
}

template <class T, class ValueFn>
Tensor strided_tensor(Layout layout, std::int64_t rows, std::int64_t cols, ValueFn value) {
  const Tensor base = make_tensor(values_of<T>(rows * cols, value), {rows, cols});
  switch (layout) {
    case Layout::Transposed:
      return base.transpose(0, 1);
    case Layout::Narrowed:
      return base.narrow(1, 1, cols - 2);
    case Layout::Selected:
      return base.select(1, 1);
  }
  return base;
}

constexpr Layout kLayouts[] = {Layout::Transposed, Layout::Narrowed, Layout::Selected};

// =============================================================================================
// all_reduce

class AllReduce : public ::testing::TestWithParam<SweepParam> {};

std::vector<Shape> reduce_shapes() {
  // 0-d, empty, empty with other dims, small, 2-d, and more than one 1024-element block.
  return {{}, {0}, {2, 0, 3}, {5}, {3, 4}, {1030}};
}

TEST_P(AllReduce, EveryAllowedOpMatchesTheScalarReferenceBitwiseOnEveryRank) {
  const int world_size = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto type) {
    using T = typename decltype(type)::type;
    const std::vector<ReduceOp> ops = allowed_ops<T>();
    const std::vector<Shape> shapes = reduce_shapes();
    const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
      std::vector<Tensor> outputs;  // all issued before any is read
      for (const ReduceOp& op : ops) {
        for (const Shape& shape : shapes) {
          const Tensor input = make_tensor(input_values<T>(rank(), element_count(shape)), shape);
          outputs.push_back(all_reduce(input, op, world()));
        }
      }
      return outputs;
    });
    for (int r = 0; r < world_size; ++r) {
      ASSERT_EQ(results[static_cast<std::size_t>(r)].size(), ops.size() * shapes.size());
    }
    std::size_t k = 0;
    for (const ReduceOp& op : ops) {
      for (const Shape& shape : shapes) {
        std::vector<std::vector<T>> inputs;
        for (int r = 0; r < world_size; ++r) {
          inputs.push_back(input_values<T>(r, element_count(shape)));
        }
        const std::vector<T> expected = reference_reduce(inputs, op);
        for (int r = 0; r < world_size; ++r) {
          EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)][k], shape, expected))
              << "rank " << r << ", " << op << ", shape " << list_text(shape);
        }
        ++k;
      }
    }
  });
}

TEST_P(AllReduce, NonContiguousInputsReduceTheirLogicalValues) {
  const int world_size = std::get<0>(GetParam());
  constexpr std::int64_t kRows = 4;
  constexpr std::int64_t kCols = 6;
  visit_element_type(std::get<1>(GetParam()), [&](auto type) {
    using T = typename decltype(type)::type;
    const std::vector<ReduceOp> ops = allowed_ops<T>();
    const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
      const int me = rank();
      const auto value = [&](std::int64_t i) { return input_value<T>(me, i); };
      std::vector<Tensor> outputs;
      for (const ReduceOp& op : ops) {
        for (Layout layout : kLayouts) {
          const Tensor input = strided_tensor<T>(layout, kRows, kCols, value);
          EXPECT_FALSE(input.is_contiguous()) << layout_name(layout);
          outputs.push_back(all_reduce(input, op, world()));
        }
      }
      return outputs;
    });
    std::size_t k = 0;
    for (const ReduceOp& op : ops) {
      for (Layout layout : kLayouts) {
        std::vector<std::vector<T>> inputs;
        Shape shape;
        for (int r = 0; r < world_size; ++r) {
          Logical<T> logical = strided_logical<T>(
              layout, kRows, kCols, [&](std::int64_t i) { return input_value<T>(r, i); });
          shape = logical.shape;
          inputs.push_back(std::move(logical.values));
        }
        const std::vector<T> expected = reference_reduce(inputs, op);
        for (int r = 0; r < world_size; ++r) {
          ASSERT_GT(results[static_cast<std::size_t>(r)].size(), k);
          EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)][k], shape, expected))
              << "rank " << r << ", " << op << ", " << layout_name(layout);
        }
        ++k;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, AllReduce,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

template <class T>
void expect_min_and_max_propagate_nan() {
  constexpr int kWorld = 3;
  using Acc = typename Accumulator<T>::type;
  const T nan = T(std::numeric_limits<Acc>::quiet_NaN());
  // Element 0: NaN on the last rank; element 1: NaN on rank 0; element 2: no NaN.
  const auto values = [&](int r) {
    std::vector<T> out = {T(2.0f), T(-1.0f), T(static_cast<float>(r))};
    if (r == kWorld - 1) {
      out[0] = nan;
    }
    if (r == 0) {
      out[1] = nan;
    }
    return out;
  };
  for (const ReduceOp& op : {ReduceOp("min"), ReduceOp("max")}) {
    std::vector<Result> results(kWorld);
    run_quietly(kWorld, [&] {
      results[rank_slot()] = capture(all_reduce(make_tensor(values(rank()), {3}), op, world()));
    });
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < kWorld; ++r) {
      inputs.push_back(values(r));
    }
    const std::vector<T> expected = reference_reduce(inputs, op);
    EXPECT_TRUE(std::isnan(static_cast<Acc>(expected[0])));
    EXPECT_TRUE(std::isnan(static_cast<Acc>(expected[1])));
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)], {3}, expected))
          << dtype_of<T> << " " << op << " rank " << r;
    }
  }
}

TEST(AllReduce, MinAndMaxPropagateNaNFromAnyRank) {
  expect_min_and_max_propagate_nan<Half>();
  expect_min_and_max_propagate_nan<BFloat16>();
  expect_min_and_max_propagate_nan<float>();
  expect_min_and_max_propagate_nan<double>();
}

TEST(AllReduce, EveryDTypeOpPairIsAcceptedExactlyWhenTheRulesAllowIt) {
  constexpr int kWorld = 2;
  run_quietly(kWorld, [&] {
    for (DType dtype : kAllDTypes) {
      visit_element_type(dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        for (const ReduceOp& op : all_ops()) {
          const Tensor input = make_tensor(input_values<T>(rank(), 2), {2});
          const bool allowed = op_allowed<T>(op.kind());
          for (int form = 0; form < 3; ++form) {
            try {
              Tensor output;
              if (form == 0) {
                output = all_reduce(input, op, world());
              } else if (form == 1) {
                output = reduce_scatter_tensor(input, op, 0, world());
              } else {
                output = all_reduce_coalesced({input, input}, op, world()).front();
              }
              wait_tensor(output);
              EXPECT_TRUE(allowed) << dtype << " " << op << " form " << form << " was accepted";
            } catch (const InvalidArgument& error) {
              EXPECT_FALSE(allowed)
                  << dtype << " " << op << " form " << form << " was rejected: " << error.what();
              EXPECT_NE(error.detail().find(std::string(dtype_name(dtype))), std::string::npos)
                  << error.detail();
            }
          }
        }
      });
    }
  });
}

// unsupported_reduction says, on a rank, what a reducing call would be refused for: the op/dtype
// rules first, then the transport's (the simulator runs every allowed pair, on the host only).
TEST(AllReduce, UnsupportedReductionGivesTheReasonARefusalWouldCarry) {
  const testing::CaughtError outside = testing::expect_error<InvalidArgument>(
      [] { (void)unsupported_reduction(DType::Float32, "sum"); }, {"outside a rank"});
  EXPECT_TRUE(testing::contains(outside.what, "unsupported_reduction")) << outside.what;
  std::vector<std::string> reasons;
  run_quietly(1, [&] {
    reasons.push_back(unsupported_reduction(DType::Float32, "sum"));
    reasons.push_back(unsupported_reduction(DType::Bool, "band"));
    reasons.push_back(unsupported_reduction(DType::Float32, "sum", Device::meta()));
    const ReduceOp max = ReduceOp::Kind::Max;
    reasons.push_back(unsupported_reduction(DType::Complex64, max) ==
                              max.check_dtype(DType::Complex64)
                          ? "check_dtype's"
                          : "another");
    reasons.push_back(unsupported_reduction(DType::Float32, "sum", Device::cuda(0)));
    try {
      (void)all_reduce(Tensor::empty({1}, DType::Complex64), max, world());
    } catch (const InvalidArgument& error) {
      reasons.push_back(std::string(error.what()).find(max.check_dtype(DType::Complex64)) !=
                                std::string::npos
                            ? "the call names it"
                            : error.what());
    }
  });
  ASSERT_EQ(reasons.size(), 6u);
  EXPECT_EQ(reasons[0], "");
  EXPECT_EQ(reasons[1], "");
  EXPECT_EQ(reasons[2], "");
  EXPECT_FALSE(ReduceOp(ReduceOp::Kind::Max).check_dtype(DType::Complex64).empty());
  EXPECT_EQ(reasons[3], "check_dtype's");
  EXPECT_NE(reasons[4].find("the simulator moves host memory only"), std::string::npos)
      << reasons[4];
  EXPECT_EQ(reasons[5], "the call names it");
}

// Waits for `call`'s result and appends "ran" to `outcomes`, or the detail of the
// InvalidArgument it threw.
void append_outcome(std::vector<std::string>& outcomes, const std::function<Tensor()>& call) {
  try {
    (void)wait_tensor(call());
    outcomes.emplace_back("ran");
  } catch (const InvalidArgument& error) {
    outcomes.push_back(error.detail());
  }
}

// Note [Supported calls]: a rank remembers the transport's last yes, keyed by every argument
// core gives Transport::supports. A call that differs from the accepted one in any of them (op
// kind, dtype, reduction, premul_sum factor, device) is asked again, and refused here.
TEST(AllReduce, ARememberedTransportAnswerCoversOnlyTheCallItWasFor) {
  auto refusals = std::make_shared<std::atomic<int>>(0);
  sim::SimOptions options = chorus::testing::quiet_options(2);
  options.cuda_devices = true;
  options.wrap_transport = chorus::testing::narrow(
      [](transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
         Device device) -> std::string {
        if (kind == transport::OpKind::AllGather) {
          return "narrowed: no all_gather";
        }
        if (dtype == DType::Float16) {
          return "narrowed: no float16";
        }
        if (reduce_op.kind() == ReduceOp::Kind::Max) {
          return "narrowed: no max";
        }
        if (reduce_op.kind() == ReduceOp::Kind::PremulSum && reduce_op.premul_factor() == 3.0) {
          return "narrowed: no premul_sum by 3";
        }
        if (device.is_cuda()) {
          return "narrowed: host memory only";
        }
        return {};
      },
      refusals);
  std::vector<std::vector<std::string>> outcomes(2);
  const sim::SimReport report = sim::run(options, [&] {
    const Tensor x = Tensor::ones({4});
    std::vector<std::string>& mine = outcomes[rank_slot()];
    const auto outcome = [&](const std::function<Tensor()>& call) { append_outcome(mine, call); };
    outcome([&] { return all_reduce(x, "sum", world()); });
    outcome([&] { return all_reduce(x.to(DType::Float16), "sum", world()); });
    outcome([&] { return all_reduce(x, "sum", world()); });
    outcome([&] { return all_reduce(x, "max", world()); });
    outcome([&] { return all_reduce(x, ReduceOp::premul_sum(2.0), world()); });
    outcome([&] { return all_reduce(x, ReduceOp::premul_sum(3.0), world()); });
    outcome([&] { return all_reduce(x, "sum", world()); });
    outcome([&] { return all_gather_tensor(x, 0, world()); });
    outcome([&] { return all_reduce(x, "sum", world()); });
    outcome([&] { return all_reduce(x.to(Device::cuda(rank())), "sum", world()); });
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  for (const std::vector<std::string>& mine : outcomes) {
    ASSERT_EQ(mine.size(), 10u);
    for (std::size_t i = 0; i < mine.size(); i += 2) {
      EXPECT_EQ(mine[i], "ran") << "call " << i;
    }
    EXPECT_NE(mine[1].find("narrowed: no float16"), std::string::npos) << mine[1];
    EXPECT_NE(mine[3].find("narrowed: no max"), std::string::npos) << mine[3];
    EXPECT_NE(mine[5].find("narrowed: no premul_sum by 3"), std::string::npos) << mine[5];
    EXPECT_NE(mine[7].find("narrowed: no all_gather"), std::string::npos) << mine[7];
    EXPECT_NE(mine[9].find("narrowed: host memory only"), std::string::npos) << mine[9];
  }
  EXPECT_EQ(refusals->load(), 10);
}

// A call that repeats the transport's last yes skips ReduceOp::check_dtype too (Note [Supported
// calls]); every call that differs from it in dtype or reduction is still checked, and refused
// with check_dtype's own text, before and after an accepted call.
TEST(AllReduce, ARememberedTransportAnswerSkipsNoDtypeCheckOfAnotherCall) {
  std::vector<std::vector<std::string>> outcomes(2);
  const sim::SimReport report = sim::run(chorus::testing::quiet_options(2), [&] {
    const Tensor x = Tensor::ones({4});
    const Tensor flags = Tensor::ones({4}, DType::Bool);
    std::vector<std::string>& mine = outcomes[rank_slot()];
    const auto outcome = [&](const std::function<Tensor()>& call) { append_outcome(mine, call); };
    outcome([&] { return all_reduce(x, "sum", world()); });
    outcome([&] { return all_reduce(x, "band", world()); });
    outcome([&] { return all_reduce(x, "sum", world()); });
    outcome([&] { return all_reduce(x, "summ", world()); });
    outcome([&] { return all_reduce(flags, "max", world()); });
    outcome([&] { return all_reduce(flags, "sum", world()); });
    outcome([&] { return all_reduce(x, ReduceOp::premul_sum(2.0), world()); });
    outcome([&] { return all_reduce(x.to(DType::Int32), ReduceOp::premul_sum(2.0), world()); });
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  for (const std::vector<std::string>& mine : outcomes) {
    ASSERT_EQ(mine.size(), 8u);
    EXPECT_EQ(mine[0], "ran");
    EXPECT_EQ(mine[1], ReduceOp("band").check_dtype(DType::Float32));
    EXPECT_EQ(mine[2], "ran");
    EXPECT_EQ(mine[3], ReduceOp("summ").check_dtype(DType::Float32));
    EXPECT_EQ(mine[4], "ran");
    EXPECT_EQ(mine[5], ReduceOp("sum").check_dtype(DType::Bool));
    EXPECT_EQ(mine[6], "ran");
    EXPECT_EQ(mine[7], ReduceOp::premul_sum(2.0).check_dtype(DType::Int32));
    for (std::size_t i : {1u, 3u, 5u, 7u}) {
      EXPECT_FALSE(mine[i].empty()) << "call " << i;
    }
  }
}

// An all_reduce output shares its input's layout only when the input's strides are exactly the
// contiguous ones (TensorAccess::empty_like): a [1, 3] transpose of a [3, 1] tensor is contiguous
// (its size-1 dim's stride is 1, not 3), and its output still gets the strides [3, 1], as
// Tensor::empty({1, 3}) would, not the input's; a fresh [3, 1] input's output gets its strides.
TEST(AllReduce, AnOutputHasContiguousStridesWhateverItsInputsSizeOneDimsStrides) {
  std::vector<std::vector<Shape>> strides(2);
  const sim::SimReport report = sim::run(chorus::testing::quiet_options(2), [&] {
    const Tensor column = Tensor::ones({3, 1});
    const Tensor row = column.transpose(0, 1);
    ASSERT_TRUE(row.is_contiguous());
    ASSERT_EQ(row.strides(), (Shape{1, 1}));
    std::vector<Shape>& mine = strides[rank_slot()];
    const Tensor row_sum = all_reduce(row, "sum", world());
    const Tensor column_sum = all_reduce(column, "sum", world());
    mine.push_back(row_sum.strides());
    mine.push_back(column_sum.strides());
    EXPECT_EQ(row_sum.sizes(), (Shape{1, 3}));
    EXPECT_EQ(row_sum.data_ptr<float>()[2], 2.0F);
    EXPECT_EQ(column_sum.data_ptr<float>()[2], 2.0F);
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  for (const std::vector<Shape>& mine : strides) {
    ASSERT_EQ(mine.size(), 2u);
    EXPECT_EQ(mine[0], (Shape{3, 1}));
    EXPECT_EQ(mine[1], (Shape{1, 1}));
  }
}

// Note [Remembered layout digests]: a rank reuses the digest of its last input only for that very
// layout object. Each input here is a view with a layout of its own: rank 1's [2, 3] view is made
// after its [6] view is gone, and must be digested anew and found to disagree with rank 0's [6].
// The memo holds the [6] layout, so the [2, 3] one cannot take its address; a memo of the address
// alone would let it (glibc hands the freed block of that size back, so this test then fails;
// an allocator that does not, ASan's quarantine, would hide that).
TEST(AllReduce, ARememberedLayoutDigestCoversOnlyTheLayoutItWasMadeFor) {
  std::vector<std::vector<std::string>> outcomes(2);
  const sim::SimReport report = sim::run(chorus::testing::quiet_options(2), [&] {
    std::vector<std::string>& mine = outcomes[rank_slot()];
    const auto outcome = [&](const Shape& shape) {
      try {
        (void)wait_tensor(all_reduce(Tensor::ones({6}).view(shape), "sum", world()));
        mine.emplace_back("ran");
      } catch (const CollectiveMismatch&) {
        mine.emplace_back("mismatch");
      }
    };
    outcome(Shape{6});
    outcome(rank() == 1 ? Shape{2, 3} : Shape{6});
  });
  for (const std::vector<std::string>& mine : outcomes) {
    EXPECT_EQ(mine, (std::vector<std::string>{"ran", "mismatch"})) << report.to_string();
  }
}

// Note [Remembered layout facts]: all_reduce takes its input's element count, contiguity and
// exact contiguous strides from the rank's memo only for the layout they were found for. Each
// input here is all-reduced twice in a row (the second call takes the memo), between inputs of
// other layouts: a [2, 3] tensor, its [3, 2] transpose (not contiguous: sent as a copy, read in
// its own order), a [1, 3] transpose of a [3, 1] tensor (contiguous, but its output gets
// Tensor::empty's strides [3, 1], not its own [1, 1]), and the [3, 1] tensor. Facts kept from the
// layout before would send the transpose as it lies in memory, or give the [1, 3] output the
// shared layout's strides.
TEST(AllReduce, RememberedLayoutFactsCoverOnlyTheLayoutTheyWereFoundFor) {
  using Outcome = std::pair<std::vector<float>, Shape>;  // values, strides
  std::vector<std::vector<Outcome>> outcomes(2);
  const sim::SimReport report = sim::run(chorus::testing::quiet_options(2), [&] {
    const Tensor matrix = Tensor::arange(6).view({2, 3});
    const Tensor transposed = matrix.transpose(0, 1);
    ASSERT_FALSE(transposed.is_contiguous());
    const Tensor column = Tensor::arange(3).view({3, 1});
    const Tensor row = column.transpose(0, 1);
    ASSERT_TRUE(row.is_contiguous());
    std::vector<Outcome>& mine = outcomes[rank_slot()];
    for (const Tensor* input : {&matrix, &transposed, &row, &column, &transposed, &matrix}) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        const Tensor sum = all_reduce(*input, "sum", world());
        mine.emplace_back(sum.to_vector<float>(), sum.strides());
      }
    }
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  const Outcome matrix_sum{{0, 2, 4, 6, 8, 10}, {3, 1}};
  const Outcome transposed_sum{{0, 6, 2, 8, 4, 10}, {2, 1}};
  const Outcome row_sum{{0, 2, 4}, {3, 1}};
  const Outcome column_sum{{0, 2, 4}, {1, 1}};
  const std::vector<Outcome> expected{
      matrix_sum, matrix_sum, transposed_sum, transposed_sum, row_sum,    row_sum,
      column_sum, column_sum, transposed_sum, transposed_sum, matrix_sum, matrix_sum};
  for (const std::vector<Outcome>& mine : outcomes) {
    EXPECT_EQ(mine, expected);
  }
}

// Note [Lowering]: the transport is asked about what it will run, the lowered dtype and
// reduction. On a transport with neither Bool, complex nor bitwise reductions (NCCL's gaps),
// Bool's band and bor run as min and max on UInt8 and complex sums as pairs of reals; Bool's bxor
// stays bitwise and is refused, as unsupported_reduction says beforehand.
TEST(AllReduce, TheTransportIsAskedAboutTheLoweredDTypeAndReduction) {
  auto refusals = std::make_shared<std::atomic<int>>(0);
  sim::SimOptions options = chorus::testing::quiet_options(2);
  options.wrap_transport = chorus::testing::narrow(
      [](transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
         Device device) -> std::string {
        if (dtype == DType::Bool || is_complex(dtype)) {
          return "narrowed: no " + std::string(dtype_name(dtype));
        }
        return chorus::testing::refuse_bitwise(kind, dtype, reduce_op, device);
      },
      refusals);
  std::vector<std::vector<std::string>> outcomes(2);
  std::vector<std::vector<Bytes>> bool_results(2);
  std::vector<std::vector<std::complex<float>>> complex_results(2);
  const sim::SimReport report = sim::run(options, [&] {
    std::vector<std::string>& mine = outcomes[rank_slot()];
    mine.push_back(unsupported_reduction(DType::Bool, "band"));
    mine.push_back(unsupported_reduction(DType::Bool, "bor"));
    mine.push_back(unsupported_reduction(DType::Complex64, "sum"));
    mine.push_back(unsupported_reduction(DType::Bool, "bxor"));
    Bytes bytes = rank() == 0 ? Bytes{1, 1, 0, 0} : Bytes{1, 0, 1, 0};
    const Tensor flags = Tensor::from_blob(bytes.data(), {4}, DType::Bool);
    for (const char* name : {"band", "bor"}) {
      bool_results[rank_slot()].push_back(tensor_bytes(all_reduce(flags, name, world())));
    }
    complex_results[rank_slot()] = all_reduce(Tensor::ones({2}, DType::Complex64), "sum", world())
                                       .to_vector<std::complex<float>>();
    append_outcome(mine, [&] { return all_reduce(flags, "bxor", world()); });
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  for (std::size_t r = 0; r < 2; ++r) {
    const std::vector<std::string>& mine = outcomes[r];
    ASSERT_EQ(mine.size(), 5u);
    EXPECT_EQ(mine[0], "") << "rank " << r;
    EXPECT_EQ(mine[1], "") << "rank " << r;
    EXPECT_EQ(mine[2], "") << "rank " << r;
    EXPECT_NE(mine[3].find("narrowed: reduce_op bxor on UInt8"), std::string::npos) << mine[3];
    EXPECT_NE(mine[4].find("cannot run all_reduce on input (Bool lowered to UInt8 on cpu): "
                           "narrowed: reduce_op bxor on UInt8"),
              std::string::npos)
        << mine[4];
    EXPECT_EQ(bool_results[r], (std::vector<Bytes>{{1, 0, 0, 0}, {1, 1, 1, 0}})) << "rank " << r;
    EXPECT_EQ(complex_results[r], (std::vector<std::complex<float>>{{2.0F, 0.0F}, {2.0F, 0.0F}}))
        << "rank " << r;
  }
  EXPECT_EQ(refusals->load(), 4)
      << "bxor only: unsupported_reduction's and the call's, on each rank";
}

TEST(AllReduce, OpNamesAreCaseInsensitiveFromEveryStringType) {
  constexpr int kWorld = 3;
  const std::string upper_sum = "SUM";
  const std::string_view mixed_max = "Max";
  const std::vector<ReduceOp> given = {
      ReduceOp(upper_sum),           ReduceOp(mixed_max),
      ReduceOp(std::string("bXoR")), ReduceOp(std::string_view("AVG")),
      ReduceOp("Product"),           ReduceOp("MIN")};
  const std::vector<ReduceOp> canonical = {"sum", "max", "bxor", "avg", "product", "min"};
  std::vector<std::vector<Result>> results(kWorld);
  run_quietly(kWorld, [&] {
    const Tensor input = make_tensor(input_values<std::int32_t>(rank(), 13), {13});
    // Each form of conversion, at the call itself.
    results[rank_slot()].push_back(capture(all_reduce(input, upper_sum, world())));
    results[rank_slot()].push_back(capture(all_reduce(input, mixed_max, world())));
    results[rank_slot()].push_back(capture(all_reduce(input, std::string("bXoR"), world())));
    results[rank_slot()].push_back(capture(all_reduce(input, std::string_view("AVG"), world())));
    results[rank_slot()].push_back(capture(all_reduce(input, "Product", world())));
    results[rank_slot()].push_back(capture(reduce_scatter_tensor(
        make_tensor(input_values<std::int32_t>(rank(), 2 * kWorld), {2 * kWorld}), "MIN", 0,
        world())));
  });
  for (std::size_t k = 0; k < given.size(); ++k) {
    EXPECT_EQ(given[k], canonical[k]) << k;
    EXPECT_TRUE(given[k].is_valid()) << k;
  }
  std::vector<std::vector<std::int32_t>> inputs;
  std::vector<std::vector<std::int32_t>> scatter_inputs;
  for (int r = 0; r < kWorld; ++r) {
    inputs.push_back(input_values<std::int32_t>(r, 13));
    scatter_inputs.push_back(input_values<std::int32_t>(r, 2 * kWorld));
  }
  for (int r = 0; r < kWorld; ++r) {
    const std::vector<Result>& got = results[static_cast<std::size_t>(r)];
    ASSERT_EQ(got.size(), canonical.size());
    for (std::size_t k = 0; k + 1 < canonical.size(); ++k) {
      EXPECT_TRUE(matches(got[k], {13}, reference_reduce(inputs, canonical[k])))
          << "rank " << r << " " << given[k];
    }
    const std::vector<std::int32_t> min_all = reference_reduce(scatter_inputs, canonical.back());
    EXPECT_TRUE(matches(got.back(), {2}, reference_chunk(min_all, {2 * kWorld}, 0, r, kWorld)))
        << "rank " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// all_reduce on every form of group.

class AllReduceGroups : public ::testing::TestWithParam<int> {};

// An order-sensitive Float32 input of 5 elements whose big element 0 sits on `big_rank`.
std::vector<float> ordered_floats(int r, int big_rank) {
  return input_values<float>(r, 5, big_rank);
}

template <class T>
std::vector<T> reduce_over(const std::vector<int>& members, const ReduceOp& op,
                           const std::function<std::vector<T>(int)>& values) {
  std::vector<std::vector<T>> inputs;
  for (int member : members) {
    inputs.push_back(values(member));
  }
  return reference_reduce(inputs, op);
}

TEST_P(AllReduceGroups, SubsetGroupsReduceInTheirOwnRankOrderWhileOthersRunApart) {
  const int world_size = GetParam();
  // Odd ranks, descending (group rank 0 is the highest odd rank); the rest ascending.
  std::vector<int> members;
  std::vector<int> others;
  for (int r = world_size - 1; r >= 0; --r) {
    if (r % 2 == 1) {
      members.push_back(r);
    }
  }
  for (int r = 0; r < world_size; ++r) {
    if (r % 2 == 0) {
      others.push_back(r);
    }
  }
  if (members.empty()) {
    std::swap(members, others);
  }
  const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
    const int me = rank();
    const bool member = position_of(members, me) >= 0;
    const std::vector<int>& mine = member ? members : others;
    const Tensor floats = make_tensor(ordered_floats(me, mine.front()), {5});
    const Tensor ints = make_tensor(input_values<std::int32_t>(me, 13), {13});
    std::vector<Tensor> outputs;
    outputs.push_back(all_reduce(floats, "sum", mine));
    outputs.push_back(all_reduce(ints, "product", new_group(mine)));  // the same group
    outputs.push_back(all_reduce(floats, ReduceOp::premul_sum(-3.0), mine));
    return outputs;
  });
  for (int r = 0; r < world_size; ++r) {
    const std::vector<int>& mine = position_of(members, r) >= 0 ? members : others;
    const std::vector<Result>& got = results[static_cast<std::size_t>(r)];
    ASSERT_EQ(got.size(), 3u) << r;
    const std::function<std::vector<float>(int)> floats = [&](int m) {
      return ordered_floats(m, mine.front());
    };
    const std::function<std::vector<std::int32_t>(int)> ints = [](int m) {
      return input_values<std::int32_t>(m, 13);
    };
    EXPECT_TRUE(matches(got[0], {5}, reduce_over<float>(mine, "sum", floats))) << "rank " << r;
    EXPECT_TRUE(matches(got[1], {13}, reduce_over<std::int32_t>(mine, "product", ints)))
        << "rank " << r;
    EXPECT_TRUE(matches(got[2], {5}, reduce_over<float>(mine, ReduceOp::premul_sum(-3.0), floats)))
        << "rank " << r;
  }
}

TEST_P(AllReduceGroups, TwoDimensionalRankListRunsWithinTheCallersSubList) {
  const int world_size = GetParam();
  // Interleaved sub-lists: {{0, 2, 4, ...}, {1, 3, 5, ...}} for even world sizes, else one list.
  const int lists_count = world_size % 2 == 0 ? 2 : 1;
  std::vector<std::vector<int>> lists(static_cast<std::size_t>(lists_count));
  for (int r = 0; r < world_size; ++r) {
    lists[static_cast<std::size_t>(r % lists_count)].push_back(r);
  }
  const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
    const int me = rank();
    const std::vector<int>& mine = lists[static_cast<std::size_t>(me % lists_count)];
    const Tensor floats = make_tensor(ordered_floats(me, mine.front()), {5});
    const Tensor ints = make_tensor(input_values<std::int64_t>(me, 13), {13});
    const Tensor a = all_reduce(floats, "sum", lists);
    const Tensor b = all_reduce(ints, "bxor", lists);
    return std::vector<Tensor>{a, b};
  });
  for (int r = 0; r < world_size; ++r) {
    const std::vector<int>& mine = lists[static_cast<std::size_t>(r % lists_count)];
    const std::vector<Result>& got = results[static_cast<std::size_t>(r)];
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(matches(
        got[0], {5},
        reduce_over<float>(mine, "sum", [&](int m) { return ordered_floats(m, mine.front()); })))
        << "rank " << r;
    EXPECT_TRUE(matches(got[1], {13},
                        reduce_over<std::int64_t>(
                            mine, "bxor", [](int m) { return input_values<std::int64_t>(m, 13); })))
        << "rank " << r;
  }
}

TEST_P(AllReduceGroups, DifferentTagsMakeDifferentGroupsThatBothWork) {
  const int world_size = GetParam();
  const std::vector<int> everyone = first_ranks(world_size);
  std::vector<std::vector<Result>> results(static_cast<std::size_t>(world_size));
  run_quietly(world_size, [&] {
    const int me = rank();
    const Tensor ints = make_tensor(input_values<std::int32_t>(me, 13), {13});
    // Even ranks issue tag "a" first, odd ranks tag "b" first: a single group would pair a sum
    // with a max. Separate groups each pair up in their own order.
    Tensor sum;
    Tensor max;
    if (me % 2 == 0) {
      sum = all_reduce(ints, "sum", everyone, "a");
      max = all_reduce(ints, "max", everyone, "b");
    } else {
      max = all_reduce(ints, "max", everyone, "b");
      sum = all_reduce(ints, "sum", everyone, "a");
    }
    // A ProcessGroup's own tag, and a call tag that overrides it.
    const Tensor min = all_reduce(ints, "min", new_group(everyone, "b"));
    const Tensor bor = all_reduce(ints, "bor", new_group(everyone, "x"), "a");
    for (const Tensor& output : {sum, max, min, bor}) {
      results[rank_slot()].push_back(capture(output));
    }
    // Sequence numbers are per group: tag "a" has run 2 ops, tag "b" 2, the untagged group 0.
    const Tensor floats = Tensor::ones({2});
    for (const auto& [tag, seq] :
         std::vector<std::pair<std::string, std::int64_t>>{{"a", 2}, {"b", 2}, {"", 0}, {"c", 0}}) {
      SCOPED_TRACE("tag '" + tag + "'");
      const testing::CaughtError refused = testing::expect_error<InvalidArgument>(
          [&, &tag = tag] { (void)all_reduce(floats, "band", everyone, tag); }, {});
      EXPECT_EQ(refused.context.seq, seq);
      EXPECT_EQ(refused.context.group, (ExpandedGroup{tag, everyone, world_size}.to_string()));
    }
  });
  std::vector<std::vector<std::int32_t>> inputs;
  for (int r = 0; r < world_size; ++r) {
    inputs.push_back(input_values<std::int32_t>(r, 13));
  }
  for (int r = 0; r < world_size; ++r) {
    const std::vector<Result>& got = results[static_cast<std::size_t>(r)];
    ASSERT_EQ(got.size(), 4u);
    EXPECT_TRUE(matches(got[0], {13}, reference_reduce(inputs, "sum"))) << r;
    EXPECT_TRUE(matches(got[1], {13}, reference_reduce(inputs, "max"))) << r;
    EXPECT_TRUE(matches(got[2], {13}, reference_reduce(inputs, "min"))) << r;
    EXPECT_TRUE(matches(got[3], {13}, reference_reduce(inputs, "bor"))) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, AllReduceGroups, ::testing::ValuesIn(kWorldSizes), world_name);

TEST(AllReduceGroups, SubsetOneTwoOfFourRanksWhileTheOthersSkip) {
  constexpr int kWorld = 4;
  const std::vector<int> members = {1, 2};
  std::vector<Result> results(kWorld);
  run_quietly(kWorld, [&] {
    if (rank() == 1 || rank() == 2) {
      results[rank_slot()] =
          capture(all_reduce(make_tensor(ordered_floats(rank(), 1), {5}), "sum", members));
    }
  });
  const std::vector<float> expected =
      reduce_over<float>(members, "sum", [](int m) { return ordered_floats(m, 1); });
  EXPECT_TRUE(matches(results[1], {5}, expected));
  EXPECT_TRUE(matches(results[2], {5}, expected));
  EXPECT_TRUE(results[0].bytes.empty() && results[3].bytes.empty());
}

// Each call expands its group into the rank's scratch group, which keeps the call before's
// group and is set only where it differs: consecutive calls on pairs of the same size (and on
// pairs whose first rank is the same) must each run on their own pair. Ranks 0, 1 and 2 pair up
// as A = [0, 1], B = [0, 2], C = [1, 2], each rank taking its two pairs in that order.
TEST(AllReduceGroups, ConsecutiveCallsOnPairsOfOneSizeRunEachOnItsOwnPair) {
  constexpr int kWorld = 3;
  const std::vector<std::vector<int>> pairs = {{0, 1}, {0, 2}, {1, 2}};
  std::vector<std::vector<float>> sums(kWorld);
  run_quietly(kWorld, [&] {
    const Tensor mine = Tensor::full({2}, static_cast<double>(1 << rank()));  // 1, 2, 4
    for (const std::vector<int>& pair : pairs) {
      if (std::find(pair.begin(), pair.end(), rank()) != pair.end()) {
        sums[rank_slot()].push_back(all_reduce(mine, "sum", pair).to_vector<float>().at(1));
      }
    }
  });
  EXPECT_EQ(sums[0], (std::vector<float>{3, 5}));  // A, B
  EXPECT_EQ(sums[1], (std::vector<float>{3, 6}));  // A, C
  EXPECT_EQ(sums[2], (std::vector<float>{5, 6}));  // B, C
}

TEST(AllReduceGroups, TwoByTwoRankListOnFourRanks) {
  constexpr int kWorld = 4;
  const std::vector<std::vector<int>> lists = {{0, 1}, {2, 3}};
  std::vector<Result> results(kWorld);
  run_quietly(kWorld, [&] {
    results[rank_slot()] = capture(
        all_reduce(make_tensor(input_values<std::int32_t>(rank(), 13), {13}), "sum", lists));
  });
  for (int r = 0; r < kWorld; ++r) {
    const std::vector<int>& mine = lists[static_cast<std::size_t>(r / 2)];
    EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)], {13},
                        reduce_over<std::int32_t>(
                            mine, "sum", [](int m) { return input_values<std::int32_t>(m, 13); })))
        << "rank " << r;
  }
}

// MeshDim on a [2, W/2] mesh, in identity and reversed rank order; and a 1-D mesh alone.
class AllReduceMesh : public ::testing::TestWithParam<int> {};

TEST_P(AllReduceMesh, MeshDimReducesOverTheCallersSliceInMeshOrder) {
  const int world_size = GetParam();
  const std::int64_t columns = world_size / 2;
  for (const std::vector<int>& mesh_ranks : {first_ranks(world_size), reversed_ranks(world_size)}) {
    // The slices through each rank, by hand: row-major [2, columns].
    const auto slice = [&](int r, int dim) {
      const int p = position_of(mesh_ranks, r);
      std::vector<int> out;
      if (dim == 0) {
        for (std::int64_t row = 0; row < 2; ++row) {
          out.push_back(mesh_ranks[to_index(row * columns + p % columns)]);
        }
      } else {
        for (std::int64_t column = 0; column < columns; ++column) {
          out.push_back(mesh_ranks[to_index(p / columns * columns + column)]);
        }
      }
      return out;
    };
    const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
      const int me = rank();
      const DeviceMesh mesh({2, columns}, mesh_ranks);
      const Tensor along_rows = all_reduce(
          make_tensor(ordered_floats(me, slice(me, 0).front()), {5}), "sum", MeshDim{mesh, 0});
      const Tensor along_columns = all_reduce(
          make_tensor(ordered_floats(me, slice(me, 1).front()), {5}), "sum", MeshDim{mesh, -1});
      const Tensor whole = all_reduce(make_tensor(ordered_floats(me, mesh_ranks.front()), {5}),
                                      "sum", DeviceMesh({world_size}, mesh_ranks));
      return std::vector<Tensor>{along_rows, along_columns, whole};
    });
    for (int r = 0; r < world_size; ++r) {
      const std::vector<Result>& got = results[static_cast<std::size_t>(r)];
      ASSERT_EQ(got.size(), 3u);
      for (int k = 0; k < 3; ++k) {
        const std::vector<int> members = k < 2 ? slice(r, k) : mesh_ranks;
        EXPECT_TRUE(
            matches(got[static_cast<std::size_t>(k)], {5},
                    reduce_over<float>(members, "sum",
                                       [&](int m) { return ordered_floats(m, members.front()); })))
            << "rank " << r << " case " << k << " mesh rank 0 = " << mesh_ranks.front();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, AllReduceMesh, ::testing::Values(4, 8), world_name);

// =============================================================================================
// all_gather_tensor

class AllGather : public ::testing::TestWithParam<SweepParam> {};

struct DimCase {
  Shape shape;
  std::int64_t dim = 0;
};

std::vector<DimCase> gather_cases() {
  return {{{5}, 0},     {{5}, -1},      {{2, 3}, 0},    {{2, 3}, 1},    {{2, 3}, -1},
          {{2, 3}, -2}, {{2, 3, 4}, 0}, {{2, 3, 4}, 1}, {{2, 3, 4}, 2}, {{2, 3, 4}, -1},
          {{}, 0},      {{}, -1},       {{0, 3}, 1},    {{2, 0}, 0}};
}

TEST_P(AllGather, ConcatenatesEveryRanksInputAlongGatherDimInGroupRankOrder) {
  const int world_size = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto type) {
    using T = typename decltype(type)::type;
    const std::vector<DimCase> cases = gather_cases();
    const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
      std::vector<Tensor> outputs;
      for (const DimCase& c : cases) {
        const Tensor input =
            make_tensor(distinct_values<T>(rank(), element_count(c.shape)), c.shape);
        outputs.push_back(all_gather_tensor(input, c.dim, world()));
      }
      // Non-contiguous inputs.
      const int me = rank();
      const auto value = [&](std::int64_t i) { return distinct_value<T>(me, i); };
      for (std::int64_t dim : {0, 1}) {
        outputs.push_back(
            all_gather_tensor(strided_tensor<T>(Layout::Transposed, 2, 3, value), dim, world()));
      }
      return outputs;
    });
    const auto check = [&](std::size_t k, const Shape& shape, std::int64_t dim,
                           const std::function<std::vector<T>(int)>& values) {
      std::vector<std::vector<T>> parts;
      for (int r = 0; r < world_size; ++r) {
        parts.push_back(values(r));
      }
      const std::int64_t d = normalized_dim(dim, shape.size());
      Shape out_shape = shape.empty() ? Shape{world_size} : shape;
      if (!shape.empty()) {
        out_shape[to_index(d)] *= world_size;
      }
      const std::vector<T> expected = reference_concat(parts, shape, d);
      for (int r = 0; r < world_size; ++r) {
        ASSERT_GT(results[static_cast<std::size_t>(r)].size(), k);
        EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)][k], out_shape, expected))
            << "rank " << r << ", input " << list_text(shape) << ", gather_dim " << dim;
      }
    };
    std::size_t k = 0;
    for (const DimCase& c : cases) {
      check(k++, c.shape, c.dim,
            [&](int r) { return distinct_values<T>(r, element_count(c.shape)); });
    }
    for (std::int64_t dim : {0, 1}) {
      check(k++, {3, 2}, dim, [&](int r) {
        return strided_logical<T>(Layout::Transposed, 2, 3,
                                  [&](std::int64_t i) { return distinct_value<T>(r, i); })
            .values;
      });
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, AllGather,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

TEST(AllGather, GathersBoolInEveryForm) {
  constexpr int kWorld = 3;
  std::vector<std::vector<Result>> results(kWorld);
  run_quietly(kWorld, [&] {
    const Tensor flags = make_tensor(distinct_values<bool>(rank(), 6), {2, 3});
    results[rank_slot()].push_back(capture(all_gather_tensor(flags, 1, world())));
    results[rank_slot()].push_back(
        capture(all_gather_into_tensor_coalesced({flags, flags.select(1, 0)}, world()).front()));
  });
  std::vector<std::vector<bool>> parts;
  for (int r = 0; r < kWorld; ++r) {
    parts.push_back(distinct_values<bool>(r, 6));
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(results[static_cast<std::size_t>(r)].size(), 2u);
    EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)][0], {2, 3 * kWorld},
                        reference_concat(parts, {2, 3}, 1)))
        << "rank " << r;
    EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)][1], {2 * kWorld, 3},
                        reference_concat(parts, {2, 3}, 0)))
        << "rank " << r;
  }
}

// =============================================================================================
// reduce_scatter_tensor

class ReduceScatter : public ::testing::TestWithParam<SweepParam> {};

template <class T>
std::vector<ReduceOp> scatter_ops() {
  if constexpr (kIsBool<T>) {
    return {"max", "band"};
  } else if constexpr (kIsInteger<T>) {
    return {"sum", "max", "avg"};
  } else if constexpr (kIsFloating<T>) {
    return {ReduceOp::premul_sum(0.5), "sum", "min"};
  } else {
    return {ReduceOp::premul_sum(-3.0), "avg"};
  }
}

std::vector<DimCase> scatter_cases(std::int64_t w) {
  return {{{2 * w}, 0},     {{2 * w}, -1},      {{w, 3}, 0},     {{3, 2 * w}, 1},
          {{3, 2 * w}, -1}, {{2, 3 * w, 2}, 1}, {{2, 3, w}, -1}, {{2, 3, w}, 2},
          {{w, 2, 3}, -3},  {{0}, 0},           {{0, w}, 1},     {{w, 0}, 0}};
}

TEST_P(ReduceScatter, RankIGetsChunkIOfTheReductionAlongScatterDim) {
  const int world_size = std::get<0>(GetParam());
  visit_element_type(std::get<1>(GetParam()), [&](auto type) {
    using T = typename decltype(type)::type;
    const std::vector<ReduceOp> ops = scatter_ops<T>();
    const std::vector<DimCase> cases = scatter_cases(world_size);
    const std::vector<std::vector<Result>> results = capture_every_rank(world_size, [&] {
      const int me = rank();
      std::vector<Tensor> outputs;
      for (const ReduceOp& op : ops) {
        for (const DimCase& c : cases) {
          const Tensor input = make_tensor(input_values<T>(me, element_count(c.shape)), c.shape);
          outputs.push_back(reduce_scatter_tensor(input, op, c.dim, world()));
        }
        // Non-contiguous: a transposed [2W, 5] base scattered along dim 1 and a narrowed
        // [W, 5] base along dim 0.
        const auto value = [&](std::int64_t i) { return input_value<T>(me, i); };
        outputs.push_back(reduce_scatter_tensor(
            strided_tensor<T>(Layout::Transposed, 2 * world_size, 5, value), op, 1, world()));
        outputs.push_back(reduce_scatter_tensor(
            strided_tensor<T>(Layout::Narrowed, world_size, 5, value), op, 0, world()));
      }
      return outputs;
    });
    std::size_t k = 0;
    const auto check = [&](const ReduceOp& op, const Shape& shape, std::int64_t dim,
                           const std::function<std::vector<T>(int)>& values) {
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world_size; ++r) {
        inputs.push_back(values(r));
      }
      const std::vector<T> reduced = reference_reduce(inputs, op);
      const std::int64_t d = normalized_dim(dim, shape.size());
      Shape out_shape = shape;
      out_shape[to_index(d)] /= world_size;
      for (int r = 0; r < world_size; ++r) {
        ASSERT_GT(results[static_cast<std::size_t>(r)].size(), k);
        EXPECT_TRUE(matches(results[static_cast<std::size_t>(r)][k], out_shape,
                            reference_chunk(reduced, shape, d, r, world_size)))
            << "rank " << r << ", " << op << ", input " << list_text(shape) << ", scatter_dim "
            << dim;
      }
      ++k;
    };
    for (const ReduceOp& op : ops) {
      for (const DimCase& c : cases) {
        check(op, c.shape, c.dim,
              [&](int r) { return input_values<T>(r, element_count(c.shape)); });
      }
      const auto logical = [&](Layout layout, std::int64_t rows, int r) {
        return strided_logical<T>(layout, rows, 5,
                                  [&](std::int64_t i) { return input_value<T>(r, i); })
            .values;
      };
      check(op, {5, 2 * world_size}, 1,
            [&](int r) { return logical(Layout::Transposed, 2 * world_size, r); });
      check(op, {world_size, 3}, 0,
            [&](int r) { return logical(Layout::Narrowed, world_size, r); });
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, ReduceScatter,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         sweep_name);

// =============================================================================================
// Coalesced forms, and the law that ties the three together.

class Coalesced : public ::testing::TestWithParam<int> {};

TEST_P(Coalesced, EqualTheSeparateOpsWithMixedDTypesShapesAndScatterDims) {
  const int world_size = GetParam();
  const std::int64_t w = world_size;
  // results[rank] = coalesced outputs..., then the separate ones in the same order.
  std::vector<std::vector<Result>> coalesced(static_cast<std::size_t>(world_size));
  std::vector<std::vector<Result>> separate(static_cast<std::size_t>(world_size));
  run_quietly(world_size, [&] {
    const int me = rank();
    const std::vector<Tensor> reduce_inputs = {
        make_tensor(input_values<std::int32_t>(me, 13), {13}),
        make_tensor(input_values<float>(me, 4), {2, 2}),
        make_tensor(input_values<Half>(me, 1), {}),
        make_tensor(input_values<std::int64_t>(me, 0), {0}),
        make_tensor(input_values<std::complex<double>>(me, 6), {3, 2}).transpose(0, 1),
    };
    const std::vector<Tensor> gather_inputs = {
        make_tensor(distinct_values<std::int32_t>(me, 6), {2, 3}),
        make_tensor(distinct_values<double>(me, 4), {4}),
        make_tensor(distinct_values<bool>(me, 1), {}),
        make_tensor(distinct_values<std::uint8_t>(me, 0), {0, 2}),
        make_tensor(distinct_values<std::complex<float>>(me, 6), {2, 3}).transpose(0, 1),
    };
    const std::vector<Tensor> scatter_inputs = {
        make_tensor(input_values<std::int32_t>(me, 2 * w * 3), {2 * w, 3}),
        make_tensor(input_values<float>(me, 3 * w), {3, w}),
        make_tensor(input_values<std::int64_t>(me, 8 * w), {2, 2, 2 * w}),
        make_tensor(input_values<BFloat16>(me, w), {w}),
        make_tensor(input_values<double>(me, 2 * w * 3), {3, 2 * w}).transpose(0, 1),
    };
    const std::vector<std::int64_t> scatter_dims = {0, 1, -1, -1, 0};

    std::vector<std::vector<Tensor>> lists;
    lists.push_back(all_reduce_coalesced(reduce_inputs, "sum", world()));
    lists.push_back(all_reduce_coalesced({reduce_inputs[1], reduce_inputs[2]}, "max", world()));
    lists.push_back(all_gather_into_tensor_coalesced(gather_inputs, world()));
    lists.push_back(reduce_scatter_tensor_coalesced(scatter_inputs, "sum", scatter_dims, world()));
    std::vector<Tensor> singles;
    for (const Tensor& input : reduce_inputs) {
      singles.push_back(all_reduce(input, "sum", world()));
    }
    singles.push_back(all_reduce(reduce_inputs[1], "max", world()));
    singles.push_back(all_reduce(reduce_inputs[2], "max", world()));
    for (const Tensor& input : gather_inputs) {
      singles.push_back(all_gather_tensor(input, 0, world()));
    }
    for (std::size_t i = 0; i < scatter_inputs.size(); ++i) {
      singles.push_back(reduce_scatter_tensor(scatter_inputs[i], "sum", scatter_dims[i], world()));
    }
    for (const std::vector<Tensor>& list : lists) {
      for (const Tensor& output : list) {
        coalesced[rank_slot()].push_back(capture(output));
      }
    }
    for (const Tensor& output : singles) {
      separate[rank_slot()].push_back(capture(output));
    }
  });
  for (int r = 0; r < world_size; ++r) {
    const auto& got = coalesced[static_cast<std::size_t>(r)];
    const auto& want = separate[static_cast<std::size_t>(r)];
    ASSERT_EQ(got.size(), 17u);
    ASSERT_EQ(want.size(), 17u);
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(same_result(got[k], want[k])) << "rank " << r << ", output " << k;
    }
  }
  // The separate ops themselves, spot-checked against the reference, so that a fault common to
  // both forms cannot hide.
  std::vector<std::vector<std::int32_t>> reduced;
  std::vector<std::vector<std::int32_t>> gathered;
  std::vector<std::vector<std::int32_t>> scattered;
  for (int r = 0; r < world_size; ++r) {
    reduced.push_back(input_values<std::int32_t>(r, 13));
    gathered.push_back(distinct_values<std::int32_t>(r, 6));
    scattered.push_back(input_values<std::int32_t>(r, 2 * w * 3));
  }
  const std::vector<std::int32_t> scatter_sum = reference_reduce(scattered, "sum");
  for (int r = 0; r < world_size; ++r) {
    const auto& got = separate[static_cast<std::size_t>(r)];
    EXPECT_TRUE(matches(got[0], {13}, reference_reduce(reduced, "sum"))) << "rank " << r;
    EXPECT_TRUE(matches(got[7], {2 * w, 3}, reference_concat(gathered, {2, 3}, 0))) << "rank " << r;
    EXPECT_TRUE(matches(got[12], {2, 3}, reference_chunk(scatter_sum, {2 * w, 3}, 0, r, w)))
        << "rank " << r;
  }
}

TEST_P(Coalesced, EmptyInputListsReturnEmptyLists) {
  const int world_size = GetParam();
  run_quietly(world_size, [&] {
    EXPECT_TRUE(all_reduce_coalesced({}, "sum", world()).empty());
    EXPECT_TRUE(all_gather_into_tensor_coalesced({}, world()).empty());
    EXPECT_TRUE(reduce_scatter_tensor_coalesced({}, "sum", {}, world()).empty());
    // Later collectives still pair up.
    const Tensor sum = all_reduce(Tensor::full({2}, rank() + 1, DType::Int64), "sum", world());
    const std::int64_t w = world_size;
    EXPECT_EQ(sum.to_vector<std::int64_t>(), std::vector<std::int64_t>(2, w * (w + 1) / 2));
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, Coalesced, ::testing::ValuesIn(kWorldSizes), world_name);

class CollectiveLaws : public ::testing::TestWithParam<SweepParam> {};

TEST_P(CollectiveLaws, AllGatherOfReduceScatterEqualsAllReduceForIntegers) {
  const int world_size = std::get<0>(GetParam());
  const std::int64_t w = world_size;
  visit_element_type(std::get<1>(GetParam()), [&](auto type) {
    using T = typename decltype(type)::type;
    const std::vector<DimCase> cases = {{{2 * w, 3}, 0},    {{3, 2 * w}, 1}, {{3, 2 * w}, -1},
                                        {{2, w, 2}, 1},     {{w}, 0},        {{2, 3, 3 * w}, 2},
                                        {{2, 3, 3 * w}, -1}};
    run_quietly(world_size, [&] {
      for (const DimCase& c : cases) {
        const Tensor x = make_tensor(input_values<T>(rank(), element_count(c.shape)), c.shape);
        // The reduce_scatter result is still pending when all_gather reads it.
        const Tensor law =
            all_gather_tensor(reduce_scatter_tensor(x, "sum", c.dim, world()), c.dim, world());
        const Tensor direct = all_reduce(x, "sum", world());
        EXPECT_TRUE(same_result(capture(law), capture(direct)))
            << "rank " << rank() << ", " << list_text(c.shape) << ", dim " << c.dim;
      }
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, CollectiveLaws,
                         ::testing::Combine(::testing::ValuesIn(kWorldSizes),
                                            ::testing::Values(DType::UInt8, DType::Int8,
                                                              DType::Int32, DType::Int64)),
                         sweep_name);

// =============================================================================================
// Invalid arguments (DESIGN 2.2, 2.3, 2.6, 2.7).

// A valid collective on the world: proves the ranks still pair up after the errors.
void expect_world_still_pairs_up() {
  const std::int64_t w = world_size();
  const Tensor sum = all_reduce(Tensor::full({3}, rank() + 1, DType::Int64), "sum", world());
  EXPECT_EQ(sum.to_vector<std::int64_t>(), std::vector<std::int64_t>(3, w * (w + 1) / 2));
  const Tensor gathered = all_gather_tensor(Tensor::full({1}, rank(), DType::Int32), 0, world());
  EXPECT_EQ(gathered.to_vector<std::int32_t>(), first_ranks(world_size()));
}

// Runs `bad_calls` on every rank, then checks a valid collective still pairs up. The bad calls
// come first on the world, so the seq they name is 0.
void on_every_rank(int world_size, const std::function<void(const std::string&)>& bad_calls) {
  run_quietly(world_size, [&] {
    bad_calls(group_label(first_ranks(world_size)));
    expect_world_still_pairs_up();
  });
}

class InvalidArgumentErrors : public ::testing::TestWithParam<int> {};

TEST_P(InvalidArgumentErrors, UnrecognizedReduceOpName) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    const Tensor x = Tensor::ones({w});
    const ErrorSite at_all_reduce{"all_reduce", 0, group};
    expect_error_on_rank([&] { (void)all_reduce(x, "summ", world()); },
                         {"Unrecognized reduce_op", "'summ'"}, at_all_reduce);
    expect_error_on_rank([&] { (void)all_reduce(x, "", world()); }, {"Unrecognized reduce_op"},
                         at_all_reduce);
    expect_error_on_rank([&] { (void)all_reduce(x, "premul_sum", world()); },
                         {"Unrecognized reduce_op", "premul_sum"}, at_all_reduce);
    // A Kind cast from a bad integer reaches no reduction kernel.
    const ReduceOp bad_kind(static_cast<ReduceOp::Kind>(42));
    expect_error_on_rank([&] { (void)all_reduce(x, bad_kind, world()); },
                         {"Unrecognized reduce_op", "'ReduceOp::Kind(42)'"}, at_all_reduce);
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(x, bad_kind, 0, world()); },
                         {"Unrecognized reduce_op", "'ReduceOp::Kind(42)'"},
                         {"reduce_scatter_tensor", 0, group});
    expect_error_on_rank(
        [&] { (void)reduce_scatter_tensor(x, std::string("Average"), 0, world()); },
        {"Unrecognized reduce_op", "'Average'"}, {"reduce_scatter_tensor", 0, group});
    expect_error_on_rank(
        [&] { (void)all_reduce_coalesced({x}, std::string_view("sum "), world()); },
        {"Unrecognized reduce_op"}, {"all_reduce_coalesced", 0, group});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor_coalesced({x}, "nope", {0}, world()); },
                         {"Unrecognized reduce_op", "'nope'"},
                         {"reduce_scatter_tensor_coalesced", 0, group});
    // No input to check it against: the name is refused all the same.
    expect_error_on_rank([&] { (void)all_reduce_coalesced({}, "nope", world()); },
                         {"Unrecognized reduce_op", "'nope'"}, {"all_reduce_coalesced", 0, group});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor_coalesced({}, "nope", {}, world()); },
                         {"Unrecognized reduce_op", "'nope'"},
                         {"reduce_scatter_tensor_coalesced", 0, group});
  });
}

// A [rows, row.size()] Float32 view of `row` with stride 0 in dim 0 (a broadcast, as torch's
// expand makes), imported through DLPack; `row` must outlive it.
Tensor expanded_rows(std::vector<float>& row, std::int64_t rows) {
  struct Holder {
    std::array<std::int64_t, 2> shape;
    std::array<std::int64_t, 2> strides;
    DLManagedTensor managed{};
  };
  auto* holder = new Holder{{rows, static_cast<std::int64_t>(row.size())}, {0, 1}, {}};
  DLTensor& dl = holder->managed.dl_tensor;
  dl.data = row.data();
  dl.device = DLDevice{kDLCPU, 0};
  dl.ndim = 2;
  dl.dtype = DLDataType{kDLFloat, 32, 1};
  dl.shape = holder->shape.data();
  dl.strides = holder->strides.data();
  holder->managed.manager_ctx = holder;
  holder->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<Holder*>(self->manager_ctx);
  };
  return Tensor::from_dlpack(&holder->managed);
}

TEST_P(InvalidArgumentErrors, AnOutputTooLargeForMemoryIsRefusedBeforeStarting) {
#if defined(CHORUS_ASAN) || defined(CHORUS_TSAN)
  GTEST_SKIP() << "the sanitizers' allocators end the process on a 4 TiB request instead of "
                  "failing it";
#else
  const int w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    // 2^40 + 1 rows of Float32 from the last rank: 4 TiB, more than malloc will give.
    std::vector<std::int64_t> output_splits(static_cast<std::size_t>(w), 1);
    output_splits.back() = (std::int64_t{1} << 40) + 1;
    const std::vector<std::int64_t> input_splits(static_cast<std::size_t>(w), 1);
    expect_error_on_rank(
        [&] {
          (void)all_to_all_single(Tensor::ones({w, 1}), output_splits, input_splits, world());
        },
        {"cannot allocate the output", "does not fit in memory"}, {"all_to_all_single", 0, group});
  });
#endif
}

TEST_P(InvalidArgumentErrors, AnOutputTooLargeToAddressIsTheCollectivesError) {
  // No allocator is asked: the output's byte count overflows int64. The error names the
  // collective, not the tensor factory it reached (it said "Tensor::empty" with no sequence
  // number or group).
  const int w = GetParam();
  on_every_rank(w, [&](const std::string& group) {
    // 2^61 + w - 1 rows of 3 Float32 from the last rank.
    std::vector<std::int64_t> output_splits(static_cast<std::size_t>(w), 1);
    output_splits.back() = std::int64_t{1} << 61;
    const std::vector<std::int64_t> input_splits(static_cast<std::size_t>(w), 1);
    const std::string too_large = "cannot allocate the output: shape [" +
                                  std::to_string((std::int64_t{1} << 61) + w - 1) +
                                  ", 3] of Float32 is too large to address";
    expect_error_on_rank(
        [&] {
          (void)all_to_all_single(Tensor::ones({w, 3}), output_splits, input_splits, world());
        },
        {too_large}, {"all_to_all_single", 0, group});
    {
      // The same shape under tracing, on meta tensors: the meta call's error (no sequence
      // number).
      TraceScope scope;
      const Tensor meta = Tensor::empty({w, 3}, DType::Float32, Device::meta());
      expect_error_on_rank(
          [&] { (void)all_to_all_single(meta, output_splits, input_splits, world()); }, {too_large},
          {"all_to_all_single", -1, group});
    }
    if (w > 1) {
      // Zero elements, but the gathered shape's strides overflow.
      const Tensor empty = Tensor::zeros({0, std::int64_t{1} << 31, std::int64_t{1} << 31});
      expect_error_on_rank([&] { (void)all_gather_tensor(empty, 1, world()); },
                           {"cannot allocate the output: shape [0, ", "too large to address"},
                           {"all_gather_tensor", 0, group});
    }
  });
}

TEST_P(InvalidArgumentErrors, InPlaceFormsRefuseStrideZeroDestinationsBeforeStarting) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    std::vector<float> row(1, 0.0f);
    Tensor tensor = expanded_rows(row, 2);
    expect_error_on_rank([&] { (void)all_reduce_inplace(tensor, "sum", world()); },
                         {"tensor has stride 0 in dim 0", "share one memory location"},
                         {"all_reduce_inplace", 0, group});
    Tensor gathered = expanded_rows(row, 2 * w);
    expect_error_on_rank(
        [&] {
          (void)all_gather_tensor_inplace(gathered, Tensor::ones({2, 1}), world());
        },
        {"output has stride 0 in dim 0"}, {"all_gather_tensor_inplace", 0, group});
    Tensor scattered = expanded_rows(row, 2);
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_inplace(scattered, Tensor::ones({2 * w, 1}), "sum", world());
        },
        {"output has stride 0 in dim 0"}, {"reduce_scatter_tensor_inplace", 0, group});
    EXPECT_EQ(row[0], 0.0f);  // nothing was written
  });
}

TEST_P(InvalidArgumentErrors, BitwiseOpOnFloatingDType) {
  on_every_rank(GetParam(), [&](const std::string& group) {
    for (const char* op : {"band", "bor", "bxor"}) {
      expect_error_on_rank([&] { (void)all_reduce(Tensor::ones({2}), op, world()); },
                           {op, "Float32", "bitwise"}, {"all_reduce", 0, group});
      expect_error_on_rank(
          [&] { (void)all_reduce(Tensor::ones({2}, DType::BFloat16), op, world()); },
          {op, "BFloat16"}, {"all_reduce", 0, group});
    }
  });
}

TEST_P(InvalidArgumentErrors, OrderedOpOnComplex) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    for (const char* op : {"min", "max", "product", "band"}) {
      expect_error_on_rank(
          [&] { (void)all_reduce(Tensor::ones({2}, DType::Complex64), op, world()); },
          {op, "Complex64"}, {"all_reduce", 0, group});
    }
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor(Tensor::ones({w}, DType::Complex128), "max", 0, world());
        },
        {"max", "Complex128"}, {"reduce_scatter_tensor", 0, group});
  });
}

TEST_P(InvalidArgumentErrors, ArithmeticOpOnBool) {
  on_every_rank(GetParam(), [&](const std::string& group) {
    for (const ReduceOp& op :
         {ReduceOp("sum"), ReduceOp("avg"), ReduceOp("product"), ReduceOp::premul_sum(2.0)}) {
      expect_error_on_rank([&] { (void)all_reduce(Tensor::ones({2}, DType::Bool), op, world()); },
                           {"Bool", op.to_string()}, {"all_reduce", 0, group});
    }
  });
}

TEST_P(InvalidArgumentErrors, PremulSumOnIntegers) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    for (DType dtype : {DType::Int32, DType::UInt8, DType::Int64}) {
      expect_error_on_rank(
          [&] { (void)all_reduce(Tensor::ones({2}, dtype), ReduceOp::premul_sum(2.0), world()); },
          {"premul_sum", std::string(dtype_name(dtype))}, {"all_reduce", 0, group});
    }
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced({Tensor::ones({w}, DType::Int32)},
                                                ReduceOp::premul_sum(0.5), {0}, world());
        },
        {"premul_sum", "Int32"}, {"reduce_scatter_tensor_coalesced", 0, group});
  });
}

TEST_P(InvalidArgumentErrors, DimOutOfRange) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    const ErrorSite at_scatter{"reduce_scatter_tensor", 0, group};
    const ErrorSite at_gather{"all_gather_tensor", 0, group};
    const Tensor one_d = Tensor::ones({2 * w});
    const Tensor two_d = Tensor::ones({2, 2 * w});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(one_d, "sum", 1, world()); },
                         {"scatter_dim", "out of range"}, at_scatter);
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(one_d, "sum", -2, world()); },
                         {"scatter_dim", "out of range"}, at_scatter);
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(two_d, "sum", 2, world()); },
                         {"scatter_dim", "out of range"}, at_scatter);
    expect_error_on_rank([&] { (void)all_gather_tensor(two_d, 2, world()); },
                         {"gather_dim", "out of range"}, at_gather);
    expect_error_on_rank([&] { (void)all_gather_tensor(two_d, -3, world()); },
                         {"gather_dim", "out of range"}, at_gather);
    expect_error_on_rank([&] { (void)all_gather_tensor(Tensor::ones({}), 1, world()); },
                         {"gather_dim 1 is out of range for a 0-d input", "expected 0 or -1"},
                         at_gather);
    expect_error_on_rank([&] { (void)all_gather_tensor(Tensor::ones({}), -2, world()); },
                         {"gather_dim -2 is out of range for a 0-d input"}, at_gather);
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced({one_d, two_d}, "sum", {0, 5}, world());
        },
        {"scatter_dim", "out of range"}, {"reduce_scatter_tensor_coalesced", 0, group});
  });
}

TEST_P(InvalidArgumentErrors, ZeroDimReduceScatter) {
  on_every_rank(GetParam(), [&](const std::string& group) {
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(Tensor::ones({}), "sum", 0, world()); },
                         {"0-d"}, {"reduce_scatter_tensor", 0, group});
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced({Tensor::ones({}, DType::Int32)}, "sum", {0},
                                                world());
        },
        {"0-d"}, {"reduce_scatter_tensor_coalesced", 0, group});
  });
}

TEST_P(InvalidArgumentErrors, ScatterDimsLengthMismatch) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    const Tensor x = Tensor::ones({w});
    const ErrorSite at{"reduce_scatter_tensor_coalesced", 0, group};
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced({x, x}, "sum", {0}, world());
        },
        {"scatter_dims"}, at);
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced({x}, "sum", {0, 0}, world());
        },
        {"scatter_dims"}, at);
    expect_error_on_rank([&] { (void)reduce_scatter_tensor_coalesced({}, "sum", {0}, world()); },
                         {"scatter_dims"}, at);
  });
}

TEST_P(InvalidArgumentErrors, UndefinedInput) {
  on_every_rank(GetParam(), [&](const std::string& group) {
    const Tensor undefined;
    const Tensor fine = Tensor::ones({GetParam()});
    expect_error_on_rank([&] { (void)all_reduce(undefined, "sum", world()); }, {"undefined"},
                         {"all_reduce", 0, group});
    expect_error_on_rank([&] { (void)all_gather_tensor(undefined, 0, world()); }, {"undefined"},
                         {"all_gather_tensor", 0, group});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(undefined, "sum", 0, world()); },
                         {"undefined"}, {"reduce_scatter_tensor", 0, group});
    expect_error_on_rank(
        [&] {
          (void)all_reduce_coalesced({fine, undefined}, "sum", world());
        },
        {"undefined", "input 1"}, {"all_reduce_coalesced", 0, group});
    expect_error_on_rank([&] { (void)all_gather_into_tensor_coalesced({undefined}, world()); },
                         {"undefined"}, {"all_gather_into_tensor_coalesced", 0, group});
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced({fine, undefined}, "sum", {0, 0}, world());
        },
        {"undefined"}, {"reduce_scatter_tensor_coalesced", 0, group});
  });
}

TEST_P(InvalidArgumentErrors, MetaInput) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    const Tensor meta = Tensor::empty({w, 2}, DType::Float32, Device::meta());
    expect_error_on_rank([&] { (void)all_reduce(meta, "sum", world()); }, {"meta"},
                         {"all_reduce", 0, group});
    expect_error_on_rank([&] { (void)all_gather_tensor(meta, 1, world()); }, {"meta"},
                         {"all_gather_tensor", 0, group});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(meta, "sum", 0, world()); }, {"meta"},
                         {"reduce_scatter_tensor", 0, group});
    expect_error_on_rank([&] { (void)all_gather_into_tensor_coalesced({meta}, world()); }, {"meta"},
                         {"all_gather_into_tensor_coalesced", 0, group});
  });
}

TEST_P(InvalidArgumentErrors, EmptyGroup) {
  on_every_rank(GetParam(), [&](const std::string&) {
    const Tensor x = Tensor::ones({2});
    expect_error_on_rank([&] { (void)all_reduce(x, "sum", std::vector<int>{}); }, {"empty"},
                         {"all_reduce", std::nullopt, std::nullopt});
    expect_error_on_rank([&] { (void)all_reduce(x, "sum", std::vector<std::vector<int>>{}); },
                         {"empty"}, {"all_reduce", std::nullopt, std::nullopt});
    expect_error_on_rank([&] { (void)all_gather_tensor(x, 0, std::vector<int>{}, "t"); }, {"empty"},
                         {"all_gather_tensor", std::nullopt, std::nullopt});
  });
}

TEST_P(InvalidArgumentErrors, DuplicateRank) {
  const int w = GetParam();
  on_every_rank(w, [&](const std::string&) {
    const Tensor x = Tensor::ones({2});
    std::vector<int> twice = first_ranks(w);
    twice.push_back(0);
    expect_error_on_rank([&] { (void)all_reduce(x, "sum", twice); }, {"more than once"},
                         {"all_reduce", std::nullopt, std::nullopt});
    expect_error_on_rank(
        [&] {
          (void)all_gather_tensor(x, 0, std::vector<int>{rank(), rank()});
        },
        {"more than once"}, {"all_gather_tensor", std::nullopt, std::nullopt});
    // Across the sub-lists of a 2-D list.
    expect_error_on_rank(
        [&] {
          (void)all_reduce(x, "sum", std::vector<std::vector<int>>{{rank()}, {rank()}});
        },
        {"more than once"}, {"all_reduce", std::nullopt, std::nullopt});
  });
}

TEST_P(InvalidArgumentErrors, OutOfRangeRank) {
  const int w = GetParam();
  on_every_rank(w, [&](const std::string&) {
    const Tensor x = Tensor::ones({2});
    std::vector<int> too_many = first_ranks(w);
    too_many.push_back(w);
    expect_error_on_rank([&] { (void)all_reduce(x, "sum", too_many); }, {"out of range"},
                         {"all_reduce", std::nullopt, std::nullopt});
    expect_error_on_rank(
        [&] {
          (void)all_reduce(x, "sum", std::vector<int>{rank(), -1});
        },
        {"out of range"}, {"all_reduce", std::nullopt, std::nullopt});
  });
}

TEST_P(InvalidArgumentErrors, NDimensionalMeshAlone) {
  const int w = GetParam();
  on_every_rank(w, [&](const std::string&) {
    const Tensor x = Tensor::ones({2});
    expect_error_on_rank(
        [&] {
          (void)all_reduce(x, "sum", DeviceMesh({1, w}, first_ranks(w)));
        },
        {"Only 1D mesh"}, {"all_reduce", std::nullopt, std::nullopt});
    expect_error_on_rank(
        [&] {
          (void)all_gather_tensor(x, 0, DeviceMesh({w, 1, 1}, first_ranks(w)));
        },
        {"Only 1D mesh"}, {"all_gather_tensor", std::nullopt, std::nullopt});
  });
}

TEST_P(InvalidArgumentErrors, InvalidArgumentConsumesNoSequenceNumber) {
  const int w = GetParam();
  const std::vector<int> everyone = first_ranks(w);
  run_quietly(w, [&] {
    const std::string group = group_label(everyone);
    const Tensor x = Tensor::ones({2});
    // The first op on a group would have had seq 0; failing, it takes none.
    expect_error_on_rank([&] { (void)all_reduce(x, "band", world()); }, {"band"},
                         {"all_reduce", 0, group});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(x, "sum", 3, world()); },
                         {"scatter_dim"}, {"reduce_scatter_tensor", 0, group});
    expect_world_still_pairs_up();  // seq 0 and 1
    expect_error_on_rank([&] { (void)all_gather_tensor(x, 7, everyone); }, {"gather_dim"},
                         {"all_gather_tensor", 2, group});
    expect_error_on_rank([&] { (void)all_reduce(Tensor(), "sum", everyone); }, {"undefined"},
                         {"all_reduce", 2, group});
    // Only some ranks make bad calls: the others' sequence numbers must still line up.
    if (rank() % 2 == 1) {
      for (int i = 0; i < 3; ++i) {
        expect_error_on_rank([&] { (void)all_reduce(x, "min_of", world()); },
                             {"Unrecognized reduce_op"}, {"all_reduce", 2, group});
      }
    }
    expect_world_still_pairs_up();  // seq 2 and 3
    // A tagged group counts on its own.
    expect_error_on_rank([&] { (void)all_reduce(x, "bxor", everyone, "other"); }, {"bxor"},
                         {"all_reduce", 0, group_label(everyone, "other")});
    expect_error_on_rank([&] { (void)all_reduce(x, "bxor", world()); }, {"bxor"},
                         {"all_reduce", 4, group});
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, InvalidArgumentErrors, ::testing::ValuesIn(kWorldSizes),
                         world_name);

// Cases that need at least two ranks (one rank is a member of every valid group and divides
// every size) or three (two equal sub-lists would be valid).
class InvalidArgumentMultiRank : public ::testing::TestWithParam<int> {};

TEST_P(InvalidArgumentMultiRank, ReduceScatterSizeNotDivisibleIsNeverFloored) {
  const std::int64_t w = GetParam();
  on_every_rank(GetParam(), [&](const std::string& group) {
    for (const DimCase& c :
         std::vector<DimCase>{{{w + 1}, 0}, {{2 * w - 1}, -1}, {{3, 2 * w + 1}, 1}, {{1, 3}, 0}}) {
      expect_error_on_rank(
          [&] { (void)reduce_scatter_tensor(Tensor::ones(c.shape), "sum", c.dim, world()); },
          {"not divisible", std::to_string(w)}, {"reduce_scatter_tensor", 0, group});
    }
    expect_error_on_rank(
        [&] {
          (void)reduce_scatter_tensor_coalesced(
              {Tensor::ones({w}), Tensor::ones({2, w + 1}, DType::Int32)}, "sum", {0, 1}, world());
        },
        {"not divisible"}, {"reduce_scatter_tensor_coalesced", 0, group});
  });
}

TEST_P(InvalidArgumentMultiRank, CallingRankNotAMemberOfTheGroup) {
  const int w = GetParam();
  run_quietly(w, [&] {
    const int me = rank();
    const std::vector<int> other = {(me + 1) % w};
    const Tensor x = Tensor::ones({2});
    expect_error_on_rank([&] { (void)all_reduce(x, "sum", other); }, {"not a member"},
                         {"all_reduce", std::nullopt, group_label(other)});
    expect_error_on_rank([&] { (void)all_gather_tensor(x, 0, new_group(other, "t")); },
                         {"not a member"},
                         {"all_gather_tensor", std::nullopt, group_label(other, "t")});
    expect_error_on_rank([&] { (void)reduce_scatter_tensor(x, "sum", 0, other); }, {"not a member"},
                         {"reduce_scatter_tensor", std::nullopt, std::nullopt});
    expect_error_on_rank([&] { (void)all_reduce_coalesced({x}, "sum", other); }, {"not a member"},
                         {"all_reduce_coalesced", std::nullopt, std::nullopt});
    expect_world_still_pairs_up();
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, InvalidArgumentMultiRank, ::testing::Values(2, 3, 4, 8),
                         world_name);

class InvalidArgumentSubLists : public ::testing::TestWithParam<int> {};

TEST_P(InvalidArgumentSubLists, UnequalSubListsOfARankList) {
  const int w = GetParam();
  on_every_rank(w, [&](const std::string&) {
    const std::vector<std::vector<int>> lists = {{0}, first_ranks(w - 1, 1)};
    expect_error_on_rank([&] { (void)all_reduce(Tensor::ones({2}), "sum", lists); },
                         {"group sizes must be identical"},
                         {"all_reduce", std::nullopt, std::nullopt});
    expect_error_on_rank([&] { (void)all_gather_tensor(Tensor::ones({2}), 0, lists, "t"); },
                         {"group sizes must be identical"},
                         {"all_gather_tensor", std::nullopt, std::nullopt});
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, InvalidArgumentSubLists, ::testing::Values(3, 4, 8), world_name);

// =============================================================================================
// The input is never modified; results do not depend on the seed.

class CollectiveInputs : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveInputs, AreNeverModified) {
  const int world_size = GetParam();
  const std::int64_t w = world_size;
  run_quietly(world_size, [&] {
    const int me = rank();
    const Tensor dense = make_tensor(input_values<float>(me, 2 * w * 3), {2 * w, 3});
    const Tensor base = make_tensor(input_values<std::int32_t>(me, 2 * w * 6), {2 * w, 6});
    const Tensor narrowed = base.narrow(1, 1, 3);    // [2W, 3], non-contiguous
    const Tensor transposed = base.transpose(0, 1);  // [6, 2W]
    const Bytes dense_before = tensor_bytes(dense);
    const Bytes base_before = tensor_bytes(base);
    const std::vector<Tensor> inputs = {dense, narrowed, transposed};
    const std::vector<Tensor> inputs_copy = inputs;

    std::vector<Tensor> outputs;
    for (const Tensor& input : inputs) {
      outputs.push_back(all_reduce(input, "sum", world()));
      outputs.push_back(all_gather_tensor(input, 0, world()));
      outputs.push_back(all_gather_tensor(input, 1, world()));
    }
    outputs.push_back(reduce_scatter_tensor(dense, "sum", 0, world()));
    outputs.push_back(reduce_scatter_tensor(narrowed, "max", 0, world()));
    outputs.push_back(reduce_scatter_tensor(transposed, "avg", 1, world()));
    for (const std::vector<Tensor>& list :
         {all_reduce_coalesced(inputs, "max", world()),
          all_gather_into_tensor_coalesced(inputs, world()),
          reduce_scatter_tensor_coalesced(inputs, "min", {0, 0, 1}, world())}) {
      outputs.insert(outputs.end(), list.begin(), list.end());
    }
    wait_tensors(outputs);
    EXPECT_EQ(tensor_bytes(dense), dense_before);
    EXPECT_EQ(tensor_bytes(base), base_before);
    // The caller's vector is untouched too.
    ASSERT_EQ(inputs.size(), inputs_copy.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_TRUE(inputs[i].shares_storage(inputs_copy[i])) << i;
      EXPECT_EQ(inputs[i].sizes(), inputs_copy[i].sizes()) << i;
      EXPECT_EQ(inputs[i].strides(), inputs_copy[i].strides()) << i;
      EXPECT_EQ(inputs[i].storage_offset(), inputs_copy[i].storage_offset()) << i;
    }
  });
}

TEST_P(CollectiveInputs, ResultsDoNotDependOnTheSeed) {
  const int world_size = GetParam();
  const std::int64_t w = world_size;
  // One program: every collective, several groups, order-sensitive floats.
  const auto program = [&](std::vector<std::vector<Bytes>>& out) {
    const int me = rank();
    const Tensor floats = make_tensor(input_values<float>(me, 4 * w), {2, 2 * w});
    const Tensor halves = make_tensor(input_values<Half>(me, 2 * w), {2 * w});
    const std::vector<int> reversed = reversed_ranks(world_size);
    std::vector<Tensor> outputs = {
        all_reduce(floats, "sum", world()),
        all_reduce(halves, "avg", reversed),
        all_reduce(floats, ReduceOp::premul_sum(0.5), world(), "tagged"),
        reduce_scatter_tensor(floats, "sum", 1, world()),
        all_gather_tensor(floats, -1, reversed),
    };
    for (const Tensor& output : all_reduce_coalesced({floats, halves}, "max", world())) {
      outputs.push_back(output);
    }
    for (const Tensor& output : outputs) {
      out[rank_slot()].push_back(tensor_bytes(output));
    }
  };
  std::vector<std::vector<Bytes>> first;
  std::set<std::uint64_t> schedules;
  for (std::uint64_t seed = 0; seed < 10; ++seed) {
    std::vector<std::vector<Bytes>> results(static_cast<std::size_t>(world_size));
    // quiet_options ignores CHORUS_SIM_SEED: the sweep really uses these seeds.
    const sim::SimReport report = run_quietly(
        world_size, [&] { program(results); }, seed);
    EXPECT_EQ(report.seed, seed);
    schedules.insert(report.schedule_hash);
    if (seed == 0) {
      first = results;
      continue;
    }
    for (int r = 0; r < world_size; ++r) {
      ASSERT_EQ(results[static_cast<std::size_t>(r)].size(), 7u);
      for (std::size_t k = 0; k < 7; ++k) {
        EXPECT_EQ(results[static_cast<std::size_t>(r)][k], first[static_cast<std::size_t>(r)][k])
            << "seed " << seed << ", rank " << r << ", output " << k;
      }
    }
  }
  if (world_size > 1) {
    EXPECT_GT(schedules.size(), 1u) << "the seeds did not change the schedule";
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, CollectiveInputs, ::testing::ValuesIn(kWorldSizes), world_name);

}  // namespace
}  // namespace chorus
