#include "server/pipeline/plan.h"

#include "server/pipeline/job_kind.h"

namespace packfeed::server {

absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving) {
  return job.kind().PlanStep(job, step, serving);
}

std::vector<scheduler::SampleRef> MicrobatchSamples(const StepPlan& plan, int microbatch,
                                                    int dp_cp_rank) {
  std::vector<scheduler::SampleRef> samples;
  const scheduler::CpGroup& group =
      scheduler::GroupOfRank(plan.plan.microbatches[static_cast<size_t>(microbatch)], dp_cp_rank);
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    samples.push_back(plan.samples[static_cast<size_t>(sequence.sample)]);
  }
  return samples;
}

}  // namespace packfeed::server
