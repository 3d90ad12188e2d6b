// The battery's case generators (props/src/battery/cases.hpp) at the sizes the runners give
// cases: case i of n is generated at size i * 100 / n, so sizes stop at 99, and every choice and
// root must still reach the top of its range.

#include "battery/cases.hpp"

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <chorus/sim/sim.hpp>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
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
  rc::Maybe<rc::Shrinkable<int>> first = drawn.shrinks().next();
  if (drawn.value() != 0) {
    ASSERT_TRUE(first);
    EXPECT_EQ(first->value(), 0);
  }
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

}  // namespace
}  // namespace chorus::props::families
