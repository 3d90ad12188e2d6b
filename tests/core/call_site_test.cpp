// CallSite captures the caller's location through default arguments.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <string>

namespace chorus {
namespace {

CallSite where(CallSite site = CallSite::current()) { return site; }

TEST(CallSite, DefaultArgumentNamesTheCaller) {
  const int line = __LINE__ + 1;
  const CallSite site = where();
  EXPECT_EQ(site.line(), line);
  EXPECT_NE(std::string(site.file_name()).find("call_site_test.cpp"), std::string::npos);
  EXPECT_NE(std::string(site.function_name()).find("TestBody"), std::string::npos);
  EXPECT_TRUE(site.known());
  EXPECT_NE(site.to_string().find("call_site_test.cpp:" + std::to_string(line)), std::string::npos);
}

TEST(CallSite, DefaultConstructedIsUnknown) {
  EXPECT_FALSE(CallSite().known());
  EXPECT_EQ(CallSite().to_string(), "<unknown>");
}

}  // namespace
}  // namespace chorus
