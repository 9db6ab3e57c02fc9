#include "server/ctl/plan_replay.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/scheduler/lower_bound.h"
#include "packfeed/scheduler/plan_stats.h"

namespace packfeed::server::ctl {
namespace {

// The figures of the lower bound for one step's plan (plan_replay.h).
struct StepBound {
  double lower_bound, gap, gap_s2, gap_calibrated, over_ideal;
};

StepBound BoundFigures(absl::Span<const int64_t> batch, const scheduler::GlobalPlan& plan,
                       const ReplayOptions& options, const scheduler::PlanStats& s2_stats,
                       const scheduler::PlanStats& calibrated_stats) {
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  scheduler::PlannerOptions planner = options.planner;
  const double budget = std::max(planner.cp_upgrade_budget, scheduler::UpgradeSpent(plan, planner));
  const auto bound = [&](const scheduler::CostModel& model) {
    planner.cost_model = model;
    return scheduler::LowerBoundStepTime(batch, planner, budget);
  };
  const absl::StatusOr<scheduler::StepTimeBound> s2 = bound(scheduler::CostModel::Megatron());
  const absl::StatusOr<scheduler::StepTimeBound> calibrated = bound(options.calibrated_model);
  // The planner's own model is usually one of those two.
  const scheduler::CostModel& model = options.planner.cost_model;
  const absl::StatusOr<scheduler::StepTimeBound> own =
      model == scheduler::CostModel::Megatron() ? s2
      : model == options.calibrated_model       ? calibrated
                                                : bound(model);
  if (!own.ok() || !s2.ok() || !calibrated.ok()) return {kNone, kNone, kNone, kNone, kNone};
  return {own->step_time,
          scheduler::StepTime(plan, options.planner.cost_model) / own->step_time - 1,
          s2_stats.step_time / s2->step_time - 1,
          calibrated_stats.step_time / calibrated->step_time - 1, s2->sum_of_max / s2->ideal};
}

}  // namespace

absl::StatusOr<ReplaySummary> ReplayTrace(absl::Span<const int64_t> lengths,
                                          const ReplayOptions& options) {
  if (options.global_batch < 1 || options.steps < 0) {
    return absl::InvalidArgumentError("global batch must be >= 1 and steps >= 0");
  }
  const int64_t available = static_cast<int64_t>(lengths.size()) / options.global_batch;
  if (available == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the trace holds ", lengths.size(),
                                                   " lengths, fewer than one global batch of ",
                                                   options.global_batch));
  }
  const int64_t steps = options.steps > 0 ? options.steps : available;
  if (steps > available) {
    return absl::InvalidArgumentError(absl::StrCat("the trace holds ", available,
                                                   " global batches of ", options.global_batch,
                                                   "; asked for ", steps));
  }
  scheduler::CpRange range{options.planner.cp, options.planner.cp};
  if (options.planner.kind == scheduler::SchedulerKind::kDynamicCp) {
    absl::StatusOr<scheduler::CpRange> resolved = scheduler::ResolveCpRange(options.planner);
    if (!resolved.ok()) return resolved.status();
    range = *resolved;
  }
  const int64_t cap = options.planner.max_tokens_per_rank;
  const scheduler::CostModel s2 = scheduler::CostModel::Megatron();

  ReplaySummary summary;
  summary.steps = steps;
  std::vector<double> millis;
  int64_t real = 0;
  int64_t padded = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const absl::Span<const int64_t> batch =
        lengths.subspan(static_cast<size_t>(step * options.global_batch),
                        static_cast<size_t>(options.global_batch));
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<scheduler::GlobalPlan> plan = scheduler::PlanGlobalBatch(batch, options.planner);
    millis.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrCat("step ", step, ": ", plan.status().message()));
    }
    const scheduler::ExecutionGraph graph = options.planner.execution;
    const scheduler::PlanStats stats =
        scheduler::ComputePlanStats(*plan, s2, cap, range.min, graph);
    summary.step_over_ideal += stats.step_over_ideal;
    summary.graph_step_over_ideal += stats.graph_step_over_ideal;
    const scheduler::PlanStats calibrated =
        scheduler::ComputePlanStats(*plan, options.calibrated_model, cap, range.min, graph);
    summary.graph_step_time_over_ideal_calibrated += calibrated.graph_step_time_over_ideal;
    summary.step_over_ideal_full_model += calibrated.step_over_ideal;
    summary.step_time_over_ideal_calibrated += calibrated.step_time_over_ideal;
    const StepBound bound = BoundFigures(batch, *plan, options, stats, calibrated);
    summary.lower_bound += bound.lower_bound;
    summary.gap_to_bound += bound.gap;
    summary.gap_to_bound_s2 += bound.gap_s2;
    summary.gap_to_bound_calibrated += bound.gap_calibrated;
    summary.lower_bound_over_ideal += bound.over_ideal;
    summary.rank_sum_max_over_mean += stats.rank_sum_max_over_mean;
    summary.microbatches_mean += stats.num_microbatches;
    summary.microbatches_lower_bound_mean += stats.microbatches_lower_bound;
    summary.cp_inflation += stats.cp_inflation;
    summary.max_tokens_on_a_rank =
        std::max(summary.max_tokens_on_a_rank, stats.max_tokens_on_a_rank);
    for (auto [c, count] : stats.cp_size_histogram) {
      summary.cp_size_histogram[c] += count;
    }
    real += plan->flops.real_sum;
    padded += plan->flops.padded_sum;
    if (options.keep_plans) {
      summary.plans.push_back(*std::move(plan));
      summary.lower_bounds.push_back(bound.lower_bound);
    }
  }
  const double n = static_cast<double>(steps);
  for (double* mean :
       {&summary.step_over_ideal, &summary.step_over_ideal_full_model,
        &summary.step_time_over_ideal_calibrated, &summary.lower_bound, &summary.gap_to_bound,
        &summary.gap_to_bound_s2, &summary.gap_to_bound_calibrated, &summary.lower_bound_over_ideal,
        &summary.graph_step_over_ideal, &summary.graph_step_time_over_ideal_calibrated,
        &summary.rank_sum_max_over_mean, &summary.microbatches_mean,
        &summary.microbatches_lower_bound_mean, &summary.cp_inflation}) {
    *mean /= n;
  }
  summary.padding_pct = 100.0 * static_cast<double>(padded - real) / static_cast<double>(real);
  std::sort(millis.begin(), millis.end());
  summary.schedule_ms_median = millis[millis.size() / 2];
  summary.schedule_ms_max = millis.back();
  return summary;
}

}  // namespace packfeed::server::ctl
