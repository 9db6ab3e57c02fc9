#ifndef PACKFEED_SERVER_PIPELINE_PLAN_H_
#define PACKFEED_SERVER_PIPELINE_PLAN_H_

// Phase 1 of a step (docs/ARCHITECTURE.md): the sampler's global batch and
// the scheduler's plan of it. Pure: a function of the job's configuration
// and the step, equal on every node.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/sampler.h"
#include "packfeed/scheduler/thd_partition.h"
#include "server/pipeline/job.h"

namespace packfeed::server {

// The plan of one step, and which stored sample each planned one is.
struct StepPlan {
  int64_t step = 0;
  scheduler::GlobalPlan plan;
  std::vector<scheduler::SampleRef> samples;  // by PlannedSequence::sample
  // Hybrid CP (Pretraining.hybrid_context_parallel): planned sequence i is
  // the input positions [begin, end) of the Megatron sample samples[i], one
  // of its document pieces (Megatron's sub-sample with gid i); a sample's
  // pieces are neighbours. Empty for every other job.
  std::vector<scheduler::TokenRange> pieces;
  // Hybrid CP: per microbatch, the group Megatron's loop runs it in
  // (scheduler::HybridGroupsOf). Empty for every other job.
  std::vector<int> hybrid_groups;
  // An ingest job's sealed step, whose samples `samples` index.
  std::shared_ptr<const SealedStep> ingested;
  // Samples cut to seq_length (LONG_DOCUMENTS_TRUNCATE), and their tokens
  // not served.
  int64_t samples_truncated = 0;
  int64_t tokens_truncated = 0;
  // The learned cost model's version the step was planned by (0: the
  // configured model; scheduler.learn_cost_model).
  uint32_t cost_model_version = 0;
};

// Samples and plan of `step` (>= 0). Errors are the planner's or a corrupt
// index entry's (DataLoss naming the file), naming the job and step; for
// an ingest job, Unavailable while the step is not sealed and NotFound once
// it was freed.
// `serving`: a plan this node serves, or decides what it serves by: a job
// that learns its cost model then adopts no version that would have planned
// `step` otherwise (Job::PlannerOptionsFor). False for a look at a plan
// (the admin API's GetPlan). Each kind of job plans its own way (job_kind.h).
absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving = true);
// The plan of an ingest job's sealed step (held by the stream or not;
// kind_ingest.cc).
absl::StatusOr<StepPlan> PlanSealedStep(const Job& job, std::shared_ptr<const SealedStep> sealed,
                                        bool serving = true);

// The samples dp-cp rank `dp_cp_rank` processes in `microbatch` of `plan`
// (its CP group's sequences), in order.
std::vector<scheduler::SampleRef> MicrobatchSamples(const StepPlan& plan, int microbatch,
                                                    int dp_cp_rank);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_PLAN_H_
