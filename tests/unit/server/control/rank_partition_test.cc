#include "server/control/rank_partition.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

TEST(RankPartitionTest, BlockAndCyclicLayoutsPartition) {
  EXPECT_TRUE(CheckRankPartition("j", 4, {{"a", {0, 1}}, {"b", {2, 3}}}).ok());
  EXPECT_TRUE(CheckRankPartition("j", 4, {{"a", {0, 2}}, {"b", {3, 1}}}).ok());
}

TEST(RankPartitionTest, NamesTwiceMissingAndOutsideRanksWithTheirNodes) {
  const absl::Status status =
      CheckRankPartition("j", 4, {{"this node (h1:1)", {0, 1, 2}}, {"peer h2:1", {2, 7}}});
  EXPECT_TRUE(absl::IsFailedPrecondition(status));
  EXPECT_THAT(status.message(),
              HasSubstr("job 'j': the nodes' local_ranks do not partition its 4"));
  EXPECT_THAT(status.message(), HasSubstr("rank 2 is hosted 2 times: by this node (h1:1) and by "
                                          "peer h2:1"));
  EXPECT_THAT(status.message(), HasSubstr("rank 3 is hosted by no node"));
  EXPECT_THAT(status.message(), HasSubstr("rank 7 (peer h2:1) is outside the world"));
}

TEST(RankPartitionTest, ShowsTheFirstFewProblemsAndCountsTheRest) {
  const absl::Status status = CheckRankPartition("j", 10, {{"a", {0}}});
  EXPECT_THAT(status.message(), HasSubstr("rank 4 is hosted by no node; and 5 more"));
}

}  // namespace
}  // namespace packfeed::server
