#ifndef PACKFEED_DATASET_DATASET_GENERATOR_H_
#define PACKFEED_DATASET_DATASET_GENERATOR_H_

// Synthetic datasets for demos, tests and benchmarks. Deterministic: the
// same options give the same bytes on every machine (our own mapping of
// mt19937_64 bits, never std::*_distribution, whose output is unspecified).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/dataset/dtype.h"

namespace packfeed::dataset {

// Sequence-length rule of Megatron's mock SFT generator: lognormal with
// median exp(μ), μ = ln(mean) − σ²/2 (so the unclipped mean is `mean`),
// rounded down and clipped to [min, max]. Same distribution, not the same
// draws as numpy's (replay a length file for those).
struct LengthDistribution {
  int64_t min = 1024;
  int64_t max = 8192;
  double mean = 4096;
  double sigma = 1.1;
};

// InvalidArgument when min < 1, max < min, mean <= 0 or sigma < 0.
absl::Status ValidateLengthDistribution(const LengthDistribution& dist);

absl::StatusOr<std::vector<int64_t>> GenerateLengths(const LengthDistribution& dist, uint64_t count,
                                                     uint64_t seed);

// Parses one positive length per line (blank lines and '#' comments
// skipped); InvalidArgument naming the line otherwise.
absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view text, absl::string_view source);

// Reads and parses a length file (ParseLengths); NotFound when unreadable.
absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path);

struct GeneratedDatasetOptions {
  int64_t vocab_size = 32000;  // Tokens are uniform in [0, vocab_size).
  DType dtype = DType::kUint16;
  uint64_t seed = 0;
};

// Writes PREFIX.idx/.bin: one document of one sequence per length.
absl::Status WriteGeneratedDataset(absl::string_view prefix, const std::vector<int64_t>& lengths,
                                   const GeneratedDatasetOptions& options);

// A synthetic side field (config.proto SideField) for a generated dataset:
//   experts      int16 [layers, top_k] per token: distinct expert indices
//                in [0, experts) per token and layer (router replay);
//   logprobs     float32 per token in (-8, 0] (rollout log-probs);
//   prompt_mask  uint8 per token: 0 over each document's first 30 % (at
//                least one token, its prompt), 1 after.
struct GeneratedSideField {
  enum class Kind { kExperts, kLogProbs, kPromptMask };
  std::string name;
  Kind kind = Kind::kLogProbs;
  int64_t layers = 1;
  int64_t top_k = 1;
  int64_t experts = 1;
};

// Parses NAME:experts:LAYERSxTOP_K:EXPERTS, NAME:logprobs or
// NAME:prompt_mask; InvalidArgument naming what is wrong.
absl::StatusOr<GeneratedSideField> ParseGeneratedSideField(absl::string_view spec);

// Writes PREFIX.idx/.bin holding `field` for the documents of `lengths`
// (one sequence each, as WriteGeneratedDataset writes them).
absl::Status WriteGeneratedSideField(absl::string_view prefix, const std::vector<int64_t>& lengths,
                                     const GeneratedSideField& field, uint64_t seed);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_DATASET_GENERATOR_H_
