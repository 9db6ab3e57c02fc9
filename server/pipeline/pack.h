#ifndef PACKFEED_SERVER_PIPELINE_PACK_H_
#define PACKFEED_SERVER_PIPELINE_PACK_H_

// Phase 3 of a step: turns the token runs of one rank's CP group into the
// fields of docs/CONTRACT.md (per-sequence fields, packing in plan order,
// padding, the zigzag CP slice), laid out as the wire's fields for the
// rank's pipeline stage and written straight into its slot. Pure: no I/O,
// no threads.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/thd_partition.h"
#include "packfeed/transport/wire.h"
#include "server/pipeline/document_mask.h"
#include "server/pipeline/job.h"
#include "server/pipeline/pack_workers.h"
#include "server/pipeline/read.h"
#include "server/pipeline/stage_fields.h"

namespace packfeed::server {

// A side field's stored rows (row_bytes() per read token), per sequence of
// the group: in memory, or (`in_file`) where they are stored, to be read
// straight into the slot (WriteMicrobatch's `reads`).
struct SideRun {
  SideSlice slice;
  std::vector<absl::Span<const char>> rows;
  std::vector<SampleNeed> in_file;
};

// One rank's microbatch, checked and sized before a byte of it is written:
// where every position comes from, the per-sequence fields, and which
// fields the rank's stage receives. It points into the step's data (runs,
// side rows), which must outlive it.
struct MicrobatchSource {
  const scheduler::CpGroup* group = nullptr;
  int cp_rank = 0;  // within the group
  dataset::SampleRules rules;
  std::vector<absl::Span<const int64_t>> runs;  // per sequence of the group
  std::vector<SideRun> sides;
  std::vector<RankRanges> slices;  // per sequence, this rank's CP slice of it
  int64_t tokens = 0;              // positions this rank holds
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> cu_seqlens_padded;
  int32_t max_seqlen = 0;
  // Dynamic CP only (as Megatron hands them).
  std::optional<int32_t> local_cp_size;
  std::vector<int32_t> cp_group_ranks;
  // Hybrid CP only: the group's sequences' planned indices (Megatron's
  // gids of its sub-samples), served as sample_ids, and the Megatron group
  // the microbatch runs in (StepPlan::hybrid_groups), as hybrid_group.
  std::optional<std::vector<int64_t>> sample_ids;
  int32_t hybrid_group = 0;
  StageFields stage;  // which THD fields the rank's stage receives
  // Per sequence, where its documents start when positions restart in each
  // (inter_document_masking); empty otherwise.
  std::vector<SampleBounds> document_bounds;
  // 0: THD ([1, T] per-token fields with cu_seqlens). Else Megatron's
  // BSHD batch of a pretraining job: per-token fields [bshd_rows =
  // micro_batch_size, S / CP], and no cu_seqlens (nothing is packed).
  int64_t bshd_rows = 0;
};

// The source of `group`'s sequences for CP rank `cp_rank` of the group:
// `runs[i]` is the token run of group.sequences[i]; `sides` the group's rows
// of each side field the rank receives (a loss-mask field replaces
// loss_mask). Every field is served (stage {true, true}), THD.
// InvalidArgument when a run does not fit its padded length, a padded
// length does not split evenly into 2·size parts, or cp_rank is outside
// the group.
absl::StatusOr<MicrobatchSource> SourceOfGroup(const scheduler::CpGroup& group,
                                               absl::Span<const absl::Span<const int64_t>> runs,
                                               int cp_rank, const dataset::SampleRules& rules,
                                               std::vector<SideRun> sides = {});

// The source of what `global_rank` receives for `microbatch` of `data`,
// with the dynamic-CP fields when the job plans dynamic CP, and its side
// fields from `side_rows` (data.side for an ingest job; a dataset job's are
// fetched per microbatch), or, when it is null, from their files (a dataset
// job's, without a loss-mask field: SideRun::in_file). The read error of a
// sample the rank needs that could not be read; Internal when `data` or
// `side_rows` lacks one.
absl::StatusOr<MicrobatchSource> SourceForRank(const Job& job, const StepData& data, int microbatch,
                                               int global_rank, const SideRows* side_rows);

// The slot's fields, in slot order (LayoutFields places them).
std::vector<transport::FieldSpec> MicrobatchSpecs(const MicrobatchSource& source);

// Writes every field of the microbatch into `slot`, at the offsets of
// `layout` = LayoutFields(MicrobatchSpecs(source), ...): one copy of each
// byte from the step's data, runs copied whole. `slot` may be the
// receiver's ring itself. A slot of at least kSplitBytes is written by
// `workers` (when given) in portions of kPortionPositions positions; the bytes
// are the same either way. Side rows `in_file` are not written: their reads
// into the slot are appended to `reads` (required then), and the slot is
// whole once they are done.
inline constexpr uint64_t kSplitBytes = uint64_t{1} << 20;
inline constexpr int64_t kPortionPositions = 16384;
void WriteMicrobatch(const MicrobatchSource& source,
                     absl::Span<const transport::FieldDescriptor> layout, uint8_t* slot,
                     PackWorkers* workers = nullptr, std::vector<SlotRead>* reads = nullptr);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_PACK_H_
