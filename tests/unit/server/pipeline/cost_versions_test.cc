#include "server/pipeline/cost_versions.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_paths.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

scheduler::CostModel Fitted(double scale) {
  scheduler::CostModel model;
  model.alpha = 2e-7 * scale;
  model.beta = 4e-5 / 3;  // not a short binary fraction: must read back bit for bit
  model.kappa = 1e-5;
  model.lambda = 2e-3;
  model.microbatch = 5e-3 * scale;
  return model;
}

TEST(CostVersionsTest, EachStepIsPlannedByTheVersionInForceThen) {
  auto versions = std::make_unique<CostModelVersions>(scheduler::CostModel::Megatron());
  EXPECT_EQ(versions->ForStep(1000).version, 0u);
  ASSERT_EQ(*versions->Offer({1, 40, Fitted(1)}), CostModelVersions::Offered::kAdopted);
  ASSERT_EQ(*versions->Offer({2, 90, Fitted(2)}), CostModelVersions::Offered::kAdopted);
  EXPECT_EQ(versions->ForStep(39).version, 0u);
  EXPECT_EQ(versions->ForStep(40).version, 1u);
  EXPECT_EQ(versions->ForStep(89).version, 1u);
  EXPECT_EQ(versions->ForStep(90).model, Fitted(2));
  EXPECT_EQ(versions->Latest().version, 2u);
  // The same announcement again (the leader repeats it to a node that did
  // not answer) changes nothing.
  EXPECT_EQ(*versions->Offer({2, 90, Fitted(2)}), CostModelVersions::Offered::kHeld);
  EXPECT_EQ(versions->All().size(), 3u);
}

TEST(CostVersionsTest, AVersionForAStepAlreadyPlannedIsMissedAndTheOldOneKept) {
  auto versions = std::make_unique<CostModelVersions>(scheduler::CostModel::Megatron());
  EXPECT_EQ(versions->ForPlanning(50).version, 0u);
  EXPECT_EQ(versions->planned_through(), 50);
  EXPECT_EQ(*versions->Offer({1, 50, Fitted(1)}), CostModelVersions::Offered::kTooLate);
  EXPECT_EQ(*versions->Offer({1, 50, Fitted(1)}), CostModelVersions::Offered::kTooLate);
  EXPECT_EQ(versions->missed(), 1);  // counted once per version
  EXPECT_EQ(versions->ForStep(60).version, 0u);
  // The next version, far enough ahead, brings the node back in step.
  EXPECT_EQ(*versions->Offer({2, 51, Fitted(2)}), CostModelVersions::Offered::kAdopted);
  EXPECT_EQ(versions->ForPlanning(51).version, 2u);
}

TEST(CostVersionsTest, RefusesVersionsThatDoNotFollowOrDisagree) {
  auto versions = std::make_unique<CostModelVersions>(scheduler::CostModel::Megatron());
  ASSERT_EQ(*versions->Offer({3, 40, Fitted(1)}), CostModelVersions::Offered::kAdopted);
  EXPECT_THAT(std::string(versions->Offer({4, 40, Fitted(2)}).status().message()),
              HasSubstr("does not follow"));
  EXPECT_THAT(std::string(versions->Offer({2, 60, Fitted(2)}).status().message()),
              HasSubstr("does not follow"));
  EXPECT_THAT(std::string(versions->Offer({3, 40, Fitted(2)}).status().message()),
              HasSubstr("differs from the version held"));
  EXPECT_EQ(versions->Latest().version, 3u);
}

TEST(CostVersionsTest, ARestartedDaemonPlansByTheVersionsItJournaled) {
  testing::ScopedTempDir dir;
  const std::string path = dir.Prefix("job.cost_models");
  {
    auto versions = std::make_unique<CostModelVersions>(scheduler::CostModel::Megatron());
    ASSERT_TRUE(versions->JournalTo(path).ok());
    ASSERT_EQ(*versions->Offer({1, 40, Fitted(1)}), CostModelVersions::Offered::kAdopted);
    ASSERT_EQ(*versions->Offer({2, 90, Fitted(3)}), CostModelVersions::Offered::kAdopted);
  }
  CostModelVersions again(scheduler::CostModel::Megatron());
  ASSERT_TRUE(again.JournalTo(path).ok());
  ASSERT_EQ(again.All().size(), 3u);
  EXPECT_EQ(again.ForStep(45).model, Fitted(1));  // every bit
  EXPECT_EQ(again.ForStep(95).model, Fitted(3));
  EXPECT_EQ(again.ForStep(95).from_step, 90);
}

TEST(CostVersionsTest, ATornLastLineIsDroppedAndACorruptOneNamed) {
  testing::ScopedTempDir dir;
  const std::string path = dir.Prefix("job.cost_models");
  const std::string first = CostModelVersionLine({1, 40, Fitted(1)});
  testing::WriteFileBytes(path, first + "cost_model 2 90 0x1p-3");
  CostModelVersions torn(scheduler::CostModel::Megatron());
  ASSERT_TRUE(torn.JournalTo(path).ok());
  EXPECT_EQ(torn.Latest().version, 1u);

  for (const std::string& bad :
       {std::string("cost_model 2 90 0x1p-3\n"), std::string("cost_model 2 90 1 1 1 1 1 nan\n"),
        std::string("cost_model 2 90 1 1 1 1 1 -1\n"), std::string("cost_model 1 90 1 1 1 1 1 1\n"),
        std::string("cost_model 2 40 1 1 1 1 1 1\n"), std::string("ledger 2 90 1 1 1 1 1 1\n")}) {
    testing::WriteFileBytes(path, first + bad);
    CostModelVersions corrupt(scheduler::CostModel::Megatron());
    const absl::Status loaded = corrupt.JournalTo(path);
    EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_THAT(std::string(loaded.message()), HasSubstr(path + " line 2: ")) << bad;
  }
}

}  // namespace
}  // namespace packfeed::server
