#include "packfeed/scheduler/lower_bound.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "packfeed/scheduler/plan_stats.h"

namespace packfeed::scheduler {
namespace {

PlannerOptions DynamicCp(int ranks, int64_t cap, double budget) {
  PlannerOptions options;
  options.kind = SchedulerKind::kDynamicCp;
  options.dp = ranks;
  options.max_tokens_per_rank = cap;
  options.cp_upgrade_budget = budget;
  return options;
}

double SumOfMax(const GlobalPlan& plan) {
  CostModel work_only = CostModel::Megatron();
  return StepTime(plan, work_only);
}

// 4 ranks of 100 tokens: a 400-token sequence fills a microbatch at CP 4
// (40 000 per rank); twelve of 10 tokens (100 each) fill another. The work is
// as balanced as it can be, and the bound says so: Σ W / N = 40 300.
TEST(LowerBoundTest, MeetsABalancedPlan) {
  std::vector<int64_t> lengths = {400};
  lengths.insert(lengths.end(), 12, 10);
  const PlannerOptions options = DynamicCp(4, 100, 0.05);
  absl::StatusOr<StepTimeBound> bound = LowerBoundStepTime(lengths, options, 0.05);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_DOUBLE_EQ(bound->ideal, 40300);
  EXPECT_DOUBLE_EQ(bound->sum_of_max, 40300);
  EXPECT_DOUBLE_EQ(bound->step_time, 40300);
  absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_DOUBLE_EQ(SumOfMax(*plan), 40300);
}

// 8 ranks of 100: the 400-token sequence needs CP 4 and lasts 40 000 per
// rank; forty of 10 tokens fill the other four ranks (1 000 each). Perfect
// balance would be 164 000 / 8 = 20 500, but no plan within a 5 % budget
// beats 40 000: lifting the long one to CP 8 would spend 400 tokens of the
// budget's 52. With the budget unbounded the floor goes, and the bound is
// the balance.
TEST(LowerBoundTest, FloorsBindBeyondPerfectBalance) {
  std::vector<int64_t> lengths = {400};
  lengths.insert(lengths.end(), 40, 10);
  const PlannerOptions options = DynamicCp(8, 100, 0.05);
  absl::StatusOr<StepTimeBound> bound = LowerBoundStepTime(lengths, options, 0.05);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_DOUBLE_EQ(bound->ideal, 20500);
  EXPECT_DOUBLE_EQ(bound->sum_of_max, 40000);
  absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_DOUBLE_EQ(SumOfMax(*plan), 40000);

  absl::StatusOr<StepTimeBound> unbounded = LowerBoundStepTime(lengths, options, 1e9);
  ASSERT_TRUE(unbounded.ok());
  EXPECT_DOUBLE_EQ(unbounded->sum_of_max, 20500);
}

TEST(LowerBoundTest, MicrobatchCostAndBubbleCount) {
  std::vector<int64_t> lengths(8, 100);  // 8 ranks of 100: at least one microbatch
  PlannerOptions options = DynamicCp(8, 100, 0);
  options.cost_model.microbatch = 50000;
  options.cost_model.bubble = 3;
  absl::StatusOr<StepTimeBound> bound = LowerBoundStepTime(lengths, options, 0);
  ASSERT_TRUE(bound.ok());
  // One microbatch: (10 000 + 50 000) · (1 + 3); a second costs more in μ
  // than it saves of the bubble: (10 000 + 100 000) · (1 + 3/2).
  EXPECT_DOUBLE_EQ(bound->step_time, 60000 * 4);
}

TEST(LowerBoundTest, RefusesWhatThePlannerRefuses) {
  const std::vector<int64_t> lengths = {10, 20};
  PlannerOptions megatron = DynamicCp(2, 100, 0);
  megatron.kind = SchedulerKind::kMegatronDpBalanced;
  EXPECT_EQ(LowerBoundStepTime(lengths, megatron, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LowerBoundStepTime({}, DynamicCp(2, 100, 0), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> too_long = {10, 201};  // 2 ranks of 100
  absl::StatusOr<StepTimeBound> bound = LowerBoundStepTime(too_long, DynamicCp(2, 100, 0), 0);
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bound.status().message().find("sample 1"), std::string::npos);
}

TEST(LowerBoundTest, UpgradeSpentCountsAsThePlannersDo) {
  // 2 ranks of 100; a 10-token sequence fits one rank but runs at CP 2,
  // padded to 12: it spends 12 · (2 − 1) of 12 + 20 padded tokens.
  GlobalPlan plan;
  plan.dp_cp_size = 2;
  plan.microbatches = {{{{0, 2, {{0, 10, 12}}}}}, {{{0, 1, {{1, 20, 20}}}, {1, 1, {{2, 5, 5}}}}}};
  EXPECT_DOUBLE_EQ(UpgradeSpent(plan, DynamicCp(2, 100, 0)), 12.0 / 37.0);
  PlannerOptions balanced = DynamicCp(1, 100, 0);
  balanced.kind = SchedulerKind::kBalanced;
  balanced.cp = 2;
  EXPECT_DOUBLE_EQ(UpgradeSpent(plan, balanced), 0);
}

// The bound's whole point: no plan beats it. Random batches of every shape
// the planners take, under s²/c and a calibrated model with μ and a bubble.
TEST(LowerBoundTest, NoPlanBeatsTheBound) {
  std::mt19937_64 rng(20261126);
  const auto draw = [&](int64_t low, int64_t high) {
    return low + static_cast<int64_t>(rng() % static_cast<uint64_t>(high - low + 1));
  };
  absl::StatusOr<CostModel> calibrated = CostModelFromName("llama8b", {1, 4, 1});
  ASSERT_TRUE(calibrated.ok());
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    PlannerOptions options;
    const int shape = static_cast<int>(draw(0, 3));
    options.kind = shape == 0 ? SchedulerKind::kBalanced : SchedulerKind::kDynamicCp;
    options.dp = static_cast<int>(1 << draw(1, 4));
    options.cp = shape == 0 ? static_cast<int>(draw(1, 2)) : 1;
    options.max_tokens_per_rank = draw(64, 512);
    options.cp_upgrade_budget = shape == 1 ? 0.0 : shape == 2 ? 0.05 : 1e9;
    options.cost_model = trial % 2 == 0 ? CostModel::Megatron() : *calibrated;
    const int64_t ranks = int64_t{options.dp} * options.cp;
    const int64_t longest = options.max_tokens_per_rank *
                            (options.kind == SchedulerKind::kDynamicCp ? ranks : options.cp) * 3 /
                            4;
    std::vector<int64_t> lengths(static_cast<size_t>(draw(ranks, 6 * ranks)));
    for (int64_t& length : lengths) {
      // Mostly short, now and then long: the heavy tail the bound is for.
      length = draw(0, 9) == 0 ? draw(1, longest) : draw(1, std::max<int64_t>(1, longest / 16));
    }
    absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
    if (!plan.ok()) continue;  // e.g. too few sequences for every rank
    const double budget = std::max(options.cp_upgrade_budget, UpgradeSpent(*plan, options));
    absl::StatusOr<StepTimeBound> bound = LowerBoundStepTime(lengths, options, budget);
    ASSERT_TRUE(bound.ok()) << bound.status();
    const double step = StepTime(*plan, options.cost_model);
    ASSERT_GE(step, bound->step_time * (1 - 1e-12)) << "trial " << trial;
    CostModel work_only = options.cost_model;
    work_only.microbatch = 0;
    work_only.bubble = 0;
    ASSERT_GE(StepTime(*plan, work_only), bound->sum_of_max * (1 - 1e-12)) << "trial " << trial;
    ASSERT_GE(bound->sum_of_max, bound->ideal);
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

}  // namespace
}  // namespace packfeed::scheduler
