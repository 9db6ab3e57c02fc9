#ifndef PACKFEED_DATASET_PRETRAINING_INDICES_H_
#define PACKFEED_DATASET_PRETRAINING_INDICES_H_

// The samples of one split of a Megatron pretraining blend, numbered as
// Megatron-Core's BlendedMegatronDatasetBuilder numbers them (a GPTDataset
// per dataset, blended by BlendedDataset, or the GPTDataset alone for one
// dataset without a weight): sample i of the split is the same tokens that
// `dataset[i]` gives in Megatron for the same configuration
// (docs/PRETRAINING.md). Takes the datasets' sequence lengths; reads
// nothing but Megatron's cache when one is named. Immutable after Build;
// const methods are thread-safe.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/dataset/gpt_indices.h"
#include "packfeed/dataset/megatron_blend.h"

namespace packfeed::dataset {

struct PretrainingBlendOptions {
  // Per dataset; nullopt = no weights (a blend by dataset size, or one
  // GPTDataset for a single dataset).
  std::optional<std::vector<double>> weights;
  std::string split = "969,30,1";
  // Samples asked of each split (Megatron's train_valid_test_num_samples);
  // nullopt = one epoch (only without weights).
  std::array<std::optional<int64_t>, kNumMegatronSplits> split_samples;
  double mid_level_dataset_surplus = 0.005;
  int64_t sequence_length = 0;
  uint32_t random_seed = 0;
  bool add_extra_token = true;
  bool drop_last_partial_validation_sequence = true;
  // Megatron's --data-cache-path: each dataset's indices are read from
  // Megatron's cache there when it holds them for this configuration
  // (megatron_cache.h), else built. `dataset_paths`: the datasets' paths
  // as Megatron's blend names them (the cache key), one per dataset.
  std::string cache_dir;
  std::vector<std::string> dataset_paths;
};

class PretrainingIndices {
 public:
  // `sequence_lengths[d]`: every sequence length of dataset d (its whole
  // index; the split chooses the range). InvalidArgument naming the dataset
  // and the rule for: a split that does not parse or has no share for
  // `split`, weights that are not > 0 or not one per dataset, a dataset
  // whose share is too small for one sample, a split without a sample count
  // where one is needed, or a blend that draws more samples of a dataset
  // than it built (raise mid_level_dataset_surplus). The datasets' indices
  // are built on up to `threads` threads; the result does not depend on it.
  static absl::StatusOr<PretrainingIndices> Build(
      std::vector<absl::Span<const int32_t>> sequence_lengths,
      const PretrainingBlendOptions& options, MegatronSplit split, int threads = 1);

  // Dataset d's sequence lengths, as the Build below fetches them (opening
  // the dataset, say): called once per dataset, from the building threads,
  // several at a time. The span must outlive the PretrainingIndices.
  using LengthsOf = std::function<absl::StatusOr<absl::Span<const int32_t>>(int dataset)>;
  // As above, each dataset's lengths fetched by the thread that then builds
  // its indices: at corpus scale opening a thousand datasets runs on
  // `threads` threads, beside the weighted interleaving, which needs only
  // the weights. The first dataset's error of `lengths_of` is returned as
  // it is, before any other.
  static absl::StatusOr<PretrainingIndices> Build(int num_datasets, const LengthsOf& lengths_of,
                                                  const PretrainingBlendOptions& options,
                                                  MegatronSplit split, int threads = 1);

  struct Sample {
    int dataset = 0;
    std::vector<SampleRun> runs;  // tokens of that dataset, in order
  };

  // Samples of the split: Megatron's len(dataset).
  int64_t num_samples() const { return num_samples_; }
  // REQUIRES: 0 <= i < num_samples().
  Sample Locate(int64_t i) const;
  // Tokens of a full sample (sequence_length + 1 with the extra token).
  int64_t sample_tokens() const;

  // What was built, for checks against Megatron's own indices: dataset d's
  // GPTDataset indices and, for a blend, the blend's indices.
  int num_datasets() const { return static_cast<int>(datasets_.size()); }
  const GptIndices& gpt_indices(int d) const { return datasets_[static_cast<size_t>(d)]; }
  const std::optional<BlendIndices>& blend() const { return blend_; }
  // The sequences [first, end) of dataset d in this split.
  std::pair<int64_t, int64_t> sequences(int d) const { return ranges_[static_cast<size_t>(d)]; }
  const GptIndexOptions& gpt_options() const { return gpt_; }
  // Whether dataset d's indices were read from Megatron's cache.
  bool from_cache(int d) const { return from_cache_[static_cast<size_t>(d)]; }

 private:
  std::vector<absl::Span<const int32_t>> lengths_;
  GptIndexOptions gpt_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::vector<GptIndices> datasets_;
  std::vector<bool> from_cache_;
  std::optional<BlendIndices> blend_;
  int64_t num_samples_ = 0;
};

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_PRETRAINING_INDICES_H_
