#include "server/internal/plan.h"

#include "absl/strings/str_cat.h"

namespace packfeed::server {

absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step) {
  StepPlan out;
  out.step = step;
  out.samples = job.sampler().GlobalBatch(step);
  std::vector<int64_t> lengths;
  lengths.reserve(out.samples.size());
  for (const scheduler::SampleRef& sample : out.samples) {
    const dataset::IndexedDataset& data = job.dataset(sample.dataset);
    // The daemon validates index entries when a step first uses them.
    absl::Status checked = data.CheckDocument(static_cast<uint64_t>(sample.index));
    if (!checked.ok()) {
      return absl::Status(checked.code(), absl::StrCat("job ", job.name(), " step ", step, ": ",
                                                       checked.message()));
    }
    lengths.push_back(dataset::PlannedLength(data.index(), sample.index, job.rules()));
  }
  absl::StatusOr<scheduler::GlobalPlan> plan =
      scheduler::PlanGlobalBatch(lengths, job.planner_options());
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("job ", job.name(), " step ", step, ": ",
                                                           plan.status().message()));
  }
  out.plan = *std::move(plan);
  return out;
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
