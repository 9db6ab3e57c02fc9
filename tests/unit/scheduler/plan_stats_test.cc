#include "packfeed/scheduler/plan_stats.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/scheduler/cost_model.h"

namespace packfeed::scheduler {
namespace {

// Two microbatches over N = 2 ranks:
//   m0: rank 0 holds a 4-token sequence, rank 1 a 2-token one (W 16 | 4)
//   m1: one CP-2 group holding an 8-token sequence (W 64/2 = 32 on each)
GlobalPlan SmallPlan() {
  GlobalPlan plan;
  plan.dp_cp_size = 2;
  plan.microbatches = {
      {{{0, 1, {{0, 3, 4}}}, {1, 1, {{1, 2, 2}}}}},
      {{{0, 2, {{2, 8, 8}}}}},
  };
  plan.flops = ComputeFlopsInputs(plan);
  return plan;
}

TEST(PlanStatsTest, FiguresFollowTheirDefinitions) {
  const PlanStats stats = ComputePlanStats(SmallPlan(), CostModel::Megatron(),
                                           /*max_tokens_per_rank=*/4);
  // Σ W = 16 + 4 + 32·2 = 84; ideal = 42; Σ max = 16 + 32 = 48.
  EXPECT_DOUBLE_EQ(stats.step_over_ideal, 48.0 / 42.0);
  // Rank sums 48 and 36, mean 42.
  EXPECT_DOUBLE_EQ(stats.rank_sum_max_over_mean, 48.0 / 42.0);
  EXPECT_EQ(stats.num_microbatches, 2);
  EXPECT_EQ(stats.microbatches_lower_bound, 2);  // ⌈14 / (2·4)⌉
  EXPECT_DOUBLE_EQ(stats.padding_pct, 100.0 * 1 / 13);
  EXPECT_EQ(stats.max_tokens_on_a_rank, 4);
  // Every sequence runs at the CP it needs: inflation 1.
  EXPECT_DOUBLE_EQ(stats.cp_inflation, 1.0);
  EXPECT_THAT(stats.cp_size_histogram,
              ::testing::ElementsAre(::testing::Pair(1, 2), ::testing::Pair(2, 1)));
  EXPECT_EQ(SmallPlan().flops, (FlopsInputs{14, 16 + 4 + 64, 13, 9 + 4 + 64}));
}

TEST(PlanStatsTest, StepTimeAddsMicrobatchCostAndTheBubble) {
  // s²/c plus μ = 10 per microbatch and a bubble of 1 (PP 2): maxima 16
  // and 32, so (16 + 10) + (32 + 10) = 68, plus one mean microbatch 34.
  CostModel model;
  model.microbatch = 10;
  model.bubble = 1;
  const PlanStats stats = ComputePlanStats(SmallPlan(), model, /*max_tokens_per_rank=*/4);
  EXPECT_DOUBLE_EQ(StepTime(SmallPlan(), model), 68 + 34);
  EXPECT_DOUBLE_EQ(stats.step_time, 68 + 34);
  // Ideal: every sequence at its needed CP (16 + 4 + 64 = 84 over 2 ranks),
  // in the lower bound of 2 microbatches: (2 + 1) · (42 / 2 + 10) = 93.
  EXPECT_DOUBLE_EQ(stats.step_time_over_ideal, 102.0 / 93.0);
  // Under s²/c alone the step time is Σ max.
  EXPECT_DOUBLE_EQ(StepTime(SmallPlan(), CostModel::Megatron()), 48);
}

// Two ranks with fixed groups, the heavy sequence on rank 0 in microbatch
// 0 and on rank 1 in microbatch 1: barrier by barrier the step waits for
// both (16 + 16); as it runs each rank does 16 + 1.
GlobalPlan CrossedPlan() {
  GlobalPlan plan;
  plan.dp_cp_size = 2;
  plan.microbatches = {
      {{{0, 1, {{0, 4, 4}}}, {1, 1, {{1, 1, 1}}}}},
      {{{0, 1, {{2, 1, 1}}}, {1, 1, {{3, 4, 4}}}}},
  };
  return plan;
}

TEST(PlanStatsTest, GraphStepTimeWaitsOnlyWhereRanksMeet) {
  const CostModel s2 = CostModel::Megatron();
  EXPECT_DOUBLE_EQ(StepTime(CrossedPlan(), s2), 32);
  EXPECT_DOUBLE_EQ(GraphStepTime(CrossedPlan(), s2), 17);
  // One EP block of both ranks: their all-to-alls make them meet in every
  // microbatch, as barriers do.
  EXPECT_DOUBLE_EQ(GraphStepTime(CrossedPlan(), s2, {.expert_parallel = 2}), 32);
  // A CP group spanning both ranks starts when the later one is free: rank
  // 0 is busy 16 in microbatch 0, then both run the CP-2 group's 32.
  EXPECT_DOUBLE_EQ(GraphStepTime(SmallPlan(), s2), 48);
  // μ on every microbatch of every rank, and the bubble's share of the
  // makespan: 2 · 10 + 17 = 37, plus 37 / 2.
  CostModel model;
  model.microbatch = 10;
  model.bubble = 1;
  EXPECT_DOUBLE_EQ(GraphStepTime(CrossedPlan(), model), 37 + 18.5);
  const PlanStats stats = ComputePlanStats(CrossedPlan(), s2, /*max_tokens_per_rank=*/4);
  EXPECT_DOUBLE_EQ(stats.graph_step_time, 17);
  EXPECT_DOUBLE_EQ(stats.graph_step_over_ideal, 17.0 / 17.0);
  EXPECT_DOUBLE_EQ(stats.step_over_ideal, 32.0 / 17.0);
}

TEST(PlanStatsTest, CpInflationCountsNeedlessSplits) {
  // The 8-token sequence at CP 2 with a cap of 8 needs CP 1: inflation
  // (3·1 + 2·1 + 8·2) / 13.
  const PlanStats stats = ComputePlanStats(SmallPlan(), CostModel::Megatron(), 8);
  EXPECT_DOUBLE_EQ(stats.cp_inflation, (3.0 + 2.0 + 16.0) / 13.0);
  EXPECT_EQ(NeededCpSize(9, 8, 1), 2);
  EXPECT_EQ(NeededCpSize(3, 8, 4), 4);
  EXPECT_EQ(NeededCpSize(49152, 3072, 1), 16);
}

TEST(PlanStatsTest, CpIsNeverFreeUnderTheFullModel) {
  // A 400-token chat message split 16 ways costs the group more in total
  // than running it on one rank; under Megatron's s²/c it looks free.
  const CostModel full = *CostModelFromName("llama8b");
  EXPECT_GT(16 * full.Cost(400, 16), full.Cost(400, 1));
  const CostModel megatron = CostModel::Megatron();
  EXPECT_LT(16 * megatron.Cost(400, 16), 1.0001 * megatron.Cost(400, 1));
  // For a long sequence, CP still pays: per-rank time falls with c.
  EXPECT_LT(full.Cost(65536, 8), full.Cost(65536, 4));
}

TEST(PlanStatsTest, ValidatePlanCatchesMissingAndDuplicateSamples) {
  GlobalPlan plan = SmallPlan();
  EXPECT_TRUE(ValidatePlan(plan, 3).ok());
  EXPECT_THAT(ValidatePlan(plan, 4).message(), ::testing::HasSubstr("sample 3 placed 0 times"));
  plan.microbatches[0].groups[1].sequences[0].sample = 0;
  EXPECT_THAT(ValidatePlan(plan, 3).message(), ::testing::HasSubstr("sample 0 placed 2 times"));
  plan = SmallPlan();
  plan.microbatches[1].groups[0].first_rank = 1;
  EXPECT_FALSE(ValidatePlan(plan, 3).ok());
}

// Microbatches with the same CP groups share a Megatron group, numbered in
// order of first appearance, adjacent or not; a different size or a
// different first rank is another partition.
TEST(PlanStatsTest, HybridGroupsJoinMicrobatchesWithTheSameCpGroups) {
  GlobalPlan plan = SmallPlan();
  EXPECT_THAT(HybridGroupsOf(plan), ::testing::ElementsAre(0, 1));
  plan.microbatches.push_back(plan.microbatches[0]);
  plan.microbatches.push_back(plan.microbatches[1]);
  plan.microbatches.push_back(plan.microbatches[0]);
  EXPECT_THAT(HybridGroupsOf(plan), ::testing::ElementsAre(0, 1, 0, 1, 0));
  plan = GlobalPlan{};
  plan.dp_cp_size = 4;
  plan.microbatches = {
      {{{0, 2, {}}, {2, 1, {}}, {3, 1, {}}}},
      {{{0, 1, {}}, {1, 1, {}}, {2, 2, {}}}},
      {{{0, 2, {}}, {2, 2, {}}}},
      {{{0, 2, {}}, {2, 1, {}}, {3, 1, {}}}},
  };
  EXPECT_THAT(HybridGroupsOf(plan), ::testing::ElementsAre(0, 1, 2, 0));
  EXPECT_THAT(HybridGroupsOf(GlobalPlan{}), ::testing::IsEmpty());
}

}  // namespace
}  // namespace packfeed::scheduler
