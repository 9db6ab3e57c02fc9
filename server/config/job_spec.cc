#include "server/config/job_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/job_config.h"

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

// The fingerprint's parts that the configuration alone decides: all but
// the datasets'.
FingerprintInputs FingerprintPartsOf(const v1::JobConfig& config) {
  const v1::Topology& t = config.topology();
  const v1::SchedulerConfig& s = config.scheduler();
  FingerprintInputs parts;
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

PretrainingSpec PretrainingSpecOf(const v1::JobConfig& config) {
  const v1::Pretraining& p = config.pretraining();
  PretrainingSpec out;
  out.micro_batch_size = p.micro_batch_size();
  out.consumed_samples = p.consumed_samples();
  out.no_extra_token = p.no_extra_token();
  out.reset_attention_mask = p.reset_attention_mask();
  out.inter_document_masking = p.inter_document_masking();
  out.balance_document_attention = p.balance_document_attention();
  out.hybrid_context_parallel = p.hybrid_context_parallel();
  out.cp_split_per_document = p.cp_split() == v1::Pretraining::CP_SPLIT_PER_DOCUMENT;
  out.cache_dir = p.cache_dir();
  out.blend = PretrainingOptionsOf(config);
  out.split = ServedSplitOf(config);
  out.batch_schedule = BatchSchedule::Of(config);
  out.canonical = absl::StrCat("pretraining:", p.ShortDebugString(), "|");
  return out;
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

absl::StatusOr<JobSpec> JobSpecOf(const v1::JobConfig& config) {
  JobSpec spec;
  spec.name = config.name();
  spec.auth_token = config.auth_token();
  const v1::Topology& t = config.topology();
  spec.layout = {static_cast<int>(t.tp()), static_cast<int>(t.pp()), static_cast<int>(t.cp()),
                 static_cast<int>(t.dp()), t.sequence_parallel()};
  spec.global_batch = config.global_batch();
  spec.seq_length = config.seq_length();
  for (uint32_t rank : config.local_ranks()) spec.local_ranks.push_back(static_cast<int>(rank));
  if (spec.local_ranks.empty()) {
    for (int r = 0; r < spec.layout.world_size(); ++r) spec.local_ranks.push_back(r);
  }
  std::sort(spec.local_ranks.begin(), spec.local_ranks.end());

  const v1::SchedulerConfig& s = config.scheduler();
  PF_ASSIGN_OR_RETURN(spec.planner, PlannerOptionsOf(config));
  if (spec.planner.kind == scheduler::SchedulerKind::kDynamicCp) {
    PF_RETURN_IF_ERROR(scheduler::ResolveCpRange(spec.planner).status());
  }
  spec.scheduler_kind = s.kind();
  spec.cost_model = s.cost_model();
  spec.cp_upgrade_budget_set = s.has_cp_upgrade_budget();
  spec.learn_cost_model = s.learn_cost_model();
  spec.learned_model_lead_steps = s.learned_model_lead_steps();

  spec.rules = SampleRulesOf(config);
  spec.sampler = SamplerOptionsOf(config, std::vector<int64_t>(config.datasets().size(), 0));
  PF_ASSIGN_OR_RETURN(spec.stages, ModelStages::Create(config.model(), spec.layout.pp,
                                                       static_cast<int>(t.vpp()), config.name()));
  for (int f = 0; f < config.side_fields_size(); ++f) {
    PF_ASSIGN_OR_RETURN(SideFieldInfo field,
                        ResolveSideField(config.side_fields(f), spec.stages,
                                         absl::StrCat(config.name(), ".side_fields[", f, "]")));
    spec.side_fields.push_back(std::move(field));
  }
  for (const v1::DatasetSpec& d : config.datasets()) {
    DatasetSource& source = spec.datasets.emplace_back();
    source.prefix = d.prefix();
    source.kind = d.kind();
    source.weight = d.weight();
    for (const SideFieldInfo& field : spec.side_fields) {
      source.side_prefixes.push_back(SideFieldPrefix(d, field.name));
    }
  }
  if (IsPretrainingJob(config)) spec.pretraining = PretrainingSpecOf(config);
  spec.fingerprint = FingerprintPartsOf(config);
  return spec;
}

}  // namespace packfeed::server
