#include "server/pipeline/document_mask.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"

namespace packfeed::server {

SampleBounds PieceBounds(absl::Span<const int64_t> piece_lengths, int64_t seq_length,
                         bool extra_token) {
  std::vector<int64_t> lengths(piece_lengths.begin(), piece_lengths.end());
  if (extra_token && !lengths.empty()) {
    // The label of the last input belongs to no document of the inputs.
    if (--lengths.back() == 0) lengths.pop_back();
  }
  int64_t total = 0;
  for (int64_t length : lengths) total += length;
  if (total < seq_length) {
    // A partial sample's pad positions count as its last document.
    if (lengths.empty()) lengths.push_back(0);
    lengths.back() += seq_length - total;
  }
  SampleBounds bounds = {0};
  for (int64_t length : lengths) {
    if (bounds.back() == seq_length) break;  // what the row merge strips
    bounds.push_back(static_cast<int32_t>(bounds.back() + length));
  }
  return bounds;
}

SampleBounds EodBounds(absl::Span<const int64_t> text, int64_t seq_length,
                       const dataset::SampleRules& rules) {
  SampleBounds bounds = {0};
  const auto stored = static_cast<int64_t>(text.size());
  for (int64_t k = 0; k < seq_length; ++k) {
    // As served: a pad id is 0, and a pad position is no EOD.
    const int64_t token = k < stored ? text[static_cast<size_t>(k)] : rules.pad_id;
    const bool eod = k < stored && (token == rules.pad_id ? 0 : token) == rules.eod_id;
    if (eod || k + 1 == seq_length) bounds.push_back(static_cast<int32_t>(k + 1));
  }
  return bounds;
}

DocumentRow RowOf(absl::Span<const SampleBounds> samples, int64_t seq_length) {
  DocumentRow row;
  row.cu_seqlens.push_back(0);
  for (size_t b = 0; b < samples.size(); ++b) {
    const auto offset = static_cast<int32_t>(static_cast<int64_t>(b) * seq_length);
    const SampleBounds& bounds = samples[b];
    for (size_t j = 1; j < bounds.size(); ++j) {
      row.cu_seqlens.push_back(offset + bounds[j]);
      row.max_seqlen = std::max(row.max_seqlen, bounds[j] - bounds[j - 1]);
    }
  }
  return row;
}

absl::StatusOr<std::vector<RankRanges>> CpRangesOfRow(const DocumentRow& row, int64_t seq_length,
                                                      int cp_size, int cp_rank, CpSplit split) {
  const int64_t row_tokens = row.cu_seqlens.back();
  if (seq_length < 1 || row_tokens % seq_length != 0) {
    return absl::InternalError(absl::StrCat("a document row of ", row_tokens,
                                            " positions is no whole number of samples of ",
                                            seq_length));
  }
  // The rank's spans of the row, in order.
  std::vector<scheduler::TokenRange> spans;
  if (split == CpSplit::kPerSequence || cp_size == 1) {
    absl::StatusOr<std::array<scheduler::TokenRange, 2>> slice =
        scheduler::ZigzagSlice(row_tokens, cp_size, cp_rank);
    if (!slice.ok()) return slice.status();
    spans.assign(slice->begin(), slice->end());
  } else {
    for (size_t j = 0; j + 1 < row.cu_seqlens.size(); ++j) {
      const int64_t start = row.cu_seqlens[j];
      const int64_t length = row.cu_seqlens[j + 1] - start;
      absl::StatusOr<std::array<scheduler::TokenRange, 2>> slice =
          scheduler::ZigzagSlice(length, cp_size, cp_rank);
      if (!slice.ok()) {
        // Transformer Engine's partition assumes it and, unchecked in
        // release builds, would hand out overlapping positions.
        return absl::FailedPreconditionError(absl::StrCat(
            "a per-document CP split needs every document to divide by 2 x cp = ", 2 * cp_size,
            "; document ", j, " of the microbatch (row positions [", start, ", ", start + length,
            "), in its sample ", start / seq_length, ") has ", length,
            " tokens; use cp_split: CP_SPLIT_PER_SEQUENCE"));
      }
      for (const scheduler::TokenRange& range : *slice) {
        spans.push_back({start + range.begin, start + range.end});
      }
    }
  }
  std::vector<RankRanges> out(static_cast<size_t>(row_tokens / seq_length));
  for (const scheduler::TokenRange& span : spans) {
    for (int64_t at = span.begin; at < span.end;) {
      const int64_t sample = at / seq_length;
      const int64_t end = std::min(span.end, (sample + 1) * seq_length);
      RankRanges& ranges = out[static_cast<size_t>(sample)];
      const scheduler::TokenRange piece = {at - sample * seq_length, end - sample * seq_length};
      if (!ranges.empty() && ranges.back().end == piece.begin) {
        ranges.back().end = piece.end;  // adjacent parts of one sample
      } else {
        ranges.push_back(piece);
      }
      at = end;
    }
  }
  return out;
}

}  // namespace packfeed::server
