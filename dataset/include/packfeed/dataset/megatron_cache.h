#ifndef PACKFEED_DATASET_MEGATRON_CACHE_H_
#define PACKFEED_DATASET_MEGATRON_CACHE_H_

// Megatron-Core's cached GPTDataset indices (its --data-cache-path):
// "<md5>-GPTDataset-<split>-{description.txt,document_index.npy,
// sample_index.npy,shuffle_index.npy}". Megatron finds them by the md5 of
// the dataset's description, a JSON text of the dataset path, sample
// count, split and seed, and the tokenizer. packfeed cannot know the
// tokenizer's part, so it finds the description whose text up to the
// tokenizer is exactly what Megatron would write for this dataset, and
// checks the arrays before any is used.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/dataset/gpt_indices.h"
#include "packfeed/dataset/megatron_blend.h"

namespace packfeed::dataset {

// What identifies one GPTDataset in Megatron's cache.
struct GptCacheKey {
  std::string dataset_path;  // the prefix exactly as the blend names it
  std::optional<int64_t> num_samples;
  MegatronSplit split = MegatronSplit::kTrain;
  uint32_t random_seed = 0;
  int64_t sequence_length = 0;
  std::string split_string;  // e.g. "969,30,1"
};

// Megatron's description text (json.dumps(..., indent=4)) up to and
// including `"tokenizer": `.
std::string GptDescriptionPrefix(const GptCacheKey& key);

// The indices Megatron cached in `dir` for `key`, checked against the
// dataset's sequence lengths and the split's sequences [first, end);
// nullopt when no description there matches. DataLoss naming the file when
// a matching entry's arrays are missing, unreadable or inconsistent.
absl::StatusOr<std::optional<GptIndices>> ReadMegatronGptCache(
    const std::string& dir, const GptCacheKey& key, absl::Span<const int32_t> sequence_lengths,
    int64_t first, int64_t end, const GptIndexOptions& options);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_MEGATRON_CACHE_H_
