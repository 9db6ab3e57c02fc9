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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// The GPTDataset descriptions in a Megatron cache directory, read once: a
// blend of a thousand datasets would otherwise read every description once
// per dataset (10^6 reads, most of a start-up from the cache).
class MegatronCacheDescriptions {
 public:
  // An unreadable or missing directory holds none.
  static MegatronCacheDescriptions Read(const std::string& dir);

  // The path all of the entry's files begin with ("DIR/<md5>-GPTDataset-
  // <split>-") for the first description of `split`, in directory order,
  // whose text begins with `prefix`; nullopt when none does.
  std::optional<std::string> Find(MegatronSplit split, absl::string_view prefix) const;

 private:
  struct Entry {
    MegatronSplit split;
    std::string text;
    std::string base;
  };
  std::vector<Entry> entries_;
};

// The indices Megatron cached for `key` (in the directory `cache` was read
// from), checked against the dataset's sequence lengths and the split's
// sequences [first, end); nullopt when no description there matches.
// DataLoss naming the file when a matching entry's arrays are missing,
// unreadable or inconsistent.
absl::StatusOr<std::optional<GptIndices>> ReadMegatronGptCache(
    const MegatronCacheDescriptions& cache, const GptCacheKey& key,
    absl::Span<const int32_t> sequence_lengths, int64_t first, int64_t end,
    const GptIndexOptions& options);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_MEGATRON_CACHE_H_
