#ifndef PACKFEED_SERVER_PIPELINE_JOB_H_
#define PACKFEED_SERVER_PIPELINE_JOB_H_

// One training job as the daemon serves it: its configuration, layout,
// open datasets, sampler, planner options, sample rules and fingerprint.
// The phases of a step (plan.h, read.h, pack.h, push.h) take it as input.
// Immutable after Create; every const method is thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/dataset/pretraining_indices.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/scheduler/sampler.h"
#include "server/config/job_spec.h"
#include "server/ingest/ingest_stream.h"
#include "server/pipeline/cost_versions.h"

namespace packfeed::server {

class JobKind;  // job_kind.h

// Opens a dataset by prefix; the daemon's shares one open dataset among
// every job on the same files (Storage::Open).
using DatasetOpener = std::function<absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>>(
    const std::string& prefix)>;

// Opens `prefix` on its own, fully validated.
absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> OpenDatasetAlone(
    const std::string& prefix);

class Job {
 public:
  // Opens the datasets through `open` (NotFound / DataLoss naming the file)
  // and computes the fingerprint.
  // An ingest job (spec.ingest_stream) reads `ingest`, which must be the
  // stream it names and outlive the job; it opens no dataset.
  static absl::StatusOr<std::unique_ptr<Job>> Create(JobSpec spec,
                                                     const DatasetOpener& open = OpenDatasetAlone,
                                                     IngestStream* ingest = nullptr);

  const std::string& name() const { return spec_.name; }
  // Its configuration, resolved (job_spec.h).
  const JobSpec& spec() const { return spec_; }
  // What its configuration makes it (job_kind.h): documents, Megatron
  // pretraining, hybrid CP or ingest, for good.
  const JobKind& kind() const { return *kind_; }
  const JobLayout& layout() const { return spec_.layout; }
  const std::string& fingerprint() const { return fingerprint_; }
  const scheduler::PlannerOptions& planner_options() const { return spec_.planner; }
  // The versions of a job's learned cost model; nullptr unless
  // scheduler.learn_cost_model. Thread-safe (the one part of a job that
  // changes after Create: the leader's versions are adopted into it).
  CostModelVersions* cost_models() const { return cost_models_.get(); }
  // The planner options of `step`: the configured ones, with the learned
  // model version in force then; `version` is its number (0 = configured).
  // `planning`: for the plan this node serves (CostModelVersions::ForPlanning).
  scheduler::PlannerOptions PlannerOptionsFor(int64_t step, bool planning,
                                              uint32_t* version = nullptr) const;
  const dataset::SampleRules& rules() const { return spec_.rules; }
  // REQUIRES: not an ingest job.
  const scheduler::Sampler& sampler() const { return *sampler_; }
  // The stream an ingest job reads; nullptr for a job of datasets.
  IngestStream* ingest() const { return ingest_; }
  // The stream's index of side field f of an ingest job.
  int ingest_field(int f) const { return ingest_fields_[static_cast<size_t>(f)]; }
  const dataset::IndexedDataset& dataset(int i) const { return *datasets_[static_cast<size_t>(i)]; }
  // Where a sample lies in its dataset (its document, and its first token
  // when a long document was split), and its run.
  // (An ingest job's sample is its index in the sealed step.)
  // (A pretraining sample's "document" is its number in the split.)
  dataset::SampleTable::Piece PieceOf(const scheduler::SampleRef& sample) const {
    if (ingest_ != nullptr || pretraining_) return {sample.index, 0};
    return sample_tables_[static_cast<size_t>(sample.dataset)].Locate(sample.index);
  }
  dataset::SampleShape ShapeOf(const scheduler::SampleRef& sample) const;
  // Documents split into several samples, over every dataset.
  int64_t split_documents() const;
  int num_datasets() const { return static_cast<int>(datasets_.size()); }
  const ModelStages& stages() const { return spec_.stages; }
  // The configured side fields, in configuration order, and dataset i's
  // copy of field f.
  const std::vector<SideFieldInfo>& side_fields() const { return spec_.side_fields; }
  const dataset::IndexedDataset& side_dataset(int i, int f) const {
    return *side_datasets_[static_cast<size_t>(i)][static_cast<size_t>(f)];
  }
  // Global ranks this node hosts, ascending.
  const std::vector<int>& local_ranks() const { return spec_.local_ranks; }
  bool IsLocal(int global_rank) const;
  // A pretraining job's samples, numbered as Megatron numbers its split
  // (docs/PRETRAINING.md); nullptr for any other job.
  const dataset::PretrainingIndices* pretraining() const {
    return pretraining_ ? &*pretraining_ : nullptr;
  }
  // Which samples each step of a pretraining job holds (its global batch
  // may change with the samples consumed). REQUIRES: pretraining().
  const BatchSchedule& batch_schedule() const { return spec_.pretraining->batch_schedule; }
  // A pretraining job planned by sub-sample for Megatron's hybrid CP
  // (Pretraining.hybrid_context_parallel): its steps' StepPlan::pieces.
  bool hybrid_context_parallel() const {
    return pretraining_ && spec_.pretraining->hybrid_context_parallel;
  }
  // The largest slot any rank of this job can need, in bytes.
  uint64_t required_slot_bytes() const { return required_slot_bytes_; }

 private:
  Job() = default;
  // FailedPrecondition naming the first document no plan can hold (too long
  // for max_tokens_per_rank even at the largest CP size).
  absl::Status CheckEverySampleFits() const;
  // The parts of Create that open what the job serves (job.cc), which
  // the kinds' JobKind::Open call.
  friend class JobKind;
  absl::Status OpenDatasets(const DatasetOpener& open, std::string& datasets_part);
  absl::Status BuildPretrainingIndices(const DatasetOpener& open, std::string& datasets_part);
  absl::Status FindIngestFields(std::string& datasets_part);

  JobSpec spec_;
  const JobKind* kind_ = nullptr;
  std::unique_ptr<CostModelVersions> cost_models_;
  std::vector<std::shared_ptr<const dataset::IndexedDataset>> datasets_;
  std::vector<dataset::SampleTable> sample_tables_;  // per dataset
  // A pretraining job's indices; they view the sequence lengths of
  // datasets_, which outlive them.
  std::optional<dataset::PretrainingIndices> pretraining_;
  std::vector<std::vector<std::shared_ptr<const dataset::IndexedDataset>>> side_datasets_;
  std::unique_ptr<scheduler::Sampler> sampler_;
  IngestStream* ingest_ = nullptr;
  std::vector<int> ingest_fields_;
  std::string fingerprint_;
  uint64_t required_slot_bytes_ = 0;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_H_
