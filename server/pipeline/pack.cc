#include "server/pipeline/pack.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/thd_partition.h"
#include "server/pipeline/job_kind.h"
#include "server/pipeline/position_writers.h"
#include "server/pipeline/side_rows.h"
#include "server/pipeline/slot_fields.h"

namespace packfeed::server {
namespace {

using dataset::SampleKind;
using transport::ElementType;

std::vector<SlotField> FieldsOf(const MicrobatchSource& source) {
  std::vector<const SideSlice*> slices;
  for (const SideRun& side : source.sides) slices.push_back(&side.slice);
  return FieldsFor(source.tokens, static_cast<int64_t>(source.cu_seqlens.size()) - 1,
                   source.local_cp_size ? static_cast<int64_t>(source.cp_group_ranks.size()) : 0,
                   source.sample_ids.has_value(), source.stage, slices, source.bshd_rows);
}

// Writes the microbatch's fields of one value or one per sequence
// (cu_seqlens, max_seqlen, ...) at their offsets in `slot`, and returns
// where its per-token fields go (`side_out`: each side field's).
TokenFields PlaceFields(const MicrobatchSource& source,
                        absl::Span<const transport::FieldDescriptor> layout, uint8_t* slot,
                        std::vector<uint8_t*>& side_out) {
  const std::vector<SlotField> fields = FieldsOf(source);
  TokenFields out;
  auto copy = [](uint8_t* to, const void* from, uint64_t bytes) {
    if (bytes > 0) std::memcpy(to, from, bytes);
  };
  for (size_t i = 0; i < fields.size(); ++i) {
    uint8_t* at = slot + layout[i].offset;
    const uint64_t bytes = layout[i].bytes;
    switch (fields[i].role) {
      case SlotFieldRole::kTokens:
        out.tokens = reinterpret_cast<int64_t*>(at);
        break;
      case SlotFieldRole::kPositionIds:
        out.position_ids = reinterpret_cast<int64_t*>(at);
        break;
      case SlotFieldRole::kLabels:
        out.labels = reinterpret_cast<int64_t*>(at);
        break;
      case SlotFieldRole::kLossMask:
        out.loss_mask = reinterpret_cast<float*>(at);
        break;
      case SlotFieldRole::kPaddingMask:
        out.padding_mask = at;
        break;
      case SlotFieldRole::kCuSeqlens:
        copy(at, source.cu_seqlens.data(), bytes);
        break;
      case SlotFieldRole::kCuSeqlensPadded:
        copy(at, source.cu_seqlens_padded.data(), bytes);
        break;
      case SlotFieldRole::kMaxSeqlen:
        copy(at, &source.max_seqlen, bytes);
        break;
      case SlotFieldRole::kLocalCpSize:
        copy(at, &*source.local_cp_size, bytes);
        break;
      case SlotFieldRole::kCpGroupRanks:
        copy(at, source.cp_group_ranks.data(), bytes);
        break;
      case SlotFieldRole::kSampleIds:
        copy(at, source.sample_ids->data(), bytes);
        break;
      case SlotFieldRole::kHybridGroup:
        copy(at, &source.hybrid_group, bytes);
        break;
      case SlotFieldRole::kSide:
        side_out[fields[i].side] = at;
        break;
    }
  }
  return out;
}

// A whole or cut token range of one sequence, and where it starts in the
// microbatch.
struct Piece {
  size_t sequence;
  scheduler::TokenRange range;
  int64_t at;  // position in the microbatch
};

// Every position is written on its own (its field entries at `at`), so
// with `split` the microbatch splits into portions of kPortionPositions
// positions, which the packing threads write at once; else one portion.
std::vector<std::vector<Piece>> PortionsOf(const MicrobatchSource& source, bool split) {
  std::vector<std::vector<Piece>> portions(1);
  int64_t in_portion = 0;
  int64_t at = 0;
  for (size_t i = 0; i < source.runs.size(); ++i) {
    for (const scheduler::TokenRange& range : source.slices[i]) {
      for (int64_t begin = range.begin; begin < range.end;) {
        const int64_t end =
            split ? std::min(range.end, begin + kPortionPositions - in_portion) : range.end;
        portions.back().push_back({i, {begin, end}, at});
        at += end - begin;
        in_portion += end - begin;
        begin = end;
        if (split && in_portion == kPortionPositions) {
          portions.emplace_back();
          in_portion = 0;
        }
      }
    }
  }
  return portions;
}

}  // namespace

absl::StatusOr<MicrobatchSource> SourceOfGroup(const scheduler::CpGroup& group,
                                               absl::Span<const absl::Span<const int64_t>> runs,
                                               int cp_rank, const dataset::SampleRules& rules,
                                               std::vector<SideRun> sides) {
  if (runs.size() != group.sequences.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(runs.size(), " token runs for ", group.sequences.size(), " sequences"));
  }
  for (const SideRun& side : sides) {
    const size_t rows = side.in_file.empty() ? side.rows.size() : side.in_file.size();
    if (rows != runs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          rows, " rows of side field ", side.slice.wire_name, " for ", runs.size(), " sequences"));
    }
  }
  if (cp_rank < 0 || cp_rank >= group.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp rank ", cp_rank, " outside a group of ", group.size));
  }
  MicrobatchSource out;
  out.group = &group;
  out.cp_rank = cp_rank;
  out.rules = rules;
  out.runs.assign(runs.begin(), runs.end());
  out.sides = std::move(sides);
  out.cu_seqlens.push_back(0);
  out.cu_seqlens_padded.push_back(0);
  int64_t real_total = 0;
  int64_t padded_total = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const scheduler::PlannedSequence& sequence = group.sequences[i];
    const auto run_length = static_cast<int64_t>(runs[i].size());
    const int64_t padded = sequence.padded_length;
    const int64_t real = sequence.length;
    // varlen reads labels up to t[real]; sft reads within the run.
    const int64_t needed = rules.kind == SampleKind::kVarlen ? real + 1 : 0;
    if (run_length < needed || real > padded || run_length > padded + 1) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", sequence.sample, ": run of ",
                                                     run_length, " tokens for length ", real,
                                                     " padded to ", padded));
    }
    absl::StatusOr<std::array<scheduler::TokenRange, 2>> slice =
        scheduler::ZigzagSlice(padded, group.size, cp_rank);
    if (!slice.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", sequence.sample, ": ", slice.status().message()));
    }
    for (const scheduler::TokenRange& range : *slice) out.tokens += range.end - range.begin;
    out.slices.emplace_back(slice->begin(), slice->end());
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

absl::StatusOr<MicrobatchSource> SourceForRank(const Job& job, const StepData& data, int microbatch,
                                               int global_rank, const SideRows* side_rows) {
  const JobKind& kind = job.kind();
  const RankCoords coords = job.layout().Coords(global_rank);
  const scheduler::CpGroup& group = scheduler::GroupOfRank(
      data.plan.plan.microbatches[static_cast<size_t>(microbatch)], coords.dp_cp_rank);
  std::vector<SideRun> sides;
  for (SideSlice& slice : SideSlicesOfStage(job.side_fields(), job.stages(), coords.pp)) {
    sides.push_back({std::move(slice), {}, {}});
  }
  std::vector<absl::Span<const int64_t>> runs;
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    auto failed = data.failed.find(sequence.sample);
    if (failed != data.failed.end()) return failed->second;
    auto run = data.runs.find(sequence.sample);
    if (run == data.runs.end()) {
      return absl::InternalError(absl::StrCat("rank ", global_rank, " step ", data.plan.step,
                                              ": sample ", sequence.sample, " was not read"));
    }
    PF_ASSIGN_OR_RETURN(absl::Span<const int64_t> tokens,
                        kind.TokensOf(data.plan, sequence.sample, run->second.tokens()));
    runs.push_back(tokens);
    if (sides.empty()) continue;
    if (side_rows == nullptr) {
      const std::vector<SampleNeed> stored = SideNeedsOf(job, data.plan, {sequence.sample});
      for (SideRun& side_run : sides) {
        if (side_run.slice.field->loss_mask) {
          return absl::InternalError(
              "a loss-mask side field is applied from memory, not read "
              "into the slot");
        }
        side_run.in_file.push_back(
            stored[static_cast<size_t>(side_run.slice.field - job.side_fields().data())]);
      }
      continue;
    }
    auto side_failed = side_rows->failed.find(sequence.sample);
    if (side_failed != side_rows->failed.end()) return side_failed->second;
    auto side = side_rows->rows.find(sequence.sample);
    if (side == side_rows->rows.end()) {
      return absl::InternalError(absl::StrCat("rank ", global_rank, " step ", data.plan.step,
                                              ": sample ", sequence.sample,
                                              "'s side rows were not read"));
    }
    for (SideRun& side_run : sides) {
      const size_t field = static_cast<size_t>(side_run.slice.field - job.side_fields().data());
      side_run.rows.push_back(side->second[field].bytes());
    }
  }
  PF_ASSIGN_OR_RETURN(MicrobatchSource source,
                      SourceOfGroup(group, runs, coords.dp_cp_rank - group.first_rank, job.rules(),
                                    std::move(sides)));
  source.stage =
      FieldsOfStage(coords.pp, job.layout().pp, job.stages().mtp_stage(), job.stages().vpp());
  PF_RETURN_IF_ERROR(kind.ShapeSource(job, data, microbatch, source));
  if (job.planner_options().kind == scheduler::SchedulerKind::kDynamicCp) {
    source.local_cp_size = group.size;
    for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
      source.cp_group_ranks.push_back(job.layout().GlobalRank(coords.tp, r, coords.pp));
    }
  }
  return source;
}

std::vector<transport::FieldSpec> MicrobatchSpecs(const MicrobatchSource& source) {
  std::vector<transport::FieldSpec> specs;
  for (SlotField& field : FieldsOf(source)) specs.push_back(std::move(field.spec));
  return specs;
}

void WriteMicrobatch(const MicrobatchSource& source,
                     absl::Span<const transport::FieldDescriptor> layout, uint8_t* slot,
                     PackWorkers* workers, std::vector<SlotRead>* reads) {
  std::vector<uint8_t*> side_out(source.sides.size(), nullptr);
  TokenFields out = PlaceFields(source, layout, slot, side_out);
  std::vector<std::vector<char>> pad_rows;
  std::vector<uint64_t> side_row_bytes;
  for (const SideRun& side : source.sides) {
    pad_rows.push_back(PadRow(side.slice));
    side_row_bytes.push_back(SliceRowBytes(side.slice));
  }
  const uint64_t slot_bytes = layout.empty() ? 0 : layout.back().offset + layout.back().bytes;
  const bool split = workers != nullptr && workers->threads() > 1 && slot_bytes >= kSplitBytes;
  const std::vector<std::vector<Piece>> portions = PortionsOf(source, split);
  std::vector<std::vector<SlotRead>> portion_reads(portions.size());
  auto write = [&](int portion) {
    for (const Piece& piece : portions[static_cast<size_t>(portion)]) {
      const int64_t real = source.group->sequences[piece.sequence].length;
      const scheduler::TokenRange& range = piece.range;
      WritePositions(source.runs[piece.sequence], real, range.begin, range.end, source.rules,
                     piece.at, out);
      if (!source.document_bounds.empty()) {
        RestartPositions(source.document_bounds[piece.sequence], range, piece.at, out.position_ids);
      }
      for (size_t f = 0; f < source.sides.size(); ++f) {
        const SideRun& side = source.sides[f];
        if (side.slice.field->loss_mask) {
          if (out.loss_mask != nullptr) {
            ApplyLossMask(side.rows[piece.sequence], real, range.begin, range.end,
                          out.loss_mask + piece.at);
          }
        } else if (side_out[f] != nullptr) {
          uint8_t* at = side_out[f] + static_cast<uint64_t>(piece.at) * side_row_bytes[f];
          if (side.in_file.empty()) {
            WriteSideRows(side.slice, side.rows[piece.sequence], real, range.begin, range.end,
                          pad_rows[f], at);
          } else {
            PlanSideRowsRead(side.slice, side.in_file[piece.sequence], real, range.begin, range.end,
                             pad_rows[f], at, portion_reads[static_cast<size_t>(portion)]);
          }
        }
      }
    }
  };
  if (split) {
    workers->Run(static_cast<int>(portions.size()), write);
  } else {
    write(0);
  }
  for (std::vector<SlotRead>& portion : portion_reads) {
    if (portion.empty()) continue;
    std::move(portion.begin(), portion.end(), std::back_inserter(*reads));
  }
}

}  // namespace packfeed::server
