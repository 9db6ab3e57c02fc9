#include "server/pipeline/pack.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/thd_partition.h"

namespace packfeed::server {
namespace {

using dataset::SampleKind;
using transport::ElementType;

// Positions [begin, end) of a Megatron pretraining sample, as
// GPTDataset.__getitem__ makes them: tokens = text[:-1], labels = text[1:]
// (text padded with the pad id to seq_length + 1); the loss masked at an
// EOD input (eod_mask_loss) and a pad label; positions restarting after each
// EOD input (reset_position_ids); pad ids served as 0.
void AppendPretrainingPositions(const std::vector<int64_t>& run, int64_t begin, int64_t end,
                                const dataset::SampleRules& rules, PackedMicrobatch& out) {
  const auto run_length = static_cast<int64_t>(run.size());
  auto text = [&](int64_t j) {
    return j < run_length ? run[static_cast<size_t>(j)] : rules.pad_id;
  };
  int64_t document_start = 0;
  if (rules.reset_position_ids) {
    for (int64_t k = begin - 1; k >= 0; --k) {
      if (text(k) == rules.eod_id) {
        document_start = k + 1;
        break;
      }
    }
  }
  for (int64_t j = begin; j < end; ++j) {
    const int64_t token = text(j);
    const int64_t label = text(j + 1);
    const bool masked = (rules.eod_mask_loss && token == rules.eod_id) || label == rules.pad_id;
    out.padding_mask.push_back(j >= run_length ? 1 : 0);
    out.tokens.push_back(token == rules.pad_id ? 0 : token);
    out.labels.push_back(label == rules.pad_id ? 0 : label);
    out.loss_mask.push_back(masked ? 0.0f : 1.0f);
    out.position_ids.push_back(rules.reset_position_ids ? j - document_start : j);
    if (rules.reset_position_ids && token == rules.eod_id) document_start = j + 1;
  }
}

// Megatron's reset_attention_mask as THD (CP 1): each sample of
// `seq_length` inputs split after every EOD input, so cu_seqlens mark the
// documents whose attention Megatron's [s, s] mask keeps apart; no dense
// mask is built.
void DocumentBoundaries(const dataset::SampleRules& rules, int64_t seq_length,
                        PackedMicrobatch& packed) {
  packed.cu_seqlens.assign(1, 0);
  packed.max_seqlen = 0;
  const auto tokens = static_cast<int64_t>(packed.tokens.size());
  int64_t start = 0;
  for (int64_t j = 0; j < tokens; ++j) {
    const bool sample_end = (j + 1) % seq_length == 0;
    const bool eod = packed.tokens[static_cast<size_t>(j)] == rules.eod_id &&
                     packed.padding_mask[static_cast<size_t>(j)] == 0;
    if (eod || sample_end) {
      packed.cu_seqlens.push_back(static_cast<int32_t>(j + 1));
      packed.max_seqlen = std::max<int32_t>(packed.max_seqlen, static_cast<int32_t>(j + 1 - start));
      start = j + 1;
    }
  }
  packed.cu_seqlens_padded = packed.cu_seqlens;
}

// Appends positions [begin, end) of one sequence to `out`.
void AppendPositions(const std::vector<int64_t>& run, int64_t real_length, int64_t begin,
                     int64_t end, const dataset::SampleRules& rules, PackedMicrobatch& out) {
  if (rules.kind == SampleKind::kPretraining) {
    AppendPretrainingPositions(run, begin, end, rules, out);
    return;
  }
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

// Bytes of one position of `slice`: its layer-axis entries' values.
uint64_t SliceRowBytes(const SideSlice& slice) {
  const SideFieldInfo& field = *slice.field;
  if (slice.entries.empty()) return field.row_bytes();
  uint64_t bytes = 0;
  for (const IndexRange& range : slice.entries) bytes += static_cast<uint64_t>(range.size());
  return bytes * (field.row_bytes() / static_cast<uint64_t>(field.inner_shape[0]));
}

std::vector<int64_t> SliceInnerShape(const SideSlice& slice) {
  std::vector<int64_t> shape = slice.field->inner_shape;
  if (!slice.entries.empty()) {
    shape[0] = 0;
    for (const IndexRange& range : slice.entries) shape[0] += range.size();
  }
  return shape;
}

// Appends positions [begin, end) of one sequence's side rows to `out`:
// stored row j (j + 1 aligned with labels) of a real position, else the pad.
void AppendSideRows(const SideSlice& slice, absl::Span<const char> rows, int64_t real_length,
                    int64_t begin, int64_t end, const std::vector<char>& pad_row,
                    std::vector<char>& out) {
  const SideFieldInfo& field = *slice.field;
  const uint64_t row_bytes = field.row_bytes();
  const int64_t shift = field.labels_aligned ? 1 : 0;
  const int64_t stored = static_cast<int64_t>(rows.size() / row_bytes);
  // Positions [begin, served) take stored rows, the rest pads.
  const int64_t served = std::max(begin, std::min({end, real_length, stored - shift}));
  const char* first = rows.data() + static_cast<uint64_t>(begin + shift) * row_bytes;
  if (slice.entries.empty()) {  // whole rows: one copy
    out.insert(out.end(), first, first + static_cast<uint64_t>(served - begin) * row_bytes);
  } else {
    const uint64_t layer_bytes = row_bytes / static_cast<uint64_t>(field.inner_shape[0]);
    for (const char* row = first; row < first + static_cast<uint64_t>(served - begin) * row_bytes;
         row += row_bytes) {
      for (const IndexRange& range : slice.entries) {
        out.insert(out.end(), row + static_cast<uint64_t>(range.begin) * layer_bytes,
                   row + static_cast<uint64_t>(range.end) * layer_bytes);
      }
    }
  }
  for (int64_t j = served; j < end; ++j) out.insert(out.end(), pad_row.begin(), pad_row.end());
}

// The loss mask of positions [begin, end): stored value j + 1 of a real
// position is 0 = not trained.
void ApplyLossMask(absl::Span<const char> mask, int64_t real_length, int64_t begin, int64_t end,
                   float* loss_mask) {
  for (int64_t j = begin; j < end; ++j, ++loss_mask) {
    const int64_t i = j + 1;
    if (j >= real_length || i >= static_cast<int64_t>(mask.size()) ||
        mask[static_cast<size_t>(i)] == 0) {
      *loss_mask = 0.0f;
    }
  }
}

// The side field `slice` serves, without its bytes.
PackedMicrobatch::Side SideOfSlice(const SideSlice& slice) {
  return {slice.wire_name, slice.field->type, SliceInnerShape(slice), {}};
}

// The wire fields of a microbatch of `tokens` local tokens and `sequences`
// sequences, in slot order; `group_ranks` > 0 adds the dynamic-CP fields.
// With `packed` the data pointers are its arrays, else null (for sizing).
SlotFields FieldsFor(const PackedMicrobatch* packed, int64_t tokens, int64_t sequences,
                     int64_t group_ranks, StageFields stage,
                     absl::Span<const PackedMicrobatch::Side> sides, int64_t bshd_rows = 0) {
  const std::vector<int64_t> per_token = bshd_rows > 0
                                             ? std::vector<int64_t>{bshd_rows, tokens / bshd_rows}
                                             : std::vector<int64_t>{1, tokens};
  SlotFields out;
  auto add = [&](std::string name, ElementType type, std::vector<int64_t> shape, const void* data) {
    out.specs.push_back({std::move(name), type, std::move(shape)});
    out.data.push_back(packed != nullptr ? data : nullptr);
  };
  const PackedMicrobatch empty;
  const PackedMicrobatch& p = packed != nullptr ? *packed : empty;
  if (stage.inputs) {
    add(ChunkFieldName("tokens", stage.inputs_chunk), ElementType::kInt64, per_token,
        p.tokens.data());
    add(ChunkFieldName("position_ids", stage.inputs_chunk), ElementType::kInt64, per_token,
        p.position_ids.data());
  }
  if (stage.targets) {
    add(ChunkFieldName("labels", stage.targets_chunk), ElementType::kInt64, per_token,
        p.labels.data());
    add(ChunkFieldName("loss_mask", stage.targets_chunk), ElementType::kFloat32, per_token,
        p.loss_mask.data());
  }
  add("padding_mask", ElementType::kBool, per_token, p.padding_mask.data());
  if (bshd_rows == 0) {
    add("cu_seqlens", ElementType::kInt32, {sequences + 1}, p.cu_seqlens.data());
    add("cu_seqlens_padded", ElementType::kInt32, {sequences + 1}, p.cu_seqlens_padded.data());
  }
  add("max_seqlen", ElementType::kInt32, {}, &p.max_seqlen);
  if (group_ranks > 0) {
    add("local_cp_size", ElementType::kInt32, {}, p.local_cp_size ? &*p.local_cp_size : nullptr);
    add("cp_group_ranks", ElementType::kInt32, {group_ranks}, p.cp_group_ranks.data());
  }
  for (const PackedMicrobatch::Side& side : sides) {
    std::vector<int64_t> shape = {1, tokens};
    shape.insert(shape.end(), side.inner_shape.begin(), side.inner_shape.end());
    add(side.name, side.type, std::move(shape), side.bytes.data());
  }
  return out;
}

}  // namespace

StageFields FieldsOfStage(int pp_rank, int pp_size, int mtp_stage, int vpp) {
  const bool first = pp_rank == 0;
  const bool mtp = pp_rank == mtp_stage;
  StageFields out{first || mtp, pp_rank == pp_size - 1 || mtp};
  if (vpp > 1) {
    // Megatron: the first stage's first chunk embeds, the last stage's last
    // chunk computes the loss, the MTP layers sit in the last chunk. An MTP
    // first stage needs the inputs in two chunks: both get them.
    out.inputs_chunk = first && mtp ? -1 : first ? 0 : vpp - 1;
    out.targets_chunk = vpp - 1;
  }
  return out;
}

std::string ChunkFieldName(absl::string_view name, int chunk) {
  return chunk < 0 ? std::string(name) : absl::StrCat(name, "@", chunk);
}

std::vector<SideSlice> SideSlicesOfStage(absl::Span<const SideFieldInfo> fields,
                                         const ModelStages& stages, int pp_rank) {
  const StageFields stage = FieldsOfStage(pp_rank, stages.pp(), stages.mtp_stage(), stages.vpp());
  std::vector<SideSlice> out;
  for (const SideFieldInfo& field : fields) {
    if (field.loss_mask) {
      if (stage.targets) out.push_back({&field, field.name, {}});
      continue;
    }
    const bool inputs = field.stages == v1::SideField::STAGES_INPUTS;
    const bool targets = field.stages == v1::SideField::STAGES_TARGETS;
    if ((inputs && !stage.inputs) || (targets && !stage.targets)) continue;
    if (!field.layer_axis) {
      // With the fields it goes with, in their chunk.
      const int chunk = inputs ? stage.inputs_chunk : targets ? stage.targets_chunk : -1;
      out.push_back({&field, ChunkFieldName(field.name, chunk), {}});
      continue;
    }
    // Cut to each model chunk's layers; a chunk without MoE layers gets
    // none (and under STAGES_LAYERS neither does a stage without any).
    for (int chunk = 0; chunk < stages.vpp(); ++chunk) {
      const std::vector<IndexRange>& entries = stages.MoeEntries(pp_rank, chunk);
      if (entries.empty() && field.stages == v1::SideField::STAGES_LAYERS) continue;
      std::string name = ChunkFieldName(field.name, stages.vpp() > 1 ? chunk : -1);
      // An empty cut of a field a stage must get: zero layers, not all.
      out.push_back(
          {&field, std::move(name), entries.empty() ? std::vector<IndexRange>{{0, 0}} : entries});
    }
  }
  return out;
}

absl::StatusOr<PackedMicrobatch> PackMicrobatch(const scheduler::CpGroup& group,
                                                absl::Span<const std::vector<int64_t>* const> runs,
                                                int cp_rank, const dataset::SampleRules& rules,
                                                absl::Span<const SideRun> sides) {
  if (runs.size() != group.sequences.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(runs.size(), " token runs for ", group.sequences.size(), " sequences"));
  }
  for (const SideRun& side : sides) {
    if (side.rows.size() != runs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(side.rows.size(), " rows of side field ",
                                                     side.slice->wire_name, " for ", runs.size(),
                                                     " sequences"));
    }
  }
  if (cp_rank < 0 || cp_rank >= group.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp rank ", cp_rank, " outside a group of ", group.size));
  }
  PackedMicrobatch out;
  std::vector<std::vector<char>> pad_rows;  // per side run
  for (const SideRun& side : sides) {
    const SideSlice& slice = *side.slice;
    std::vector<char> pad_row;
    const uint64_t row_bytes = SliceRowBytes(slice);
    for (uint64_t b = 0; b < row_bytes; b += slice.field->element_bytes) {
      pad_row.insert(pad_row.end(), slice.field->pad.begin(), slice.field->pad.end());
    }
    pad_rows.push_back(std::move(pad_row));
    if (!slice.field->loss_mask) out.side.push_back(SideOfSlice(slice));
  }
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
      const size_t first = out.loss_mask.size();
      AppendPositions(run, real, chunk.begin, chunk.end, rules, out);
      size_t served = 0;
      for (size_t f = 0; f < sides.size(); ++f) {
        const absl::Span<const char> rows = sides[f].rows[i];
        if (sides[f].slice->field->loss_mask) {
          ApplyLossMask(rows, real, chunk.begin, chunk.end, out.loss_mask.data() + first);
        } else {
          AppendSideRows(*sides[f].slice, rows, real, chunk.begin, chunk.end, pad_rows[f],
                         out.side[served++].bytes);
        }
      }
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
  const std::vector<SideSlice> slices =
      SideSlicesOfStage(job.side_fields(), job.stages(), coords.pp);
  std::vector<SideRun> sides(slices.size());
  for (size_t f = 0; f < slices.size(); ++f) sides[f].slice = &slices[f];
  std::vector<const std::vector<int64_t>*> runs;
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    auto failed = data.failed.find(sequence.sample);
    if (failed != data.failed.end()) return failed->second;
    auto run = data.runs.find(sequence.sample);
    auto side = data.side.find(sequence.sample);
    if (run == data.runs.end() || (!slices.empty() && side == data.side.end())) {
      return absl::InternalError(absl::StrCat("rank ", global_rank, " step ", data.plan.step,
                                              ": sample ", sequence.sample, " was not read"));
    }
    runs.push_back(&run->second);
    for (SideRun& side_run : sides) {
      const size_t field = static_cast<size_t>(side_run.slice->field - job.side_fields().data());
      side_run.rows.push_back(side->second[field].bytes());
    }
  }
  PF_ASSIGN_OR_RETURN(
      PackedMicrobatch packed,
      PackMicrobatch(group, runs, coords.dp_cp_rank - group.first_rank, job.rules(), sides));
  packed.stage =
      FieldsOfStage(coords.pp, job.layout().pp, job.stages().mtp_stage(), job.stages().vpp());
  if (job.pretraining() != nullptr) {
    if (job.config().pretraining().reset_attention_mask()) {
      DocumentBoundaries(job.rules(), job.config().seq_length(), packed);
    } else {
      packed.bshd_rows = static_cast<int64_t>(group.sequences.size());
    }
  }
  if (job.planner_options().kind == scheduler::SchedulerKind::kDynamicCp) {
    packed.local_cp_size = group.size;
    for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
      packed.cp_group_ranks.push_back(job.layout().GlobalRank(coords.tp, r, coords.pp));
    }
  }
  return packed;
}

SlotFields MicrobatchFields(const PackedMicrobatch& packed) {
  return FieldsFor(&packed, static_cast<int64_t>(packed.padding_mask.size()),
                   static_cast<int64_t>(packed.cu_seqlens.size()) - 1,
                   packed.local_cp_size ? static_cast<int64_t>(packed.cp_group_ranks.size()) : 0,
                   packed.stage, packed.side, packed.bshd_rows);
}

absl::StatusOr<uint64_t> MaxSlotBytes(const Job& job) {
  const int64_t group_ranks = job.planner_options().kind == scheduler::SchedulerKind::kDynamicCp
                                  ? job.layout().dp_cp_size()
                                  : 0;
  uint64_t largest = 0;
  for (int pp_rank = 0; pp_rank < job.layout().pp; ++pp_rank) {
    std::vector<PackedMicrobatch::Side> sides;
    for (const SideSlice& slice : SideSlicesOfStage(job.side_fields(), job.stages(), pp_rank)) {
      if (!slice.field->loss_mask) sides.push_back(SideOfSlice(slice));
    }
    PF_ASSIGN_OR_RETURN(std::vector<transport::FieldDescriptor> layout,
                        transport::LayoutFields(
                            FieldsFor(nullptr, job.config().scheduler().max_tokens_per_rank(),
                                      job.config().global_batch(), group_ranks, {true, true}, sides)
                                .specs,
                            UINT64_MAX));
    largest = std::max(largest, layout.back().offset + layout.back().bytes);
  }
  return largest;
}

}  // namespace packfeed::server
