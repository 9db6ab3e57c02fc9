// A job of documents: the sampler's global batch of stored documents (or
// pieces of split ones), planned by the scheduler, each read whole and
// served under the sample rules (EOD, truncation).

#include "packfeed/common/status_macros.h"
#include "server/pipeline/job_kinds.h"

namespace packfeed::server {
namespace {

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

class Documents final : public JobKind {
 public:
  absl::string_view name() const override { return "documents"; }

  absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving) const override {
    return PlanBatch(job, step, serving, [&](StepPlan& out, std::vector<int64_t>& lengths) {
      return StoredBatch(job, out, lengths);
    });
  }

  void AddNeeds(const Job& job, const StepPlan& plan, int64_t sample,
                StepNeeds& out) const override {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(sample)];
    const dataset::IndexedDataset& data = job.dataset(ref.dataset);
    const dataset::SampleShape shape = job.ShapeOf(ref);
    const int64_t document = job.PieceOf(ref).document;
    const auto first = static_cast<uint64_t>(shape.first_token);
    const auto read = static_cast<uint64_t>(shape.read_tokens);
    const uint64_t token_bytes = DTypeSize(data.dtype());
    out.samples.push_back(sample);
    out.needs.push_back({&data, document, ref.epoch, first * token_bytes, read * token_bytes});
    out.counts.push_back(1);
  }

  void AddRuns(const Job& job, const StepPlan& plan, int64_t sample, const absl::Status& read,
               std::vector<int64_t> tokens, StepData& data) const override {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(sample)];
    if (!read.ok()) {
      data.failed.emplace(sample, FailedRead(job, ref, "document", read));
      return;
    }
    data.runs.emplace(sample,
                      TokenRun(dataset::MakeTokenRun(tokens, job.ShapeOf(ref), job.rules())));
  }

  absl::Status Open(Job& job, const DatasetOpener& open,
                    std::string& datasets_part) const override {
    return OpenDatasets(job, open, datasets_part);
  }

  absl::Status CheckServable(const Job& job) const override { return CheckEverySampleFits(job); }
};

}  // namespace

const JobKind& DocumentsKind() {
  static const Documents kind;
  return kind;
}

}  // namespace packfeed::server
