#include "packfeed/server/job.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/megatron_dp_balanced.h"
#include "packfeed/scheduler/padding.h"
#include "packfeed/server/fingerprint.h"

namespace packfeed {
namespace {

using transport::ElementType;
using transport::FieldSpec;

// The wire fields of a microbatch of `tokens` local tokens and `sequences`
// sequences, in slot order; `group_ranks` > 0 adds the dynamic-CP fields.
// With `packed` the data pointers are its arrays, else null (for sizing).
SlotFields FieldsFor(const PackedMicrobatch* packed, int64_t tokens, int64_t sequences,
                     int64_t group_ranks, StageFields stage) {
  SlotFields out;
  auto add = [&](const char* name, ElementType type, std::vector<int64_t> shape,
                 const void* data) {
    out.specs.push_back({name, type, std::move(shape)});
    out.data.push_back(packed != nullptr ? data : nullptr);
  };
  const PackedMicrobatch empty;
  const PackedMicrobatch& p = packed != nullptr ? *packed : empty;
  if (stage.inputs) {
    add("tokens", ElementType::kInt64, {1, tokens}, p.tokens.data());
    add("position_ids", ElementType::kInt64, {1, tokens}, p.position_ids.data());
  }
  if (stage.targets) {
    add("labels", ElementType::kInt64, {1, tokens}, p.labels.data());
    add("loss_mask", ElementType::kFloat32, {1, tokens}, p.loss_mask.data());
  }
  add("padding_mask", ElementType::kBool, {1, tokens}, p.padding_mask.data());
  add("cu_seqlens", ElementType::kInt32, {sequences + 1}, p.cu_seqlens.data());
  add("cu_seqlens_padded", ElementType::kInt32, {sequences + 1}, p.cu_seqlens_padded.data());
  add("max_seqlen", ElementType::kInt32, {}, &p.max_seqlen);
  if (group_ranks > 0) {
    add("local_cp_size", ElementType::kInt32, {}, p.local_cp_size ? &*p.local_cp_size : nullptr);
    add("cp_group_ranks", ElementType::kInt32, {group_ranks}, p.cp_group_ranks.data());
  }
  return out;
}

absl::StatusOr<CostModel> CostModelFromName(const std::string& name) {
  if (name == "llama8b") return CostModel::FromModel(4096, 14336, 1024);
  return CostModel::Megatron();
}

std::string Canonical(std::initializer_list<int64_t> values) {
  std::string out;
  for (int64_t v : values) absl::StrAppend(&out, v, ";");
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

SlotFields MicrobatchFields(const PackedMicrobatch& packed, int pp_rank, int pp_size) {
  return FieldsFor(&packed, static_cast<int64_t>(packed.padding_mask.size()),
                   static_cast<int64_t>(packed.cu_seqlens.size()) - 1,
                   packed.local_cp_size ? static_cast<int64_t>(packed.cp_group_ranks.size()) : 0,
                   FieldsOfStage(pp_rank, pp_size));
}

absl::StatusOr<std::unique_ptr<Job>> Job::Create(const v1::JobConfig& config) {
  std::unique_ptr<Job> job(new Job());
  job->config_ = config;
  const v1::Topology& t = config.topology();
  job->layout_ = {static_cast<int>(t.tp()), static_cast<int>(t.pp()), static_cast<int>(t.cp()),
                  static_cast<int>(t.dp()), t.sequence_parallel()};
  const v1::SchedulerConfig& s = config.scheduler();
  PF_ASSIGN_OR_RETURN(job->planner_.kind, SchedulerKindFromName(s.kind()));
  job->planner_.dp = job->layout_.dp;
  job->planner_.cp = job->layout_.cp;
  job->planner_.tp = job->layout_.tp;
  job->planner_.sequence_parallel = t.sequence_parallel();
  job->planner_.vpp_group_size = static_cast<int>(t.vpp_group_size());
  job->planner_.max_tokens_per_rank = s.max_tokens_per_rank();
  job->planner_.min_cp = static_cast<int>(s.min_cp());
  job->planner_.max_cp = static_cast<int>(s.max_cp());
  job->planner_.cp_upgrade_budget = s.cp_upgrade_budget();
  PF_ASSIGN_OR_RETURN(job->planner_.cost_model, CostModelFromName(s.cost_model()));
  job->planner_.max_sequences_per_pack = static_cast<int>(s.max_sequences_per_pack());
  if (job->planner_.kind == SchedulerKind::kDynamicCp) {
    PF_RETURN_IF_ERROR(ResolveCpRange(job->planner_).status());
  }

  const bool sft = config.datasets(0).kind() == v1::DATASET_KIND_SFT;
  job->rules_ = {sft ? SampleKind::kSft : SampleKind::kVarlen, config.seq_length(),
                 config.eod_id(), config.pad_id(), config.append_eod(),
                 job->planner_.kind == SchedulerKind::kMegatronDpBalanced};

  SamplerOptions sampler;
  sampler.global_batch = config.global_batch();
  sampler.seed = config.seed();
  sampler.shuffle = config.sampler() != v1::SAMPLER_MODE_SEQUENTIAL;
  std::string datasets_part;
  for (const v1::DatasetSpec& spec : config.datasets()) {
    PF_ASSIGN_OR_RETURN(IndexedDataset dataset, IndexedDataset::Open(spec.prefix()));
    if (dataset.num_documents() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(spec.prefix(), ": the dataset holds no document"));
    }
    PF_ASSIGN_OR_RETURN(MappedFile idx, MappedFile::Open(spec.prefix() + ".idx"));
    const absl::Span<const uint8_t> idx_bytes = idx.bytes();
    absl::StrAppend(&datasets_part,
                    StableHash(absl::string_view(reinterpret_cast<const char*>(idx_bytes.data()),
                                                 idx_bytes.size())),
                    ";", dataset.bin_bytes(), ";", spec.kind(), ";", spec.weight(), "|");
    sampler.datasets.push_back({static_cast<int64_t>(dataset.num_documents()), spec.weight()});
    job->datasets_.push_back(std::move(dataset));
  }
  PF_ASSIGN_OR_RETURN(Sampler created, Sampler::Create(sampler));
  job->sampler_ = std::make_unique<Sampler>(std::move(created));

  FingerprintInputs parts;
  parts.datasets = datasets_part;
  parts.topology = Canonical({t.tp(), t.pp(), t.cp(), t.dp(), t.vpp_group_size(),
                              t.sequence_parallel()});
  parts.batch = Canonical({config.global_batch(), config.seq_length(), config.eod_id(),
                           config.pad_id(), config.append_eod()});
  parts.scheduler = absl::StrCat(s.kind(), ";", s.cost_model(), ";", s.cp_upgrade_budget(), ";",
                                 Canonical({s.max_tokens_per_rank(), s.min_cp(), s.max_cp(),
                                            s.max_sequences_per_pack()}));
  parts.sampler = Canonical({config.sampler(), static_cast<int64_t>(config.seed())});
  job->fingerprint_ = MakeFingerprint(parts);

  for (uint32_t rank : config.local_ranks()) job->local_ranks_.push_back(static_cast<int>(rank));
  if (job->local_ranks_.empty()) {
    for (int r = 0; r < job->layout_.world_size(); ++r) job->local_ranks_.push_back(r);
  }
  std::sort(job->local_ranks_.begin(), job->local_ranks_.end());

  // The worst case of every stage: a rank's tokens are capped by the
  // planner; a microbatch holds at most the whole batch's sequences.
  const bool dynamic = job->planner_.kind == SchedulerKind::kDynamicCp;
  PF_ASSIGN_OR_RETURN(
      std::vector<transport::FieldDescriptor> layout,
      transport::LayoutFields(FieldsFor(nullptr, s.max_tokens_per_rank(), config.global_batch(),
                                        dynamic ? job->layout_.dp_cp_size() : 0, {true, true})
                                  .specs,
                              UINT64_MAX));
  job->required_slot_bytes_ = layout.back().offset + layout.back().bytes;
  return job;
}

bool Job::IsLocal(int global_rank) const {
  return std::binary_search(local_ranks_.begin(), local_ranks_.end(), global_rank);
}

int64_t Job::StoredTokens(const SampleRef& sample) const {
  const IndexView& index = datasets_[sample.dataset].index();
  int64_t tokens = 0;
  for (int64_t i = index.document_index(sample.index); i < index.document_index(sample.index + 1);
       ++i) {
    tokens += index.length(i);
  }
  return tokens;
}

absl::StatusOr<StepPlan> Job::Plan(int64_t step) const {
  StepPlan out;
  out.step = step;
  const std::vector<SampleRef> batch = sampler_->GlobalBatch(step);
  std::vector<int64_t> lengths;
  lengths.reserve(batch.size());
  for (const SampleRef& sample : batch) {
    lengths.push_back(RealLength(ShapeOfSample(StoredTokens(sample), rules_).run_length, rules_));
  }
  absl::StatusOr<GlobalPlan> plan;
  if (planner_.kind == SchedulerKind::kMegatronDpBalanced) {
    // Megatron numbers the batch DP-rank-major: DP rank d reads positions
    // k·DP + d, and its k-th sample is gid d·(G/DP) + k. Every sequence is
    // padded to Megatron's divisor; sft rows count their padding as real.
    const int64_t per_dp = static_cast<int64_t>(batch.size()) / layout_.dp;
    const int64_t divisor = PaddingDivisor(layout_.cp, layout_.tp, layout_.sequence_parallel);
    std::vector<int64_t> real(batch.size()), padded(batch.size());
    out.samples.resize(batch.size());
    for (int64_t p = 0; p < static_cast<int64_t>(batch.size()); ++p) {
      const int64_t gid = (p % layout_.dp) * per_dp + p / layout_.dp;
      padded[gid] = PadTo(lengths[p], divisor);
      real[gid] = rules_.kind == SampleKind::kSft ? padded[gid] : lengths[p];
      out.samples[gid] = batch[p];
    }
    MegatronDpBalancedOptions options;
    options.dp = layout_.dp;
    options.cp = layout_.cp;
    options.max_seqlen_per_dp_cp_rank = planner_.max_tokens_per_rank;
    options.max_num_seqs = planner_.max_sequences_per_pack;
    options.vpp_group_size = planner_.vpp_group_size;
    plan = PlanMegatronDpBalanced(real, padded, options);
  } else {
    out.samples = batch;
    plan = PlanGlobalBatch(lengths, planner_);
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("job ", name(), " step ", step, ": ", plan.status().message()));
  }
  out.plan = *std::move(plan);
  return out;
}

absl::StatusOr<std::vector<int64_t>> Job::ReadRun(const SampleRef& sample, uint64_t& bytes) const {
  const IndexedDataset& dataset = datasets_[sample.dataset];
  const IndexView& index = dataset.index();
  const int64_t first = index.document_index(sample.index);
  const int64_t last = index.document_index(sample.index + 1);
  const int64_t stored = StoredTokens(sample);
  const SampleShape shape = ShapeOfSample(stored, rules_);
  std::vector<int64_t> read(shape.read_tokens);
  if (shape.read_tokens == stored) {
    PF_RETURN_IF_ERROR(dataset.ReadSequences(first, last - first, absl::MakeSpan(read)));
  } else {
    // Truncated: only the kept prefix is read.
    int64_t filled = 0;
    for (int64_t i = first; i < last && filled < shape.read_tokens; ++i) {
      const int64_t take = std::min<int64_t>(index.length(i), shape.read_tokens - filled);
      PF_RETURN_IF_ERROR(dataset.Read(i, absl::MakeSpan(read).subspan(filled, take)));
      filled += take;
    }
  }
  bytes += shape.read_tokens * DTypeSize(dataset.dtype());
  return MakeTokenRun(read, shape, rules_);
}

absl::StatusOr<StepData> Job::Read(StepPlan plan, absl::Span<const int> global_ranks) const {
  std::set<int> dp_cp_ranks;
  for (int rank : global_ranks) dp_cp_ranks.insert(layout_.Coords(rank).dp_cp_rank);
  StepData data;
  std::vector<uint64_t> before;
  for (const IndexedDataset& dataset : datasets_) before.push_back(dataset.bytes_read());
  for (const PlannedMicrobatch& microbatch : plan.plan.microbatches) {
    for (const CpGroup& group : microbatch.groups) {
      auto hosted = dp_cp_ranks.lower_bound(group.first_rank);
      if (hosted == dp_cp_ranks.end() || *hosted >= group.first_rank + group.size) continue;
      for (const PlannedSequence& sequence : group.sequences) {
        if (data.runs.count(sequence.sample) != 0) continue;
        PF_ASSIGN_OR_RETURN(std::vector<int64_t> run,
                            ReadRun(plan.samples[sequence.sample], data.unique_bytes));
        data.runs.emplace(sequence.sample, std::move(run));
      }
    }
  }
  for (size_t i = 0; i < datasets_.size(); ++i) {
    data.bytes_read += datasets_[i].bytes_read() - before[i];
  }
  data.plan = std::move(plan);
  return data;
}

absl::StatusOr<PackedMicrobatch> Job::Pack(const StepData& data, int microbatch,
                                           int global_rank) const {
  const RankCoords coords = layout_.Coords(global_rank);
  const CpGroup& group = GroupOfRank(data.plan.plan.microbatches[microbatch], coords.dp_cp_rank);
  std::vector<const std::vector<int64_t>*> runs;
  for (const PlannedSequence& sequence : group.sequences) {
    auto run = data.runs.find(sequence.sample);
    if (run == data.runs.end()) {
      return absl::InternalError(absl::StrCat("rank ", global_rank, " step ", data.plan.step,
                                              ": sample ", sequence.sample, " was not read"));
    }
    runs.push_back(&run->second);
  }
  PF_ASSIGN_OR_RETURN(PackedMicrobatch packed,
                      PackMicrobatch(group, runs, coords.dp_cp_rank - group.first_rank, rules_));
  if (planner_.kind == SchedulerKind::kDynamicCp) {
    packed.local_cp_size = group.size;
    for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
      packed.cp_group_ranks.push_back(layout_.GlobalRank(coords.tp, r, coords.pp));
    }
  }
  return packed;
}

std::vector<SampleRef> MicrobatchSamples(const StepPlan& plan, int microbatch, int dp_cp_rank) {
  std::vector<SampleRef> samples;
  const CpGroup& group = GroupOfRank(plan.plan.microbatches[microbatch], dp_cp_rank);
  for (const PlannedSequence& sequence : group.sequences) {
    samples.push_back(plan.samples[sequence.sample]);
  }
  return samples;
}

}  // namespace packfeed
