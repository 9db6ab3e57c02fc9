#include "packfeed/common/status_macros.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed {
namespace {

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok) {
  if (!ok) return absl::InvalidArgumentError("no int");
  return std::make_unique<int>(7);
}

absl::StatusOr<int> Twice(bool ok) {
  PF_ASSIGN_OR_RETURN(std::unique_ptr<int> value, MakeInt(ok));
  return *value * 2;
}

absl::Status Check(bool ok, int* calls) {
  ++*calls;
  PF_RETURN_IF_ERROR(ok ? absl::OkStatus() : absl::NotFoundError("missing"));
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnMovesValue) { EXPECT_EQ(*Twice(true), 14); }

TEST(StatusMacrosTest, AssignOrReturnPropagatesError) {
  absl::StatusOr<int> result = Twice(false);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "no int");
}

TEST(StatusMacrosTest, ReturnIfErrorEvaluatesOnce) {
  int calls = 0;
  EXPECT_TRUE(Check(true, &calls).ok());
  EXPECT_EQ(Check(false, &calls).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace packfeed
