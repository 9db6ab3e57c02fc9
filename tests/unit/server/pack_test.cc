#include "server/internal/pack.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

dataset::SampleRules Varlen() { return {dataset::SampleKind::kVarlen, 8, 99, 98, false}; }
dataset::SampleRules Sft() { return {dataset::SampleKind::kSft, 8, 99, 98, false}; }

TEST(PackTest, VarlenZeroesPadSlotsAndRestartsPositions) {
  const std::vector<int64_t> a = {10, 11, 12, 99};  // real 3
  const std::vector<int64_t> b = {20, 99};          // real 1
  scheduler::CpGroup group{0, 1, {{0, 3, 4}, {1, 1, 2}}};
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

TEST(PackTest, SftKeepsPadIdsAndMasksPadLabels) {
  const std::vector<int64_t> a = {10, 11, 99};  // EOD is an input here
  scheduler::CpGroup group{0, 1, {{0, 4, 4}}};  // Megatron: real = padded
  const std::vector<const std::vector<int64_t>*> runs = {&a};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Sft());
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->tokens, ElementsAre(10, 11, 99, 98));
  EXPECT_THAT(packed->labels, ElementsAre(11, 99, 98, 98));
  EXPECT_THAT(packed->loss_mask, ElementsAre(1, 1, 0, 0));
  EXPECT_THAT(packed->position_ids, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(packed->padding_mask, ElementsAre(0, 0, 0, 0));
}

TEST(PackTest, ZigzagGivesRankKChunksKAnd2cMinus1MinusK) {
  std::vector<int64_t> run(9);
  for (int i = 0; i < 9; ++i) run[i] = 100 + i;  // real 8, padded 8, c = 2: chunks of 2
  scheduler::CpGroup group{4, 2, {{7, 8, 8}}};
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

TEST(PackTest, RefusesWhatCannotBePacked) {
  const std::vector<int64_t> run = {1, 2, 3, 99};
  const std::vector<const std::vector<int64_t>*> runs = {&run};
  EXPECT_THAT(PackMicrobatch({0, 2, {{0, 3, 6}}}, runs, 0, Varlen()).status().message(),
              HasSubstr("does not split into 4 chunks"));
  EXPECT_THAT(PackMicrobatch({0, 2, {{0, 3, 8}}}, runs, 2, Varlen()).status().message(),
              HasSubstr("outside a group"));
  EXPECT_THAT(PackMicrobatch({0, 1, {{0, 5, 8}}}, runs, 0, Varlen()).status().message(),
              HasSubstr("run of 4 tokens"));
}

TEST(PackTest, StagesGetTheirFields) {
  EXPECT_TRUE(FieldsOfStage(0, 1).inputs && FieldsOfStage(0, 1).targets);
  EXPECT_TRUE(FieldsOfStage(0, 3).inputs && !FieldsOfStage(0, 3).targets);
  EXPECT_TRUE(!FieldsOfStage(1, 3).inputs && !FieldsOfStage(1, 3).targets);
  EXPECT_TRUE(!FieldsOfStage(2, 3).inputs && FieldsOfStage(2, 3).targets);
}

}  // namespace
}  // namespace packfeed::server
