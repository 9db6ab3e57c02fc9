#ifndef PACKFEED_SERVER_PIPELINE_DOCUMENT_MASK_H_
#define PACKFEED_SERVER_PIPELINE_DOCUMENT_MASK_H_

// Document-masked attention of a Megatron pretraining microbatch, served as
// THD: the microbatch's samples one after another in one row
// [1, micro_batch_size x seq_length], cu_seqlens at the documents' bounds,
// and the positions of that row each CP rank holds. Pure.
//
// Two definitions of a sample's documents (docs/PRETRAINING.md):
// - inter_document_masking (Megatron-Core 0.19): the pieces the sample index
//   cuts, one per sequence the sample runs through (PieceBounds);
// - reset_attention_mask: the spans Megatron's [s, s] mask keeps apart, a
//   document ending after each EOD input (EodBounds).

#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/thd_partition.h"

namespace packfeed::server {

// Where a sample's documents start and end, in its input positions:
// 0 = bounds[0] <= ... <= bounds.back() = seq_length.
using SampleBounds = std::vector<int32_t>;

// Megatron-Core 0.19's GPTDataset with inter_document_masking: the sample's
// runs of `piece_lengths` tokens (the extra label token in the last when
// `extra_token`), that token taken off the last piece (which goes when it
// was only that), the pad of a short sample folded into the last piece, and
// the bounds cut at the first that reaches `seq_length` (as
// flatten_batch_for_packed_sequences strips a row).
SampleBounds PieceBounds(absl::Span<const int64_t> piece_lengths, int64_t seq_length,
                         bool extra_token);

// reset_attention_mask: a document ends after each EOD input of `text` (the
// sample's tokens; a position past it is a pad, never an EOD) and at
// seq_length.
SampleBounds EodBounds(absl::Span<const int64_t> text, int64_t seq_length,
                       const dataset::SampleRules& rules);

// The microbatch's row: cu_seqlens with sample b's bounds offset by
// b x seq_length (each sample's leading 0 dropped after the first), and the
// longest document.
struct DocumentRow {
  std::vector<int32_t> cu_seqlens;
  int32_t max_seqlen = 0;
};
DocumentRow RowOf(absl::Span<const SampleBounds> samples, int64_t seq_length);

enum class CpSplit {
  kPerSequence,  // the whole row in 2·cp parts
  kPerDocument,  // each document in 2·cp parts
};

// Per sample of the row, the positions [begin, end) within it that CP rank
// `cp_rank` of `cp_size` holds, in row order (the row's order is the rank's
// order: part r of each span before part 2·cp − 1 − r). FailedPrecondition
// naming the document when a per-document split meets a document that does
// not divide by 2·cp; InvalidArgument when the row does not.
using RankRanges = absl::InlinedVector<scheduler::TokenRange, 2>;
absl::StatusOr<std::vector<RankRanges>> CpRangesOfRow(const DocumentRow& row, int64_t seq_length,
                                                      int cp_size, int cp_rank, CpSplit split);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_DOCUMENT_MASK_H_
