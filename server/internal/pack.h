#ifndef PACKFEED_SERVER_INTERNAL_PACK_H_
#define PACKFEED_SERVER_INTERNAL_PACK_H_

// Stage 3 of a step: turns the token runs of one rank's CP group into the
// fields of DESIGN.md §3 (per-sequence fields, packing in plan order,
// padding, the zigzag CP slice), and lays them out as the wire's fields for
// the rank's pipeline stage. Pure: no I/O, no threads.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/transport/wire.h"
#include "server/internal/job.h"
#include "server/internal/read.h"

namespace packfeed::server {

// Which fields a pipeline stage receives (DESIGN.md §3).
struct StageFields {
  bool inputs = true;   // tokens, position_ids (first stage, MTP)
  bool targets = true;  // labels, loss_mask (last stage, MTP)
};
StageFields FieldsOfStage(int pp_rank, int pp_size);

// One rank's microbatch, every field flat.
struct PackedMicrobatch {
  std::vector<int64_t> tokens;
  std::vector<int64_t> labels;
  std::vector<float> loss_mask;
  std::vector<int64_t> position_ids;
  std::vector<uint8_t> padding_mask;  // bool
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> cu_seqlens_padded;
  int32_t max_seqlen = 0;
  // Dynamic CP only (as Megatron hands them).
  std::optional<int32_t> local_cp_size;
  std::vector<int32_t> cp_group_ranks;
};

// Packs `group`'s sequences for CP rank `cp_rank` of the group: `runs[i]` is
// the token run of group.sequences[i]. InvalidArgument when a run does not
// fit its padded length, a padded length does not split evenly into 2·size
// chunks, or cp_rank is outside the group.
absl::StatusOr<PackedMicrobatch> PackMicrobatch(const scheduler::CpGroup& group,
                                                absl::Span<const std::vector<int64_t>* const> runs,
                                                int cp_rank, const dataset::SampleRules& rules);

// The microbatch `global_rank` receives for `microbatch` of `data`, with the
// dynamic-CP fields when the job plans dynamic CP. The read error of a
// sample the rank needs that could not be read; Internal when `data` lacks
// one.
absl::StatusOr<PackedMicrobatch> PackForRank(const Job& job, const StepData& data, int microbatch,
                                             int global_rank);

// The wire fields of a packed microbatch for a rank of PP stage `pp_rank`
// of `pp_size`, in slot order, and their bytes.
struct SlotFields {
  std::vector<transport::FieldSpec> specs;
  std::vector<const void*> data;
};
SlotFields MicrobatchFields(const PackedMicrobatch& packed, int pp_rank, int pp_size);

// The bytes of the largest slot a microbatch of at most `max_tokens` local
// tokens and `max_sequences` sequences needs; `group_ranks` > 0 adds the
// dynamic-CP fields for groups of up to that many ranks.
absl::StatusOr<uint64_t> MaxSlotBytes(int64_t max_tokens, int64_t max_sequences,
                                      int64_t group_ranks);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INTERNAL_PACK_H_
