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
#include "packfeed/v1/config.pb.h"
#include "server/config/batch_schedule.h"
#include "server/config/model_stages.h"
#include "server/config/side_fields.h"
#include "server/ingest/ingest_stream.h"
#include "server/pipeline/cost_versions.h"

namespace packfeed::server {

class JobKind;  // job_kind.h

// A rank's place in the job: global rank = tp + TP·(cp + CP·(dp + DP·pp)).
struct RankCoords {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
  int dp_cp_rank = 0;  // cp + CP·dp
};

struct JobLayout {
  int tp = 1, pp = 1, cp = 1, dp = 1;
  bool sequence_parallel = false;

  int world_size() const { return tp * pp * cp * dp; }
  int dp_cp_size() const { return cp * dp; }
  RankCoords Coords(int global_rank) const;
  int GlobalRank(int tp_rank, int dp_cp_rank, int pp_rank) const {
    return tp_rank + tp * (dp_cp_rank + dp_cp_size() * pp_rank);
  }
};

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
  // and computes the fingerprint. REQUIRES: `config` passed
  // ValidateJobConfig (defaults filled).
  // An ingest job (config.ingest_stream) reads `ingest`, which must be the
  // stream it names and outlive the job; it opens no dataset.
  static absl::StatusOr<std::unique_ptr<Job>> Create(const v1::JobConfig& config,
                                                     const DatasetOpener& open = OpenDatasetAlone,
                                                     IngestStream* ingest = nullptr);

  const std::string& name() const { return config_.name(); }
  const v1::JobConfig& config() const { return config_; }
  // What its configuration makes it (job_kind.h): documents, Megatron
  // pretraining, hybrid CP or ingest, for good.
  const JobKind& kind() const { return *kind_; }
  const JobLayout& layout() const { return layout_; }
  const std::string& fingerprint() const { return fingerprint_; }
  const scheduler::PlannerOptions& planner_options() const { return planner_; }
  // The versions of a job's learned cost model; nullptr unless
  // scheduler.learn_cost_model. Thread-safe (the one part of a job that
  // changes after Create: the leader's versions are adopted into it).
  CostModelVersions* cost_models() const { return cost_models_.get(); }
  // The planner options of `step`: the configured ones, with the learned
  // model version in force then; `version` is its number (0 = configured).
  // `planning`: for the plan this node serves (CostModelVersions::ForPlanning).
  scheduler::PlannerOptions PlannerOptionsFor(int64_t step, bool planning,
                                              uint32_t* version = nullptr) const;
  const dataset::SampleRules& rules() const { return rules_; }
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
  const ModelStages& stages() const { return *stages_; }
  // The configured side fields, in configuration order, and dataset i's
  // copy of field f.
  const std::vector<SideFieldInfo>& side_fields() const { return side_fields_; }
  const dataset::IndexedDataset& side_dataset(int i, int f) const {
    return *side_datasets_[static_cast<size_t>(i)][static_cast<size_t>(f)];
  }
  // Global ranks this node hosts, ascending.
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  bool IsLocal(int global_rank) const;
  // A pretraining job's samples, numbered as Megatron numbers its split
  // (docs/PRETRAINING.md); nullptr for any other job.
  const dataset::PretrainingIndices* pretraining() const {
    return pretraining_ ? &*pretraining_ : nullptr;
  }
  // Which samples each step of a pretraining job holds (its global batch
  // may change with the samples consumed). REQUIRES: pretraining().
  const BatchSchedule& batch_schedule() const { return *batch_schedule_; }
  // A pretraining job planned by sub-sample for Megatron's hybrid CP
  // (Pretraining.hybrid_context_parallel): its steps' StepPlan::pieces.
  bool hybrid_context_parallel() const {
    return pretraining_ && config_.pretraining().hybrid_context_parallel();
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

  v1::JobConfig config_;
  const JobKind* kind_ = nullptr;
  JobLayout layout_;
  scheduler::PlannerOptions planner_;
  std::unique_ptr<CostModelVersions> cost_models_;
  dataset::SampleRules rules_;
  std::vector<std::shared_ptr<const dataset::IndexedDataset>> datasets_;
  std::vector<dataset::SampleTable> sample_tables_;  // per dataset
  // A pretraining job's indices; they view the sequence lengths of
  // datasets_, which outlive them.
  std::optional<dataset::PretrainingIndices> pretraining_;
  std::optional<BatchSchedule> batch_schedule_;
  std::optional<ModelStages> stages_;
  std::vector<SideFieldInfo> side_fields_;
  std::vector<std::vector<std::shared_ptr<const dataset::IndexedDataset>>> side_datasets_;
  std::unique_ptr<scheduler::Sampler> sampler_;
  IngestStream* ingest_ = nullptr;
  std::vector<int> ingest_fields_;
  std::string fingerprint_;
  std::vector<int> local_ranks_;
  uint64_t required_slot_bytes_ = 0;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_H_
