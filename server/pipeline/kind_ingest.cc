// An ingest job: the samples a driver put for a step (its sealed step, in
// the step's order), planned by the scheduler and served whole under the
// sample rules from the stream's memory (read.h's AssembleIngestStep: never
// through the Storage).

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "server/pipeline/job_kinds.h"

namespace packfeed::server {
namespace {

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

class Ingest final : public JobKind {
 public:
  absl::string_view name() const override { return "ingest"; }

  absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving) const override {
    absl::StatusOr<std::shared_ptr<const SealedStep>> sealed = job.ingest()->Sealed(step);
    if (!sealed.ok()) return InStep(job, step, sealed.status());
    return PlanSealedStep(job, *std::move(sealed), serving);
  }

  // Not read through the Storage: nothing to add.
  void AddNeeds(const Job&, const StepPlan&, int64_t, StepNeeds&) const override {}

  void AddRuns(const Job&, const StepPlan& plan, int64_t sample, const absl::Status&,
               std::vector<int64_t>, StepData& data) const override {
    data.failed.emplace(sample, absl::InternalError(absl::StrCat(
                                    "ingested sample ", sample, " of step ", plan.step,
                                    " was assembled as a stored one (AssembleIngestStep serves "
                                    "an ingest job's steps)")));
  }

  // The stream's fields stand for datasets; each sample is checked as it
  // is put (no CheckServable).
  absl::Status Open(Job& job, const DatasetOpener&, std::string& datasets_part) const override {
    return FindIngestFields(job, datasets_part);
  }

  bool SamplesInMemory() const override { return true; }

  void Connect(const Job& job, std::function<void()> wake) const override {
    job.ingest()->AddConsumer(IngestConsumerOf(job), std::move(wake));
  }

  void Consumed(const Job& job, int64_t before) const override {
    job.ingest()->Consumed(job.name(), before);
  }
};

}  // namespace

const JobKind& IngestKind() {
  static const Ingest kind;
  return kind;
}

absl::StatusOr<StepPlan> PlanSealedStep(const Job& job, std::shared_ptr<const SealedStep> sealed,
                                        bool serving) {
  const int64_t step = sealed->step;
  return PlanBatch(job, step, serving, [&](StepPlan& out, std::vector<int64_t>& lengths) {
    out.ingested = std::move(sealed);
    IngestBatch(job, *out.ingested, out, lengths);
    return absl::OkStatus();
  });
}

}  // namespace packfeed::server
