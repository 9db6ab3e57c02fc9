#include "server/internal/pack.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/thd_partition.h"

namespace packfeed::server {
namespace {

using dataset::SampleKind;
using transport::ElementType;

// Appends positions [begin, end) of one sequence to `out`.
void AppendPositions(const std::vector<int64_t>& run, int64_t real_length, int64_t begin,
                     int64_t end, const dataset::SampleRules& rules, PackedMicrobatch& out) {
  const int64_t run_length = static_cast<int64_t>(run.size());
  for (int64_t j = begin; j < end; ++j) {
    const bool pad = j >= real_length;
    out.padding_mask.push_back(pad ? 1 : 0);
    if (rules.kind == SampleKind::kVarlen) {
      // Megatron zeroes every field of a pad slot.
      out.tokens.push_back(pad ? 0 : run[j]);
      out.labels.push_back(pad ? 0 : run[j + 1]);
      out.loss_mask.push_back(pad ? 0.0f : 1.0f);
      out.position_ids.push_back(pad ? 0 : j);
    } else {
      // b = t + pads: pad slots keep the pad id and running positions; a
      // position whose label is a pad (or Megatron's ignore index) is not
      // trained.
      const int64_t token = j < run_length ? run[j] : rules.pad_id;
      const int64_t label = j + 1 < run_length ? run[j + 1] : rules.pad_id;
      out.tokens.push_back(token);
      out.labels.push_back(label);
      out.loss_mask.push_back(label == rules.pad_id || label == -100 ? 0.0f : 1.0f);
      out.position_ids.push_back(j);
    }
  }
}

// The wire fields of a microbatch of `tokens` local tokens and `sequences`
// sequences, in slot order; `group_ranks` > 0 adds the dynamic-CP fields.
// With `packed` the data pointers are its arrays, else null (for sizing).
SlotFields FieldsFor(const PackedMicrobatch* packed, int64_t tokens, int64_t sequences,
                     int64_t group_ranks, StageFields stage) {
  SlotFields out;
  auto add = [&](const char* name, ElementType type, std::vector<int64_t> shape, const void* data) {
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

}  // namespace

StageFields FieldsOfStage(int pp_rank, int pp_size) {
  return {pp_rank == 0, pp_rank == pp_size - 1};
}

absl::StatusOr<PackedMicrobatch> PackMicrobatch(const scheduler::CpGroup& group,
                                                absl::Span<const std::vector<int64_t>* const> runs,
                                                int cp_rank, const dataset::SampleRules& rules) {
  if (runs.size() != group.sequences.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(runs.size(), " token runs for ", group.sequences.size(), " sequences"));
  }
  if (cp_rank < 0 || cp_rank >= group.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp rank ", cp_rank, " outside a group of ", group.size));
  }
  PackedMicrobatch out;
  out.cu_seqlens.push_back(0);
  out.cu_seqlens_padded.push_back(0);
  int64_t real_total = 0;
  int64_t padded_total = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const scheduler::PlannedSequence& sequence = group.sequences[i];
    const std::vector<int64_t>& run = *runs[i];
    const int64_t padded = sequence.padded_length;
    const int64_t real = sequence.length;
    // varlen reads labels up to t[real]; sft reads within the run.
    const int64_t needed = rules.kind == SampleKind::kVarlen ? real + 1 : 0;
    if (static_cast<int64_t>(run.size()) < needed || real > padded ||
        static_cast<int64_t>(run.size()) > padded + 1) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", sequence.sample, ": run of ",
                                                     run.size(), " tokens for length ", real,
                                                     " padded to ", padded));
    }
    absl::StatusOr<std::array<scheduler::TokenRange, 2>> chunks =
        scheduler::ZigzagChunks(padded, group.size, cp_rank);
    if (!chunks.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", sequence.sample, ": ", chunks.status().message()));
    }
    for (const scheduler::TokenRange& chunk : *chunks) {
      AppendPositions(run, real, chunk.begin, chunk.end, rules, out);
    }
    real_total += real;
    padded_total += padded;
    if (padded_total > INT32_MAX) {
      return absl::InvalidArgumentError("microbatch exceeds 2^31 tokens");
    }
    out.cu_seqlens.push_back(static_cast<int32_t>(real_total));
    out.cu_seqlens_padded.push_back(static_cast<int32_t>(padded_total));
    out.max_seqlen = std::max<int32_t>(out.max_seqlen, static_cast<int32_t>(padded));
  }
  return out;
}

absl::StatusOr<PackedMicrobatch> PackForRank(const Job& job, const StepData& data, int microbatch,
                                             int global_rank) {
  const RankCoords coords = job.layout().Coords(global_rank);
  const scheduler::CpGroup& group = scheduler::GroupOfRank(
      data.plan.plan.microbatches[static_cast<size_t>(microbatch)], coords.dp_cp_rank);
  std::vector<const std::vector<int64_t>*> runs;
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    auto failed = data.failed.find(sequence.sample);
    if (failed != data.failed.end()) return failed->second;
    auto run = data.runs.find(sequence.sample);
    if (run == data.runs.end()) {
      return absl::InternalError(absl::StrCat("rank ", global_rank, " step ", data.plan.step,
                                              ": sample ", sequence.sample, " was not read"));
    }
    runs.push_back(&run->second);
  }
  PF_ASSIGN_OR_RETURN(
      PackedMicrobatch packed,
      PackMicrobatch(group, runs, coords.dp_cp_rank - group.first_rank, job.rules()));
  if (job.planner_options().kind == scheduler::SchedulerKind::kDynamicCp) {
    packed.local_cp_size = group.size;
    for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
      packed.cp_group_ranks.push_back(job.layout().GlobalRank(coords.tp, r, coords.pp));
    }
  }
  return packed;
}

SlotFields MicrobatchFields(const PackedMicrobatch& packed, int pp_rank, int pp_size) {
  return FieldsFor(&packed, static_cast<int64_t>(packed.padding_mask.size()),
                   static_cast<int64_t>(packed.cu_seqlens.size()) - 1,
                   packed.local_cp_size ? static_cast<int64_t>(packed.cp_group_ranks.size()) : 0,
                   FieldsOfStage(pp_rank, pp_size));
}

absl::StatusOr<uint64_t> MaxSlotBytes(int64_t max_tokens, int64_t max_sequences,
                                      int64_t group_ranks) {
  PF_ASSIGN_OR_RETURN(
      std::vector<transport::FieldDescriptor> layout,
      transport::LayoutFields(
          FieldsFor(nullptr, max_tokens, max_sequences, group_ranks, {true, true}).specs,
          UINT64_MAX));
  return layout.back().offset + layout.back().bytes;
}

}  // namespace packfeed::server
