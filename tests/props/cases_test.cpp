// The battery's case generators (props/src/battery/cases.hpp) at the sizes the runners give
// cases: case i of n is generated at size i * 100 / n, so sizes stop at 99, and every choice and
// root must still reach the top of its range.

#include "battery/cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chorus/chorus.hpp>
#include <chorus/props/battery.hpp>
#include <chorus/props/runner.hpp>
#include <chorus/sim/sim.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::props::families {
namespace {

constexpr int kCases = 100;  // the runners' default
constexpr int kSizeMax = 100;

int case_size(int case_index) { return case_index * kSizeMax / kCases; }

// Every value of gen over `seeds` runs of kCases cases.
template <class T, class Key>
std::set<Key> sample(const rc::Gen<T>& gen, int seeds, Key (*key)(const T&)) {
  std::set<Key> seen;
  for (int seed = 0; seed < seeds; ++seed) {
    for (int i = 0; i < kCases; ++i) {
      const rc::Random random(static_cast<std::uint64_t>(seed) * 1'000'003u +
                              static_cast<std::uint64_t>(i));
      seen.insert(key(gen(random, case_size(i)).value()));
    }
  }
  return seen;
}

std::string pair_text(const OpDType& pair) {
  return pair.op.to_string() + " on " + std::string(dtype_name(pair.dtype));
}

TEST(Cases, EveryAllowedOpDTypePairIsGenerated) {
  std::set<std::string> allowed;
  for (const ReduceOp& op :
       {ReduceOp(ReduceOp::Kind::Sum), ReduceOp(ReduceOp::Kind::Avg),
        ReduceOp(ReduceOp::Kind::Product), ReduceOp(ReduceOp::Kind::Min),
        ReduceOp(ReduceOp::Kind::Max), ReduceOp(ReduceOp::Kind::BAnd),
        ReduceOp(ReduceOp::Kind::BOr), ReduceOp(ReduceOp::Kind::BXor), ReduceOp::premul_sum(0.5),
        ReduceOp::premul_sum(2.0), ReduceOp::premul_sum(-0.25)}) {
    for (const DType dtype : kAllDTypes) {
      if (op.check_dtype(dtype).empty()) {
        allowed.insert(pair_text({op, dtype}));
      }
    }
  }
  ASSERT_EQ(allowed.size(), 79u);
  const std::set<std::string> seen = sample<OpDType, std::string>(
      gen_op_dtype(), 20, [](const OpDType& pair) { return pair_text(pair); });
  for (const std::string& pair : allowed) {
    EXPECT_TRUE(seen.count(pair) == 1) << pair << " is never generated";
  }
  EXPECT_EQ(seen, allowed);
}

TEST(Cases, EveryIndexOfALargeRangeIsGeneratedAndShrinksTowardsZero) {
  const std::set<int> seen =
      sample<int, int>(gen_index(64), 20, [](const int& index) { return index; });
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 63);
  // Still shrinks towards 0.
  const rc::Shrinkable<int> drawn = gen_index(64)(rc::Random(7), 0);
  ASSERT_NE(drawn.value(), 0);  // else there would be nothing to shrink
  rc::Maybe<rc::Shrinkable<int>> first = drawn.shrinks().next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->value(), 0);
}

// gen_shape(2) draws every rank from 0 to 2 and every dim size from 0 (an empty tensor) to 4.
TEST(Cases, ShapesReachEveryRankAndEveryDimSizeWithEmptyOnes) {
  const std::set<Shape> shapes =
      sample<Shape, Shape>(gen_shape(2), 5, [](const Shape& shape) { return shape; });
  std::set<std::size_t> ranks;
  std::set<std::int64_t> sizes;
  for (const Shape& shape : shapes) {
    ranks.insert(shape.size());
    sizes.insert(shape.begin(), shape.end());
  }
  EXPECT_EQ(ranks, (std::set<std::size_t>{0, 1, 2}));
  EXPECT_EQ(sizes, (std::set<std::int64_t>{0, 1, 2, 3, 4}));
}

// The roots of a 64-rank group (broadcast's src, reduce's dst) reach its last rank.
TEST(Cases, EveryRootOfASixtyFourRankGroupIsGenerated) {
  std::set<std::int64_t> roots;
  for (int seed = 0; seed < 60; ++seed) {
    for (int i = 0; i < kCases; ++i) {
      const rc::Random random(static_cast<std::uint64_t>(seed) * 1'000'003u +
                              static_cast<std::uint64_t>(i));
      const ReduceCase c = gen_reduce_case(World{64}, false)(random, case_size(i)).value();
      if (c.layout.group_size() == 64) {
        roots.insert(c.dim);
      }
    }
  }
  EXPECT_EQ(roots.count(62), 1u);
  EXPECT_EQ(roots.count(63), 1u);
}

// Every form a GroupSpec takes (docs/properties.md): a rank list (the world's, a subset), 2-D
// rank lists, a MeshDim, a tagged ProcessGroup and a 1-D DeviceMesh, in every run of 100 cases;
// the covering layouts hold every rank.
TEST(Cases, EveryLayoutKindIsGeneratedInOneRunOfCases) {
  for (const bool covering : {false, true}) {
    for (int seed = 0; seed < 5; ++seed) {
      std::set<Layout::Kind> kinds;
      for (int i = 0; i < kCases; ++i) {
        const rc::Random random(static_cast<std::uint64_t>(seed) * 1'000'003u +
                                static_cast<std::uint64_t>(i));
        const rc::Gen<Layout> gen = covering ? gen_covering_layout(6) : gen_layout(6);
        const Layout layout = gen(random, case_size(i)).value();
        kinds.insert(layout.kind);
        if (covering) {
          for (int r = 0; r < 6; ++r) {
            EXPECT_NE(layout.members_of(r), nullptr) << r << ": " << rc::toString(layout);
          }
        }
      }
      EXPECT_EQ(kinds.size(), static_cast<std::size_t>(Layout::kKinds) - (covering ? 1 : 0))
          << "seed " << seed << (covering ? " (covering)" : "");
      EXPECT_EQ(kinds.count(Layout::Kind::Tagged), 1u);
      EXPECT_EQ(kinds.count(Layout::Kind::Mesh1D), 1u);
    }
  }
}

// The tagged layout's group is new_group(ranks, kLayoutTag): its own communicator.
TEST(Cases, TheTaggedLayoutIsATaggedProcessGroup) {
  Layout layout;
  layout.kind = Layout::Kind::Tagged;
  layout.lists = {{2, 0}};
  ExpandedGroup expanded;
  const sim::SimReport report = sim::simulate(
      [] {
        sim::SimOptions options;
        options.world_size = 3;
        options.print_failures = false;
        options.seed_from_environment = false;
        return options;
      }(),
      [&] {
        if (rank() == 0) {
          expanded = expand_group(layout.spec());
        }
      });
  EXPECT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(expanded.tag, kLayoutTag);
  EXPECT_EQ(expanded.ranks, std::vector<int>({2, 0}));
  EXPECT_EQ(rc::toString(layout), "new_group([2, 0], 'chorus.check.tagged')");
}

// require_refusal reads the sequence number from the error's context, not from its text: the
// errors property used to search the message for " #", which found a number in the detail when
// the context named none ("[rank 0] all_reduce: detail #5 x" gave 5).
TEST(Cases, ARefusalsSequenceNumberIsTheOneItsContextNames) {
  Env env(0);
  const Refusal without = require_refusal(
      env,
      [] {
        throw InvalidArgument(ErrorContext{0, "all_reduce", -1, ""}, "detail #5 x");
      },
      "no sequence number");
  EXPECT_NE(without.message.find("detail #5 x"), std::string::npos) << without.message;
  EXPECT_EQ(without.seq, std::nullopt);
  const Refusal with = require_refusal(
      env,
      [] {
        throw InvalidArgument(ErrorContext{0, "all_reduce", 3, "world"}, "detail #5 x");
      },
      "sequence number 3");
  EXPECT_EQ(with.seq, std::optional<std::int64_t>(3));
  EXPECT_THROW(require_refusal(
                   env, [] {}, "nothing thrown"),
               PropertyFailure);
}

// ---- Whole properties' cases, read from their descriptions (the case types are private to the
// battery, and the description is what a counterexample report shows).

// The descriptions of the first `first` cases (all if 0) of `seeds` runs of `--cases cases` of the
// property `name` on `ranks` ranks, at the sizes such a run gives them (case i at i * 100 /
// cases).
std::vector<std::string> case_texts(std::string_view name, int ranks, int seeds, int cases,
                                    int first = 0) {
  const std::vector<Property> selected = select(battery(), name);
  EXPECT_EQ(selected.size(), 1u) << name;
  std::vector<std::string> texts;
  if (selected.size() != 1) {
    return texts;
  }
  const rc::Gen<Case> gen = selected.front().cases(World{ranks});
  for (int seed = 0; seed < seeds; ++seed) {
    for (int i = 0; i < (first == 0 ? cases : first); ++i) {
      const rc::Random random(static_cast<std::uint64_t>(seed) * 1'000'003u +
                              static_cast<std::uint64_t>(i));
      texts.push_back(gen(random, i * kSizeMax / cases).value().text());
    }
  }
  return texts;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}
bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The integers of the list that opens at `text[at]` ("[2, 0]", "[1 2; 0 1]"); empty if none.
std::vector<std::int64_t> integers_at(std::string_view text, std::size_t at) {
  std::vector<std::int64_t> values;
  if (at >= text.size() || text[at] != '[') {
    ADD_FAILURE() << "no list at " << at << " of: " << text;
    return values;
  }
  std::size_t i = at + 1;
  while (i < text.size() && text[i] != ']') {
    if (std::isdigit(static_cast<unsigned char>(text[i])) != 0) {
      std::int64_t value = 0;
      while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) {
        value = value * 10 + (text[i] - '0');
        ++i;
      }
      values.push_back(value);
    } else {
      ++i;
    }
  }
  return values;
}
bool has_zero(const std::vector<std::int64_t>& values) {
  return std::find(values.begin(), values.end(), 0) != values.end();
}

// Whether a case moves no data (every tensor it passes has no elements), from its description:
// such a case cannot fail a value check.
// A ReduceCase (reduce_scatter, the in-place forms): its shape, the last one it names.
bool reduce_case_is_empty(std::string_view text) {
  const std::size_t at = text.rfind(", shape [");
  EXPECT_NE(at, std::string_view::npos) << text;
  return at == std::string_view::npos || has_zero(integers_at(text, at + 8));
}
// law.coalesced_equals_separate: every one of its shapes.
bool coalesced_case_is_empty(std::string_view text) {
  std::size_t at = text.find(", shapes ");
  EXPECT_NE(at, std::string_view::npos) << text;
  const std::size_t end = text.find(", data seed");
  bool empty = true;
  for (at = text.find('[', at); at < end; at = text.find('[', at + 1)) {
    empty = empty && has_zero(integers_at(text, at));
  }
  return empty;
}
// law.all_to_all_roundtrip: its trailing shape, or every block (equal split of 0, or all split
// counts 0).
bool all_to_all_case_is_empty(std::string_view text) {
  const std::size_t trailing = text.find("trailing shape [");
  EXPECT_NE(trailing, std::string_view::npos) << text;
  if (trailing == std::string_view::npos || has_zero(integers_at(text, trailing + 15))) {
    return true;
  }
  const std::size_t equal = text.find("equal split of ");
  if (equal != std::string_view::npos) {
    return text.substr(equal + 15, 2) == "0,";
  }
  const std::size_t splits = text.find("splits [");
  EXPECT_NE(splits, std::string_view::npos) << text;
  const std::vector<std::int64_t> counts = integers_at(text, splits + 7);
  return std::all_of(counts.begin(), counts.end(), [](std::int64_t count) { return count == 0; });
}

// Empty cases are a case (gen_shape's empty dims, gen_multiple's 0), but one a minority of cases
// is spent on: in a sample of 20 runs of 100 cases on 8 ranks, at most this share of each
// property's cases moves no data. (With rc::gen::inRange(0, 3) * group size the share was
// 46-61%: inRange is 0 at every case size below 25. reduce.all_reduce, whose only empties are
// gen_shape's, measures about 9%.)
constexpr double kEmptyShareMax = 0.2;

TEST(Cases, FewCasesOfTheScatterAllToAllAndCoalescedPropertiesMoveNoData) {
  const std::vector<std::pair<std::string, std::function<bool(std::string_view)>>> properties = {
      {"reduce.reduce_scatter", reduce_case_is_empty},
      {"law.reduce_scatter_then_all_gather", reduce_case_is_empty},
      {"law.inplace_equals_out_of_place", reduce_case_is_empty},
      {"law.coalesced_equals_separate", coalesced_case_is_empty},
      {"law.all_to_all_roundtrip", all_to_all_case_is_empty},
  };
  for (const auto& [name, is_empty] : properties) {
    const std::vector<std::string> texts = case_texts(name, 8, 20, kCases);
    // An init-capture: clang 14 (the fuzz preset's) refuses capturing a structured binding.
    const auto empty =
        std::count_if(texts.begin(), texts.end(),
                      [&is_empty = is_empty](const std::string& text) { return is_empty(text); });
    const double share = static_cast<double>(empty) / static_cast<double>(texts.size());
    EXPECT_LE(share, kEmptyShareMax)
        << name << ": " << empty << " of " << texts.size() << " cases move no data";
    // Empty cases are still generated (they are a case).
    EXPECT_GT(empty, 0) << name;
  }
}

// Every documented kind of each enumeration a property draws from appears in the first 10 cases
// of a few seeds, in runs of --cases 10 (sizes 0, 10, ..., 90) and of --cases 100 (sizes 0..9):
// drawn with gen_index, not rc::gen::inRange, whose range grows with the case size (it is 0 below
// size 25; errors.invalid_argument's "caller not a member" came from size 93 only, shape.*'s
// permute_tensor from 92: never at --cases 10).
TEST(Cases, EveryKindOfEachEnumerationIsGeneratedWithinTenCases) {
  // `matches(text, name)`: the case's description names that kind.
  using Matches = std::function<bool(std::string_view, const std::string&)>;
  const Matches leads = [](std::string_view text, const std::string& name) {
    return starts_with(text, name + " ") || starts_with(text, name + ",");
  };
  struct Enumeration {
    std::string property;
    std::vector<std::string> kinds;
    Matches matches;
  };
  const std::vector<Enumeration> enumerations = {
      {"errors.invalid_argument",
       {"op not allowed for the dtype", "unknown reduce op", "scatter dim not divisible",
        "gather_dim out of range", "wrong split count", "broadcast src out of range",
        "duplicate permute destinations", "caller not a member"},
       leads},
      {"errors.mismatch",
       {"shape (element count)", "dtype", "reduce op", "op", "broadcast root",
        "shape (same element count)", "gather dim", "scatter dim"},
       [](std::string_view text, const std::string& name) {
         return contains(text, " passes a different " + name + ", shape ");
       }},
      {"shape.eager_meta_traced",
       {"all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single",
        "broadcast", "reduce", "permute_tensor"},
       leads},
      {"law.coalesced_equals_separate",
       {"all_reduce_coalesced", "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced"},
       leads},
      {"law.inplace_equals_out_of_place",
       {"all_reduce_inplace", "all_gather_tensor_inplace", "reduce_scatter_tensor_inplace"},
       leads},
      {"async.wait_orders",
       {"wait_tensor", "wait_tensor(view)", "data access", "wait_tensors", "another thread"},
       [](std::string_view text, const std::string& name) {
         return contains(text, " by " + name + " ") || contains(text, " by " + name + ",");
       }},
      {"async.registry_cleanup",
       {"wait then drop", "drop unwaited", "view outlives the result",
        "coalesced, outputs dropped one by one"},
       [](std::string_view text, const std::string& name) {
         return contains(text, " " + name + ";");
       }},
      {"schedule.independence",
       {"all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single",
        "broadcast", "permute_tensor"},
       [](std::string_view text, const std::string& name) {
         return starts_with(text, name + " ") || contains(text, "; " + name + " ");
       }},
  };
  constexpr int kSeeds = 10;
  constexpr int kFirstCases = 10;
  for (const int run_cases : {10, kCases}) {
    for (const Enumeration& enumeration : enumerations) {
      const std::vector<std::string> texts =
          case_texts(enumeration.property, 8, kSeeds, run_cases, kFirstCases);
      for (const std::string& kind : enumeration.kinds) {
        const bool seen = std::any_of(texts.begin(), texts.end(), [&](const std::string& text) {
          return enumeration.matches(text, kind);
        });
        EXPECT_TRUE(seen) << enumeration.property << ": '" << kind << "' never in the first "
                          << kFirstCases << " cases of " << kSeeds << " runs of --cases "
                          << run_cases;
      }
    }
  }
}

// A counterexample names the tensors the run passed: errors.* print the shape each call used
// where the check does not use the drawn one.
TEST(Cases, ErrorCasesNameTheShapeTheRunPassed) {
  int scatter_dims = 0;
  int gather_dims = 0;
  for (const std::string& text : case_texts("errors.mismatch", 4, 10, kCases)) {
    if (contains(text, "different scatter dim, shape ")) {
      // [W, 2W] whatever shape was drawn.
      EXPECT_TRUE(contains(text, "different scatter dim, shape [4, 8]")) << text;
      ++scatter_dims;
    } else if (contains(text, "different gather dim, shape ")) {
      // Two dims at least.
      const std::vector<std::int64_t> dims = integers_at(text, text.find("shape [") + 6);
      EXPECT_GE(dims.size(), 2u) << text;
      ++gather_dims;
    } else if (contains(text, "different shape (element count), shape ")) {
      EXPECT_TRUE(contains(text, "'s: [")) << text;
    }
  }
  EXPECT_GT(scatter_dims, 0);
  EXPECT_GT(gather_dims, 0);
  int scatter_divisible = 0;
  for (const std::string& text : case_texts("errors.invalid_argument", 4, 10, kCases)) {
    if (starts_with(text, "scatter dim not divisible on group ")) {
      // Dim 0 is group size * 2 + 1 in the call: never a multiple of the group size.
      const std::size_t at = text.find("(the bad call's: [");
      ASSERT_NE(at, std::string::npos) << text;
      const std::vector<std::int64_t> dims = integers_at(text, at + 17);
      ASSERT_FALSE(dims.empty()) << text;
      EXPECT_EQ(dims[0] % 2, 1) << text;
      ++scatter_divisible;
    }
  }
  EXPECT_GT(scatter_divisible, 0);
}

}  // namespace
}  // namespace chorus::props::families
