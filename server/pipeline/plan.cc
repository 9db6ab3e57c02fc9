#include "server/pipeline/plan.h"

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::server {

namespace {

absl::Status InStep(const Job& job, int64_t step, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("job ", job.name(), " step ", step, ": ", status.message()));
}

// A sealed step's samples, served whole, in the step's order; epoch = step
// (what the ledger's per-epoch shares count).
void IngestBatch(const Job& job, const SealedStep& sealed, StepPlan& out,
                 std::vector<int64_t>& lengths) {
  for (size_t i = 0; i < sealed.samples.size(); ++i) {
    const auto tokens = static_cast<int64_t>(sealed.samples[i].num_tokens);
    const dataset::SampleShape shape = dataset::ShapeOfSample(tokens, job.rules());
    out.samples.push_back({0, static_cast<int64_t>(i), sealed.step});
    lengths.push_back(dataset::RealLength(shape.run_length, job.rules()));
  }
}

// The sampler's batch, each sample's index entry checked when a step first
// uses it.
absl::Status StoredBatch(const Job& job, StepPlan& out, std::vector<int64_t>& lengths) {
  out.samples = job.sampler().GlobalBatch(out.step);
  lengths.reserve(out.samples.size());
  for (const scheduler::SampleRef& sample : out.samples) {
    const dataset::IndexedDataset& data = job.dataset(sample.dataset);
    const dataset::SampleTable::Piece piece = job.PieceOf(sample);
    PF_RETURN_IF_ERROR(data.CheckDocument(static_cast<uint64_t>(piece.document)));
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
  return absl::OkStatus();
}

absl::Status Schedule(const Job& job, const std::vector<int64_t>& lengths, StepPlan& out) {
  absl::StatusOr<scheduler::GlobalPlan> plan =
      scheduler::PlanGlobalBatch(lengths, job.planner_options());
  if (!plan.ok()) return InStep(job, out.step, plan.status());
  out.plan = *std::move(plan);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step) {
  if (job.ingest() != nullptr) {
    absl::StatusOr<std::shared_ptr<const SealedStep>> sealed = job.ingest()->Sealed(step);
    if (!sealed.ok()) return InStep(job, step, sealed.status());
    return PlanSealedStep(job, *std::move(sealed));
  }
  StepPlan out;
  out.step = step;
  std::vector<int64_t> lengths;
  if (absl::Status stored = StoredBatch(job, out, lengths); !stored.ok()) {
    return InStep(job, step, stored);
  }
  PF_RETURN_IF_ERROR(Schedule(job, lengths, out));
  return out;
}

absl::StatusOr<StepPlan> PlanSealedStep(const Job& job, std::shared_ptr<const SealedStep> sealed) {
  StepPlan out;
  out.step = sealed->step;
  out.ingested = std::move(sealed);
  std::vector<int64_t> lengths;
  IngestBatch(job, *out.ingested, out, lengths);
  PF_RETURN_IF_ERROR(Schedule(job, lengths, out));
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
