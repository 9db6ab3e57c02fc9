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

std::string Canonical(std::initializer_list<int64_t> values) {
  std::string out;
  for (int64_t v : values) absl::StrAppend(&out, v, ";");
  return out;
}

std::string ModelCanonical(const v1::ModelLayers& m) {
  return absl::StrCat(
      Canonical({m.num_layers(),
                 m.has_num_layers_in_first_pipeline_stage() ? m.num_layers_in_first_pipeline_stage()
                                                            : int64_t{-1},
                 m.has_num_layers_in_last_pipeline_stage() ? m.num_layers_in_last_pipeline_stage()
                                                           : int64_t{-1},
                 m.mtp_num_layers(), m.has_mtp_stage() ? m.mtp_stage() : int64_t{-1}}),
      "dense:", absl::StrJoin(m.dense_layers(), ","));
}

// A dataset with documents, as `open` gives it.
absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> OpenWithDocuments(
    const DatasetOpener& open, const v1::DatasetSpec& spec) {
  PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> dataset, open(spec.prefix()));
  if (dataset->num_documents() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.prefix(), ": the dataset holds no document"));
  }
  return dataset;
}

// A dataset's part of the job fingerprint.
std::string DatasetPart(const dataset::IndexedDataset& dataset, const v1::DatasetSpec& spec) {
  return absl::StrCat(dataset.idx_digest(), ";", dataset.bin_bytes(), ";", spec.kind(), ";",
                      spec.weight(), "|");
}

// The job's fingerprint inputs: `datasets_part` (what its datasets or
// stream are) and the configuration that shapes its batches.
FingerprintInputs FingerprintPartsOf(const v1::JobConfig& config, std::string datasets_part) {
  const v1::Topology& t = config.topology();
  const v1::SchedulerConfig& s = config.scheduler();
  FingerprintInputs parts;
  parts.datasets = std::move(datasets_part);
  parts.topology =
      Canonical({t.tp(), t.pp(), t.cp(), t.dp(), t.vpp_group_size(), t.sequence_parallel()});
  // Parts added after a release only when used, so the fingerprints (and
  // ledgers) of jobs without them stay as they were.
  if (t.vpp() > 1 || config.has_model()) {
    absl::StrAppend(&parts.topology, "vpp", t.vpp(), ";", ModelCanonical(config.model()));
  }
  if (t.ep() > 1) absl::StrAppend(&parts.topology, ";ep", t.ep());
  parts.batch = Canonical({config.global_batch(), config.seq_length(), config.eod_id(),
                           config.pad_id(), config.append_eod(), config.long_documents()});
  for (const v1::SideField& field : config.side_fields()) {
    absl::StrAppend(&parts.batch, "side:", field.name(), ";", field.dtype(), ";",
                    absl::StrJoin(field.inner_shape(), ","), ";", field.pad_value(), ";",
                    field.align(), ";", field.layer_axis(), ";", field.role(), ";", field.stages(),
                    "|");
  }
  parts.scheduler = absl::StrCat(
      s.kind(), ";", s.cost_model(), ";", s.model_shape().ShortDebugString(), ";",
      s.hardware().ShortDebugString(), ";", s.cp_upgrade_budget(), ";",
      Canonical({s.max_tokens_per_rank(), s.min_cp(), s.max_cp(), s.max_sequences_per_pack()}));
  if (!s.objective().empty() && s.objective() != "barrier") {
    absl::StrAppend(&parts.scheduler, ";objective=", s.objective());
  }
  // (Only when set, so that the fingerprints of jobs without them stay.)
  if (s.has_rates()) absl::StrAppend(&parts.scheduler, ";rates=", s.rates().ShortDebugString());
  if (s.learn_cost_model()) {
    absl::StrAppend(&parts.scheduler, ";learn=", s.learned_model_lead_steps());
  }
  parts.sampler = Canonical({config.sampler(), static_cast<int64_t>(config.seed())});
  return parts;
}

}  // namespace

RankCoords JobLayout::Coords(int global_rank) const {
  RankCoords c;
  c.tp = global_rank % tp;
  int rest = global_rank / tp;
  c.cp = rest % cp;
  rest /= cp;
  c.dp = rest % dp;
  c.pp = rest / dp;
  c.dp_cp_rank = c.cp + cp * c.dp;
  return c;
}

absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> OpenDatasetAlone(
    const std::string& prefix) {
  PF_ASSIGN_OR_RETURN(dataset::IndexedDataset dataset, dataset::IndexedDataset::Open(prefix));
  return std::make_shared<const dataset::IndexedDataset>(std::move(dataset));
}

// Opens the datasets of a job that is neither an ingest nor a pretraining
// job: each one's sample table and side datasets, appending their
// fingerprint parts to `datasets_part`; then its sampler.
absl::Status Job::OpenDatasets(const DatasetOpener& open, std::string& datasets_part) {
  const v1::JobConfig& config = config_;
  std::vector<int64_t> num_documents;
  for (const v1::DatasetSpec& spec : config.datasets()) {
    PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> dataset,
                        OpenWithDocuments(open, spec));
    absl::StrAppend(&datasets_part, DatasetPart(*dataset, spec));
    PF_ASSIGN_OR_RETURN(
        dataset::SampleTable table,
        dataset::SampleTable::Build(dataset->index(), rules_, dataset->prefix() + ".idx"));
    sample_tables_.push_back(std::move(table));
    num_documents.push_back(sample_tables_.back().num_samples());
    std::vector<std::shared_ptr<const dataset::IndexedDataset>> sides;
    for (const SideFieldInfo& field : side_fields_) {
      PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> side,
                          open(SideFieldPrefix(spec, field.name)));
      PF_RETURN_IF_ERROR(CheckSideDataset(field, *dataset, *side));
      absl::StrAppend(&datasets_part, field.name, ":", side->idx_digest(), ";", side->bin_bytes(),
                      "|");
      sides.push_back(std::move(side));
    }
    side_datasets_.push_back(std::move(sides));
    datasets_.push_back(std::move(dataset));
  }
  PF_ASSIGN_OR_RETURN(scheduler::Sampler sampler,
                      scheduler::Sampler::Create(SamplerOptionsOf(config, num_documents)));
  sampler_ = std::make_unique<scheduler::Sampler>(std::move(sampler));
  return absl::OkStatus();
}

// Opens a pretraining job's datasets on the threads that build its
// indices (Megatron's, docs/PRETRAINING.md), appending their fingerprint
// parts to `datasets_part`.
absl::Status Job::BuildPretrainingIndices(const DatasetOpener& open, std::string& datasets_part) {
  const v1::JobConfig& config = config_;
  // Spans of the datasets' own lengths, which the job holds as long.
  datasets_.resize(static_cast<size_t>(config.datasets_size()));
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<dataset::PretrainingIndices> indices = dataset::PretrainingIndices::Build(
      config.datasets_size(),
      [&](int d) -> absl::StatusOr<absl::Span<const int32_t>> {
        PF_ASSIGN_OR_RETURN(datasets_[static_cast<size_t>(d)],
                            OpenWithDocuments(open, config.datasets(d)));
        return datasets_[static_cast<size_t>(d)]->sequence_lengths();
      },
      PretrainingOptionsOf(config), ServedSplitOf(config),
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  for (int d = 0; indices.ok() && d < config.datasets_size(); ++d) {
    absl::StrAppend(&datasets_part,
                    DatasetPart(*datasets_[static_cast<size_t>(d)], config.datasets(d)));
  }
  if (!indices.ok()) {
    // A dataset that did not open is refused as OpenDatasets refuses it.
    for (const auto& opened : datasets_) {
      if (opened == nullptr) return indices.status();
    }
    return absl::Status(indices.status().code(),
                        absl::StrCat("job ", config.name(), ": ", indices.status().message()));
  }
  pretraining_ = *std::move(indices);
  // The longest part of a corpus-scale start-up (docs/PRETRAINING.md).
  spdlog::info("job {}: indices of {} samples from {} datasets in {:.2f} s", config.name(),
               pretraining_->num_samples(), pretraining_->num_datasets(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  batch_schedule_.emplace(BatchSchedule::Of(config));
  for (int d = 0; d < pretraining_->num_datasets(); ++d) {
    if (pretraining_->from_cache(d)) {
      spdlog::info("job {}: dataset {} ({}): Megatron's cached indices read from {}", config.name(),
                   d, config.datasets(d).prefix(), config.pretraining().cache_dir());
    }
  }
  absl::StrAppend(&datasets_part, "pretraining:", config.pretraining().ShortDebugString(), "|");
  return absl::OkStatus();
}

// An ingest job: the stream's name and fields stand for the datasets
// (the bytes are whatever the driver puts); each side field is one of the
// stream's fields.
absl::Status Job::FindIngestFields(std::string& datasets_part) {
  IngestStream* ingest = ingest_;
  absl::StrAppend(&datasets_part, "ingest:", ingest->name(), "|");
  for (const SideFieldInfo& field : side_fields_) {
    const int f = ingest->FieldIndex(field.name);
    if (f < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ingest stream ", ingest->name(), " has no field '", field.name, "'"));
    }
    ingest_fields_.push_back(f);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Job>> Job::Create(const v1::JobConfig& config,
                                                 const DatasetOpener& open, IngestStream* ingest) {
  std::unique_ptr<Job> job(new Job());
  job->config_ = config;
  job->ingest_ = ingest;
  job->kind_ = &KindFor(config, ingest != nullptr);
  const v1::Topology& t = config.topology();
  job->layout_ = {static_cast<int>(t.tp()), static_cast<int>(t.pp()), static_cast<int>(t.cp()),
                  static_cast<int>(t.dp()), t.sequence_parallel()};
  PF_ASSIGN_OR_RETURN(job->planner_, PlannerOptionsOf(config));
  if (config.scheduler().learn_cost_model()) {
    job->cost_models_ = std::make_unique<CostModelVersions>(job->planner_.cost_model);
  }
  if (job->planner_.kind == scheduler::SchedulerKind::kDynamicCp) {
    PF_RETURN_IF_ERROR(scheduler::ResolveCpRange(job->planner_).status());
  }
  job->rules_ = SampleRulesOf(config);
  PF_ASSIGN_OR_RETURN(job->stages_, ModelStages::Create(config.model(), job->layout_.pp,
                                                        static_cast<int>(t.vpp()), config.name()));
  for (int f = 0; f < config.side_fields_size(); ++f) {
    PF_ASSIGN_OR_RETURN(SideFieldInfo field,
                        ResolveSideField(config.side_fields(f), *job->stages_,
                                         absl::StrCat(config.name(), ".side_fields[", f, "]")));
    job->side_fields_.push_back(std::move(field));
  }

  std::string datasets_part;
  PF_RETURN_IF_ERROR(job->kind().Open(*job, open, datasets_part));
  job->fingerprint_ = MakeFingerprint(FingerprintPartsOf(config, std::move(datasets_part)));

  for (uint32_t rank : config.local_ranks()) job->local_ranks_.push_back(static_cast<int>(rank));
  if (job->local_ranks_.empty()) {
    for (int r = 0; r < job->layout_.world_size(); ++r) job->local_ranks_.push_back(r);
  }
  std::sort(job->local_ranks_.begin(), job->local_ranks_.end());

  PF_RETURN_IF_ERROR(job->kind().CheckServable(*job));
  PF_ASSIGN_OR_RETURN(job->required_slot_bytes_,
                      MaxSlotBytes(job->kind().BoundsOf(*job), job->side_fields(), job->stages()));
  return job;
}

absl::Status Job::CheckEverySampleFits() const {
  // Truncation or splitting bounds every sample by seq_length real tokens:
  // when that fits, every sample does, and no index is scanned.
  if (scheduler::CheckSequenceFits(rules_.seq_length, planner_).ok()) return absl::OkStatus();
  for (size_t i = 0; i < datasets_.size(); ++i) {
    const dataset::IndexView& index = datasets_[i]->index();
    for (int64_t s = 0; s < sample_tables_[i].num_samples(); ++s) {
      const dataset::SampleTable::Piece piece = sample_tables_[i].Locate(s);
      if (piece.first_token == 0) {
        PF_RETURN_IF_ERROR(datasets_[i]->CheckDocument(static_cast<uint64_t>(piece.document)));
      }
      const int64_t length = dataset::PlannedLength(index, piece, rules_);
      absl::Status fits = scheduler::CheckSequenceFits(length, planner_);
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
      dataset::DocumentTokens(dataset(sample.dataset).index(), piece.document), rules_,
      piece.first_token);
}

int64_t Job::split_documents() const {
  int64_t out = 0;
  for (const dataset::SampleTable& table : sample_tables_) out += table.split_documents();
  return out;
}

scheduler::PlannerOptions Job::PlannerOptionsFor(int64_t step, bool planning,
                                                 uint32_t* version) const {
  scheduler::PlannerOptions options = planner_;
  if (version != nullptr) *version = 0;
  if (cost_models_ == nullptr) return options;
  const CostModelVersion in_force =
      planning ? cost_models_->ForPlanning(step) : cost_models_->ForStep(step);
  options.cost_model = in_force.model;
  if (version != nullptr) *version = in_force.version;
  // A learned model is in seconds: unless the configuration caps CP
  // inflation, the planner then spends it by cost, as under a preset.
  if (in_force.version > 0 && !config_.scheduler().has_cp_upgrade_budget()) {
    options.cp_upgrade_budget = DefaultCpUpgradeBudget("learned", hybrid_context_parallel());
  }
  return options;
}

bool Job::IsLocal(int global_rank) const {
  return std::binary_search(local_ranks_.begin(), local_ranks_.end(), global_rank);
}

}  // namespace packfeed::server
