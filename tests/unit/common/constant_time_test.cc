#include "packfeed/common/constant_time.h"

#include <gtest/gtest.h>

#include <string>

namespace packfeed {
namespace {

TEST(ConstantTimeEqualsTest, EqualOnlyForTheSameBytes) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));  // a prefix is not the secret
  EXPECT_FALSE(ConstantTimeEquals("", "s"));
  const std::string with_zero("a\0b", 3);
  EXPECT_FALSE(ConstantTimeEquals(with_zero, "a"));
  EXPECT_TRUE(ConstantTimeEquals(with_zero, std::string("a\0b", 3)));
}

}  // namespace
}  // namespace packfeed
