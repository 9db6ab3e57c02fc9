#include "packfeed/dataset/sample_rules.h"

#include <algorithm>

#include "packfeed/common/status_macros.h"

namespace packfeed::dataset {

namespace {

bool Splits(const SampleRules& rules) {
  return rules.split_long_documents && rules.kind == SampleKind::kVarlen;
}

}  // namespace

SampleShape ShapeOfSample(int64_t stored_tokens, const SampleRules& rules, int64_t first_token) {
  const int64_t length = stored_tokens + (rules.append_eod ? 1 : 0);
  // Megatron's mock rules: a varlen run may hold seq_length + 1 tokens (its
  // EOD is only a label), an sft run seq_length; a longer one keeps its first
  // seq_length − 1 tokens and ends in a forced EOD.
  const int64_t limit = rules.kind == SampleKind::kVarlen ? rules.seq_length + 1 : rules.seq_length;
  if (Splits(rules)) {
    // A piece: seq_length inputs and the next token as the last label.
    const int64_t end = std::min(length, first_token + limit);
    return {first_token, std::min(end, stored_tokens) - first_token, end - first_token};
  }
  if (length > limit) return {0, rules.seq_length - 1, rules.seq_length};
  return {0, stored_tokens, length};
}

int64_t PiecesOfDocument(int64_t stored_tokens, const SampleRules& rules) {
  if (!Splits(rules)) return 1;
  const int64_t inputs = stored_tokens + (rules.append_eod ? 1 : 0) - 1;
  return std::max<int64_t>(1, (inputs + rules.seq_length - 1) / rules.seq_length);
}

absl::StatusOr<SampleTable> SampleTable::Build(const IndexView& index, const SampleRules& rules,
                                               absl::string_view file_name) {
  SampleTable table;
  table.seq_length_ = rules.seq_length;
  const auto documents = static_cast<int64_t>(index.num_documents());
  table.num_samples_ = documents;
  if (!Splits(rules)) return table;
  for (int64_t d = 0; d < documents; ++d) {
    PF_RETURN_IF_ERROR(CheckDocument(index, static_cast<uint64_t>(d), file_name));
    const int64_t pieces = PiecesOfDocument(DocumentTokens(index, d), rules);
    if (pieces > 1) {
      table.split_.push_back({d + table.num_samples_ - documents, d, pieces});
      table.num_samples_ += pieces - 1;
    }
  }
  return table;
}

SampleTable::Piece SampleTable::Locate(int64_t sample) const {
  // The last split document starting at or before `sample`.
  auto after =
      std::upper_bound(split_.begin(), split_.end(), sample,
                       [](int64_t s, const Split& split) { return s < split.first_sample; });
  if (after == split_.begin()) return {sample, 0};
  const Split& split = *std::prev(after);
  const int64_t past = sample - split.first_sample;
  if (past < split.pieces) return {split.document, past * seq_length_};
  return {split.document + 1 + (past - split.pieces), 0};
}

std::vector<int64_t> MakeTokenRun(absl::Span<const int64_t> read, const SampleShape& shape,
                                  const SampleRules& rules) {
  std::vector<int64_t> run(read.begin(), read.end());
  // One token short: an appended EOD, or the EOD forced after a truncation.
  if (static_cast<int64_t>(run.size()) < shape.run_length) run.push_back(rules.eod_id);
  return run;
}

int64_t RealLength(int64_t run_length, const SampleRules& rules) {
  return rules.kind == SampleKind::kVarlen ? run_length - 1 : run_length;
}

int64_t DocumentTokens(const IndexView& index, int64_t document) {
  int64_t tokens = 0;
  for (int64_t i = index.document_index(document); i < index.document_index(document + 1); ++i) {
    tokens += index.length(i);
  }
  return tokens;
}

int64_t DocumentOfSequence(const IndexView& index, int64_t sequence) {
  uint64_t low = 0;  // first sequence of `low` <= sequence
  uint64_t high = index.num_documents();
  while (high - low > 1) {
    const uint64_t mid = low + (high - low) / 2;
    if (index.document_index(mid) <= sequence) {
      low = mid;
    } else {
      high = mid;
    }
  }
  return static_cast<int64_t>(low);
}

int64_t PlannedLength(const IndexView& index, SampleTable::Piece piece, const SampleRules& rules) {
  return RealLength(
      ShapeOfSample(DocumentTokens(index, piece.document), rules, piece.first_token).run_length,
      rules);
}

}  // namespace packfeed::dataset
