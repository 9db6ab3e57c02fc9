#ifndef PACKFEED_DATASET_GPT_INDICES_H_
#define PACKFEED_DATASET_GPT_INDICES_H_

// Megatron-Core's GPTDataset indices, built as Megatron builds them so the
// same configuration gives the same samples (docs/PRETRAINING.md):
//   document index — the split's sequence ids repeated once per epoch and
//     shuffled with numpy's RandomState(random_seed), the final epoch
//     shuffled on its own when it is used for less than 80 % of a pass;
//   sample index — where each sample of sequence_length (+1) tokens starts:
//     a position in the document index and a token offset, samples running
//     across sequence boundaries;
//   shuffle index — a permutation of the samples (the final epoch's apart
//     when separated), drawn from the same random stream.
// Sample i of the dataset is sample_index[shuffle_index[i]] up to the next
// one. Pure: no I/O; memory is 4 B per document-epoch + 24 B per sample.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace packfeed::dataset {

struct GptIndexOptions {
  int64_t sequence_length = 0;  // > 1
  uint32_t random_seed = 0;
  // Each sample holds sequence_length + 1 tokens, so inputs and labels both
  // have sequence_length (Megatron's add_extra_token_to_sequence).
  bool add_extra_token = true;
  // Drop a last sample shorter than a full one (Megatron: always for train
  // and test; drop_last_partial_validation_sequence for valid).
  bool drop_last_partial = true;
};

// A sample's place in the document index: position and token offset.
struct SampleStart {
  int64_t document_position = 0;
  int64_t offset = 0;
};

struct GptIndices {
  int num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t tokens_per_epoch = 0;
  std::vector<int32_t> document_index;    // sequence ids
  std::vector<SampleStart> sample_index;  // num_samples() + 1 entries
  std::vector<int64_t> shuffle_index;     // num_samples() entries

  int64_t num_samples() const { return static_cast<int64_t>(shuffle_index.size()); }
};

// One contiguous run of a sample: `length` tokens of sequence `sequence`
// from token `offset`, in pass `pass` over the split (which copy of the
// sequence in the document index: position / split sequences).
struct SampleRun {
  int64_t sequence = 0;
  int64_t offset = 0;
  int64_t length = 0;
  int64_t pass = 0;
};

// Builds the indices of the GPTDataset over sequences [first, end) of a
// dataset whose sequence lengths are `sequence_lengths`, drawing at least
// `num_samples` samples (more epochs as needed), or one epoch when absent.
// InvalidArgument when the range is empty or outside the dataset, when it
// holds fewer tokens than one sample needs, or when the options are out of
// range; the error names the values.
absl::StatusOr<GptIndices> BuildGptIndices(absl::Span<const int32_t> sequence_lengths,
                                           int64_t first, int64_t end,
                                           std::optional<int64_t> num_samples,
                                           const GptIndexOptions& options);

// Checks that indices made elsewhere (Megatron's cache) can be used on
// this dataset: document entries inside [first, end), sample starts in
// order and inside their sequences (the extra token too), the shuffle a
// permutation of the samples. InvalidArgument naming the first violation.
absl::Status CheckGptIndices(const GptIndices& indices, absl::Span<const int32_t> sequence_lengths,
                             int64_t first, int64_t end, const GptIndexOptions& options);

// The runs of sample `i` (after the shuffle), in order; their lengths add up
// to sequence_length (+1), or less for a partial last sample.
// REQUIRES: 0 <= i < indices.num_samples().
std::vector<SampleRun> RunsOfSample(const GptIndices& indices,
                                    absl::Span<const int32_t> sequence_lengths,
                                    const GptIndexOptions& options, int64_t i);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_GPT_INDICES_H_
