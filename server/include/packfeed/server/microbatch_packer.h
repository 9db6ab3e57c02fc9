#ifndef PACKFEED_SERVER_MICROBATCH_PACKER_H_
#define PACKFEED_SERVER_MICROBATCH_PACKER_H_

// Turns stored token runs into the fields of DESIGN.md §3 for one rank of one
// microbatch: sample rules (EOD, truncation), per-sequence fields, packing in
// plan order, and the zigzag CP slice. Pure: no I/O, no threads.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed {

enum class SampleKind {
  kVarlen,  // one document = one sequence; the EOD is never an input
  kSft,     // mock-SFT rows: the EOD is an input, pad-labelled slots masked
};

// How a stored document becomes a token run `t` (fixtures/golden notes).
struct SampleRules {
  SampleKind kind = SampleKind::kVarlen;
  int64_t seq_length = 0;  // Megatron's seq_length
  int64_t eod_id = 0;
  int64_t pad_id = 0;
  // Append EOD to every document (false: documents already end with it, as
  // Megatron's preprocess_data --append-eod writes them).
  bool append_eod = false;
  // Megatron's padding (every sequence to its divisor, real length = padded
  // length for sft) instead of packfeed's per-CP-size padding.
  bool megatron_compat = false;
};

// Tokens of `t` that are read from the document of `stored_tokens` tokens
// (after truncation), and the length of `t`.
struct SampleShape {
  int64_t read_tokens = 0;
  int64_t run_length = 0;
};
SampleShape ShapeOfSample(int64_t stored_tokens, const SampleRules& rules);

// `t` from the `shape.read_tokens` tokens read.
std::vector<int64_t> MakeTokenRun(absl::Span<const int64_t> read, const SampleShape& shape,
                                  const SampleRules& rules);

// The real length the planner and cu_seqlens see for a run of `run_length`:
// varlen run_length − 1 (the EOD is only a label); sft run_length.
int64_t RealLength(int64_t run_length, const SampleRules& rules);

// Which fields a pipeline stage receives (DESIGN.md §3).
struct StageFields {
  bool inputs = true;  // tokens, position_ids (first stage, MTP)
  bool targets = true; // labels, loss_mask (last stage, MTP)
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
absl::StatusOr<PackedMicrobatch> PackMicrobatch(
    const CpGroup& group, absl::Span<const std::vector<int64_t>* const> runs,
    int cp_rank, const SampleRules& rules);

}  // namespace packfeed

#endif  // PACKFEED_SERVER_MICROBATCH_PACKER_H_
