// The chorus::Error hierarchy: codes, messages naming rank/op/seq/group, dynamic types kept
// through make_error.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace chorus {
namespace {

TEST(Error, MessageNamesRankOpSequenceAndGroup) {
  const CollectiveMismatch error(ErrorContext{3, "all_reduce", 7, "[0, 1, 2, 3]"}, "dtype differs");
  EXPECT_STREQ(error.what(),
               "chorus::CollectiveMismatch: [rank 3] all_reduce #7 on group [0, 1, 2, 3]: dtype "
               "differs");
  EXPECT_EQ(error.code(), ErrorCode::CollectiveMismatch);
  EXPECT_EQ(error.detail(), "dtype differs");
  EXPECT_EQ(error.context().seq, 7);
}

TEST(Error, FieldsThatDoNotApplyAreLeftOut) {
  EXPECT_STREQ(InvalidArgument(ErrorContext{-1, "Tensor::view", -1, ""}, "bad").what(),
               "chorus::InvalidArgument: Tensor::view: bad");
  EXPECT_STREQ(Timeout(ErrorContext{0, "", -1, ""}, "late").what(),
               "chorus::Timeout: [rank 0]: late");
  // No context at all: one colon after the code, not "InvalidArgument:: bad".
  EXPECT_STREQ(InvalidArgument({}, "chorus bench: bad").what(),
               "chorus::InvalidArgument: chorus bench: bad");
  // Operation #0 and rank 0 are numbers like any other; a sequence number without an operation
  // has nothing to follow.
  EXPECT_STREQ(Deadlock(ErrorContext{0, "barrier", 0, ""}, "stuck").what(),
               "chorus::Deadlock: [rank 0] barrier #0: stuck");
  EXPECT_STREQ(Aborted(ErrorContext{-1, "", 3, "[0, 1]"}, "gone").what(),
               "chorus::Aborted: on group [0, 1]: gone");
}

// describe: what() of a chorus error or any std::exception, fixed texts otherwise.
TEST(Error, DescribeNamesAnyExceptionAndNone) {
  EXPECT_EQ(describe(nullptr), "no error");
  EXPECT_EQ(describe(make_error(ErrorCode::Timeout, ErrorContext{1, "send", 4, ""}, "late")),
            "chorus::Timeout: [rank 1] send #4: late");
  EXPECT_EQ(describe(std::make_exception_ptr(std::logic_error("plain"))), "plain");
  EXPECT_EQ(describe(std::make_exception_ptr(42)), "an exception not derived from std::exception");
  // A value outside the enumeration still has a name.
  EXPECT_EQ(error_code_name(static_cast<ErrorCode>(99)), "Unknown");
}

TEST(Error, MakeErrorKeepsTheDynamicType) {
  const ErrorCode codes[] = {ErrorCode::InvalidArgument, ErrorCode::CollectiveMismatch,
                             ErrorCode::Timeout,         ErrorCode::Deadlock,
                             ErrorCode::RankFailure,     ErrorCode::TransportError,
                             ErrorCode::Aborted,         ErrorCode::InputModified};
  for (ErrorCode code : codes) {
    for (const std::exception_ptr& error :
         {make_error(code, ErrorContext{1, "op", 2, "[0, 1]"}, "detail"),
          try_make_error(code, ErrorContext{1, "op", 2, "[0, 1]"}, "detail")}) {
      ASSERT_NE(error, nullptr);
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), code);
        EXPECT_EQ(e.what(), "chorus::" + std::string(error_code_name(code)) +
                                ": [rank 1] op #2 on group [0, 1]: detail");
      }
    }
  }
  EXPECT_THROW(std::rethrow_exception(make_error(ErrorCode::Deadlock, {}, "")), Deadlock);
  EXPECT_THROW(std::rethrow_exception(make_error(ErrorCode::RankFailure, {}, "")), RankFailure);
  EXPECT_THROW(throw_error(ErrorCode::Aborted, {}, ""), Aborted);
  EXPECT_THROW(throw_error(ErrorCode::Timeout, {}, ""), std::runtime_error);
  EXPECT_THROW(std::rethrow_exception(try_make_error(ErrorCode::InputModified, {}, "")),
               InputModified);
}

// Errors are copied where they are stored and rethrown (std::make_exception_ptr copies its
// argument): copying shares the context and detail and cannot throw, and a move copies too, so
// an error moved from still answers context() and detail().
TEST(Error, CopiesAndMovesKeepEveryPart) {
  static_assert(std::is_nothrow_copy_constructible_v<Error>);
  static_assert(std::is_nothrow_copy_constructible_v<Timeout>);
  static_assert(std::is_nothrow_copy_assignable_v<Timeout>);
  Timeout error(ErrorContext{2, "all_gather", 5, "[0, 2]"}, "late");
  const Timeout copy = error;
  Timeout moved = std::move(error);
  const Timeout* const errors[] = {&copy, &moved, &error};  // NOLINT(bugprone-use-after-move)
  for (const Timeout* e : errors) {
    EXPECT_EQ(e->context().rank, 2);
    EXPECT_EQ(e->context().op, "all_gather");
    EXPECT_EQ(e->context().seq, 5);
    EXPECT_EQ(e->context().group, "[0, 2]");
    EXPECT_EQ(e->detail(), "late");
    EXPECT_STREQ(e->what(), "chorus::Timeout: [rank 2] all_gather #5 on group [0, 2]: late");
  }
  moved = copy;
  EXPECT_EQ(moved.detail(), "late");
}

}  // namespace
}  // namespace chorus
