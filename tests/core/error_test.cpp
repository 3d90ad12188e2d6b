// The chorus::Error hierarchy: codes, messages naming rank/op/seq/group, dynamic types kept
// through make_error.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <exception>
#include <string>

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
}

TEST(Error, MakeErrorKeepsTheDynamicType) {
  const ErrorCode codes[] = {ErrorCode::InvalidArgument, ErrorCode::CollectiveMismatch,
                             ErrorCode::Timeout,         ErrorCode::Deadlock,
                             ErrorCode::RankFailure,     ErrorCode::TransportError,
                             ErrorCode::Aborted};
  for (ErrorCode code : codes) {
    std::exception_ptr error = make_error(code, ErrorContext{1, "op", 2, "[0, 1]"}, "detail");
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(std::string(error_code_name(code))), std::string::npos);
    }
  }
  EXPECT_THROW(std::rethrow_exception(make_error(ErrorCode::Deadlock, {}, "")), Deadlock);
  EXPECT_THROW(std::rethrow_exception(make_error(ErrorCode::RankFailure, {}, "")), RankFailure);
  EXPECT_THROW(throw_error(ErrorCode::Aborted, {}, ""), Aborted);
  EXPECT_THROW(throw_error(ErrorCode::Timeout, {}, ""), std::runtime_error);
}

}  // namespace
}  // namespace chorus
