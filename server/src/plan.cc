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
    const dataset::SampleTable::Piece piece = job.PieceOf(sample);
    absl::Status checked = data.CheckDocument(static_cast<uint64_t>(piece.document));
    if (!checked.ok()) {
      return absl::Status(checked.code(), absl::StrCat("job ", job.name(), " step ", step, ": ",
                                                       checked.message()));
    }
    const int64_t stored = dataset::DocumentTokens(data.index(), piece.document);
    const dataset::SampleShape shape =
        dataset::ShapeOfSample(stored, job.rules(), piece.first_token);
    // (A piece of a split document leaves the rest to the next pieces.)
    const int64_t dropped =
        job.rules().split_long_documents ? 0 : stored - piece.first_token - shape.read_tokens;
    if (dropped > 0) {
      ++out.samples_truncated;
      out.tokens_truncated += dropped;
    }
    lengths.push_back(dataset::RealLength(shape.run_length, job.rules()));
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
