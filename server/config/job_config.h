#ifndef PACKFEED_SERVER_CONFIG_JOB_CONFIG_H_
#define PACKFEED_SERVER_CONFIG_JOB_CONFIG_H_

// What a job's configuration means to the pipeline's pure parts: the
// planner's options, the sample rules and the sampler's options. The one
// translation: the daemon and `packfeedctl plan --config` both use it, so
// an offline plan is the plan the daemon serves.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/dataset/pretraining_indices.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/scheduler/sampler.h"

namespace packfeed::v1 {
class JobConfig;
class SchedulerConfig;
class Topology;
}  // namespace packfeed::v1

namespace packfeed::server {

// InvalidArgument for an unknown scheduler kind or cost model.
// REQUIRES: `job` passed ValidateJobConfig (defaults filled).
absl::StatusOr<scheduler::PlannerOptions> PlannerOptionsOf(const v1::JobConfig& job);

// scheduler.cp_upgrade_budget when a job names none. Under megatron's s²/c
// the budget stands in for CP's cost: 0.05. A model in seconds prices it,
// and the plan then chooses its inflation by cost, uncapped (planner.h).
// Megatron's hybrid CP spends inflation as its sub-samples need; a plan for
// its loop may spend up to 100 %.
double DefaultCpUpgradeBudget(absl::string_view cost_model, bool hybrid_context_parallel);

// The cost model `scheduler` names, calibrated for `topology`'s TP, PP and
// VPP: "megatron", a preset, or "custom" from model_shape; hardware
// overrides the default rates. InvalidArgument naming the field otherwise.
absl::StatusOr<scheduler::CostModel> CostModelOf(const v1::SchedulerConfig& scheduler,
                                                 const v1::Topology& topology);

dataset::SampleRules SampleRulesOf(const v1::JobConfig& job);

// `num_documents[i]`: documents of job.datasets(i).
scheduler::SamplerOptions SamplerOptionsOf(const v1::JobConfig& job,
                                           const std::vector<int64_t>& num_documents);

// Whether the job serves Megatron pretraining samples (its datasets are of
// DATASET_KIND_PRETRAINING).
bool IsPretrainingJob(const v1::JobConfig& job);

// The blend a pretraining job names, as Megatron-Core's builder takes it:
// split, sample counts (0 = one epoch), surplus, seq_length, seed, and the
// datasets' weights (none when every weight is 0).
dataset::PretrainingBlendOptions PretrainingOptionsOf(const v1::JobConfig& job);
dataset::MegatronSplit ServedSplitOf(const v1::JobConfig& job);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_JOB_CONFIG_H_
