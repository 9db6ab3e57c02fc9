#ifndef PACKFEED_SERVER_PIPELINE_SLOT_FIELDS_H_
#define PACKFEED_SERVER_PIPELINE_SLOT_FIELDS_H_

// The fields of a slot in wire order (docs/CONTRACT.md), their types and
// shapes, and the largest slot a job can need. Pure: pack.h fills the
// fields; a Job sizes its rings from MaxSlotBytes before any step exists.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/transport/wire.h"
#include "server/config/model_stages.h"
#include "server/config/side_fields.h"
#include "server/pipeline/stage_fields.h"

namespace packfeed::server {

// What a slot field holds.
enum class SlotFieldRole {
  kTokens,
  kPositionIds,
  kLabels,
  kLossMask,
  kPaddingMask,
  kCuSeqlens,
  kCuSeqlensPadded,
  kMaxSeqlen,
  kLocalCpSize,
  kCpGroupRanks,
  kSampleIds,
  kHybridGroup,
  kSide,
};
struct SlotField {
  transport::FieldSpec spec;
  SlotFieldRole role = SlotFieldRole::kTokens;
  size_t side = 0;  // kSide: which of the slices
};

// The slot fields of a microbatch of `tokens` local tokens and `sequences`
// sequences, in slot order; `group_ranks` > 0 adds the dynamic-CP fields,
// `sample_ids` the sequences' ids (hybrid CP). `slices`: the side fields
// the rank's stage receives (a loss-mask field is applied, not served).
// `bshd_rows` > 0: Megatron's BSHD batch, per-token fields [bshd_rows,
// tokens / bshd_rows] and no cu_seqlens.
std::vector<SlotField> FieldsFor(int64_t tokens, int64_t sequences, int64_t group_ranks,
                                 bool sample_ids, StageFields stage,
                                 absl::Span<const SideSlice* const> slices, int64_t bshd_rows);

// What bounds every microbatch of a job, for MaxSlotBytes.
struct SlotBounds {
  int64_t max_tokens = 0;     // local tokens of a rank
  int64_t max_sequences = 0;  // sequences of a microbatch
  int64_t group_ranks = 0;    // > 0: dynamic CP, groups of up to this many ranks
  bool sample_ids = false;    // hybrid CP's sample_ids and hybrid_group
};
// The bytes of the largest slot of any of `stages`' pipeline stages within
// `bounds`, with the side fields each stage receives.
absl::StatusOr<uint64_t> MaxSlotBytes(const SlotBounds& bounds,
                                      absl::Span<const SideFieldInfo> side_fields,
                                      const ModelStages& stages);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_SLOT_FIELDS_H_
