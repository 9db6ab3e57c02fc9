#include "packfeed/scheduler/thd_partition.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/scheduler/padding.h"

namespace packfeed::scheduler {
namespace {

using ::testing::ElementsAre;

std::vector<int64_t> Indices(std::vector<int64_t> cu, int c, int k) {
  absl::StatusOr<std::vector<int64_t>> indices = ZigzagIndices(cu, c, k);
  EXPECT_TRUE(indices.ok()) << indices.status();
  return indices.ok() ? *indices : std::vector<int64_t>{};
}

// Worked example 1 of the contract notes: real lengths 5 and 11, CP 2.
TEST(ThdPartitionTest, WorkedExampleCp2) {
  EXPECT_EQ(PadTo(5, PaddingDivisor(2, 1, false)), 8);
  EXPECT_EQ(PadTo(11, PaddingDivisor(2, 1, false)), 12);
  EXPECT_THAT(Indices({0, 8, 20}, 2, 0), ElementsAre(0, 1, 6, 7, 8, 9, 10, 17, 18, 19));
  EXPECT_THAT(Indices({0, 8, 20}, 2, 1), ElementsAre(2, 3, 4, 5, 11, 12, 13, 14, 15, 16));
}

// Worked example 2: CP 4, cu = [0, 8, 24].
TEST(ThdPartitionTest, WorkedExampleCp4) {
  EXPECT_THAT(Indices({0, 8, 24}, 4, 0), ElementsAre(0, 7, 8, 9, 22, 23));
  EXPECT_THAT(Indices({0, 8, 24}, 4, 1), ElementsAre(1, 6, 10, 11, 20, 21));
  EXPECT_THAT(Indices({0, 8, 24}, 4, 2), ElementsAre(2, 5, 12, 13, 18, 19));
  EXPECT_THAT(Indices({0, 8, 24}, 4, 3), ElementsAre(3, 4, 14, 15, 16, 17));
}

// E2 (dynamic CP, real Megatron run): 249 tokens padded to 256, CP 4.
TEST(ThdPartitionTest, DynamicCpExampleFromE2) {
  EXPECT_EQ(PadTo(249, PaddingDivisor(4, 1, false)), 256);
  std::vector<int64_t> rank0 = Indices({0, 256}, 4, 0);
  ASSERT_EQ(rank0.size(), 64u);
  EXPECT_EQ(rank0[0], 0);
  EXPECT_EQ(rank0[31], 31);
  EXPECT_EQ(rank0[32], 224);
  EXPECT_EQ(rank0[63], 255);
}

TEST(ThdPartitionTest, RanksCoverEveryIndexOnce) {
  const std::vector<int64_t> cu = {0, 16, 16, 48, 112};
  for (int c : {1, 2, 4, 8}) {
    std::vector<int64_t> all;
    for (int k = 0; k < c; ++k) {
      std::vector<int64_t> part = Indices(cu, c, k);
      EXPECT_EQ(part.size(), 112u / c);
      all.insert(all.end(), part.begin(), part.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(112);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << "cp " << c;
  }
}

TEST(ThdPartitionTest, SequenceParallelMultipliesTheDivisor) {
  EXPECT_EQ(PaddingDivisor(1, 4, false), 1);
  EXPECT_EQ(PaddingDivisor(1, 4, true), 4);
  EXPECT_EQ(PaddingDivisor(2, 2, true), 8);
  EXPECT_EQ(PadTo(17, 8), 24);
  EXPECT_EQ(PadTo(16, 8), 16);
}

TEST(ThdPartitionTest, SmallestFittingCpCountsThePadding) {
  // 4 097 tokens: 4 097 per rank at CP 1, 2 050 at CP 2 (padded to 4 100).
  EXPECT_EQ(SmallestFittingCp(4097, 1, 8, 4097, 1, false), 1);
  EXPECT_EQ(SmallestFittingCp(4097, 1, 8, 4096, 1, false), 2);
  EXPECT_EQ(SmallestFittingCp(4097, 1, 8, 2049, 1, false), 4);  // 2 050 > 2 049
  EXPECT_EQ(SmallestFittingCp(4097, 1, 8, 512, 1, false), 0);   // 520 at CP 8
  EXPECT_EQ(SmallestFittingCp(4097, 2, 8, 4096, 1, false), 2);  // not below min
  // Sequence parallelism pads to 2·c·TP: 4 112 / 2 = 2 056 at CP 2, TP 4.
  EXPECT_EQ(SmallestFittingCp(4097, 1, 8, 2050, 4, true), 4);
  // Static CP: one size, any number.
  EXPECT_EQ(SmallestFittingCp(4097, 3, 3, 1366, 1, false), 3);  // 4 098 / 3
  EXPECT_EQ(SmallestFittingCp(4097, 3, 3, 1365, 1, false), 0);
}

TEST(ThdPartitionTest, SliceIsPartKThenItsMirror) {
  auto ranges = ZigzagSlice(24, 3, 1);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  EXPECT_EQ((*ranges)[0].begin, 4);
  EXPECT_EQ((*ranges)[0].end, 8);
  EXPECT_EQ((*ranges)[1].begin, 16);
  EXPECT_EQ((*ranges)[1].end, 20);
  auto whole = ZigzagSlice(7, 1, 0);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)[0].end, 7);
  EXPECT_EQ((*whole)[1].end - (*whole)[1].begin, 0);
  EXPECT_FALSE(ZigzagSlice(10, 2, 0).ok());
  EXPECT_FALSE(ZigzagSlice(8, 2, -1).ok());
}

TEST(ThdPartitionTest, RejectsBadInputs) {
  EXPECT_FALSE(ZigzagIndices(std::vector<int64_t>{0, 6}, 2, 0).ok());
  EXPECT_FALSE(ZigzagIndices(std::vector<int64_t>{1, 8}, 2, 0).ok());
  EXPECT_FALSE(ZigzagIndices(std::vector<int64_t>{0, 8, 4}, 2, 0).ok());
  EXPECT_FALSE(ZigzagIndices(std::vector<int64_t>{0, 8}, 2, 2).ok());
  EXPECT_FALSE(ZigzagIndices(std::vector<int64_t>{}, 1, 0).ok());
  EXPECT_THAT(ZigzagIndices(std::vector<int64_t>{0, 6}, 2, 0).status().message(),
              ::testing::HasSubstr("cu_seqlens_padded[1] = 6"));
}

}  // namespace
}  // namespace packfeed::scheduler
