#include "server/pipeline/job.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "packfeed/common/status_macros.h"
#include "server/config/fingerprint.h"
#include "server/config/job_config.h"
#include "server/pipeline/job_kind.h"
#include "server/pipeline/slot_fields.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

namespace {

// A dataset with documents, as `open` gives it.
absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> OpenWithDocuments(
    const DatasetOpener& open, const DatasetSource& source) {
  PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> dataset, open(source.prefix));
  if (dataset->num_documents() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(source.prefix, ": the dataset holds no document"));
  }
  return dataset;
}

// A dataset's part of the job fingerprint.
std::string DatasetPart(const dataset::IndexedDataset& dataset, const DatasetSource& source) {
  return absl::StrCat(dataset.idx_digest(), ";", dataset.bin_bytes(), ";", source.kind, ";",
                      source.weight, "|");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> OpenDatasetAlone(
    const std::string& prefix) {
  PF_ASSIGN_OR_RETURN(dataset::IndexedDataset dataset, dataset::IndexedDataset::Open(prefix));
  return std::make_shared<const dataset::IndexedDataset>(std::move(dataset));
}

// Opens the datasets of a job that is neither an ingest nor a pretraining
// job: each one's sample table and side datasets, appending their
// fingerprint parts to `datasets_part`; then its sampler.
absl::Status Job::OpenDatasets(const DatasetOpener& open, std::string& datasets_part) {
  scheduler::SamplerOptions sampler_options = spec_.sampler;
  for (size_t d = 0; d < spec_.datasets.size(); ++d) {
    const DatasetSource& source = spec_.datasets[d];
    PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> dataset,
                        OpenWithDocuments(open, source));
    absl::StrAppend(&datasets_part, DatasetPart(*dataset, source));
    PF_ASSIGN_OR_RETURN(
        dataset::SampleTable table,
        dataset::SampleTable::Build(dataset->index(), rules(), dataset->prefix() + ".idx"));
    sample_tables_.push_back(std::move(table));
    sampler_options.datasets[d].num_samples = sample_tables_.back().num_samples();
    std::vector<std::shared_ptr<const dataset::IndexedDataset>> sides;
    for (size_t f = 0; f < side_fields().size(); ++f) {
      const SideFieldInfo& field = side_fields()[f];
      PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> side,
                          open(source.side_prefixes[f]));
      PF_RETURN_IF_ERROR(CheckSideDataset(field, *dataset, *side));
      absl::StrAppend(&datasets_part, field.name, ":", side->idx_digest(), ";", side->bin_bytes(),
                      "|");
      sides.push_back(std::move(side));
    }
    side_datasets_.push_back(std::move(sides));
    datasets_.push_back(std::move(dataset));
  }
  PF_ASSIGN_OR_RETURN(scheduler::Sampler sampler,
                      scheduler::Sampler::Create(std::move(sampler_options)));
  sampler_ = std::make_unique<scheduler::Sampler>(std::move(sampler));
  return absl::OkStatus();
}

// Opens a pretraining job's datasets on the threads that build its
// indices (Megatron's, docs/PRETRAINING.md), appending their fingerprint
// parts to `datasets_part`.
absl::Status Job::BuildPretrainingIndices(const DatasetOpener& open, std::string& datasets_part) {
  const PretrainingSpec& pretraining = *spec_.pretraining;
  const int num_datasets = static_cast<int>(spec_.datasets.size());
  // Spans of the datasets' own lengths, which the job holds as long.
  datasets_.resize(spec_.datasets.size());
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<dataset::PretrainingIndices> indices = dataset::PretrainingIndices::Build(
      num_datasets,
      [&](int d) -> absl::StatusOr<absl::Span<const int32_t>> {
        PF_ASSIGN_OR_RETURN(datasets_[static_cast<size_t>(d)],
                            OpenWithDocuments(open, spec_.datasets[static_cast<size_t>(d)]));
        return datasets_[static_cast<size_t>(d)]->sequence_lengths();
      },
      pretraining.blend, pretraining.split,
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  for (size_t d = 0; indices.ok() && d < spec_.datasets.size(); ++d) {
    absl::StrAppend(&datasets_part, DatasetPart(*datasets_[d], spec_.datasets[d]));
  }
  if (!indices.ok()) {
    // A dataset that did not open is refused as OpenDatasets refuses it.
    for (const auto& opened : datasets_) {
      if (opened == nullptr) return indices.status();
    }
    return absl::Status(indices.status().code(),
                        absl::StrCat("job ", name(), ": ", indices.status().message()));
  }
  pretraining_ = *std::move(indices);
  // The longest part of a corpus-scale start-up (docs/PRETRAINING.md).
  spdlog::info("job {}: indices of {} samples from {} datasets in {:.2f} s", name(),
               pretraining_->num_samples(), pretraining_->num_datasets(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  for (int d = 0; d < pretraining_->num_datasets(); ++d) {
    if (pretraining_->from_cache(d)) {
      spdlog::info("job {}: dataset {} ({}): Megatron's cached indices read from {}", name(), d,
                   spec_.datasets[static_cast<size_t>(d)].prefix, pretraining.cache_dir);
    }
  }
  absl::StrAppend(&datasets_part, pretraining.canonical);
  return absl::OkStatus();
}

// An ingest job: the stream's name and fields stand for the datasets
// (the bytes are whatever the driver puts); each side field is one of the
// stream's fields.
absl::Status Job::FindIngestFields(std::string& datasets_part) {
  IngestStream* ingest = ingest_;
  absl::StrAppend(&datasets_part, "ingest:", ingest->name(), "|");
  for (const SideFieldInfo& field : side_fields()) {
    const int f = ingest->FieldIndex(field.name);
    if (f < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ingest stream ", ingest->name(), " has no field '", field.name, "'"));
    }
    ingest_fields_.push_back(f);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Job>> Job::Create(JobSpec spec, const DatasetOpener& open,
                                                 IngestStream* ingest) {
  std::unique_ptr<Job> job(new Job());
  job->spec_ = std::move(spec);
  job->ingest_ = ingest;
  job->kind_ = &KindFor(job->spec_, ingest != nullptr);
  if (job->spec_.learn_cost_model) {
    job->cost_models_ = std::make_unique<CostModelVersions>(job->planner_options().cost_model);
  }

  std::string datasets_part;
  PF_RETURN_IF_ERROR(job->kind().Open(*job, open, datasets_part));
  FingerprintInputs fingerprint = job->spec_.fingerprint;
  fingerprint.datasets = std::move(datasets_part);
  job->fingerprint_ = MakeFingerprint(fingerprint);

  PF_RETURN_IF_ERROR(job->kind().CheckServable(*job));
  PF_ASSIGN_OR_RETURN(job->required_slot_bytes_,
                      MaxSlotBytes(job->kind().BoundsOf(*job), job->side_fields(), job->stages()));
  return job;
}

absl::Status Job::CheckEverySampleFits() const {
  // Truncation or splitting bounds every sample by seq_length real tokens:
  // when that fits, every sample does, and no index is scanned.
  if (scheduler::CheckSequenceFits(rules().seq_length, planner_options()).ok())
    return absl::OkStatus();
  for (size_t i = 0; i < datasets_.size(); ++i) {
    const dataset::IndexView& index = datasets_[i]->index();
    for (int64_t s = 0; s < sample_tables_[i].num_samples(); ++s) {
      const dataset::SampleTable::Piece piece = sample_tables_[i].Locate(s);
      if (piece.first_token == 0) {
        PF_RETURN_IF_ERROR(datasets_[i]->CheckDocument(static_cast<uint64_t>(piece.document)));
      }
      const int64_t length = dataset::PlannedLength(index, piece, rules());
      absl::Status fits = scheduler::CheckSequenceFits(length, planner_options());
      if (!fits.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(datasets_[i]->prefix(), " document ", piece.document, " (", length,
                         " tokens as planned) can never be served: ",
                         fits.message().substr(fits.message().find(" does not fit") + 1),
                         "; raise scheduler.max_tokens_per_rank or max_cp, or lower seq_length"));
      }
    }
  }
  return absl::OkStatus();
}

dataset::SampleShape Job::ShapeOf(const scheduler::SampleRef& sample) const {
  const dataset::SampleTable::Piece piece = PieceOf(sample);
  return dataset::ShapeOfSample(
      dataset::DocumentTokens(dataset(sample.dataset).index(), piece.document), rules(),
      piece.first_token);
}

int64_t Job::split_documents() const {
  int64_t out = 0;
  for (const dataset::SampleTable& table : sample_tables_) out += table.split_documents();
  return out;
}

scheduler::PlannerOptions Job::PlannerOptionsFor(int64_t step, bool planning,
                                                 uint32_t* version) const {
  scheduler::PlannerOptions options = planner_options();
  if (version != nullptr) *version = 0;
  if (cost_models_ == nullptr) return options;
  const CostModelVersion in_force =
      planning ? cost_models_->ForPlanning(step) : cost_models_->ForStep(step);
  options.cost_model = in_force.model;
  if (version != nullptr) *version = in_force.version;
  // A learned model is in seconds: unless the configuration caps CP
  // inflation, the planner then spends it by cost, as under a preset.
  if (in_force.version > 0 && !spec_.cp_upgrade_budget_set) {
    options.cp_upgrade_budget = DefaultCpUpgradeBudget("learned", hybrid_context_parallel());
  }
  return options;
}

bool Job::IsLocal(int global_rank) const {
  return std::binary_search(local_ranks().begin(), local_ranks().end(), global_rank);
}

}  // namespace packfeed::server
