// The runner's held steps: planned on the planner's thread, fetched through
// the storage, kept while some local rank still needs them, evicted after.

#include <algorithm>

#include "packfeed/scheduler/plan_stats.h"
#include "server/pipeline/job_runner.h"
#include "server/pipeline/job_runner_state.h"
#include "server/pipeline/push.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

bool JobRunner::AwaitingRanks() const {
  return ranks_.size() < job_.local_ranks().size() && first_start_.has_value() &&
         absl::Now() - first_attach_ < kAttachGrace;
}

void JobRunner::Evict() {
  int64_t keep_from = SlowestStep();
  // Ranks attach over a few seconds; the first ones are pushed steps ahead
  // before the last arrive. Keep what those will need (from where the first
  // rank began) for a while, so that a staggered start reads nothing twice.
  if (AwaitingRanks()) keep_from = std::min(keep_from, *first_start_);
  while (!steps_.empty() && steps_.begin()->first < keep_from) steps_.erase(steps_.begin());
}

const StepData* JobRunner::StepAt(int64_t step, int rank, bool urgent) {
  auto found = steps_.find(step);
  if (found != steps_.end()) {
    HeldStep& held = found->second;
    if (held.planning) {
      held.urgent = held.urgent || urgent;
      return nullptr;
    }
    // A failure read ahead may be stale (an NFS server back since, a
    // transient EIO): a rank is told only once a fetch made for it fails.
    if (held.data != nullptr && !held.data->failed.empty() && !held.retried) {
      auto plan = std::make_shared<StepPlan>(held.data->plan);
      held.data = nullptr;
      held.retried = true;
      StartFetch(step, held, std::move(plan), rank, urgent);
      return nullptr;
    }
    return held.data.get();
  }
  if (planner_ != nullptr) {
    HeldStep& planned = steps_[step];
    planned.generation = ++fetches_;
    planned.planning = true;
    planned.rank = rank;
    planned.urgent = urgent;
    planner_->Request(step);
    return nullptr;
  }
  // An ingest job's step: its samples are in memory already, so it is
  // planned here and served at once.
  const absl::Time start = absl::Now();
  absl::StatusOr<StepPlan> plan = PlanStep(job_, step);
  plan_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  // Not sealed yet: the seal wakes this runner.
  if (absl::IsUnavailable(plan.status())) return nullptr;
  if (!plan.ok()) {
    KeepPlanFailure(step, plan.status());
    return nullptr;
  }
  HeldStep& held = steps_[step];
  held.generation = ++fetches_;
  held.fetched = start;
  OnStepRead(
      step, held.generation,
      std::make_shared<StepData>(AssembleIngestStep(job_, *std::move(plan), job_.local_ranks())));
  return held.data.get();
}

void JobRunner::KeepPlanFailure(int64_t step, const absl::Status& status) {
  if (failed_step_ != step) {
    spdlog::error("job {} step {}: {}", job_.name(), step, status.ToString());
    failed_step_ = step;
  }
  failure_ = status;
}

void JobRunner::OnStepPlanned(int64_t step, absl::StatusOr<StepPlan> plan, absl::Duration took) {
  plan_seconds_ += absl::ToDoubleSeconds(took);
  auto held = steps_.find(step);
  if (held == steps_.end() || !held->second.planning) return;  // evicted since
  if (!plan.ok()) {
    // Planned again when a rank next needs the step.
    steps_.erase(held);
    KeepPlanFailure(step, plan.status());
    return;
  }
  held->second.planning = false;
  StartFetch(step, held->second, std::make_shared<StepPlan>(*std::move(plan)), held->second.rank,
             held->second.urgent);
}

void JobRunner::StartFetch(int64_t step, HeldStep& held, std::shared_ptr<const StepPlan> plan,
                           int rank, bool urgent) {
  StepNeeds needs = NeedsOfStep(job_, *plan, job_.local_ranks());
  held.generation = ++fetches_;
  held.fetched = absl::Now();
  held.pin.reset();  // the previous fetch's, when fetching again
  // Assembled on the storage's thread, handed to this one.
  held.pin = storage_.Fetch(
      {job_.name(), rank, step}, std::move(needs.needs), urgent,
      [this, step, generation = held.generation, plan, samples = std::move(needs.samples),
       counts = std::move(needs.counts)](std::vector<FetchedSample> fetched) {
        std::shared_ptr<const StepData> data =
            std::make_shared<StepData>(AssembleStep(job_, *plan, samples, counts, fetched));
        Post([this, step, generation, data] { OnStepRead(step, generation, data); });
      });
}

void JobRunner::OnStepRead(int64_t step, uint64_t generation,
                           std::shared_ptr<const StepData> data) {
  auto held = steps_.find(step);
  if (held == steps_.end() || held->second.generation != generation) return;  // evicted since
  held->second.data = std::move(data);
  const StepData& ready = *held->second.data;
  read_seconds_ += absl::ToDoubleSeconds(absl::Now() - held->second.fetched);
  ++steps_planned_;
  cost_learner_.Planned(step, ready.plan.plan);
  samples_truncated_ += ready.plan.samples_truncated;
  tokens_truncated_ += ready.plan.tokens_truncated;
  step_over_ideal_sum_ +=
      scheduler::ComputePlanStats(ready.plan.plan, scheduler::CostModel::Megatron(),
                                  job_.planner_options().max_tokens_per_rank)
          .step_over_ideal;
  if (!ready.failed.empty()) {
    spdlog::error(
        "job {} step {}: {} sample(s) could not be read, the ranks that need them "
        "are ended; first: {}",
        job_.name(), step, ready.failed.size(), ready.failed.begin()->second.ToString());
  }
}

void JobRunner::FetchAhead() {
  const int64_t slowest = SlowestStep();
  if (slowest == INT64_MAX) return;
  const int rank = SlowestRank();
  for (int64_t step = slowest; step <= slowest + options_.prefetch_steps; ++step) {
    if (steps_.count(step) == 0 && failed_step_ != step) StepAt(step, rank, step == slowest);
  }
}

}  // namespace packfeed::server
