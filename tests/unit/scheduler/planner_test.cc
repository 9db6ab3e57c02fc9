#include "packfeed/scheduler/planner.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/scheduler/lower_bound.h"
#include "packfeed/scheduler/padding.h"
#include "packfeed/scheduler/plan_stats.h"

namespace packfeed::scheduler {
namespace {

using ::testing::HasSubstr;

// Uniform in [lo, hi] from raw bits (std::uniform_*_distribution is not
// specified across standard libraries; the cases must be the same
// everywhere).
int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

bool IsPowerOfTwo(int x) { return x > 0 && (x & (x - 1)) == 0; }

// Every promise PlanGlobalBatch makes, checked on one plan.
void ExpectPlanKeepsItsPromises(const GlobalPlan& plan, const std::vector<int64_t>& lengths,
                                const PlannerOptions& options, const std::string& where) {
  SCOPED_TRACE(where);
  const int n = options.dp * options.cp;
  ASSERT_EQ(plan.dp_cp_size, n);
  ASSERT_TRUE(ValidatePlan(plan, static_cast<int64_t>(lengths.size())).ok())
      << ValidatePlan(plan, static_cast<int64_t>(lengths.size()));
  ASSERT_GE(plan.num_microbatches(), 1);
  if (options.vpp_group_size > 0) {
    EXPECT_EQ(plan.num_microbatches() % options.vpp_group_size, 0);
  }
  const CpRange range = options.kind == SchedulerKind::kDynamicCp ? *ResolveCpRange(options)
                                                                  : CpRange{options.cp, options.cp};
  FlopsInputs flops;
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    for (const CpGroup& group : microbatch.groups) {
      ASSERT_FALSE(group.sequences.empty()) << "idle ranks at " << group.first_rank;
      if (options.kind == SchedulerKind::kDynamicCp) {
        EXPECT_TRUE(IsPowerOfTwo(group.size)) << group.size;
        EXPECT_GE(group.size, range.min);
        EXPECT_LE(group.size, range.max);
      } else {
        EXPECT_EQ(group.size, options.cp);
      }
      EXPECT_EQ(group.first_rank % group.size, 0);
      int64_t tokens = 0;
      for (const PlannedSequence& s : group.sequences) {
        EXPECT_EQ(s.length, lengths[s.sample]);
        EXPECT_EQ(s.padded_length, PadTo(s.length, PaddingDivisor(group.size, options.tp,
                                                                  options.sequence_parallel)));
        tokens += s.padded_length / group.size;
        flops.padded_sum += s.padded_length;
        flops.padded_squared_sum += s.padded_length * s.padded_length;
        flops.real_sum += s.length;
        flops.real_squared_sum += s.length * s.length;
      }
      EXPECT_LE(tokens, options.max_tokens_per_rank)
          << "group at rank " << group.first_rank << " size " << group.size;
    }
  }
  EXPECT_EQ(plan.flops, flops);
}

// max_r Σ_m W ≤ the graph's makespan ≤ Σ_m max_r W (μ and the bubble
// aside): ranks wait at most at every microbatch, and never do less than
// their own work.
void ExpectGraphTimeBetweenItsBounds(const GlobalPlan& plan, const PlannerOptions& options,
                                     const std::string& where) {
  CostModel work = options.cost_model;
  work.microbatch = 0;
  work.bubble = 0;
  std::vector<double> rank_sum(static_cast<size_t>(plan.dp_cp_size), 0.0);
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    for (const CpGroup& group : microbatch.groups) {
      double w = 0;
      for (const PlannedSequence& s : group.sequences) w += work.Cost(s.padded_length, group.size);
      for (int r = group.first_rank; r < group.first_rank + group.size; ++r) rank_sum[r] += w;
    }
  }
  const double graph = GraphStepTime(plan, work, options.execution);
  const double most = *std::max_element(rank_sum.begin(), rank_sum.end());
  EXPECT_GE(graph, most * (1 - 1e-12)) << where;
  EXPECT_LE(graph, StepTime(plan, work) * (1 + 1e-12)) << where;
}

struct RandomCase {
  std::vector<int64_t> lengths;
  PlannerOptions options;
  std::string description;
};

// `index` picks the objective and EP size, leaving the random stream (and
// so the cases) as they were before those options existed.
RandomCase MakeCase(std::mt19937_64& rng, SchedulerKind kind, int index) {
  RandomCase c;
  PlannerOptions& o = c.options;
  o.kind = kind;
  o.dp = static_cast<int>(Uniform(rng, 1, 12));
  o.cp = static_cast<int>(Uniform(rng, 1, 4));  // 3: DP×CP not a power of 2
  o.tp = static_cast<int>(Uniform(rng, 1, 4));
  o.sequence_parallel = Uniform(rng, 0, 1) == 1;
  o.vpp_group_size = Uniform(rng, 0, 2) == 0 ? static_cast<int>(Uniform(rng, 2, 4)) : 0;
  o.max_tokens_per_rank = Uniform(rng, 64, 4096);
  const int n = o.dp * o.cp;
  int largest = 1;  // the largest group a sequence may use
  if (kind == SchedulerKind::kDynamicCp) {
    int top = 1;
    while (top * 2 <= n) top *= 2;
    o.max_cp = Uniform(rng, 0, 1) == 0 ? top : static_cast<int>(std::max(1, top / 2));
    o.min_cp = Uniform(rng, 0, 3) == 0 && n % 2 == 0 ? 2 : 1;
    if (o.min_cp > o.max_cp) o.min_cp = o.max_cp;
    largest = o.max_cp;
  } else {
    largest = o.cp;
  }
  o.cost_model = Uniform(rng, 0, 1) == 0 ? CostModel::Megatron()
                                         : Calibrate({8, 1024, 8, 2, 4096, 32000, true}, {}, {});
  o.cp_upgrade_budget = Uniform(rng, 0, 1) == 0 ? 0.05 : 1.0;
  if (index % 3 == 0) o.objective = Objective::kGraph;
  if (index % 6 == 1 && kind == SchedulerKind::kDynamicCp) o.objective = Objective::kHybrid;
  if (n % 2 == 0 && index % 5 == 0) o.execution.expert_parallel = 2;
  // Enough sequences to give every rank of several microbatches one; a mix
  // of tiny ones, typical ones and ones that need the largest group.
  const int64_t count = Uniform(rng, n * 2, n * 12 + 8);
  const int64_t divisor = PaddingDivisor(largest, o.tp, o.sequence_parallel);
  const int64_t longest = (largest * o.max_tokens_per_rank) / divisor * divisor - divisor + 1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t kind_of_length = Uniform(rng, 0, 9);
    int64_t length;
    if (kind_of_length == 0) {
      length = Uniform(rng, 1, 8);
    } else if (kind_of_length == 9) {
      length = Uniform(rng, std::max<int64_t>(1, longest / 2), std::max<int64_t>(1, longest));
    } else {
      length = Uniform(rng, 1, std::max<int64_t>(1, std::min(o.max_tokens_per_rank, longest)));
    }
    c.lengths.push_back(length);
  }
  c.description = std::string(SchedulerKindName(kind)) + " DP" + std::to_string(o.dp) + " CP" +
                  std::to_string(o.cp) + " TP" + std::to_string(o.tp) +
                  (o.sequence_parallel ? " SP" : "") + " VPP" + std::to_string(o.vpp_group_size) +
                  " cap " + std::to_string(o.max_tokens_per_rank) + " cp [" +
                  std::to_string(o.min_cp) + "," + std::to_string(o.max_cp) + "] n " +
                  std::to_string(count) + " " + std::string(ObjectiveName(o.objective)) + " EP" +
                  std::to_string(o.execution.expert_parallel);
  return c;
}

// Cases [first, first + cases) of one random stream: the cases before
// `first` are drawn (cheap) and not planned, so a part holds the same
// cases as when the whole range ran in one test.
void RunRandomCases(SchedulerKind kind, int first, int cases) {
  std::mt19937_64 rng(20261121 + static_cast<int>(kind));
  for (int i = 0; i < first; ++i) MakeCase(rng, kind, i);
  int planned = 0;
  for (int i = first; i < first + cases; ++i) {
    const RandomCase c = MakeCase(rng, kind, i);
    absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(c.lengths, c.options);
    if (!plan.ok()) {
      // The only refusal a valid random batch may meet: too few sequences
      // to give every rank one — VPP rounding asks for more microbatches
      // than the batch can fill, or (dynamic CP, DP×CP not a power of two,
      // a few sequences per rank) the last microbatch is left only
      // sequences too wide for its free block.
      EXPECT_THAT(std::string(plan.status().message()), HasSubstr("cannot give every one of the"))
          << c.description << ": " << plan.status();
      continue;
    }
    ++planned;
    ExpectPlanKeepsItsPromises(*plan, c.lengths, c.options, c.description);
    // The same input gives the same plan.
    absl::StatusOr<GlobalPlan> again = PlanGlobalBatch(c.lengths, c.options);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *plan) << c.description;
    ExpectGraphTimeBetweenItsBounds(*plan, c.options, c.description);
    if (kind == SchedulerKind::kDynamicCp) {
      const int64_t ranks = int64_t{c.options.dp} * c.options.cp;
      const double spent = UpgradeSpent(*plan, c.options);
      if (static_cast<int64_t>(c.lengths.size()) >= 8 * ranks) {
        // Plenty of sequences: no need to exceed the budget to give every
        // rank work.
        EXPECT_LE(spent, c.options.cp_upgrade_budget + 1e-9) << c.description;
      }
    }
    if (c.options.objective == Objective::kHybrid) {
      // Among the same candidates: never slower in Megatron's hybrid loop
      // than the plan the barrier objective keeps.
      PlannerOptions barrier = c.options;
      barrier.objective = Objective::kBarrier;
      absl::StatusOr<GlobalPlan> other = PlanGlobalBatch(c.lengths, barrier);
      ASSERT_TRUE(other.ok()) << c.description;
      EXPECT_LE(HybridStepTime(*plan, c.options.cost_model),
                HybridStepTime(*other, c.options.cost_model))
          << c.description;
    }
    if (c.options.objective == Objective::kGraph) {
      // Among the same candidates, then refined: never slower as it runs
      // than the plan the barrier objective keeps.
      PlannerOptions barrier = c.options;
      barrier.objective = Objective::kBarrier;
      absl::StatusOr<GlobalPlan> other = PlanGlobalBatch(c.lengths, barrier);
      ASSERT_TRUE(other.ok()) << c.description;
      EXPECT_LE(GraphStepTime(*plan, c.options.cost_model, c.options.execution),
                GraphStepTime(*other, c.options.cost_model, c.options.execution))
          << c.description;
    }
  }
  // Refusals must stay rare, or the test checks nothing.
  EXPECT_GE(planned, cases * 85 / 100);
}

// 1 500 random cases per planner, in parts of 125: separate tests, so that
// ctest's shards of scheduler_test (tests/CMakeLists.txt) run them side by
// side, which matters under ASan. Parts of 250 took 25 s each there, and
// the shard that drew one beside StepTimeNeverRisesWithTheCap (20 s) ran
// 45 s, the others 19–28 s.
constexpr int kCasesPerPart = 125;
class PlannerPropertyTest : public ::testing::TestWithParam<std::tuple<SchedulerKind, int>> {};

TEST_P(PlannerPropertyTest, KeepsEveryPromise) {
  const auto [kind, part] = GetParam();
  RunRandomCases(kind, part * kCasesPerPart, kCasesPerPart);
}

INSTANTIATE_TEST_SUITE_P(Parts, PlannerPropertyTest,
                         ::testing::Combine(::testing::Values(SchedulerKind::kBalanced,
                                                              SchedulerKind::kDynamicCp),
                                            ::testing::Range(0, 1500 / kCasesPerPart)),
                         [](const ::testing::TestParamInfo<PlannerPropertyTest::ParamType>& info) {
                           return absl::StrCat(std::get<0>(info.param) == SchedulerKind::kBalanced
                                                   ? "Balanced"
                                                   : "DynamicCp",
                                               "Part", std::get<1>(info.param));
                         });

PlannerOptions Options(SchedulerKind kind, int dp, int cp, int64_t cap) {
  PlannerOptions options;
  options.kind = kind;
  options.dp = dp;
  options.cp = cp;
  options.max_tokens_per_rank = cap;
  return options;
}

TEST(PlannerTest, OversizedSequenceIsNamed) {
  const std::vector<int64_t> lengths = {10, 20, 4097, 30};
  for (SchedulerKind kind : {SchedulerKind::kBalanced, SchedulerKind::kDynamicCp}) {
    PlannerOptions options = Options(kind, 2, 2, 1024);
    const absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
    ASSERT_FALSE(plan.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
    EXPECT_THAT(std::string(plan.status().message()),
                HasSubstr("sample 2 of length 4097 does not fit"));
  }
}

TEST(PlannerTest, TooFewSequencesForTheRanksIsRefused) {
  const std::vector<int64_t> lengths = {10, 20, 30};
  const absl::StatusOr<GlobalPlan> plan =
      PlanGlobalBatch(lengths, Options(SchedulerKind::kBalanced, 4, 1, 1024));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("cannot give every one of the 4 ranks"));
}

TEST(PlannerTest, DynamicCpGrowsGroupsRatherThanIdleRanks) {
  // One long sequence and one short one over 4 ranks: nothing may idle, so
  // the groups grow to cover every rank.
  const std::vector<int64_t> lengths = {1000, 10};
  const absl::StatusOr<GlobalPlan> plan =
      PlanGlobalBatch(lengths, Options(SchedulerKind::kDynamicCp, 4, 1, 512));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->num_microbatches(), 1);
  int covered = 0;
  for (const CpGroup& group : plan->microbatches[0].groups) {
    covered += group.size;
    EXPECT_FALSE(group.sequences.empty());
  }
  EXPECT_EQ(covered, 4);
}

TEST(PlannerTest, DynamicCpMergesGroupsOnlyWithinTheUpgradeBudget) {
  // Two sequences that each fill a rank: apart, the ranks' work is 100² and
  // 60²; merged into one CP-2 group each rank does (100² + 60²)/2. Merging
  // runs all tokens above their needed CP size, so only a budget of 100 %
  // allows it.
  const std::vector<int64_t> lengths = {100, 60};
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 2, 1, 100);
  options.cp_upgrade_budget = 0.05;
  const GlobalPlan apart = *PlanGlobalBatch(lengths, options);
  ASSERT_EQ(apart.num_microbatches(), 1);
  EXPECT_EQ(apart.microbatches[0].groups.size(), 2u);
  options.cp_upgrade_budget = 1.0;
  const GlobalPlan merged = *PlanGlobalBatch(lengths, options);
  ASSERT_EQ(merged.num_microbatches(), 1);
  ASSERT_EQ(merged.microbatches[0].groups.size(), 1u);
  EXPECT_EQ(merged.microbatches[0].groups[0].size, 2);
  EXPECT_EQ(merged.microbatches[0].groups[0].sequences.size(), 2u);
  const PlanStats stats = ComputePlanStats(merged, CostModel::Megatron(), 100);
  EXPECT_DOUBLE_EQ(stats.step_over_ideal, 1.0);
  EXPECT_DOUBLE_EQ(stats.cp_inflation, 2.0);
}

TEST(PlannerTest, DynamicCpMergesEveryGroupThatSharesTheMaximum) {
  // Two 100-token sequences (100² per rank) and two of 20 on 4 ranks of
  // 100. Merging one 100 with one 20 leaves the other 100 at the maximum:
  // only both merges, each into a CP-2 group of (100² + 20²)/2 = 5 200,
  // lower it. They spend every token's worth of inflation; a budget above
  // 100 % plans no lifted-anchor candidate, so the merges are the only way.
  const std::vector<int64_t> lengths = {100, 100, 20, 20};
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 4, 1, 100);
  options.cp_upgrade_budget = 1.5;
  const absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->num_microbatches(), 1);
  EXPECT_DOUBLE_EQ(StepTime(*plan, CostModel::Megatron()), 5200.0);
  ASSERT_EQ(plan->microbatches[0].groups.size(), 2u);
  for (const CpGroup& group : plan->microbatches[0].groups) {
    EXPECT_EQ(group.size, 2);
    EXPECT_EQ(group.sequences.size(), 2u);
  }
}

TEST(PlannerTest, DynamicCpLiftsASequenceThatWouldSetItsMicrobatchsTime) {
  // 8 ranks of 100. The 400-token sequence needs CP 4 (40 000 per rank),
  // the 250-token one CP 4 too (256² / 4 = 16 384), and 120 of 50 tokens
  // (2 500 each) share the rest, about 5 000 per rank and microbatch.
  // Packed side by side the two long ones make a microbatch of 40 000.
  // Lifting the 400-token one to CP 8 as it anchors its microbatch spends
  // 400 tokens of inflation, within the budget's 665 (10 % of 6 656), and
  // halves its cost: 20 000 + 16 384 + 7 · 5 000 against 40 000 + 7.5 ·
  // 5 000.
  std::vector<int64_t> lengths = {400, 250};
  lengths.insert(lengths.end(), 120, 50);
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 8, 1, 100);
  options.cp_upgrade_budget = 0.1;
  const absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int lifted_to = 0;
  for (const PlannedMicrobatch& microbatch : plan->microbatches) {
    for (const CpGroup& group : microbatch.groups) {
      for (const PlannedSequence& s : group.sequences) {
        if (s.sample == 0) lifted_to = group.size;
      }
    }
  }
  EXPECT_EQ(lifted_to, 8);
  const PlanStats stats = ComputePlanStats(*plan, CostModel::Megatron(), 100);
  EXPECT_LE(stats.cp_inflation - 1, 0.1);
  options.cp_upgrade_budget = 0;
  const PlanStats unlifted =
      ComputePlanStats(*PlanGlobalBatch(lengths, options), CostModel::Megatron(), 100);
  EXPECT_LT(stats.step_time, unlifted.step_time - 5000)
      << stats.step_time << " " << unlifted.step_time;
}

TEST(PlannerTest, BadOptionsAreRefused) {
  const std::vector<int64_t> lengths = {10, 20};
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 2, 2, 1024);
  options.max_cp = 3;
  EXPECT_THAT(std::string(PlanGlobalBatch(lengths, options).status().message()),
              HasSubstr("powers of two"));
  options = Options(SchedulerKind::kBalanced, 2, 1, 0);
  EXPECT_THAT(std::string(PlanGlobalBatch(lengths, options).status().message()),
              HasSubstr("max_tokens_per_rank"));
  options = Options(SchedulerKind::kBalanced, 2, 1, 100);
  EXPECT_THAT(std::string(PlanGlobalBatch({10, 0}, options).status().message()),
              HasSubstr("sample 1 has length 0"));
  options = Options(SchedulerKind::kBalanced, 3, 1, 100);
  options.execution.expert_parallel = 2;
  EXPECT_THAT(std::string(PlanGlobalBatch(lengths, options).status().message()),
              HasSubstr("expert parallel size 2 must be >= 1 and divide DP·CP = 3"));
  EXPECT_FALSE(ObjectiveFromName("fastest").ok());
  EXPECT_EQ(*ObjectiveFromName(""), Objective::kBarrier);
  EXPECT_EQ(*ObjectiveFromName("graph"), Objective::kGraph);
  EXPECT_FALSE(SchedulerKindFromName("greedy").ok());
  for (SchedulerKind kind :
       {SchedulerKind::kBalanced, SchedulerKind::kDynamicCp, SchedulerKind::kMegatronDpBalanced}) {
    EXPECT_EQ(*SchedulerKindFromName(SchedulerKindName(kind)), kind);
  }
}

// A heavy-tailed batch (a few sequences near the cap among many short
// ones) on 32 ranks: barrier by barrier a microbatch's heaviest group sets
// its time; as the step runs only each rank's chain of groups does, and
// the graph objective plans for that.
TEST(PlannerTest, GraphObjectiveShortensTheStepAsItRuns) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 512; ++i) {
    // Pareto: median 1 000, p99 50 000, as source files' lengths are.
    const double u = static_cast<double>(rng() % 1000000 + 1) / 1e6;
    lengths.push_back(std::min<int64_t>(65536, static_cast<int64_t>(500.0 / u)));
  }
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 32, 1, 8192);
  absl::StatusOr<GlobalPlan> barrier = PlanGlobalBatch(lengths, options);
  options.objective = Objective::kGraph;
  absl::StatusOr<GlobalPlan> graph = PlanGlobalBatch(lengths, options);
  ASSERT_TRUE(barrier.ok() && graph.ok());
  const double before = GraphStepTime(*barrier, options.cost_model);
  const double after = GraphStepTime(*graph, options.cost_model);
  EXPECT_LT(after, 0.95 * before) << after << " vs " << before;
}

TEST(PlannerTest, BalancesWorkBetterThanMegatronsDpBalanced) {
  // A fixed lognormal-like batch (deterministic): the balanced planner's
  // modelled step must be well below dp_balanced's, within a microbatch of
  // the token lower bound.
  std::mt19937_64 rng(7);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 256; ++i) {
    const int64_t r = Uniform(rng, 0, 99);
    lengths.push_back(r < 25 ? 1024 : r < 88 ? Uniform(rng, 1025, 8191) : 8192);
  }
  PlannerOptions options = Options(SchedulerKind::kBalanced, 8, 1, 8192);
  const GlobalPlan ours = *PlanGlobalBatch(lengths, options);
  options.kind = SchedulerKind::kMegatronDpBalanced;
  const GlobalPlan megatron = *PlanGlobalBatch(lengths, options);
  const PlanStats ours_stats = ComputePlanStats(ours, CostModel::Megatron(), 8192);
  const PlanStats megatron_stats = ComputePlanStats(megatron, CostModel::Megatron(), 8192);
  EXPECT_LT(ours_stats.step_over_ideal, 1.10);
  EXPECT_GT(megatron_stats.step_over_ideal, 1.30);
  EXPECT_LE(ours_stats.num_microbatches, ours_stats.microbatches_lower_bound + 1);
}

// Many short sequences can be balanced almost perfectly; the local search
// stops once within 0.1 % of the microbatches' mean per rank (an RL step of
// 1 024 rollouts over 8 ranks), and no later than that.
TEST(PlannerTest, ManyShortSequencesAreBalancedToATenthOfAPercent) {
  std::mt19937_64 rng(11);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 1024; ++i) lengths.push_back(Uniform(rng, 64, 2047));
  const PlannerOptions options = Options(SchedulerKind::kBalanced, 8, 1, 8192);
  const PlanStats stats =
      ComputePlanStats(*PlanGlobalBatch(lengths, options), CostModel::Megatron(), 8192);
  EXPECT_LE(stats.step_over_ideal, 1.001);
}

// The models a cap is tried under: s²/c, and Llama-3-8B in seconds on
// hardware whose CP exchange is cheap, as calibrated, or dear.
std::vector<CostModel> ModelsOfEveryKind() {
  const ModelShape shape = *ModelPreset("llama8b");
  Hardware cheap;
  cheap.cp_link_gbps = 400;
  cheap.cp_latency_us = 2;
  cheap.exposed_fraction = 0.05;
  cheap.microbatch_overhead_ms = 3;
  Hardware dear;
  dear.cp_link_gbps = 25;
  dear.cp_latency_us = 60;
  dear.exposed_fraction = 1;
  dear.microbatch_overhead_ms = 0.5;
  return {CostModel::Megatron(), Calibrate(shape, cheap, {}), Calibrate(shape, {}, {}),
          Calibrate(shape, dear, {})};
}

TEST(PlannerTest, StepTimeNeverRisesWithTheCap) {
  // Caps on the ladder of budgets the planner climbs and between its rungs.
  const double caps[] = {0, 0.01, 0.025, 0.04, 0.05, 0.08, 0.1, 0.3, 0.5, 0.9, 1, 1.5, 1e9};
  const std::vector<CostModel> models = ModelsOfEveryKind();
  std::mt19937_64 rng(20261129);
  int compared = 0;
  for (int i = 0; i < 48; ++i) {
    RandomCase c = MakeCase(rng, SchedulerKind::kDynamicCp, i);
    c.options.cost_model = models[static_cast<size_t>(i) % models.size()];
    if (i % 6 == 4) c.options.objective = Objective::kHybrid;  // and MakeCase's i % 6 == 1
    double last = 0;
    double last_cap = -1;
    for (const double cap : caps) {
      c.options.cp_upgrade_budget = cap;
      const absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(c.lengths, c.options);
      if (!plan.ok()) break;  // too few sequences for the ranks: as under every cap
      const double time = ObjectiveTime(*plan, c.options);
      if (last_cap >= 0) {
        EXPECT_LE(time, last * (1 + 1e-12))
            << c.description << " model " << i % models.size() << ": cap " << cap
            << " is slower than cap " << last_cap;
        ++compared;
      }
      last = time;
      last_cap = cap;
    }
  }
  EXPECT_GE(compared, 48 * 12 * 85 / 100);
}

// Megatron's hybrid-CP loop runs microbatches with the same CP groups as
// one group, so a batch whose sequences all fit one rank can run as one
// group, each rank's total evened out across its microbatches (as
// Megatron's own scheduler does): within 0.2 % of Σ W / N, below the
// barrier objective's plan in that loop, and one group. Under both
// budgets, 0.05 and a hybrid job's 1.0.
TEST(PlannerTest, TheHybridObjectiveRunsShortSequencesAsOneEvenGroup) {
  std::mt19937_64 rng(20261129);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 256; ++i) {
    const int64_t kind_of_length = Uniform(rng, 0, 9);
    lengths.push_back(kind_of_length < 7 ? Uniform(rng, 100, 1500) : Uniform(rng, 1500, 8000));
  }
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 8, 1, 8192);
  for (const double budget : {0.05, 1.0}) {
    SCOPED_TRACE(budget);
    options.cp_upgrade_budget = budget;
    options.objective = Objective::kHybrid;
    const absl::StatusOr<GlobalPlan> hybrid = PlanGlobalBatch(lengths, options);
    ASSERT_TRUE(hybrid.ok()) << hybrid.status();
    ExpectPlanKeepsItsPromises(*hybrid, lengths, options, "hybrid");
    options.objective = Objective::kBarrier;
    const absl::StatusOr<GlobalPlan> barrier = PlanGlobalBatch(lengths, options);
    ASSERT_TRUE(barrier.ok()) << barrier.status();
    double work = 0;
    for (const int64_t length : lengths) work += options.cost_model.Cost(length, 1);
    const double time = HybridStepTime(*hybrid, options.cost_model);
    EXPECT_LE(time, 1.002 * work / 8);
    EXPECT_LT(time, HybridStepTime(*barrier, options.cost_model));
    EXPECT_THAT(HybridGroupsOf(*hybrid), ::testing::Each(0));
  }
}

// The seventh global batch of 128 of the heavy-tailed family (bench/
// traces) over 8 ranks of 16 384 tokens: three sequences need 2-8 ranks,
// most hold a tenth of one, so how much CP inflation pays depends on what
// CP costs.
std::vector<int64_t> HeavyTailedBatch() {
  std::ifstream trace(std::string(PF_MADE_TRACES) + "/trace_heavy_tail.txt");
  std::vector<int64_t> lengths;
  for (int64_t length; lengths.size() < 7 * 128 && trace >> length;) lengths.push_back(length);
  if (lengths.size() == 7 * 128) lengths.erase(lengths.begin(), lengths.begin() + 6 * 128);
  return lengths;
}

TEST(PlannerTest, AModelInSecondsChoosesTheInflationThatPays) {
  const std::vector<int64_t> lengths = HeavyTailedBatch();
  ASSERT_EQ(lengths.size(), 128u);
  const std::vector<CostModel> models = ModelsOfEveryKind();
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 8, 1, 16384);
  double inflation[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(k == 0 ? "cheap CP" : "dear CP");
    options.cost_model = models[k == 0 ? 1 : 3];
    options.cp_upgrade_budget = kNoInflationCap;
    const absl::StatusOr<GlobalPlan> chosen = PlanGlobalBatch(lengths, options);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    options.cp_upgrade_budget = kDefaultCpUpgradeBudget;
    const absl::StatusOr<GlobalPlan> budgeted = PlanGlobalBatch(lengths, options);
    ASSERT_TRUE(budgeted.ok()) << budgeted.status();
    const PlanStats stats = ComputePlanStats(*chosen, options.cost_model, 16384);
    inflation[k] = stats.cp_inflation - 1;
    // 17 % (cheap) and 10 % (dear) faster than the old fixed budget.
    EXPECT_LT(stats.step_time,
              0.95 * ComputePlanStats(*budgeted, options.cost_model, 16384).step_time);
  }
  // Both spend more than the old fixed budget, as it pays; less where CP
  // is dear.
  EXPECT_GT(inflation[1], kDefaultCpUpgradeBudget);
  EXPECT_LT(inflation[1], inflation[0]);
}

}  // namespace
}  // namespace packfeed::scheduler

namespace packfeed::scheduler {
namespace {

// The graph objective refines its best few candidates, not only the best:
// how far the local search gets depends on where it starts. On the chat
// and long-document family at 512 ranks (bench/traces), refining only the
// best candidate ends near 1.12 of the ideal as the step runs; refining
// the best three and keeping the fastest, near 1.01.
TEST(PlannerTest, GraphObjectiveRefinesSeveralCandidatesAndKeepsTheFastest) {
  std::ifstream trace(std::string(PF_SOURCE_DIR) + "/bench/traces/trace_chat_longdoc.txt");
  std::vector<int64_t> lengths;
  for (int64_t length; lengths.size() < 8192 && trace >> length;) lengths.push_back(length);
  ASSERT_EQ(lengths.size(), 8192u);
  PlannerOptions options = Options(SchedulerKind::kDynamicCp, 512, 1, 4096);
  options.objective = Objective::kGraph;
  absl::StatusOr<GlobalPlan> plan = PlanGlobalBatch(lengths, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const PlanStats stats = ComputePlanStats(*plan, options.cost_model, 4096);
  EXPECT_LT(stats.graph_step_over_ideal, 1.05);
}
}  // namespace
}  // namespace packfeed::scheduler
