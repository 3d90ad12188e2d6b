// CHORUS_CHECK runs in every build; CHORUS_DCHECK only in debug builds, where it fails as a
// CHORUS_CHECK does, and in release builds it does not even evaluate its operands (Note
// [Debug-only checks]).

#include "chorus/check.hpp"

#include <gtest/gtest.h>

namespace {

// Debug builds, and the fuzz build (Note [Debug-only checks]).
constexpr bool kDebugBuild = CHORUS_DCHECK_IS_ON;

TEST(DebugCheck, EvaluatesItsOperandsInDebugBuildsOnly) {
  int evaluated = 0;
  CHORUS_DCHECK(++evaluated == 1);
  CHORUS_DCHECK_EQ(++evaluated, 2);
  CHORUS_DCHECK_LT(++evaluated, 4);
  EXPECT_EQ(evaluated, kDebugBuild ? 3 : 0);
}

TEST(CheckDeathTest, AFailedCheckNamesTheConditionAndBothValuesInEveryBuild) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  [[maybe_unused]] const int two = 2;
  EXPECT_DEATH(CHORUS_CHECK_EQ(two + 1, 4),
               "chorus: CHECK failed at .*check_test\\.cpp:[0-9]+: two \\+ 1 == 4 \\(3 vs 4\\)");
}

TEST(CheckDeathTest, AFailedDebugCheckStopsTheProcessInDebugBuildsOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  [[maybe_unused]] const int two = 2;
  if constexpr (kDebugBuild) {
    EXPECT_DEATH(CHORUS_DCHECK_GE(two, 5), "CHECK failed at .*: two >= 5 \\(2 vs 5\\)");
    EXPECT_DEATH(CHORUS_DCHECK(two == 3), "CHECK failed at .*: two == 3 ");
  } else {
    CHORUS_DCHECK_GE(two, 5);
    CHORUS_DCHECK(two == 3);
    SUCCEED() << "release builds compile CHORUS_DCHECK to nothing";
  }
}

}  // namespace
