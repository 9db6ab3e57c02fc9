#include "server/pipeline/document_mask.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The positions of the row each rank holds, flattened in row order.
std::vector<int64_t> RowPositions(const std::vector<RankRanges>& ranges, int64_t seq_length) {
  std::vector<int64_t> out;
  for (size_t b = 0; b < ranges.size(); ++b) {
    for (const scheduler::TokenRange& range : ranges[b]) {
      for (int64_t k = range.begin; k < range.end; ++k) {
        out.push_back(static_cast<int64_t>(b) * seq_length + k);
      }
    }
  }
  return out;
}

TEST(PieceBoundsTest, TakesTheExtraTokenOffTheLastPiece) {
  // seq 8 + the extra token over three sequences: 3, 4, 2.
  EXPECT_THAT(PieceBounds({3, 4, 2}, 8, true), ElementsAre(0, 3, 7, 8));
  // The last piece was only the extra token: it goes.
  EXPECT_THAT(PieceBounds({5, 3, 1}, 8, true), ElementsAre(0, 5, 8));
  EXPECT_THAT(PieceBounds({9}, 8, true), ElementsAre(0, 8));
  // Without the extra token the pieces are the inputs.
  EXPECT_THAT(PieceBounds({5, 3}, 8, false), ElementsAre(0, 5, 8));
}

TEST(PieceBoundsTest, FoldsAShortSamplesPadIntoItsLastPiece) {
  // A partial validation sample: 5 stored tokens (4 inputs) of 8.
  EXPECT_THAT(PieceBounds({2, 3}, 8, true), ElementsAre(0, 2, 8));
  EXPECT_THAT(PieceBounds({1}, 8, true), ElementsAre(0, 8));
  EXPECT_THAT(PieceBounds({}, 8, true), ElementsAre(0, 8));
}

TEST(PieceBoundsTest, StopsAtTheFirstBoundThatReachesTheSample) {
  // A zero-length sequence after the end: stripped as the row merge does.
  EXPECT_THAT(PieceBounds({8, 0, 1}, 8, true), ElementsAre(0, 8));
  // Within the sample it stays (a document of no tokens).
  EXPECT_THAT(PieceBounds({4, 0, 5}, 8, true), ElementsAre(0, 4, 4, 8));
}

TEST(EodBoundsTest, EndsADocumentAfterEachEodInputAndAtTheEnd) {
  dataset::SampleRules rules;
  rules.kind = dataset::SampleKind::kPretraining;
  rules.eod_id = 0;
  rules.pad_id = -1;
  EXPECT_THAT(EodBounds({5, 0, 6, 7, 0, 8, 9}, 6, rules), ElementsAre(0, 2, 5, 6));
  // An EOD as the last input ends the sample once; pads are no EODs.
  EXPECT_THAT(EodBounds({5, 6, 0, 1}, 3, rules), ElementsAre(0, 3));
  EXPECT_THAT(EodBounds({5, 0}, 4, rules), ElementsAre(0, 2, 4));
}

TEST(RowOfTest, OffsetsEachSampleAndKeepsTheLongestDocument) {
  const std::vector<SampleBounds> samples = {{0, 3, 8}, {0, 1, 2, 8}};
  const DocumentRow row = RowOf(samples, 8);
  EXPECT_THAT(row.cu_seqlens, ElementsAre(0, 3, 8, 9, 10, 16));
  EXPECT_EQ(row.max_seqlen, 6);
}

TEST(CpRangesOfRowTest, PerSequenceSplitsTheWholeRowAcrossSamples) {
  // Two samples of 8: the row of 16 in 4 parts of 4 for CP 2.
  const DocumentRow row = RowOf(std::vector<SampleBounds>{{0, 3, 8}, {0, 8}}, 8);
  absl::StatusOr<std::vector<RankRanges>> rank0 =
      CpRangesOfRow(row, 8, 2, 0, CpSplit::kPerSequence);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_THAT(RowPositions(*rank0, 8), ElementsAre(0, 1, 2, 3, 12, 13, 14, 15));  // parts 0 and 3
  absl::StatusOr<std::vector<RankRanges>> rank1 =
      CpRangesOfRow(row, 8, 2, 1, CpSplit::kPerSequence);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  // Parts 1 and 2 meet in sample 0 and 1: one range each.
  EXPECT_EQ((*rank1)[0].size(), 1u);
  EXPECT_THAT(RowPositions(*rank1, 8), ElementsAre(4, 5, 6, 7, 8, 9, 10, 11));
}

TEST(CpRangesOfRowTest, PerDocumentSplitsEachDocumentAsTransformerEngineDoes) {
  // Documents of 4 and 12 in one sample of 16, CP 2: parts of 1 and 3.
  const DocumentRow row = RowOf(std::vector<SampleBounds>{{0, 4, 16}}, 16);
  absl::StatusOr<std::vector<RankRanges>> rank0 =
      CpRangesOfRow(row, 16, 2, 0, CpSplit::kPerDocument);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_THAT(RowPositions(*rank0, 16), ElementsAre(0, 3, 4, 5, 6, 13, 14, 15));
  absl::StatusOr<std::vector<RankRanges>> rank1 =
      CpRangesOfRow(row, 16, 2, 1, CpSplit::kPerDocument);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_THAT(RowPositions(*rank1, 16), ElementsAre(1, 2, 7, 8, 9, 10, 11, 12));
}

TEST(CpRangesOfRowTest, EveryPositionGoesToExactlyOneRank) {
  const DocumentRow row = RowOf(std::vector<SampleBounds>{{0, 8, 24}, {0, 16, 24}, {0, 24}}, 24);
  for (CpSplit split : {CpSplit::kPerSequence, CpSplit::kPerDocument}) {
    std::vector<int64_t> all;
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<std::vector<RankRanges>> ranges = CpRangesOfRow(row, 24, 4, r, split);
      ASSERT_TRUE(ranges.ok()) << ranges.status();
      const std::vector<int64_t> mine = RowPositions(*ranges, 24);
      EXPECT_EQ(mine.size(), 18u);
      EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(72);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(all, want);
  }
}

TEST(CpRangesOfRowTest, PerDocumentRefusesADocumentThatDoesNotDivide) {
  const DocumentRow row = RowOf(std::vector<SampleBounds>{{0, 8, 16}, {0, 5, 16}}, 16);
  absl::StatusOr<std::vector<RankRanges>> ranges =
      CpRangesOfRow(row, 16, 2, 0, CpSplit::kPerDocument);
  ASSERT_EQ(ranges.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ranges.status().message(), HasSubstr("document 2 of the microbatch"));
  EXPECT_THAT(ranges.status().message(), HasSubstr("has 5 tokens"));
  EXPECT_THAT(ranges.status().message(), HasSubstr("CP_SPLIT_PER_SEQUENCE"));
  // The per-sequence split of the same row is fine.
  EXPECT_TRUE(CpRangesOfRow(row, 16, 2, 0, CpSplit::kPerSequence).ok());
}

TEST(CpRangesOfRowTest, RefusesARowThatIsNoWholeNumberOfSamples) {
  const DocumentRow row = RowOf(std::vector<SampleBounds>{{0, 5, 9}}, 8);
  EXPECT_EQ(CpRangesOfRow(row, 8, 1, 0, CpSplit::kPerSequence).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace packfeed::server
