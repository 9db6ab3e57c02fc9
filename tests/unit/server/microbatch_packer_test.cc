#include "packfeed/server/microbatch_packer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

SampleRules Varlen() { return {SampleKind::kVarlen, 8, 99, 98, false, false}; }
SampleRules Sft() { return {SampleKind::kSft, 8, 99, 98, false, false}; }

TEST(SampleRulesTest, TruncatesWithEodForcedLast) {
  // varlen holds seq_length + 1 tokens; longer keeps seq_length − 1 and EOD.
  EXPECT_EQ(ShapeOfSample(9, Varlen()).run_length, 9);
  EXPECT_EQ(ShapeOfSample(10, Varlen()).read_tokens, 7);
  EXPECT_EQ(ShapeOfSample(10, Varlen()).run_length, 8);
  EXPECT_EQ(ShapeOfSample(9, Sft()).run_length, 8);
  std::vector<int64_t> stored = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_THAT(MakeTokenRun(absl::MakeSpan(stored).subspan(0, 7), ShapeOfSample(10, Varlen()),
                           Varlen()),
              ElementsAre(1, 2, 3, 4, 5, 6, 7, 99));
  SampleRules append = Varlen();
  append.append_eod = true;
  EXPECT_THAT(MakeTokenRun(absl::MakeSpan(stored).subspan(0, 3), ShapeOfSample(3, append), append),
              ElementsAre(1, 2, 3, 99));
  EXPECT_THAT(MakeTokenRun(absl::MakeSpan(stored).subspan(0, 3), ShapeOfSample(3, Varlen()),
                           Varlen()),
              ElementsAre(1, 2, 3));
  EXPECT_EQ(RealLength(4, Varlen()), 3);
  EXPECT_EQ(RealLength(4, Sft()), 4);
}

TEST(MicrobatchPackerTest, VarlenZeroesPadSlotsAndRestartsPositions) {
  const std::vector<int64_t> a = {10, 11, 12, 99};  // real 3
  const std::vector<int64_t> b = {20, 99};          // real 1
  CpGroup group{0, 1, {{0, 3, 4}, {1, 1, 2}}};
  const std::vector<const std::vector<int64_t>*> runs = {&a, &b};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Varlen());
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->tokens, ElementsAre(10, 11, 12, 0, 20, 0));
  EXPECT_THAT(packed->labels, ElementsAre(11, 12, 99, 0, 99, 0));
  EXPECT_THAT(packed->loss_mask, ElementsAre(1, 1, 1, 0, 1, 0));
  EXPECT_THAT(packed->position_ids, ElementsAre(0, 1, 2, 0, 0, 0));
  EXPECT_THAT(packed->padding_mask, ElementsAre(0, 0, 0, 1, 0, 1));
  EXPECT_THAT(packed->cu_seqlens, ElementsAre(0, 3, 4));
  EXPECT_THAT(packed->cu_seqlens_padded, ElementsAre(0, 4, 6));
  EXPECT_EQ(packed->max_seqlen, 4);
}

TEST(MicrobatchPackerTest, SftKeepsPadIdsAndMasksPadLabels) {
  const std::vector<int64_t> a = {10, 11, 99};  // EOD is an input here
  CpGroup group{0, 1, {{0, 4, 4}}};             // Megatron: real = padded
  const std::vector<const std::vector<int64_t>*> runs = {&a};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Sft());
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->tokens, ElementsAre(10, 11, 99, 98));
  EXPECT_THAT(packed->labels, ElementsAre(11, 99, 98, 98));
  EXPECT_THAT(packed->loss_mask, ElementsAre(1, 1, 0, 0));
  EXPECT_THAT(packed->position_ids, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(packed->padding_mask, ElementsAre(0, 0, 0, 0));
}

TEST(MicrobatchPackerTest, ZigzagGivesRankKChunksKAnd2cMinus1MinusK) {
  std::vector<int64_t> run(9);
  for (int i = 0; i < 9; ++i) run[i] = 100 + i;  // real 8, padded 8, c = 2: chunks of 2
  CpGroup group{4, 2, {{7, 8, 8}}};
  const std::vector<const std::vector<int64_t>*> runs = {&run};
  absl::StatusOr<PackedMicrobatch> rank0 = PackMicrobatch(group, runs, 0, Varlen());
  absl::StatusOr<PackedMicrobatch> rank1 = PackMicrobatch(group, runs, 1, Varlen());
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  EXPECT_THAT(rank0->tokens, ElementsAre(100, 101, 106, 107));
  EXPECT_THAT(rank1->tokens, ElementsAre(102, 103, 104, 105));
  EXPECT_THAT(rank1->position_ids, ElementsAre(2, 3, 4, 5));
  // Metadata is global, identical on both ranks.
  EXPECT_EQ(rank0->cu_seqlens_padded, rank1->cu_seqlens_padded);
  EXPECT_THAT(rank0->cu_seqlens_padded, ElementsAre(0, 8));
}

TEST(MicrobatchPackerTest, RefusesWhatCannotBePacked) {
  const std::vector<int64_t> run = {1, 2, 3, 99};
  const std::vector<const std::vector<int64_t>*> runs = {&run};
  EXPECT_THAT(PackMicrobatch({0, 2, {{0, 3, 6}}}, runs, 0, Varlen()).status().message(),
              HasSubstr("does not split into 4 chunks"));
  EXPECT_THAT(PackMicrobatch({0, 2, {{0, 3, 8}}}, runs, 2, Varlen()).status().message(),
              HasSubstr("outside a group"));
  EXPECT_THAT(PackMicrobatch({0, 1, {{0, 5, 8}}}, runs, 0, Varlen()).status().message(),
              HasSubstr("run of 4 tokens"));
}

TEST(MicrobatchPackerTest, StagesGetTheirFields) {
  EXPECT_TRUE(FieldsOfStage(0, 1).inputs && FieldsOfStage(0, 1).targets);
  EXPECT_TRUE(FieldsOfStage(0, 3).inputs && !FieldsOfStage(0, 3).targets);
  EXPECT_TRUE(!FieldsOfStage(1, 3).inputs && !FieldsOfStage(1, 3).targets);
  EXPECT_TRUE(!FieldsOfStage(2, 3).inputs && FieldsOfStage(2, 3).targets);
}

}  // namespace
}  // namespace packfeed
