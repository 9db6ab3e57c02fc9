#include "server/config/job_config.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed::server {

absl::StatusOr<scheduler::CostModel> CostModelOf(const v1::SchedulerConfig& s,
                                                 const v1::Topology& t) {
  const bool custom = s.cost_model() == "custom";
  if (s.has_model_shape() != custom) {
    return absl::InvalidArgumentError(
        custom ? "cost_model \"custom\" needs model_shape"
               : absl::StrCat("model_shape is only for cost_model \"custom\", not \"",
                              s.cost_model(), "\""));
  }
  if ((s.cost_model() == "rates") != s.has_rates()) {
    return absl::InvalidArgumentError(
        s.has_rates()
            ? absl::StrCat("rates are only for cost_model \"rates\", not \"", s.cost_model(), "\"")
            : "cost_model \"rates\" needs rates");
  }
  if (s.has_rates()) {
    if (s.has_hardware()) {
      return absl::InvalidArgumentError("hardware has no meaning for cost_model \"rates\"");
    }
    const v1::CostRates& r = s.rates();
    scheduler::CostModel model;
    for (auto [name, value, target] : {std::tuple{"alpha", r.alpha(), &model.alpha},
                                       {"beta", r.beta(), &model.beta},
                                       {"kappa", r.kappa(), &model.kappa},
                                       {"lambda", r.lambda(), &model.lambda},
                                       {"mu", r.mu(), &model.microbatch}}) {
      if (!(value >= 0) || std::isinf(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rates.", name, " = ", value, " must be a finite number >= 0"));
      }
      *target = value;
    }
    if (!(model.alpha > 0 || model.beta > 0)) {
      return absl::InvalidArgumentError("rates: alpha or beta must be > 0");
    }
    model.bubble =
        static_cast<double>(std::max<uint32_t>(t.pp(), 1) - 1) / std::max<uint32_t>(t.vpp(), 1);
    return model;
  }
  if (s.cost_model() == "megatron") {
    if (s.has_hardware()) {
      return absl::InvalidArgumentError("hardware has no meaning for cost_model \"megatron\"");
    }
    return scheduler::CostModel::Megatron();
  }
  scheduler::ModelShape shape;
  if (custom) {
    const v1::ModelShape& m = s.model_shape();
    for (auto [name, value] : {std::pair{"layers", m.layers()},
                               {"hidden", m.hidden()},
                               {"heads", m.heads()},
                               {"ffn_hidden", m.ffn_hidden()}}) {
      if (value == 0) {
        return absl::InvalidArgumentError(absl::StrCat("model_shape.", name, " must be >= 1"));
      }
    }
    shape = {m.layers(),     m.hidden(), m.heads(),     m.kv_heads() > 0 ? m.kv_heads() : m.heads(),
             m.ffn_hidden(), m.vocab(),  !m.plain_mlp()};
  } else {
    absl::StatusOr<scheduler::ModelShape> preset = scheduler::ModelPreset(s.cost_model());
    if (!preset.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown cost model '", s.cost_model(),
                                                     "'; expected ", scheduler::kCostModelNames,
                                                     " | custom | rates"));
    }
    shape = *preset;
  }
  scheduler::Hardware hardware;
  const v1::HardwareRates& h = s.hardware();
  // Rates must be positive; the rest may be zero.
  for (auto [name, has, value, target, rate] :
       {std::tuple{"tflops", h.has_tflops(), h.tflops(), &hardware.tflops, true},
        {"cp_link_gbps", h.has_cp_link_gbps(), h.cp_link_gbps(), &hardware.cp_link_gbps, true},
        {"cp_latency_us", h.has_cp_latency_us(), h.cp_latency_us(), &hardware.cp_latency_us, false},
        {"exposed_fraction", h.has_exposed_fraction(), h.exposed_fraction(),
         &hardware.exposed_fraction, false},
        {"microbatch_overhead_ms", h.has_microbatch_overhead_ms(), h.microbatch_overhead_ms(),
         &hardware.microbatch_overhead_ms, false}}) {
    if (!has) continue;
    if (!(rate ? value > 0 : value >= 0) || std::isinf(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("hardware.", name, " = ", value, rate ? " must be > 0" : " must be >= 0"));
    }
    *target = value;
  }
  const auto at_least_one = [](uint32_t x) { return static_cast<int>(std::max<uint32_t>(x, 1)); };
  return scheduler::Calibrate(shape, hardware,
                              {at_least_one(t.tp()), at_least_one(t.pp()), at_least_one(t.vpp())});
}

double DefaultCpUpgradeBudget(absl::string_view cost_model, bool hybrid_context_parallel) {
  if (hybrid_context_parallel) return 1.0;
  return cost_model == "megatron" ? scheduler::kDefaultCpUpgradeBudget : scheduler::kNoInflationCap;
}

absl::StatusOr<scheduler::PlannerOptions> PlannerOptionsOf(const v1::JobConfig& job) {
  const v1::Topology& t = job.topology();
  const v1::SchedulerConfig& s = job.scheduler();
  scheduler::PlannerOptions options;
  PF_ASSIGN_OR_RETURN(options.kind, scheduler::SchedulerKindFromName(s.kind()));
  PF_ASSIGN_OR_RETURN(options.cost_model, CostModelOf(s, t));
  options.dp = static_cast<int>(t.dp());
  options.cp = static_cast<int>(t.cp());
  options.tp = static_cast<int>(t.tp());
  options.sequence_parallel = t.sequence_parallel();
  options.vpp_group_size = static_cast<int>(t.vpp_group_size());
  options.max_tokens_per_rank = s.max_tokens_per_rank();
  options.min_cp = static_cast<int>(s.min_cp());
  options.max_cp = static_cast<int>(s.max_cp());
  options.cp_upgrade_budget =
      s.has_cp_upgrade_budget()
          ? s.cp_upgrade_budget()
          : DefaultCpUpgradeBudget(s.cost_model(), job.has_pretraining() &&
                                                       job.pretraining().hybrid_context_parallel());
  options.max_sequences_per_pack = static_cast<int>(s.max_sequences_per_pack());
  PF_ASSIGN_OR_RETURN(options.objective, scheduler::ObjectiveFromName(s.objective()));
  options.execution.expert_parallel = static_cast<int>(std::max<uint32_t>(t.ep(), 1));
  options.megatron_padding_is_real = SampleRulesOf(job).kind == dataset::SampleKind::kSft;
  return options;
}

dataset::SampleRules SampleRulesOf(const v1::JobConfig& job) {
  dataset::SampleRules rules;
  rules.kind = !job.datasets().empty() && job.datasets(0).kind() == v1::DATASET_KIND_SFT
                   ? dataset::SampleKind::kSft
                   : dataset::SampleKind::kVarlen;
  rules.seq_length = job.seq_length();
  rules.eod_id = job.eod_id();
  rules.pad_id = job.pad_id();
  if (IsPretrainingJob(job)) {
    const v1::Pretraining& p = job.pretraining();
    rules.kind = dataset::SampleKind::kPretraining;
    rules.pad_id = p.has_tokenizer_pad_id() ? p.tokenizer_pad_id() : -1;
    rules.eod_mask_loss = p.eod_mask_loss();
    rules.reset_position_ids = p.reset_position_ids();
    return rules;
  }
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

bool IsPretrainingJob(const v1::JobConfig& job) {
  return !job.datasets().empty() && job.datasets(0).kind() == v1::DATASET_KIND_PRETRAINING;
}

dataset::PretrainingBlendOptions PretrainingOptionsOf(const v1::JobConfig& job) {
  const v1::Pretraining& p = job.pretraining();
  dataset::PretrainingBlendOptions options;
  if (!job.datasets().empty() && job.datasets(0).weight() != 0) {
    options.weights.emplace();
    for (const v1::DatasetSpec& d : job.datasets()) options.weights->push_back(d.weight());
  }
  options.split = p.split();
  const int64_t samples[] = {p.train_samples(), p.valid_samples(), p.test_samples()};
  for (size_t s = 0; s < options.split_samples.size(); ++s) {
    if (samples[s] > 0) options.split_samples[s] = samples[s];
  }
  options.mid_level_dataset_surplus = p.mid_level_dataset_surplus();
  options.sequence_length = job.seq_length();
  options.random_seed = static_cast<uint32_t>(job.seed());
  options.add_extra_token = !p.no_extra_token();
  options.drop_last_partial_validation_sequence = !p.keep_partial_validation_sequence();
  options.cache_dir = p.cache_dir();
  for (const v1::DatasetSpec& d : job.datasets()) options.dataset_paths.push_back(d.prefix());
  return options;
}

dataset::MegatronSplit ServedSplitOf(const v1::JobConfig& job) {
  return static_cast<dataset::MegatronSplit>(job.pretraining().serve_split());
}

}  // namespace packfeed::server
