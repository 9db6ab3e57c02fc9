#include "server/pipeline/step_planner.h"

#include <utility>

#include "absl/time/clock.h"

namespace packfeed::server {

StepPlanner::StepPlanner(const Job& job, OnPlanned on_planned, Plan plan)
    : job_(job),
      on_planned_(std::move(on_planned)),
      plan_(plan ? std::move(plan) : Plan([](const Job& j, int64_t s) { return PlanStep(j, s); })),
      thread_(&StepPlanner::Loop, this) {}

StepPlanner::~StepPlanner() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
  }
  thread_.join();
}

void StepPlanner::Request(int64_t step) {
  absl::MutexLock lock(&mutex_);
  waiting_.insert(step);
}

void StepPlanner::Loop() {
  while (true) {
    int64_t step = 0;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(
          +[](StepPlanner* self)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->stop_ || !self->waiting_.empty(); },
          this));
      if (stop_) return;
      step = *waiting_.begin();
      waiting_.erase(waiting_.begin());
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<StepPlan> plan = plan_(job_, step);
    on_planned_(step, std::move(plan), absl::Now() - start);
  }
}

}  // namespace packfeed::server
