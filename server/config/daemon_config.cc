#include "server/config/daemon_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/megatron_blend.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/transport/wire.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/batch_schedule.h"
#include "server/config/job_config.h"
#include "server/config/model_stages.h"
#include "server/config/side_fields.h"

namespace packfeed::server {
namespace {

// Collects the parser's complaints instead of letting protobuf log them.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// Megatron's blend_per_split: the valid or test split has datasets of its own.
bool IsBlendPerSplit(const v1::Pretraining& p) {
  return !p.valid_datasets().empty() || !p.test_datasets().empty();
}

// A blend_per_split job's own split string: all of its datasets train.
constexpr char kWholeTrainSplit[] = "1,0,0";

absl::Status FieldError(absl::string_view where, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ".", field, ": ", problem));
}

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Megatron's --hybrid-context-parallel: what its argument checks require
// (pp 1; its sub-samples come from cu_seqlens), and a plan by sub-sample.
absl::Status ValidateHybridCp(const v1::JobConfig& job, absl::string_view where) {
  const v1::Pretraining& p = job.pretraining();
  if (!p.inter_document_masking()) {
    return FieldError(where, "pretraining.hybrid_context_parallel",
                      "needs inter_document_masking (Megatron's sub-samples are the documents "
                      "its cu_seqlens cut)");
  }
  if (job.topology().pp() > 1 || job.topology().vpp() > 1) {
    return FieldError(where, "pretraining.hybrid_context_parallel",
                      "is not supported with pipeline parallelism (Megatron refuses it too)");
  }
  if (job.scheduler().kind() != "dynamic_cp") {
    return FieldError(where, "scheduler.kind",
                      "must be dynamic_cp with pretraining.hybrid_context_parallel (each "
                      "sub-sample at its own CP size)");
  }
  if (p.balance_document_attention() || p.cp_split() != v1::Pretraining::CP_SPLIT_PER_SEQUENCE) {
    return FieldError(where, "pretraining.hybrid_context_parallel",
                      "places and splits every sub-sample itself: balance_document_attention "
                      "and cp_split do not apply");
  }
  if (job.scheduler().objective() != "hybrid") {
    return FieldError(where, "scheduler.objective",
                      "must be hybrid with pretraining.hybrid_context_parallel (Megatron's loop "
                      "runs the plan group by group, each sub-sample its own forward)");
  }
  return absl::OkStatus();
}

// Megatron pretraining options: what Megatron itself would refuse, refused
// here with the field named.
absl::Status ValidatePretraining(const v1::JobConfig& job, absl::string_view where) {
  const v1::Pretraining& p = job.pretraining();
  if (!job.ingest_stream().empty()) {
    return FieldError(where, "pretraining", "an ingest job has no Megatron datasets");
  }
  absl::StatusOr<dataset::SplitMatrix> split = dataset::ParseMegatronSplit(p.split());
  if (!split.ok()) return FieldError(where, "pretraining.split", split.status().message());
  if (!(*split)[static_cast<size_t>(p.serve_split())].has_value()) {
    return FieldError(where, "pretraining.serve_split",
                      absl::StrCat("split \"", p.split(), "\" gives it no share"));
  }
  if (p.eval_global_batch() < 0) {
    return FieldError(where, "pretraining.eval_global_batch", "is negative");
  }
  if ((p.eval_global_batch() > 0 || p.eval_micro_batch_size() > 0) && !p.serve_every_split()) {
    return FieldError(where, "pretraining.eval_global_batch",
                      "and eval_micro_batch_size apply to the splits serve_every_split serves");
  }
  for (auto [field, value] : {std::pair{"train_samples", p.train_samples()},
                              {"valid_samples", p.valid_samples()},
                              {"test_samples", p.test_samples()},
                              {"consumed_samples", p.consumed_samples()},
                              {"consumed_valid_samples", p.consumed_valid_samples()}}) {
    if (value < 0) return FieldError(where, absl::StrCat("pretraining.", field), "is negative");
  }
  if (!(p.mid_level_dataset_surplus() >= 0) || !std::isfinite(p.mid_level_dataset_surplus())) {
    return FieldError(where, "pretraining.mid_level_dataset_surplus", "must be >= 0");
  }
  if (job.seq_length() < 2) return FieldError(where, "seq_length", "must be at least 2");
  const v1::Topology& t = job.topology();
  const int64_t per_microbatch = int64_t{p.micro_batch_size()} * t.dp();
  // (Under a batch schedule, each batch a step takes is checked instead.)
  if (absl::Status schedule = ValidateBatchSchedule(job); !schedule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", schedule.message()));
  }
  if (p.batch_schedule().empty() && job.global_batch() % per_microbatch != 0) {
    return FieldError(
        where, "global_batch",
        absl::StrCat(job.global_batch(),
                     " is not a multiple of micro_batch_size x dp = ", per_microbatch));
  }
  if (t.cp() > 1 && job.seq_length() % (2 * int64_t{t.cp()}) != 0) {
    return FieldError(where, "seq_length",
                      absl::StrCat(job.seq_length(), " does not split into 2 x cp = ", 2 * t.cp(),
                                   " parts (Megatron's CP split)"));
  }
  if (job.side_fields_size() > 0) {
    return FieldError(where, "side_fields", "are not served with Megatron pretraining samples");
  }
  const bool documents = p.reset_attention_mask() || p.inter_document_masking();
  if (p.balance_document_attention() && !documents) {
    return FieldError(where, "pretraining.balance_document_attention",
                      "needs reset_attention_mask or inter_document_masking (every sample "
                      "costs the same otherwise)");
  }
  if (p.reset_attention_mask() && p.inter_document_masking()) {
    // Megatron 0.19 drops the [s, s] mask when both are on; serving one of
    // two document definitions silently would hide a mistake.
    return FieldError(where, "pretraining.reset_attention_mask",
                      "and inter_document_masking are both set: the first splits documents at "
                      "EOD tokens, the second at the sample's document pieces; choose one");
  }
  if (p.reset_attention_mask() && t.cp() > 1) {
    // Megatron splits its dense [s, s] mask by query rows under CP, which has
    // no THD form; its own document masking under CP is the 0.19 one.
    return FieldError(where, "pretraining.reset_attention_mask",
                      "is served with cp = 1 only; under CP use inter_document_masking "
                      "(Megatron-Core 0.19's --dataloader-inter-document-masking)");
  }
  const bool per_split = IsBlendPerSplit(p);
  if ((p.serve_every_split() || per_split) && p.serve_split() != v1::Pretraining::SPLIT_TRAIN) {
    return FieldError(where, "pretraining.serve_split",
                      "is the train split with serve_every_split or valid_datasets/test_datasets "
                      "(the other splits are served as NAME.valid and NAME.test)");
  }
  if (per_split && p.split() != kWholeTrainSplit) {
    return FieldError(where, "pretraining.split",
                      "is not used with valid_datasets/test_datasets (Megatron's blend_per_split: "
                      "each split draws on the whole of its datasets)");
  }
  if (p.cp_split() != v1::Pretraining::CP_SPLIT_PER_SEQUENCE && !p.inter_document_masking()) {
    return FieldError(where, "pretraining.cp_split", "applies to inter_document_masking only");
  }

  if (p.hybrid_context_parallel()) {
    if (absl::Status hybrid = ValidateHybridCp(job, where); !hybrid.ok()) return hybrid;
  }
  if (job.seed() > UINT32_MAX) {
    return FieldError(where, "seed", "Megatron's random_seed is below 2^32");
  }
  return absl::OkStatus();
}

bool IsName(const std::string& name) {
  return !name.empty() && name.find_first_not_of(
                              "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                              "0123456789_.-") == std::string::npos;
}

// The streams' names and fields, and that each consumer job reads a
// stream that has its side fields with the same dtype and shape.
absl::Status ValidateIngest(const v1::DaemonConfig& config, absl::string_view source) {
  std::map<std::string, const v1::IngestStream*> streams;
  for (int i = 0; i < config.ingest_streams_size(); ++i) {
    const v1::IngestStream& stream = config.ingest_streams(i);
    const std::string where = absl::StrCat(source, ": ingest_streams[", i, "]");
    if (!IsName(stream.name())) {
      return FieldError(where, "name",
                        absl::StrCat("'", stream.name(), "' must be [A-Za-z0-9_.-]+"));
    }
    if (!streams.emplace(stream.name(), &stream).second) {
      return FieldError(where, "name", absl::StrCat("'", stream.name(), "' names two streams"));
    }
    PF_ASSIGN_OR_RETURN(ModelStages no_layers, ModelStages::Create({}, 1, 1, where));
    std::set<std::string> names;
    for (int f = 0; f < stream.fields_size(); ++f) {
      const std::string at = absl::StrCat(where, ".fields[", f, "]");
      PF_ASSIGN_OR_RETURN(SideFieldInfo field, ResolveSideField(stream.fields(f), no_layers, at));
      if (!names.insert(field.name).second) return FieldError(at, "name", "the same name twice");
    }
  }
  for (int i = 0; i < config.jobs_size(); ++i) {
    const v1::JobConfig& job = config.jobs(i);
    if (job.ingest_stream().empty()) continue;
    const std::string where = absl::StrCat(source, ": jobs[", i, "]");
    auto stream = streams.find(job.ingest_stream());
    if (stream == streams.end()) {
      return FieldError(
          where, "ingest_stream",
          absl::StrCat("no ingest_streams entry is named '", job.ingest_stream(), "'"));
    }
    for (int f = 0; f < job.side_fields_size(); ++f) {
      const v1::SideField& wanted = job.side_fields(f);
      const std::string at = absl::StrCat("side_fields[", f, "]");
      const v1::SideField* have = nullptr;
      for (const v1::SideField& field : stream->second->fields()) {
        if (field.name() == wanted.name()) have = &field;
      }
      if (have == nullptr) {
        return FieldError(
            where, at,
            absl::StrCat("stream '", job.ingest_stream(), "' has no field '", wanted.name(), "'"));
      }
      if (have->dtype() != wanted.dtype() ||
          !std::equal(have->inner_shape().begin(), have->inner_shape().end(),
                      wanted.inner_shape().begin(), wanted.inner_shape().end())) {
        return FieldError(where, at,
                          absl::StrCat("'", wanted.name(), "' is ", wanted.dtype(), " [",
                                       absl::StrJoin(wanted.inner_shape(), ","), "] here and ",
                                       have->dtype(), " [", absl::StrJoin(have->inner_shape(), ","),
                                       "] in stream '", job.ingest_stream(), "'"));
      }
    }
  }
  return absl::OkStatus();
}

// Whether Megatron's split string `split` gives `which` any samples.
bool HasShare(const std::string& split, v1::Pretraining::Split which) {
  absl::StatusOr<dataset::SplitMatrix> matrix = dataset::ParseMegatronSplit(split);
  return matrix.ok() && (*matrix)[static_cast<size_t>(which)].has_value();
}

// The valid and test splits of a job with serve_every_split, as jobs of
// their own (docs/PRETRAINING.md): NAME.valid from consumed_valid_samples,
// NAME.test from 0; under blend_per_split each on its own datasets, whole.
std::vector<v1::JobConfig> SplitJobsOf(const v1::JobConfig& job) {
  std::vector<v1::JobConfig> out;
  const v1::Pretraining& p = job.pretraining();
  if (!p.serve_every_split()) return out;
  const bool per_split = IsBlendPerSplit(p);
  struct Split {
    v1::Pretraining::Split split;
    const char* suffix;
    const char* whole;  // the split string of a blend_per_split split
    const google::protobuf::RepeatedPtrField<v1::DatasetSpec>* datasets;
    int64_t consumed;
  };
  for (const Split& split :
       {Split{v1::Pretraining::SPLIT_VALID, ".valid", "0,1,0", &p.valid_datasets(),
              p.consumed_valid_samples()},
        Split{v1::Pretraining::SPLIT_TEST, ".test", "0,0,1", &p.test_datasets(), 0}}) {
    // Megatron builds no such split.
    if (per_split ? split.datasets->empty() : !HasShare(p.split(), split.split)) continue;
    v1::JobConfig derived = job;
    derived.set_name(job.name() + split.suffix);
    v1::Pretraining& q = *derived.mutable_pretraining();
    q.set_serve_every_split(false);
    q.clear_valid_datasets();
    q.clear_test_datasets();
    q.set_serve_split(split.split);
    q.set_consumed_samples(split.consumed);
    q.set_consumed_valid_samples(0);
    // Megatron evaluates with its evaluation batch.
    if (p.eval_global_batch() > 0) derived.set_global_batch(p.eval_global_batch());
    if (p.eval_micro_batch_size() > 0) {
      q.set_micro_batch_size(p.eval_micro_batch_size());
      if (!p.hybrid_context_parallel()) {
        // The slot holds the evaluation microbatch.
        derived.mutable_scheduler()->set_max_tokens_per_rank(
            std::max<int64_t>(job.scheduler().max_tokens_per_rank(),
                              int64_t{p.eval_micro_batch_size()} * job.seq_length()));
      }
    }
    q.set_eval_global_batch(0);
    q.set_eval_micro_batch_size(0);
    q.clear_batch_schedule();  // evaluation keeps its one batch
    if (per_split) {
      *derived.mutable_datasets() = *split.datasets;
      for (v1::DatasetSpec& dataset : *derived.mutable_datasets()) {
        if (dataset.kind() == v1::DATASET_KIND_UNSPECIFIED) {
          dataset.set_kind(v1::DATASET_KIND_PRETRAINING);
        }
      }
      if (derived.datasets_size() == 1) derived.mutable_datasets(0)->set_weight(0);
      q.set_split(split.whole);
    }
    out.push_back(std::move(derived));
  }
  return out;
}

void FillDefaults(v1::JobConfig& job) {
  v1::Topology& t = *job.mutable_topology();
  for (auto [get, set] : {std::pair{&v1::Topology::tp, &v1::Topology::set_tp},
                          {&v1::Topology::pp, &v1::Topology::set_pp},
                          {&v1::Topology::cp, &v1::Topology::set_cp},
                          {&v1::Topology::dp, &v1::Topology::set_dp}}) {
    if ((t.*get)() == 0) (t.*set)(1);
  }
  if (t.vpp() == 0) t.set_vpp(1);
  if (job.long_documents() == v1::JobConfig::LONG_DOCUMENTS_UNSPECIFIED) {
    const bool sft = !job.datasets().empty() && job.datasets(0).kind() == v1::DATASET_KIND_SFT;
    job.set_long_documents(sft ? v1::JobConfig::LONG_DOCUMENTS_TRUNCATE
                               : v1::JobConfig::LONG_DOCUMENTS_SPLIT);
  }
  if (job.scheduler().kind().empty()) {
    // Hybrid CP is planned by sub-sample, at each one's own CP size.
    job.mutable_scheduler()->set_kind(job.pretraining().hybrid_context_parallel() ? "dynamic_cp"
                                                                                  : "balanced");
  }
  if (job.scheduler().cost_model().empty()) job.mutable_scheduler()->set_cost_model("megatron");
  if (job.scheduler().learned_model_lead_steps() == 0) {
    job.mutable_scheduler()->set_learned_model_lead_steps(32);
  }
  if (job.scheduler().objective().empty() && job.pretraining().hybrid_context_parallel()) {
    job.mutable_scheduler()->set_objective("hybrid");
  }
  // A job that learns its model keeps the budget unset, so that a learned
  // version (in seconds) plans without the s²/c default's cap
  // (Job::PlannerOptionsFor).
  if (!job.scheduler().has_cp_upgrade_budget() && !job.scheduler().learn_cost_model()) {
    job.mutable_scheduler()->set_cp_upgrade_budget(DefaultCpUpgradeBudget(
        job.scheduler().cost_model(), job.pretraining().hybrid_context_parallel()));
  }
  if (job.sampler() == v1::SAMPLER_MODE_UNSPECIFIED) job.set_sampler(v1::SAMPLER_MODE_SHUFFLE);
  if (job.pad_id() == 0) job.set_pad_id(job.eod_id());
  const bool pretraining = IsPretrainingJob(job);
  if (pretraining) {
    v1::Pretraining& p = *job.mutable_pretraining();
    const bool per_split = IsBlendPerSplit(p);
    if (p.split().empty()) p.set_split(per_split ? kWholeTrainSplit : "969,30,1");
    // Megatron's blend_per_split builds a split of one dataset as that
    // dataset alone, weighted or not.
    if (per_split && job.datasets_size() == 1) job.mutable_datasets(0)->set_weight(0);
    if (!p.has_mid_level_dataset_surplus()) p.set_mid_level_dataset_surplus(0.005);
    if (p.micro_batch_size() == 0) p.set_micro_batch_size(1);
    // Megatron's batch is fixed: micro_batch_size samples per DP rank.
    if (job.scheduler().max_tokens_per_rank() == 0) {
      job.mutable_scheduler()->set_max_tokens_per_rank(p.micro_batch_size() * job.seq_length());
    }
  }
  for (v1::DatasetSpec& dataset : *job.mutable_datasets()) {
    // A pretraining job's weights stay 0 when none are given: Megatron
    // blends differently without weights.
    if (dataset.weight() == 0 && !pretraining) dataset.set_weight(1);
    if (dataset.kind() == v1::DATASET_KIND_UNSPECIFIED) dataset.set_kind(v1::DATASET_KIND_VARLEN);
  }
}

// IngestPeerTimes: the defaults config.proto names, then the ranges.
absl::Status FillIngestPeerTimes(v1::IngestPeerTimes& times, absl::string_view source) {
  if (times.room_wait_ms() == 0) times.set_room_wait_ms(30'000);
  if (times.forward_timeout_ms() == 0) times.set_forward_timeout_ms(times.room_wait_ms() + 30'000);
  if (times.seal_wait_ms() == 0) times.set_seal_wait_ms(10'000);
  if (times.sync_interval_ms() == 0) times.set_sync_interval_ms(500);
  struct Range {
    const char* field;
    uint32_t value, least, most;
  };
  for (const Range& range : {Range{"room_wait_ms", times.room_wait_ms(), 1, 3'600'000},
                             Range{"forward_timeout_ms", times.forward_timeout_ms(),
                                   times.room_wait_ms() + 1, 3'900'000},
                             Range{"seal_wait_ms", times.seal_wait_ms(), 1, 3'600'000},
                             Range{"sync_interval_ms", times.sync_interval_ms(), 50, 60'000}}) {
    if (range.value < range.least || range.value > range.most) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ingest_peers.", range.field, ": ",
                                                     range.value, " is out of [", range.least, ", ",
                                                     range.most, "]"));
    }
  }
  return absl::OkStatus();
}

// Ranks attaching over TCP are known by their job's token alone (no uid).
absl::Status ValidateRanksOverTcp(const v1::DaemonConfig& config, absl::string_view source) {
  if (!config.ranks_over_tcp()) return absl::OkStatus();
  if (config.admin_tcp_address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ranks_over_tcp: ranks attach over admin_tcp_address, which is not set"));
  }
  for (const v1::JobConfig& job : config.jobs()) {
    if (job.auth_token().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ranks_over_tcp: job '", job.name(),
          "' has no auth_token, and a rank attaching over TCP proves itself by it alone"));
    }
  }
  if (!config.has_admin_tls() && !config.ranks_over_tcp_without_tls()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": ranks_over_tcp without admin_tls: every job token and rank connection key would "
        "cross the network in cleartext; set admin_tls, or ranks_over_tcp_without_tls: true "
        "on a network only the job's own hosts reach"));
  }
  return absl::OkStatus();
}

// The job's name and where its samples come from: datasets or an ingest
// stream.
absl::Status ValidateSources(const v1::JobConfig& job, absl::string_view where) {
  const std::string& name = job.name();
  if (!IsName(name)) {
    return FieldError(where, "name", absl::StrCat("'", name, "' must be [A-Za-z0-9_.-]+"));
  }
  const bool ingest = !job.ingest_stream().empty();
  if (ingest) {
    if (!job.datasets().empty()) {
      return FieldError(where, "datasets", "a job reads datasets or an ingest_stream, not both");
    }
    if (job.append_eod()) {
      return FieldError(where, "append_eod", "ingested samples are served as put");
    }
  } else if (job.datasets().empty()) {
    return FieldError(where, "datasets", "at least one is required (or an ingest_stream)");
  }
  for (int i = 0; i < job.datasets_size(); ++i) {
    const v1::DatasetSpec& dataset = job.datasets(i);
    const std::string at = absl::StrCat("datasets[", i, "]");
    if (dataset.prefix().empty()) return FieldError(where, at + ".prefix", "required");
    const bool no_weights = IsPretrainingJob(job) && job.datasets(0).weight() == 0;
    if (no_weights ? dataset.weight() != 0 : !(dataset.weight() > 0)) {
      return FieldError(where, at + ".weight",
                        no_weights ? "give every dataset of a pretraining blend a weight, or none"
                                   : absl::StrCat(dataset.weight(), " is not positive"));
    }
    if (dataset.kind() != job.datasets(0).kind()) {
      return FieldError(where, at + ".kind", "every dataset of a job must have the same kind");
    }
  }
  return absl::OkStatus();
}

// The ranks of one model replica set: TP·PP·CP·DP.
uint64_t WorldSize(const v1::Topology& t) { return uint64_t{t.tp()} * t.pp() * t.cp() * t.dp(); }

// Each parallel size in range, and the world they make within 2^20 ranks.
absl::Status ValidateTopology(const v1::Topology& t, absl::string_view where) {
  for (auto [field, value] :
       {std::pair{"tp", t.tp()}, {"pp", t.pp()}, {"cp", t.cp()}, {"dp", t.dp()}}) {
    if (value < 1 || value > 65536) {
      return FieldError(where, absl::StrCat("topology.", field),
                        absl::StrCat(value, " is out of [1, 65536]"));
    }
  }
  const uint64_t world = WorldSize(t);
  if (world > (1u << 20)) {
    return FieldError(where, "topology", absl::StrCat("world size ", world, " exceeds 2^20 ranks"));
  }
  return absl::OkStatus();
}

// VPP, Megatron's layer split per stage, and the side fields: each resolved,
// named once, at most one loss mask, within the wire's fields with the THD
// ones, and every dataset's side-field prefix naming one of them.
absl::Status ValidateSideFields(const v1::JobConfig& job, absl::string_view where) {
  const v1::Topology& t = job.topology();
  if (t.vpp() < 1 || t.vpp() > 1024) {
    return FieldError(where, "topology.vpp", absl::StrCat(t.vpp(), " is out of [1, 1024]"));
  }
  if (t.vpp() > 1 && t.pp() < 2) return FieldError(where, "topology.vpp", "needs topology.pp > 1");
  absl::StatusOr<ModelStages> stages = ModelStages::Create(
      job.model(), static_cast<int>(t.pp()), static_cast<int>(t.vpp()), std::string(where));
  if (!stages.ok()) return stages.status();
  std::set<std::string> side_names;
  int loss_masks = 0;
  size_t wire_fields = 0;
  for (int f = 0; f < job.side_fields_size(); ++f) {
    const std::string at = absl::StrCat(where, ".side_fields[", f, "]");
    absl::StatusOr<SideFieldInfo> field = ResolveSideField(job.side_fields(f), *stages, at);
    if (!field.ok()) return field.status();
    if (!side_names.insert(field->name).second) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".name: '", field->name, "' twice"));
    }
    if (field->loss_mask && ++loss_masks > 1) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".role: a second loss mask"));
    }
    wire_fields += field->layer_axis ? t.vpp() : 1;
  }
  // The THD fields take at most 10 of the wire's slots, hybrid CP's
  // sample_ids and hybrid_group 2 more.
  const size_t thd_fields =
      IsPretrainingJob(job) && job.pretraining().hybrid_context_parallel() ? 12 : 10;
  if (wire_fields + thd_fields > transport::kMaxFields) {
    return FieldError(where, "side_fields",
                      absl::StrCat(wire_fields,
                                   " fields to serve (a layer-axis field once per "
                                   "model chunk); at most ",
                                   transport::kMaxFields - thd_fields));
  }
  for (int i = 0; i < job.datasets_size(); ++i) {
    for (const auto& [name, prefix] : job.datasets(i).side_field_prefixes()) {
      if (side_names.count(name) == 0) {
        return FieldError(where, absl::StrCat("datasets[", i, "].side_field_prefixes"),
                          absl::StrCat("'", name, "' is not a side field of the job"));
      }
    }
  }
  return absl::OkStatus();
}

// The planner: its kind, cost model, CP bounds, objective and what learning
// the cost model needs. Returns the kind.
absl::StatusOr<scheduler::SchedulerKind> ValidateScheduler(const v1::JobConfig& job,
                                                           absl::string_view where) {
  const v1::Topology& t = job.topology();
  const v1::SchedulerConfig& s = job.scheduler();
  absl::StatusOr<scheduler::SchedulerKind> kind = scheduler::SchedulerKindFromName(s.kind());
  if (!kind.ok()) return FieldError(where, "scheduler.kind", kind.status().message());
  if (s.max_tokens_per_rank() < 1) {
    return FieldError(where, "scheduler.max_tokens_per_rank", "required (>= 1)");
  }
  if (absl::Status model = CostModelOf(s, t).status(); !model.ok()) {
    return FieldError(where, "scheduler.cost_model", model.message());
  }
  for (auto [field, value] : {std::pair{"min_cp", s.min_cp()}, {"max_cp", s.max_cp()}}) {
    if (value != 0 && !IsPowerOfTwo(value)) {
      return FieldError(where, absl::StrCat("scheduler.", field),
                        absl::StrCat(value, " is not a power of two"));
    }
  }
  if (!(s.cp_upgrade_budget() >= 0)) {
    return FieldError(where, "scheduler.cp_upgrade_budget", "must be >= 0");
  }
  absl::StatusOr<scheduler::Objective> objective = scheduler::ObjectiveFromName(s.objective());
  if (!objective.ok())
    return FieldError(where, "scheduler.objective", objective.status().message());
  if (*objective == scheduler::Objective::kHybrid &&
      !(IsPretrainingJob(job) && job.pretraining().hybrid_context_parallel())) {
    return FieldError(where, "scheduler.objective",
                      "hybrid judges a plan as Megatron's hybrid-CP loop runs it; it needs "
                      "pretraining.hybrid_context_parallel");
  }
  if (s.learn_cost_model()) {
    // What the learner fits from: each rank's compute per microbatch of a
    // plan the daemon made (cost_learner.h).
    if (t.pp() > 1) {
      return FieldError(where, "scheduler.learn_cost_model",
                        "needs PP 1 (pipeline stages interleave microbatches, so a rank's "
                        "compute per microbatch is not measured)");
    }
    if (*kind == scheduler::SchedulerKind::kMegatronDpBalanced ||
        (IsPretrainingJob(job) && !job.pretraining().hybrid_context_parallel())) {
      return FieldError(where, "scheduler.learn_cost_model",
                        "needs a job the daemon plans by cost (balanced or dynamic_cp; a "
                        "pretraining job only with hybrid_context_parallel)");
    }
  }
  if (s.learned_model_lead_steps() > 100000) {
    return FieldError(where, "scheduler.learned_model_lead_steps",
                      absl::StrCat(s.learned_model_lead_steps(), " is above 100000"));
  }
  return *kind;
}

}  // namespace

absl::Status ValidateJobConfig(const v1::JobConfig& job, absl::string_view where) {
  PF_RETURN_IF_ERROR(ValidateSources(job, where));
  PF_RETURN_IF_ERROR(ValidateTopology(job.topology(), where));
  const bool ingest = !job.ingest_stream().empty();
  const v1::Topology& t = job.topology();
  const uint64_t world = WorldSize(t);
  if (job.long_documents() == v1::JobConfig::LONG_DOCUMENTS_SPLIT && !ingest &&
      job.datasets(0).kind() == v1::DATASET_KIND_SFT) {
    return FieldError(where, "long_documents",
                      "LONG_DOCUMENTS_SPLIT is for varlen datasets (sft rows are truncated)");
  }
  if (IsPretrainingJob(job)) PF_RETURN_IF_ERROR(ValidatePretraining(job, where));
  PF_RETURN_IF_ERROR(ValidateSideFields(job, where));
  if (job.global_batch() < 1) {
    return FieldError(where, "global_batch", absl::StrCat(job.global_batch(), " must be >= 1"));
  }
  if (job.seq_length() < 2) {
    return FieldError(where, "seq_length", absl::StrCat(job.seq_length(), " must be >= 2"));
  }
  PF_ASSIGN_OR_RETURN(const scheduler::SchedulerKind kind, ValidateScheduler(job, where));
  if (t.ep() > 1 && (t.dp() * t.cp()) % t.ep() != 0) {
    return FieldError(where, "topology.ep",
                      absl::StrCat(t.ep(), " does not divide DP·CP = ", t.dp() * t.cp()));
  }
  if (kind == scheduler::SchedulerKind::kMegatronDpBalanced) {
    if (job.global_batch() % t.dp() != 0) {
      return FieldError(where, "global_batch",
                        absl::StrCat(job.global_batch(), " is not a multiple of DP ", t.dp(),
                                     " (megatron_dp_balanced)"));
    }
    if (job.datasets_size() != 1 || job.sampler() != v1::SAMPLER_MODE_SEQUENTIAL || ingest) {
      // Megatron's sample order is defined for one dataset read in order.
      return FieldError(where, "sampler",
                        "megatron_dp_balanced needs one dataset and SAMPLER_MODE_SEQUENTIAL");
    }
  }
  if (job.sampler() == v1::SAMPLER_MODE_SEQUENTIAL && job.datasets_size() != 1 && !ingest) {
    return FieldError(where, "sampler", "SAMPLER_MODE_SEQUENTIAL reads exactly one dataset");
  }
  std::set<uint32_t> seen;
  for (uint32_t rank : job.local_ranks()) {
    if (rank >= world) {
      return FieldError(where, "local_ranks",
                        absl::StrCat("rank ", rank, " is outside the world of ", world));
    }
    if (!seen.insert(rank).second) {
      return FieldError(where, "local_ranks", absl::StrCat("rank ", rank, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DaemonConfig> ParseDaemonConfig(absl::string_view text,
                                                   absl::string_view source) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", errors.first()));
  }
  if (config.socket_path().empty()) config.set_socket_path(kDefaultSocketPath);
  if (config.prefetch_steps() == 0) config.set_prefetch_steps(2);
  if (config.side_rows_read_ahead_bytes() == 0) config.set_side_rows_read_ahead_bytes(16u << 20);
  if (config.peer_timeout_seconds() == 0) config.set_peer_timeout_seconds(120);
  // The ledger's defaults (LedgerOptions), named in config.proto.
  if (config.ledger_keep_steps() == 0) config.set_ledger_keep_steps(1000);
  if (config.ledger_compact_after_lines() == 0) config.set_ledger_compact_after_lines(65536);
  if (!config.admin_tcp_address().empty() && config.admin_tcp_token().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": admin_tcp_token: required with admin_tcp_address (a TCP listener is "
                     "open to the network)"));
  }
  if (config.has_admin_tls()) {
    const v1::AdminTls& tls = config.admin_tls();
    if (config.admin_tcp_address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": admin_tls: secures admin_tcp_address, which is not set"));
    }
    for (auto [field, value] : {std::pair{"cert_file", &tls.cert_file()},
                                {"key_file", &tls.key_file()},
                                {"ca_file", &tls.ca_file()}}) {
      if (value->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": admin_tls.", field, ": required with admin_tls"));
      }
    }
  }
  if (!config.peers().empty() && config.admin_tcp_address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": peers: peers check each other, so admin_tcp_address must be set too"));
  }
  if (config.jobs().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": jobs: at least one job is required"));
  }
  if (config.packing_threads() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": packing_threads: ", config.packing_threads(), " threads per job; at most 64"));
  }
  std::set<std::string> names;
  std::vector<v1::JobConfig> split_jobs;
  for (int i = 0; i < config.jobs_size(); ++i) {
    v1::JobConfig& job = *config.mutable_jobs(i);
    FillDefaults(job);
    const std::string where = absl::StrCat(source, ": jobs[", i, "]");
    PF_RETURN_IF_ERROR(ValidateJobConfig(job, where));
    for (v1::JobConfig& derived : SplitJobsOf(job)) {
      FillDefaults(derived);
      PF_RETURN_IF_ERROR(ValidateJobConfig(
          derived, absl::StrCat(where, " (its job '", derived.name(), "', serve_every_split)")));
      split_jobs.push_back(std::move(derived));
    }
  }
  for (v1::JobConfig& derived : split_jobs) *config.add_jobs() = std::move(derived);
  for (int i = 0; i < config.jobs_size(); ++i) {
    if (!names.insert(config.jobs(i).name()).second) {
      return FieldError(absl::StrCat(source, ": jobs[", i, "]"), "name",
                        absl::StrCat("'", config.jobs(i).name(), "' names two jobs"));
    }
  }
  PF_RETURN_IF_ERROR(ValidateRanksOverTcp(config, source));
  PF_RETURN_IF_ERROR(ValidateIngest(config, source));
  if (config.learned_model_sync_ms() > 60000) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": learned_model_sync_ms: ", config.learned_model_sync_ms(), " is above 60000"));
  }
  if (config.learned_model_sync_ms() == 0) config.set_learned_model_sync_ms(1000);
  PF_RETURN_IF_ERROR(FillIngestPeerTimes(*config.mutable_ingest_peers(), source));
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadDaemonConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("cannot read the configuration file: ",
                                                           text.status().message()));
  }
  return ParseDaemonConfig(*text, path);
}

}  // namespace packfeed::server
