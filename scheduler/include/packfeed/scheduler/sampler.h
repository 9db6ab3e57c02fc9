#ifndef PACKFEED_SCHEDULER_SAMPLER_H_
#define PACKFEED_SCHEDULER_SAMPLER_H_

// Which samples make up the global batch of a step (docs/ARCHITECTURE.md): a pure
// function of (options, step), computed directly — O(global batch), nothing
// proportional to the datasets — so resuming at step s costs what step 0
// costs, and every node computes the same batch.
//
// Blends: each global batch takes a fixed number of samples from each
// dataset, the global batch apportioned by weight (largest remainders). So
// every batch has the blend's mix, not just the average over many, and
// dataset d's j-th draw overall is simply the (j mod n_d)-th of its epoch
// ⌊j / n_d⌋.
// Shuffle: each (dataset, epoch) has its own seeded permutation; the batch's
// positions are then shuffled with a per-step permutation so datasets mix.
// Sequential (no shuffle, one dataset): position p of step s is sample
// s·G + p (mod n) — Megatron's order, where DP rank d reads positions
// k·DP + d.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace packfeed::scheduler {

struct SamplerDataset {
  int64_t num_samples = 0;  // >= 1
  double weight = 1.0;      // > 0; relative
};

struct SamplerOptions {
  std::vector<SamplerDataset> datasets;  // at least one
  int64_t global_batch = 0;              // >= 1
  uint64_t seed = 0;
  bool shuffle = true;
};

struct SampleRef {
  int dataset = 0;
  int64_t index = 0;  // within the dataset
  int64_t epoch = 0;  // of that dataset

  friend bool operator==(const SampleRef&, const SampleRef&) = default;
};

class Sampler {
 public:
  // InvalidArgument for: no datasets, an empty dataset, a weight that is
  // not positive, or a weight so small that its dataset would get no sample
  // of a global batch (the message names the dataset and the batch size).
  static absl::StatusOr<Sampler> Create(SamplerOptions options);

  // Samples per global batch from each dataset; sums to the global batch.
  const std::vector<int64_t>& per_batch() const { return per_batch_; }

  // The global batch of `step` (>= 0), in batch order.
  std::vector<SampleRef> GlobalBatch(int64_t step) const;

  // The epoch dataset `dataset` is in when `step` begins.
  int64_t EpochAt(int dataset, int64_t step) const;

 private:
  explicit Sampler(SamplerOptions options) : options_(std::move(options)) {}

  SamplerOptions options_;
  std::vector<int64_t> per_batch_;
};

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SAMPLER_H_
