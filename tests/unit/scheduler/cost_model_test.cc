#include "packfeed/scheduler/cost_model.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::scheduler {
namespace {

TEST(CostModelTest, NamesAreTheOnlyOnes) {
  absl::StatusOr<CostModel> megatron = CostModelFromName("megatron");
  ASSERT_TRUE(megatron.ok());
  EXPECT_EQ(megatron->Cost(100, 2), 100.0 * 100.0 / 2);
  absl::StatusOr<CostModel> llama = CostModelFromName("llama8b");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->Cost(4096, 4), CostModel::Llama8b().Cost(4096, 4));
  absl::StatusOr<CostModel> unknown = CostModelFromName("gpt5");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), ::testing::HasSubstr("megatron | llama8b"));
}

}  // namespace
}  // namespace packfeed::scheduler
