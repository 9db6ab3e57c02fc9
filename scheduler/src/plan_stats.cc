#include "packfeed/scheduler/plan_stats.h"

#include <algorithm>
#include <vector>

#include "scheduler/src/meeting_runs.h"

namespace packfeed::scheduler {

int NeededCpSize(int64_t padded_length, int64_t max_tokens_per_rank, int min_cp) {
  int c = 1;
  while (c < min_cp) c *= 2;
  while ((padded_length + c - 1) / c > max_tokens_per_rank) c *= 2;
  return c;
}

namespace {

// Σ_m (max_r W + μ) and M, for StepTime and ComputePlanStats.
double WithPipeline(double sum_of_max, int microbatches, const CostModel& model) {
  if (microbatches == 0) return 0.0;
  const double total = sum_of_max + model.microbatch * microbatches;
  return total + model.bubble * total / microbatches;
}

}  // namespace

double GraphStepTime(const GlobalPlan& plan, const CostModel& model, ExecutionGraph graph) {
  const int ep = std::max(graph.expert_parallel, 1);
  std::vector<double> free_at(static_cast<size_t>(plan.dp_cp_size), 0.0);
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    for (const auto& [first, last] : MeetingRuns(microbatch, ep)) {
      const int begin = microbatch.groups[first].first_rank;
      const int end = microbatch.groups[last].first_rank + microbatch.groups[last].size;
      double start = 0.0;
      for (int r = begin; r < end; ++r) start = std::max(start, free_at[static_cast<size_t>(r)]);
      double work = 0.0;
      for (size_t g = first; g <= last; ++g) {
        double group_work = 0.0;
        for (const PlannedSequence& s : microbatch.groups[g].sequences) {
          group_work += model.Cost(s.padded_length, microbatch.groups[g].size);
        }
        work = std::max(work, group_work);
      }
      for (int r = begin; r < end; ++r) {
        free_at[static_cast<size_t>(r)] = start + work + model.microbatch;
      }
    }
  }
  const int m = plan.num_microbatches();
  if (m == 0 || free_at.empty()) return 0.0;
  const double makespan = *std::max_element(free_at.begin(), free_at.end());
  return makespan + model.bubble * makespan / m;
}

double StepTime(const GlobalPlan& plan, const CostModel& model) {
  double sum_of_max = 0.0;
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    double microbatch_max = 0.0;
    for (const CpGroup& group : microbatch.groups) {
      double work = 0.0;
      for (const PlannedSequence& s : group.sequences)
        work += model.Cost(s.padded_length, group.size);
      microbatch_max = std::max(microbatch_max, work);
    }
    sum_of_max += microbatch_max;
  }
  return WithPipeline(sum_of_max, plan.num_microbatches(), model);
}

double HybridStepTime(const GlobalPlan& plan, const CostModel& model) {
  const std::vector<int> groups = HybridGroupsOf(plan);
  const size_t ranks = static_cast<size_t>(plan.dp_cp_size);
  std::vector<std::vector<double>> rank_time;  // [group][rank]
  for (size_t m = 0; m < groups.size(); ++m) {
    const auto g = static_cast<size_t>(groups[m]);
    if (g == rank_time.size()) rank_time.emplace_back(ranks, 0.0);
    for (const CpGroup& group : plan.microbatches[m].groups) {
      double work = 0.0;
      for (const PlannedSequence& s : group.sequences) {
        work += model.Cost(s.padded_length, group.size) + model.microbatch;
      }
      for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
        rank_time[g][static_cast<size_t>(r)] += work;
      }
    }
  }
  if (rank_time.empty()) return 0.0;
  double total = 0.0;
  for (const std::vector<double>& times : rank_time) {
    total += *std::max_element(times.begin(), times.end());
  }
  return total + model.bubble * total / static_cast<double>(rank_time.size());
}

PlanStats ComputePlanStats(const GlobalPlan& plan, const CostModel& model,
                           int64_t max_tokens_per_rank, int min_cp, ExecutionGraph graph) {
  PlanStats stats;
  const int n = plan.dp_cp_size;
  stats.num_microbatches = plan.num_microbatches();
  std::vector<double> rank_sum(static_cast<size_t>(n), 0.0);
  double total = 0.0;
  double sum_of_max = 0.0;
  int64_t real = 0;
  int64_t padded = 0;
  double inflation_weighted = 0.0;
  double ideal_work = 0.0;  // Σ cost at c_needed
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    double microbatch_max = 0.0;
    for (const CpGroup& group : microbatch.groups) {
      double work = 0.0;
      int64_t tokens = 0;
      for (const PlannedSequence& s : group.sequences) {
        work += model.Cost(s.padded_length, group.size);
        tokens += s.padded_length;
        real += s.length;
        padded += s.padded_length;
        stats.cp_size_histogram[group.size] += 1;
        const int needed = NeededCpSize(s.padded_length, max_tokens_per_rank, min_cp);
        inflation_weighted +=
            static_cast<double>(s.length) * group.size / static_cast<double>(needed);
        ideal_work += model.Cost(s.padded_length, needed) * needed;
      }
      const int64_t per_rank = (tokens + group.size - 1) / group.size;
      stats.max_tokens_on_a_rank = std::max(stats.max_tokens_on_a_rank, per_rank);
      microbatch_max = std::max(microbatch_max, work);
      for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
        rank_sum[static_cast<size_t>(r)] += work;
      }
      total += work * group.size;
    }
    sum_of_max += microbatch_max;
  }
  if (total > 0) {
    stats.step_over_ideal = sum_of_max / (total / n);
    CostModel work_only = model;
    work_only.microbatch = 0;
    work_only.bubble = 0;
    stats.graph_step_over_ideal = GraphStepTime(plan, work_only, graph) / (total / n);
    const double max_rank = *std::max_element(rank_sum.begin(), rank_sum.end());
    stats.rank_sum_max_over_mean = max_rank / (total / n);
  }
  const int64_t capacity = int64_t{n} * max_tokens_per_rank;
  stats.microbatches_lower_bound = static_cast<int>((padded + capacity - 1) / capacity);
  stats.step_time = WithPipeline(sum_of_max, stats.num_microbatches, model);
  const int bound = std::max(stats.microbatches_lower_bound, 1);
  const double ideal = (bound + model.bubble) * (ideal_work / n / bound + model.microbatch);
  stats.graph_step_time = GraphStepTime(plan, model, graph);
  if (ideal > 0) {
    stats.step_time_over_ideal = stats.step_time / ideal;
    stats.graph_step_time_over_ideal = stats.graph_step_time / ideal;
  }
  if (real > 0) {
    stats.padding_pct = 100.0 * static_cast<double>(padded - real) / static_cast<double>(real);
    stats.cp_inflation = inflation_weighted / static_cast<double>(real);
  }
  return stats;
}

}  // namespace packfeed::scheduler
