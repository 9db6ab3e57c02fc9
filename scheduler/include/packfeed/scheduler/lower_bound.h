#ifndef PACKFEED_SCHEDULER_LOWER_BOUND_H_
#define PACKFEED_SCHEDULER_LOWER_BOUND_H_

// A lower bound on the step time of every plan of a batch, at full size
// (docs/SCHEDULER.md, "How far from the best"). It covers every plan the
// rules of planner.h allow (balanced and dynamic_cp padding, the per-rank
// cap, the CP range, any number of microbatches) that spends at most
// `upgrade_budget` on CP inflation, counted as the planners count it:
// Σ padded(c)·(c/own − 1) ≤ budget · Σ padded(c), own the smallest CP size a
// sequence fits.
//
// The argument, for microbatches ordered by their time T_1 ≥ T_2 ≥ …:
//  - floors: a sequence's microbatch lasts at least its per-rank cost at its
//    own CP size, unless the budget buys it a larger one. The sequences
//    whose floor is ≥ τ and that the budget cannot lift below τ (a
//    fractional knapsack) hold R(τ) tokens, so ⌈R(τ) / (N·cap)⌉
//    microbatches last ≥ τ: T_j ≥ g_j, the largest τ with R(τ) > (j−1)·N·cap;
//  - work: the k longest microbatches hold at most k·N·cap tokens, so at
//    most D(k·N·cap) work, the densest tokens' (work per token, greedy);
//    the rest of the work W needs Σ_{j>k} T_j ≥ (W − D(k·N·cap)) / N.
// So Σ_m T_m ≥ max(W / N, max_k Σ_{j≤k} g_j + (W − D(k·N·cap)) / N). It
// drops what ties a sequence's tokens to one CP group, so it can be loose
// where many mid-length sequences share microbatches; it never exceeds the
// optimum (tests/integration/scheduler_optimality_test.py checks it against
// the exact MILP).

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/planner.h"

namespace packfeed::scheduler {

struct StepTimeBound {
  double sum_of_max = 0;  // ≤ Σ_m max_r W[m][r] of every plan
  double step_time = 0;   // ≤ StepTime (μ and bubble) of every plan
  double ideal = 0;       // Σ_i min_c c·cost(s_i, c) / N: perfect balance
};

// The bound under options.cost_model. InvalidArgument for what
// PlanGlobalBatch refuses (bad options, a sequence that fits no CP size, an
// empty batch) and for megatron_dp_balanced, whose padding is Megatron's.
absl::StatusOr<StepTimeBound> LowerBoundStepTime(absl::Span<const int64_t> lengths,
                                                 const PlannerOptions& options,
                                                 double upgrade_budget);

// What `plan` spent on CP inflation, as LowerBoundStepTime counts it (0 for
// a plan of one CP size). A plan may exceed options.cp_upgrade_budget where
// giving every rank work needs it; the bound for that plan takes the larger.
double UpgradeSpent(const GlobalPlan& plan, const PlannerOptions& options);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_LOWER_BOUND_H_
