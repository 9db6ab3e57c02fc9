#ifndef PACKFEED_SERVER_CTL_PLAN_REPLAY_H_
#define PACKFEED_SERVER_CTL_PLAN_REPLAY_H_

// Offline planning: replays consecutive global batches of a length trace
// through a planner and summarises the plans with the figures of
// docs/SCHEDULER.md — capacity planning before a run, and what
// bench/ prints beside Megatron-LM's own schedulers.

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/planner.h"

namespace packfeed::server::ctl {

struct ReplayOptions {
  scheduler::PlannerOptions planner;
  int64_t global_batch = 256;
  // Global batches to replay from the start of the trace; 0 = every whole
  // one it holds.
  int64_t steps = 0;
  // The calibrated model every plan is also judged by, beside s²/c (the
  // planner's own when it is calibrated). Required.
  scheduler::CostModel calibrated_model;
  bool keep_plans = false;
};

// Means over steps, except where noted.
struct ReplaySummary {
  int64_t steps = 0;
  double step_over_ideal = 0;             // under s²/c
  double step_over_ideal_full_model = 0;  // Σ max / (Σ W / N) under calibrated_model
  // Modelled step time over the ideal, under calibrated_model (plan_stats.h).
  double step_time_over_ideal_calibrated = 0;
  // The lower bound of scheduler/lower_bound.h, for plans that spend at
  // most the budget (or what this plan spent, if more) on CP inflation. NaN
  // for megatron_dp_balanced, which pads as Megatron does.
  //   lower_bound: on StepTime under the planner's own model;
  //   gap_to_bound: the plan's StepTime over it, minus 1, under the
  //   planner's model, s²/c and calibrated_model;
  //   lower_bound_over_ideal: under s²/c, over Σ_i s_i² / N.
  double lower_bound = 0;
  double gap_to_bound = 0;
  double gap_to_bound_s2 = 0;
  double gap_to_bound_calibrated = 0;
  double lower_bound_over_ideal = 0;
  // The same two under GraphStepTime (ranks meet only where the model makes
  // them, plan_stats.h) over the planner's execution graph: s²/c's makespan
  // over Σ W / N, and the calibrated step time over the same ideal.
  double graph_step_over_ideal = 0;
  double graph_step_time_over_ideal_calibrated = 0;
  double rank_sum_max_over_mean = 0;
  double microbatches_mean = 0;
  double microbatches_lower_bound_mean = 0;
  double padding_pct = 0;  // over all steps' tokens
  double schedule_ms_median = 0;
  double schedule_ms_max = 0;
  double cp_inflation = 0;
  int64_t max_tokens_on_a_rank = 0;          // over all steps
  std::map<int, int64_t> cp_size_histogram;  // summed over steps
  std::vector<scheduler::GlobalPlan> plans;  // when keep_plans
  std::vector<double> lower_bounds;          // each step's lower_bound, when keep_plans
};

// Errors: InvalidArgument for options or a trace too short for the steps,
// and any planner error, prefixed with the step.
absl::StatusOr<ReplaySummary> ReplayTrace(absl::Span<const int64_t> lengths,
                                          const ReplayOptions& options);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_PLAN_REPLAY_H_
