#ifndef PACKFEED_SERVER_CONFIG_JOB_SPEC_H_
#define PACKFEED_SERVER_CONFIG_JOB_SPEC_H_

// A job's configuration as the pipeline reads it: validated, its defaults
// filled and every rule resolved (planner and sampler options, sample
// rules, layer split, side fields, Megatron's split and batch schedule),
// in plain values. The config layer is the one place that reads the
// generated messages; the libraries below control/ read this.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "packfeed/dataset/pretraining_indices.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/scheduler/sampler.h"
#include "server/config/batch_schedule.h"
#include "server/config/fingerprint.h"
#include "server/config/model_stages.h"
#include "server/config/side_fields.h"

namespace packfeed::v1 {
class JobConfig;
}  // namespace packfeed::v1

namespace packfeed::server {

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

// One configured dataset.
struct DatasetSource {
  std::string prefix;
  int kind = 0;       // the DatasetKind's number, as the fingerprint writes it
  double weight = 0;  // as configured (0: the blend is by size)
  // Per side field of the job, in order: the prefix of this dataset's copy.
  std::vector<std::string> side_prefixes;
};

// A Megatron pretraining job's settings (docs/PRETRAINING.md).
struct PretrainingSpec {
  int64_t micro_batch_size = 1;
  int64_t consumed_samples = 0;
  bool no_extra_token = false;
  bool reset_attention_mask = false;
  bool inter_document_masking = false;
  bool balance_document_attention = false;
  bool hybrid_context_parallel = false;
  bool cp_split_per_document = false;  // else per sequence
  std::string cache_dir;
  dataset::PretrainingBlendOptions blend;
  dataset::MegatronSplit split = dataset::MegatronSplit::kTrain;
  // The train split's schedule from consumed_samples on (JobSpecOf sets
  // it; a BatchSchedule is never empty).
  BatchSchedule batch_schedule{{{0, 1}}, 0};
  // Its part of the fingerprint's datasets part.
  std::string canonical;
};

struct JobSpec {
  std::string name;
  std::string auth_token;
  JobLayout layout;  // VPP: stages.vpp()
  int64_t global_batch = 0;
  int64_t seq_length = 0;
  // The global ranks this node hosts, ascending (every rank when the
  // configuration names none).
  std::vector<int> local_ranks;
  std::vector<DatasetSource> datasets;  // none for an ingest job

  scheduler::PlannerOptions planner;
  std::string scheduler_kind;          // as configured
  std::string cost_model;              // as configured; empty or "megatron": s²/c
  bool cp_upgrade_budget_set = false;  // configured rather than defaulted
  bool learn_cost_model = false;
  int64_t learned_model_lead_steps = 0;

  dataset::SampleRules rules;
  // The sampler's options but each dataset's document count, which only
  // opening it tells.
  scheduler::SamplerOptions sampler;
  ModelStages stages;
  std::vector<SideFieldInfo> side_fields;
  std::optional<PretrainingSpec> pretraining;
  // Every part of the fingerprint but the datasets', which opening them
  // tells.
  FingerprintInputs fingerprint;
};

// The spec of `config`. REQUIRES: `config` passed ValidateJobConfig
// (defaults filled). InvalidArgument naming the field for what only
// resolving finds (a cost model, the layer split, a side field).
absl::StatusOr<JobSpec> JobSpecOf(const v1::JobConfig& config);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_JOB_SPEC_H_
