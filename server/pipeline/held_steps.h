#ifndef PACKFEED_SERVER_PIPELINE_HELD_STEPS_H_
#define PACKFEED_SERVER_PIPELINE_HELD_STEPS_H_

// The steps a job's runner holds, from plan to eviction:
//
//   At(step) ─▶ plan ─▶ fetch ─▶ held ─▶ EvictBefore
//
// A dataset job's step is planned on the StepPlanner's thread (a plan of
// 16 384 ranks takes about 170 ms, which the runner's thread must not
// wait for), then its samples are fetched through the node's Storage,
// each once for every local rank, and assembled on the storage's thread.
// An ingest job's samples are in memory already: its step is planned and
// held at once, or not yet (not sealed: Unavailable, the seal wakes the
// runner). A step's samples stay pinned in the storage while it is held.
//
// Completions (a plan, a fetch) come back through `post`, which must run
// them on the owner's thread; every other call is made on that thread.
// Not thread-safe otherwise.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/pipeline/job.h"
#include "server/pipeline/read.h"
#include "server/pipeline/step_planner.h"
#include "server/storage/storage.h"

namespace packfeed::server {

class HeldSteps {
 public:
  // Runs a task on the owner's thread, or drops it once the owner stops.
  using Post = std::function<void(std::function<void()>)>;
  // A step's samples are held (some may have failed: StepData::failed).
  using OnHeld = std::function<void(int64_t step, const StepData&)>;

  // `plan_step` plans a dataset job's step (PlanStep when empty).
  // REQUIRES: `job` and `storage` outlive this; `post` stays callable
  // until this is destroyed.
  HeldSteps(const Job& job, Storage& storage, Post post, OnHeld on_held,
            StepPlanner::Plan plan_step = {});
  // Stops the planner, then unpins every step (waiting for the reads under
  // way, whose completions `post` must drop).
  ~HeldSteps();
  HeldSteps(const HeldSteps&) = delete;
  HeldSteps& operator=(const HeldSteps&) = delete;

  // The step's samples once held; nullptr while it is planned or fetched
  // (which begins here, for `rank`: the storage's budget favours `urgent`
  // reads, those a rank waits for now) and when its plan failed (then
  // failed_step() is `step`). A step held with failed samples is fetched
  // once more when next asked for (a failure read ahead may be stale: an
  // NFS server back since); what fails then is served as failed.
  const StepData* At(int64_t step, int rank, bool urgent);
  // The step's samples when held, without beginning anything.
  std::shared_ptr<const StepData> Held(int64_t step) const;
  // Begins each step of [from, through] not held, planned or failed, for
  // `rank`; `from` is urgent.
  void FetchAhead(int64_t from, int64_t through, int rank);
  // Drops every step before `step` (a plan or read under way is dropped
  // when it comes back).
  void EvictBefore(int64_t step);

  // The step whose plan failed last (-1: none), and why. A failed step is
  // planned again when next asked for; its failure is logged once.
  int64_t failed_step() const { return failed_step_; }
  const absl::Status& failure() const { return failure_; }

  struct Figures {
    int64_t steps_held = 0;  // planned and fetched, over the job's life
    int64_t samples_truncated = 0;
    int64_t tokens_truncated = 0;
    double plan_seconds = 0;
    double read_seconds = 0;
    double step_over_ideal_sum = 0;  // over steps_held
  };
  const Figures& figures() const { return figures_; }
  // The token bytes the held steps own (not views of ingested samples).
  uint64_t TokenBytes() const;

 private:
  struct Entry {
    uint64_t generation = 0;
    // Waiting for its plan, for `rank`'s need, urgent or not.
    bool planning = false;
    int rank = 0;
    bool urgent = false;
    absl::Time fetched;
    std::unique_ptr<FetchPin> pin;
    std::shared_ptr<const StepData> data;  // once every sample is held
    bool retried = false;                  // fetched again after a failure
  };

  void OnPlanned(int64_t step, absl::StatusOr<StepPlan> plan, absl::Duration took);
  void StartFetch(int64_t step, Entry& entry, std::shared_ptr<const StepPlan> plan, int rank,
                  bool urgent);
  void OnRead(int64_t step, uint64_t generation, std::shared_ptr<const StepData> data);
  void KeepPlanFailure(int64_t step, const absl::Status& status);

  const Job& job_;
  Storage& storage_;
  const Post post_;
  const OnHeld on_held_;
  std::map<int64_t, Entry> steps_;
  uint64_t generations_ = 0;
  int64_t failed_step_ = -1;
  absl::Status failure_;
  Figures figures_;
  // A dataset job's; declared last, so destroyed first (its last plan
  // posts into this object).
  std::unique_ptr<StepPlanner> planner_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_HELD_STEPS_H_
