#ifndef PACKFEED_SCHEDULER_PLAN_STATS_H_
#define PACKFEED_SCHEDULER_PLAN_STATS_H_

// Figures that judge a plan (definitions in docs/SCHEDULER.md):
//   W[m][r]       = Σ over the sequences rank r holds in microbatch m of
//                   cost(padded, c) (the cost model divides by c)
//   step/ideal    = Σ_m max_r W[m][r] / (Σ W / N)
//   rank-sum      = max_r Σ_m W / mean_r Σ_m W
//   M lower bound = ⌈Σ padded / (N · max tokens per rank)⌉
//   padding %     = (Σ padded − Σ real) / Σ real · 100
//   CP inflation  = token-weighted mean of c / c_needed, c_needed = the
//                   smallest power of two ≥ min CP with ⌈padded/c⌉ ≤ cap
//   step time     = Σ_m (max_r W[m][r] + μ) + bubble · mean_m (max_r W + μ)
//   graph step time: the makespan when ranks meet only where the model
//                   makes them (GraphStepTime), with the same μ and bubble
//   step time / ideal: over the same with every sequence at c_needed,
//                   perfect balance and the M lower bound:
//                   ideal = (LB + bubble) · (Σ_i cost(s_i, c_needed) / N / LB + μ)

#include <cstdint>
#include <map>

#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

struct PlanStats {
  double step_over_ideal = 1.0;
  // The same under GraphStepTime: the makespan of W alone over Σ W / N.
  double graph_step_over_ideal = 1.0;
  double rank_sum_max_over_mean = 1.0;
  int num_microbatches = 0;
  int microbatches_lower_bound = 0;
  double padding_pct = 0.0;
  double cp_inflation = 1.0;
  int64_t max_tokens_on_a_rank = 0;          // per microbatch, after the CP split
  std::map<int, int64_t> cp_size_histogram;  // c → sequences run at c
  double step_time = 0.0;                    // in the model's unit (seconds when calibrated)
  double step_time_over_ideal = 1.0;
  double graph_step_time = 0.0;  // GraphStepTime
  double graph_step_time_over_ideal = 1.0;
};

// Where ranks meet besides their CP group. With expert parallelism each
// aligned block of `expert_parallel` dp-cp ranks exchanges tokens
// (all-to-all) in every MoE layer of every microbatch; 1 = no EP.
struct ExecutionGraph {
  int expert_parallel = 1;
};

// REQUIRES: max_tokens_per_rank >= 1, min_cp >= 1, a well-formed plan,
// expert_parallel a divisor of plan.dp_cp_size.
PlanStats ComputePlanStats(const GlobalPlan& plan, const CostModel& model,
                           int64_t max_tokens_per_rank, int min_cp = 1, ExecutionGraph graph = {});

// Σ_m (max_r W[m][r] + μ) + bubble · mean_m (max_r W[m][r] + μ): what the
// planners minimise.
double StepTime(const GlobalPlan& plan, const CostModel& model);

// The step as it runs, not barrier by barrier. A rank runs its microbatches
// in order; a CP group's ranks run its sequences together (ring attention:
// every layer needs all of them), so the group starts when its last rank is
// free and holds them all for its W + μ; ranks of one EP block also move
// together (their all-to-alls), at the slowest group's pace. Nothing else
// waits until the gradient reduction, where every rank meets: the step is
// the latest rank's finish, plus the bubble's share (bubble · makespan / M,
// as StepTime adds it). It lies between max_r Σ_m W and StepTime; with
// fixed CP groups and no EP it is the heaviest group's total.
double GraphStepTime(const GlobalPlan& plan, const CostModel& model, ExecutionGraph graph = {});

// The step as Megatron's hybrid-CP loop runs the plan: the microbatches of
// one HybridGroupsOf group run as one group, a barrier over every rank
// after it, and each sequence is its own forward (μ each). Σ over groups of
// the slowest rank's Σ (W + μ), plus the bubble's share per group. Never
// more than StepTime with μ per sequence instead of per microbatch.
double HybridStepTime(const GlobalPlan& plan, const CostModel& model);

// The smallest power of two c ≥ min_cp with ⌈padded/c⌉ ≤ max_tokens_per_rank.
int NeededCpSize(int64_t padded_length, int64_t max_tokens_per_rank, int min_cp);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_PLAN_STATS_H_
