#ifndef PACKFEED_DATASET_SAMPLE_RULES_H_
#define PACKFEED_DATASET_SAMPLE_RULES_H_

// How a stored Megatron document becomes one training sequence
// (docs/CONTRACT.md): the EOD rule, truncation to seq_length, and
// the real length the planner sees. The one definition: the daemon's plan
// and pack stages and `packfeedctl plan` all use it, so an offline plan is
// the plan the daemon serves.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "packfeed/dataset/index_format.h"

namespace packfeed::dataset {

enum class SampleKind {
  kVarlen,  // one document = one sequence; the EOD is never an input
  kSft,     // mock-SFT rows: the EOD is an input, pad-labelled slots masked
  // Megatron-Core GPTDataset samples (docs/PRETRAINING.md): seq_length (+1)
  // tokens across documents; the fields follow GPTDataset.__getitem__.
  kPretraining,
};

struct SampleRules {
  SampleKind kind = SampleKind::kVarlen;
  int64_t seq_length = 0;  // Megatron's seq_length
  int64_t eod_id = 0;
  int64_t pad_id = 0;
  // Append EOD to every document (false: documents already end with it, as
  // Megatron's preprocess_data --append-eod writes them).
  bool append_eod = false;
  // varlen: a document longer than seq_length becomes several samples of
  // at most seq_length inputs each (piece k: t[k·S, k·S + S + 1), so every
  // label is trained once), instead of being truncated.
  bool split_long_documents = false;
  // kPretraining only (Megatron's GPTDatasetConfig): the loss is masked
  // where the input is EOD (eod_mask_loss); positions restart after each
  // EOD (reset_position_ids); `pad_id` is Megatron's pad (-1 when the
  // tokenizer has none), masked in the loss and served as 0.
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
};

// The run `t` of the sample that starts at stored token `first_token` of a
// document of `stored_tokens` tokens: the tokens read from there (after
// truncation), and the length of `t`.
struct SampleShape {
  int64_t first_token = 0;
  int64_t read_tokens = 0;
  int64_t run_length = 0;
};
SampleShape ShapeOfSample(int64_t stored_tokens, const SampleRules& rules, int64_t first_token = 0);

// Samples a document of `stored_tokens` tokens makes: 1, or under
// split_long_documents one per seq_length inputs.
int64_t PiecesOfDocument(int64_t stored_tokens, const SampleRules& rules);

// The samples of a dataset, numbered 0, 1, …: one per document, except
// that each document split into pieces takes one number per piece.
// Memory is per split document only.
class SampleTable {
 public:
  struct Piece {
    int64_t document = 0;
    int64_t first_token = 0;  // where the sample starts in the document
  };
  // Scans the index's document lengths once when rules split documents,
  // each document's entries checked (CheckDocument) before they are used:
  // DataLoss naming `file_name`, the document and the entry for a corrupt
  // one, never a read outside the index.
  static absl::StatusOr<SampleTable> Build(const IndexView& index, const SampleRules& rules,
                                           absl::string_view file_name);
  int64_t num_samples() const { return num_samples_; }
  int64_t split_documents() const { return static_cast<int64_t>(split_.size()); }
  // REQUIRES: 0 <= sample < num_samples().
  Piece Locate(int64_t sample) const;

 private:
  struct Split {
    int64_t first_sample = 0;
    int64_t document = 0;
    int64_t pieces = 0;
  };
  int64_t seq_length_ = 0;
  int64_t num_samples_ = 0;
  std::vector<Split> split_;  // ascending
};

// `t` from the `shape.read_tokens` tokens read.
std::vector<int64_t> MakeTokenRun(absl::Span<const int64_t> read, const SampleShape& shape,
                                  const SampleRules& rules);

// The real length the planner and cu_seqlens see for a run of `run_length`:
// varlen run_length − 1 (the EOD is only a label); sft run_length.
int64_t RealLength(int64_t run_length, const SampleRules& rules);

// Tokens stored for document `document` (its sequences together).
// REQUIRES: document < index.num_documents().
int64_t DocumentTokens(const IndexView& index, int64_t document);

// The document holding sequence `sequence` (the last document whose first
// sequence is at or before it). REQUIRES: sequence < index.num_sequences().
int64_t DocumentOfSequence(const IndexView& index, int64_t sequence);

// RealLength of the sample `piece` under `rules`: what a planner is given.
int64_t PlannedLength(const IndexView& index, SampleTable::Piece piece, const SampleRules& rules);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_SAMPLE_RULES_H_
