#ifndef PACKFEED_DATASET_SAMPLE_RULES_H_
#define PACKFEED_DATASET_SAMPLE_RULES_H_

// How a stored Megatron document becomes one training sequence (DESIGN.md
// §3, fixtures/golden notes): the EOD rule, truncation to seq_length, and
// the real length the planner sees. The one definition: the daemon's plan
// and pack stages and `packfeedctl plan` all use it, so an offline plan is
// the plan the daemon serves.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "packfeed/dataset/index_format.h"

namespace packfeed::dataset {

enum class SampleKind {
  kVarlen,  // one document = one sequence; the EOD is never an input
  kSft,     // mock-SFT rows: the EOD is an input, pad-labelled slots masked
};

struct SampleRules {
  SampleKind kind = SampleKind::kVarlen;
  int64_t seq_length = 0;  // Megatron's seq_length
  int64_t eod_id = 0;
  int64_t pad_id = 0;
  // Append EOD to every document (false: documents already end with it, as
  // Megatron's preprocess_data --append-eod writes them).
  bool append_eod = false;
};

// Tokens of the run `t` that are read from a document of `stored_tokens`
// tokens (after truncation), and the length of `t`.
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

// Tokens stored for document `document` (its sequences together).
// REQUIRES: document < index.num_documents().
int64_t DocumentTokens(const IndexView& index, int64_t document);

// RealLength of document `document` under `rules`: what a planner is given.
int64_t PlannedLength(const IndexView& index, int64_t document, const SampleRules& rules);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_SAMPLE_RULES_H_
