#include "packfeed/scheduler/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/scheduler/permutation.h"

namespace packfeed::scheduler {
namespace {

// Distinct, well-mixed seeds per (dataset, epoch) and per step.
uint64_t EpochSeed(uint64_t seed, int dataset, int64_t epoch) {
  return Mix64(Mix64(seed) ^ Mix64((uint64_t(dataset) << 48) ^ static_cast<uint64_t>(epoch)));
}
uint64_t StepSeed(uint64_t seed, int64_t step) {
  return Mix64(Mix64(seed + 0x5851f42d4c957f2dULL) ^ Mix64(static_cast<uint64_t>(step)));
}

}  // namespace

absl::StatusOr<Sampler> Sampler::Create(SamplerOptions options) {
  if (options.datasets.empty()) {
    return absl::InvalidArgumentError("sampler: no datasets");
  }
  if (options.global_batch < 1) {
    return absl::InvalidArgumentError("sampler: global batch must be >= 1");
  }
  double total_weight = 0;
  for (size_t d = 0; d < options.datasets.size(); ++d) {
    const SamplerDataset& dataset = options.datasets[d];
    if (dataset.num_samples < 1) {
      return absl::InvalidArgumentError(absl::StrCat("sampler: dataset ", d, " has no samples"));
    }
    if (!(dataset.weight > 0) || !std::isfinite(dataset.weight)) {
      return absl::InvalidArgumentError(absl::StrCat("sampler: dataset ", d, " has weight ",
                                                     dataset.weight, "; weights must be positive"));
    }
    total_weight += dataset.weight;
  }
  // Largest remainders; ties to the lower dataset index.
  const size_t n = options.datasets.size();
  std::vector<int64_t> counts(n);
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t d = 0; d < n; ++d) {
    const double quota =
        static_cast<double>(options.global_batch) * options.datasets[d].weight / total_weight;
    counts[d] = static_cast<int64_t>(std::floor(quota));
    given += counts[d];
    remainders.push_back({quota - std::floor(quota), d});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < options.global_batch; ++i, ++given) {
    ++counts[remainders[i % n].second];
  }
  for (size_t d = 0; d < n; ++d) {
    if (counts[d] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampler: dataset ", d, " (weight ", options.datasets[d].weight, " of ",
                       total_weight, ") would get no sample of a global batch of ",
                       options.global_batch, "; raise its weight or the batch"));
    }
  }
  Sampler sampler(std::move(options));
  sampler.per_batch_ = std::move(counts);
  return sampler;
}

int64_t Sampler::EpochAt(int dataset, int64_t step) const {
  return step * per_batch_[dataset] / options_.datasets[dataset].num_samples;
}

std::vector<SampleRef> Sampler::GlobalBatch(int64_t step) const {
  std::vector<SampleRef> drawn;
  drawn.reserve(static_cast<size_t>(options_.global_batch));
  for (size_t d = 0; d < per_batch_.size(); ++d) {
    const int64_t n = options_.datasets[d].num_samples;
    const int64_t first = step * per_batch_[d];
    int64_t epoch = -1;
    Permutation permutation(1, 0);
    for (int64_t j = first; j < first + per_batch_[d]; ++j) {
      if (j / n != epoch) {
        epoch = j / n;
        permutation = Permutation(static_cast<uint64_t>(n),
                                  EpochSeed(options_.seed, static_cast<int>(d), epoch));
      }
      const int64_t position = j % n;
      const int64_t index = options_.shuffle
                                ? static_cast<int64_t>(permutation(static_cast<uint64_t>(position)))
                                : position;
      drawn.push_back({static_cast<int>(d), index, epoch});
    }
  }
  if (!options_.shuffle) return drawn;
  const Permutation order(static_cast<uint64_t>(drawn.size()), StepSeed(options_.seed, step));
  std::vector<SampleRef> batch;
  batch.reserve(drawn.size());
  for (size_t p = 0; p < drawn.size(); ++p) batch.push_back(drawn[order(p)]);
  return batch;
}

}  // namespace packfeed::scheduler
