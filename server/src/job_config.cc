#include "packfeed/server/job_config.h"

#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cost_model.h"

namespace packfeed::server {

absl::StatusOr<scheduler::PlannerOptions> PlannerOptionsOf(const v1::JobConfig& job) {
  const v1::Topology& t = job.topology();
  const v1::SchedulerConfig& s = job.scheduler();
  scheduler::PlannerOptions options;
  PF_ASSIGN_OR_RETURN(options.kind, scheduler::SchedulerKindFromName(s.kind()));
  PF_ASSIGN_OR_RETURN(options.cost_model, scheduler::CostModelFromName(s.cost_model()));
  options.dp = static_cast<int>(t.dp());
  options.cp = static_cast<int>(t.cp());
  options.tp = static_cast<int>(t.tp());
  options.sequence_parallel = t.sequence_parallel();
  options.vpp_group_size = static_cast<int>(t.vpp_group_size());
  options.max_tokens_per_rank = s.max_tokens_per_rank();
  options.min_cp = static_cast<int>(s.min_cp());
  options.max_cp = static_cast<int>(s.max_cp());
  options.cp_upgrade_budget = s.cp_upgrade_budget();
  options.max_sequences_per_pack = static_cast<int>(s.max_sequences_per_pack());
  options.megatron_padding_is_real = SampleRulesOf(job).kind == dataset::SampleKind::kSft;
  return options;
}

dataset::SampleRules SampleRulesOf(const v1::JobConfig& job) {
  dataset::SampleRules rules;
  rules.kind = job.datasets(0).kind() == v1::DATASET_KIND_SFT ? dataset::SampleKind::kSft
                                                              : dataset::SampleKind::kVarlen;
  rules.seq_length = job.seq_length();
  rules.eod_id = job.eod_id();
  rules.pad_id = job.pad_id();
  rules.append_eod = job.append_eod();
  rules.split_long_documents = job.long_documents() == v1::JobConfig::LONG_DOCUMENTS_SPLIT;
  return rules;
}

scheduler::SamplerOptions SamplerOptionsOf(const v1::JobConfig& job,
                                           const std::vector<int64_t>& num_documents) {
  scheduler::SamplerOptions options;
  options.global_batch = job.global_batch();
  options.seed = job.seed();
  options.shuffle = job.sampler() != v1::SAMPLER_MODE_SEQUENTIAL;
  for (int i = 0; i < job.datasets_size(); ++i) {
    options.datasets.push_back({num_documents[static_cast<size_t>(i)], job.datasets(i).weight()});
  }
  return options;
}

}  // namespace packfeed::server
