#ifndef PACKFEED_SERVER_PIPELINE_STEP_PLANNER_H_
#define PACKFEED_SERVER_PIPELINE_STEP_PLANNER_H_

// Plans a job's steps on a thread of its own, so that the runner thread,
// which pushes to the ranks, never stops for a plan (about 170 ms for a
// step of 16 384 ranks). The runner asks for a step; the plan comes back
// through `on_planned` (called on the planner's thread), lowest step first
// when several wait.
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/pipeline/job.h"
#include "server/pipeline/plan.h"

namespace packfeed::server {

class StepPlanner {
 public:
  // `on_planned(step, plan, time it took)`; `plan` plans a step (PlanStep
  // when empty). REQUIRES: `job` outlives this.
  using OnPlanned = std::function<void(int64_t, absl::StatusOr<StepPlan>, absl::Duration)>;
  using Plan = std::function<absl::StatusOr<StepPlan>(const Job&, int64_t)>;
  StepPlanner(const Job& job, OnPlanned on_planned, Plan plan = {});
  ~StepPlanner();  // Waits for the plan under way; drops those waiting.

  // Plans `step` unless it is waiting already.
  void Request(int64_t step);

 private:
  void Loop();

  const Job& job_;
  const OnPlanned on_planned_;
  const Plan plan_;
  absl::Mutex mutex_;
  std::set<int64_t> waiting_ ABSL_GUARDED_BY(mutex_);
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_STEP_PLANNER_H_
