#include "packfeed/dataset/megatron_blend.h"

#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "packfeed/dataset/numpy_compat.h"

namespace packfeed::dataset {

absl::string_view MegatronSplitName(MegatronSplit split) {
  switch (split) {
    case MegatronSplit::kTrain:
      return "train";
    case MegatronSplit::kValid:
      return "valid";
    case MegatronSplit::kTest:
      return "test";
  }
  return "?";
}

absl::StatusOr<SplitMatrix> ParseMegatronSplit(absl::string_view split) {
  std::vector<double> parts;
  for (absl::string_view part : absl::StrSplit(split, ',')) {
    part = absl::StripAsciiWhitespace(part);
    double value = 0;
    // Digits and dots only, as Megatron's pattern [.0-9]+ reads them.
    const bool digits = !part.empty() && part.find_first_not_of("0123456789.") == part.npos;
    if (!digits || !absl::SimpleAtod(part, &value) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("split \"", split, "\": \"", part, "\" is not a non-negative number"));
    }
    parts.push_back(value);
  }
  if (parts.size() > kNumMegatronSplits) {
    return absl::InvalidArgumentError(
        absl::StrCat("split \"", split, "\" has ", parts.size(), " parts; at most 3"));
  }
  parts.resize(kNumMegatronSplits, 0.0);
  const double sum = NumpySum(parts);
  if (!(sum > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("split \"", split, "\" sums to 0"));
  }
  // convert_split_vector_to_split_matrix: cumulative bookends, a split of
  // zero width is absent.
  SplitMatrix matrix;
  double begin = 0;
  for (int i = 0; i < kNumMegatronSplits; ++i) {
    const double end = begin + parts[static_cast<size_t>(i)] / sum;
    if (end > begin) matrix[static_cast<size_t>(i)] = std::make_pair(begin, end);
    begin = end;
  }
  return matrix;
}

std::pair<int64_t, int64_t> SplitSequences(const std::pair<double, double>& share,
                                           int64_t num_sequences) {
  const auto n = static_cast<double>(num_sequences);
  return {PythonRound(share.first * n), PythonRound(share.second * n)};
}

absl::StatusOr<std::vector<double>> NormalizeBlendWeights(absl::Span<const double> weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("blend weight ", i, " is ", weights[i], "; weights must be > 0"));
    }
  }
  if (weights.empty()) return absl::InvalidArgumentError("a blend needs at least one dataset");
  const double sum = NumpySum(weights);
  std::vector<double> out;
  out.reserve(weights.size());
  for (double w : weights) out.push_back(w / sum);
  return out;
}

std::vector<int64_t> SamplesPerDataset(absl::Span<const double> normalized_weights, int64_t target,
                                       double surplus) {
  std::vector<int64_t> out;
  out.reserve(normalized_weights.size());
  for (double w : normalized_weights) {
    const double planned = std::ceil(static_cast<double>(target) * w);
    out.push_back(static_cast<int64_t>(std::ceil(planned * (1.0 + surplus))));
  }
  return out;
}

namespace {

// helpers.cpp's rule for sample i: the dataset furthest behind its weight
// (weight · max(i, 1) − drawn), the first on ties, among those `open`
// admits (the exhaustive blend drops datasets that have given every sample).
template <typename Open>
size_t FurthestBehind(absl::Span<const double> weights, absl::Span<const int64_t> drawn, int64_t i,
                      Open open) {
  const double at = std::max(static_cast<double>(i), 1.0);
  size_t best = weights.size();
  double best_error = std::numeric_limits<double>::lowest();
  for (size_t d = 0; d < weights.size(); ++d) {
    if (!open(d)) continue;
    const double error = weights[d] * at - static_cast<double>(drawn[d]);
    if (error > best_error) {
      best_error = error;
      best = d;
    }
  }
  return best;
}

BlendIndices Interleave(absl::Span<const double> weights, int64_t size,
                        absl::Span<const int64_t> sizes) {
  BlendIndices out;
  out.dataset_index.reserve(static_cast<size_t>(size));
  out.dataset_sample_index.reserve(static_cast<size_t>(size));
  std::vector<int64_t> drawn(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const size_t best = FurthestBehind(
        weights, drawn, i, [&](size_t d) { return sizes.empty() || drawn[d] < sizes[d]; });
    out.dataset_index.push_back(static_cast<int16_t>(best));
    out.dataset_sample_index.push_back(drawn[best]++);
  }
  return out;
}

}  // namespace

BlendIndices BuildBlendIndices(absl::Span<const double> normalized_weights, int64_t size) {
  return Interleave(normalized_weights, size, {});
}

BlendIndices BuildExhaustiveBlendIndices(absl::Span<const int64_t> sizes) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::vector<double> weights;
  for (int64_t s : sizes) weights.push_back(static_cast<double>(s) / static_cast<double>(total));
  return Interleave(weights, total, sizes);
}

}  // namespace packfeed::dataset
