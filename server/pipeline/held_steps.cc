#include "server/pipeline/held_steps.h"

#include <utility>

#include "packfeed/scheduler/plan_stats.h"
#include "server/pipeline/job_kind.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

HeldSteps::HeldSteps(const Job& job, Storage& storage, Post post, OnHeld on_held,
                     StepPlanner::Plan plan_step)
    : job_(job), storage_(storage), post_(std::move(post)), on_held_(std::move(on_held)) {
  if (job.kind().SamplesInMemory()) return;
  planner_ = std::make_unique<StepPlanner>(
      job,
      [this](int64_t step, absl::StatusOr<StepPlan> plan, absl::Duration took) {
        // std::function needs a copyable task; the plan is moved once.
        auto shared = std::make_shared<absl::StatusOr<StepPlan>>(std::move(plan));
        post_([this, step, shared, took] { OnPlanned(step, std::move(*shared), took); });
      },
      std::move(plan_step));
}

HeldSteps::~HeldSteps() {
  planner_.reset();
  steps_.clear();
}

const StepData* HeldSteps::At(int64_t step, int rank, bool urgent) {
  auto found = steps_.find(step);
  if (found != steps_.end()) {
    Entry& entry = found->second;
    if (entry.planning) {
      entry.urgent = entry.urgent || urgent;
      return nullptr;
    }
    if (entry.data != nullptr && !entry.data->failed.empty() && !entry.retried) {
      auto plan = std::make_shared<StepPlan>(entry.data->plan);
      entry.data = nullptr;
      entry.retried = true;
      StartFetch(step, entry, std::move(plan), rank, urgent);
      return nullptr;
    }
    return entry.data.get();
  }
  if (planner_ != nullptr) {
    Entry& entry = steps_[step];
    entry.generation = ++generations_;
    entry.planning = true;
    entry.rank = rank;
    entry.urgent = urgent;
    planner_->Request(step);
    return nullptr;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<StepPlan> plan = PlanStep(job_, step);
  figures_.plan_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (absl::IsUnavailable(plan.status())) return nullptr;  // not sealed yet
  if (!plan.ok()) {
    KeepPlanFailure(step, plan.status());
    return nullptr;
  }
  Entry& entry = steps_[step];
  entry.generation = ++generations_;
  entry.fetched = start;
  OnRead(
      step, entry.generation,
      std::make_shared<StepData>(AssembleIngestStep(job_, *std::move(plan), job_.local_ranks())));
  return entry.data.get();
}

std::shared_ptr<const StepData> HeldSteps::Held(int64_t step) const {
  auto found = steps_.find(step);
  return found == steps_.end() ? nullptr : found->second.data;
}

void HeldSteps::FetchAhead(int64_t from, int64_t through, int rank) {
  for (int64_t step = from; step <= through; ++step) {
    if (steps_.count(step) == 0 && failed_step_ != step) At(step, rank, step == from);
  }
}

void HeldSteps::EvictBefore(int64_t step) {
  while (!steps_.empty() && steps_.begin()->first < step) steps_.erase(steps_.begin());
}

uint64_t HeldSteps::TokenBytes() const {
  uint64_t bytes = 0;
  for (const auto& [_, entry] : steps_) {
    if (entry.data == nullptr) continue;
    for (const auto& [_, run] : entry.data->runs) bytes += run.owned_bytes();
  }
  return bytes;
}

void HeldSteps::KeepPlanFailure(int64_t step, const absl::Status& status) {
  if (failed_step_ != step) {
    spdlog::error("job {} step {}: {}", job_.name(), step, status.ToString());
    failed_step_ = step;
  }
  failure_ = status;
}

void HeldSteps::OnPlanned(int64_t step, absl::StatusOr<StepPlan> plan, absl::Duration took) {
  figures_.plan_seconds += absl::ToDoubleSeconds(took);
  auto found = steps_.find(step);
  if (found == steps_.end() || !found->second.planning) return;  // evicted since
  if (!plan.ok()) {
    steps_.erase(found);
    KeepPlanFailure(step, plan.status());
    return;
  }
  Entry& entry = found->second;
  entry.planning = false;
  StartFetch(step, entry, std::make_shared<StepPlan>(*std::move(plan)), entry.rank, entry.urgent);
}

void HeldSteps::StartFetch(int64_t step, Entry& entry, std::shared_ptr<const StepPlan> plan,
                           int rank, bool urgent) {
  StepNeeds needs = NeedsOfStep(job_, *plan, job_.local_ranks());
  entry.generation = ++generations_;
  entry.fetched = absl::Now();
  entry.pin.reset();  // the previous fetch's, when fetching again
  entry.pin = storage_.Fetch(
      {job_.name(), rank, step}, std::move(needs.needs), urgent,
      [this, step, generation = entry.generation, plan, samples = std::move(needs.samples),
       counts = std::move(needs.counts)](std::vector<FetchedSample> fetched) {
        // Assembled here, on the storage's thread; held on the owner's.
        std::shared_ptr<const StepData> data =
            std::make_shared<StepData>(AssembleStep(job_, *plan, samples, counts, fetched));
        post_([this, step, generation, data] { OnRead(step, generation, data); });
      });
}

void HeldSteps::OnRead(int64_t step, uint64_t generation, std::shared_ptr<const StepData> data) {
  auto found = steps_.find(step);
  if (found == steps_.end() || found->second.generation != generation) return;  // evicted since
  Entry& entry = found->second;
  entry.data = std::move(data);
  const StepData& ready = *entry.data;
  figures_.read_seconds += absl::ToDoubleSeconds(absl::Now() - entry.fetched);
  ++figures_.steps_held;
  figures_.samples_truncated += ready.plan.samples_truncated;
  figures_.tokens_truncated += ready.plan.tokens_truncated;
  figures_.step_over_ideal_sum +=
      scheduler::ComputePlanStats(ready.plan.plan, scheduler::CostModel::Megatron(),
                                  job_.planner_options().max_tokens_per_rank)
          .step_over_ideal;
  if (!ready.failed.empty()) {
    spdlog::error(
        "job {} step {}: {} sample(s) could not be read, the ranks that need them "
        "are ended; first: {}",
        job_.name(), step, ready.failed.size(), ready.failed.begin()->second.ToString());
  }
  if (on_held_) on_held_(step, ready);
}

}  // namespace packfeed::server
