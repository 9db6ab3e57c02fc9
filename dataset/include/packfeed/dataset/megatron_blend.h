#ifndef PACKFEED_DATASET_MEGATRON_BLEND_H_
#define PACKFEED_DATASET_MEGATRON_BLEND_H_

// Megatron-Core's blending rules (BlendedMegatronDatasetBuilder and
// BlendedDataset), reproduced so a blend draws the same samples in the same
// order: the split string and its document ranges, weight normalisation, the
// samples each dataset is asked for (with mid_level_dataset_surplus), and
// the greedy interleaving of datasets by weight. Pure functions.

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace packfeed::dataset {

enum class MegatronSplit { kTrain = 0, kValid = 1, kTest = 2 };
constexpr int kNumMegatronSplits = 3;
absl::string_view MegatronSplitName(MegatronSplit split);  // "train", "valid", "test"

// The split string ("969,30,1"; one to three non-negative numbers separated
// by commas) as Megatron's split matrix: per split, the [begin, end) share
// of a dataset's sequences, or nullopt for a split of weight 0.
// InvalidArgument for anything else, or a sum of 0.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, kNumMegatronSplits>;
absl::StatusOr<SplitMatrix> ParseMegatronSplit(absl::string_view split);

// The sequences [first, end) of a dataset of `num_sequences` that a split's
// share covers (Python's round, half to even, of each bound).
std::pair<int64_t, int64_t> SplitSequences(const std::pair<double, double>& share,
                                           int64_t num_sequences);

// Megatron's normalize: w / numpy.sum(w). InvalidArgument unless every
// weight is finite and > 0.
absl::StatusOr<std::vector<double>> NormalizeBlendWeights(absl::Span<const double> weights);

// Samples a blend asks of each dataset for a split of `target` samples:
// ceil(ceil(target · w) · (1 + surplus)) per normalized weight w.
std::vector<int64_t> SamplesPerDataset(absl::Span<const double> normalized_weights, int64_t target,
                                       double surplus);

// BlendedDataset's indices: for each of `size` samples, the dataset it comes
// from and that dataset's sample number.
struct BlendIndices {
  std::vector<int16_t> dataset_index;
  std::vector<int64_t> dataset_sample_index;
};

// build_blending_indices: sample i goes to the dataset furthest behind its
// weight (weight · max(i, 1) − drawn so far; the first on ties), for the
// doubles Megatron's helpers.cpp computes, at any dataset count. Datasets
// of equal weight are drawn as one class; from kBlocksFrom distinct
// weights on, the same choices come from blocks of classes rather than a
// scan of all of them per sample.
inline constexpr size_t kBlocksFrom = 256;
// REQUIRES: 1 <= normalized_weights.size() < 32767.
BlendIndices BuildBlendIndices(absl::Span<const double> normalized_weights, int64_t size);

// build_exhaustive_blending_indices: exactly sizes[d] samples of dataset d,
// interleaved in proportion to the sizes (a blend without weights).
BlendIndices BuildExhaustiveBlendIndices(absl::Span<const int64_t> sizes);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_MEGATRON_BLEND_H_
