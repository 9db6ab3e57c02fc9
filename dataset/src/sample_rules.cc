#include "packfeed/dataset/sample_rules.h"

namespace packfeed::dataset {

SampleShape ShapeOfSample(int64_t stored_tokens, const SampleRules& rules) {
  const int64_t length = stored_tokens + (rules.append_eod ? 1 : 0);
  // Megatron's mock rules: a varlen run may hold seq_length + 1 tokens (its
  // EOD is only a label), an sft run seq_length; a longer one keeps its first
  // seq_length − 1 tokens and ends in a forced EOD.
  const int64_t limit = rules.kind == SampleKind::kVarlen ? rules.seq_length + 1 : rules.seq_length;
  if (length > limit) return {rules.seq_length - 1, rules.seq_length};
  return {stored_tokens, length};
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

int64_t PlannedLength(const IndexView& index, int64_t document, const SampleRules& rules) {
  return RealLength(ShapeOfSample(DocumentTokens(index, document), rules).run_length, rules);
}

}  // namespace packfeed::dataset
