#include "packfeed/dataset/pretraining_indices.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/megatron_cache.h"

namespace packfeed::dataset {

namespace {

// What each dataset's GPTDataset is asked for (Megatron's builder), and a
// weighted blend's normalized weights and size.
struct DatasetAsks {
  std::optional<std::vector<double>> weights;
  std::vector<std::optional<int64_t>> asked;  // per dataset; none: one epoch
  int64_t blend_size = 0;
};

absl::StatusOr<DatasetAsks> AsksOf(const PretrainingBlendOptions& options, int num_datasets,
                                   std::optional<int64_t> requested, absl::string_view split_name) {
  DatasetAsks out;
  out.asked.assign(static_cast<size_t>(num_datasets), requested);
  if (options.weights.has_value()) {
    if (static_cast<int>(options.weights->size()) != num_datasets) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.weights->size(), " weights for ", num_datasets, " datasets"));
    }
    PF_ASSIGN_OR_RETURN(out.weights, NormalizeBlendWeights(*options.weights));
    if (!requested.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a blend with weights needs the number of ", split_name, " samples"));
    }
    const std::vector<int64_t> target = SamplesPerDataset(*out.weights, *requested, 0.0);
    const std::vector<int64_t> buffer =
        SamplesPerDataset(*out.weights, *requested, options.mid_level_dataset_surplus);
    for (int d = 0; d < num_datasets; ++d) {
      out.asked[static_cast<size_t>(d)] = buffer[static_cast<size_t>(d)];
      out.blend_size += target[static_cast<size_t>(d)];
    }
  } else if (num_datasets > 1) {
    // Without weights each dataset builds one epoch and the blend follows
    // their sizes.
    for (auto& a : out.asked) a.reset();
  }
  return out;
}

// An unweighted blend of several datasets: by their sizes, of `requested`
// samples (at most all of them), or every sample of each without a count.
absl::StatusOr<BlendIndices> BlendBySize(const std::vector<GptIndices>& datasets,
                                         std::optional<int64_t> requested) {
  std::vector<double> sizes;
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const GptIndices& g : datasets) {
    sizes.push_back(static_cast<double>(g.num_samples()));
    counts.push_back(g.num_samples());
    total += g.num_samples();
  }
  if (requested.has_value()) {
    PF_ASSIGN_OR_RETURN(const std::vector<double> by_size, NormalizeBlendWeights(sizes));
    return BuildBlendIndices(by_size, std::min(*requested, total));
  }
  return BuildExhaustiveBlendIndices(counts);
}

// One dataset's GPTDataset indices over its sequences in `range`: read
// from Megatron's cache when that holds them (`from_cache`), else built.
absl::StatusOr<GptIndices> DatasetIndices(const PretrainingBlendOptions& options,
                                          const MegatronCacheDescriptions& cache,
                                          MegatronSplit split, int d,
                                          absl::Span<const int32_t> lengths,
                                          std::pair<int64_t, int64_t> range,
                                          std::optional<int64_t> asked, const GptIndexOptions& gpt,
                                          bool& from_cache) {
  from_cache = false;
  if (!options.cache_dir.empty()) {
    const GptCacheKey key{options.dataset_paths[static_cast<size_t>(d)],
                          asked,
                          split,
                          options.random_seed,
                          options.sequence_length,
                          options.split};
    absl::StatusOr<std::optional<GptIndices>> cached =
        ReadMegatronGptCache(cache, key, lengths, range.first, range.second, gpt);
    if (!cached.ok()) return cached.status();
    if (cached->has_value()) {
      from_cache = true;
      return **std::move(cached);
    }
  }
  return BuildGptIndices(lengths, range.first, range.second, asked, gpt);
}

// BlendedDataset's check: no dataset is drawn beyond what it built.
absl::Status CheckBlendDraws(const BlendIndices& blend, const std::vector<GptIndices>& datasets,
                             absl::string_view split_name, double surplus) {
  std::vector<int64_t> drawn(datasets.size(), 0);
  for (int16_t d : blend.dataset_index) ++drawn[static_cast<size_t>(d)];
  for (size_t d = 0; d < datasets.size(); ++d) {
    const int64_t built = datasets[d].num_samples();
    if (drawn[d] > built) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", split_name, " blend draws ", drawn[d], " samples of dataset ", d,
          ", which built ", built, "; raise mid_level_dataset_surplus (now ", surplus, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PretrainingIndices> PretrainingIndices::Build(
    std::vector<absl::Span<const int32_t>> sequence_lengths, const PretrainingBlendOptions& options,
    MegatronSplit split, int threads) {
  return Build(
      static_cast<int>(sequence_lengths.size()),
      [&](int d) { return sequence_lengths[static_cast<size_t>(d)]; }, options, split, threads);
}

absl::StatusOr<PretrainingIndices> PretrainingIndices::Build(int num_datasets,
                                                             const LengthsOf& lengths_of,
                                                             const PretrainingBlendOptions& options,
                                                             MegatronSplit split, int threads) {
  if (num_datasets < 1 || num_datasets >= 32767) {
    return absl::InvalidArgumentError(
        absl::StrCat("a blend holds 1 to 32766 datasets, not ", num_datasets));
  }
  const auto s = static_cast<size_t>(split);
  const absl::string_view split_name = MegatronSplitName(split);
  PF_ASSIGN_OR_RETURN(const SplitMatrix matrix, ParseMegatronSplit(options.split));
  if (!matrix[s].has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("split \"", options.split, "\" gives the ", split_name, " split no share"));
  }
  const std::optional<int64_t> requested = options.split_samples[s];
  if (requested.has_value() && *requested < 0) {
    return absl::InvalidArgumentError(absl::StrCat(split_name, " samples ", *requested, " < 0"));
  }

  PretrainingIndices out;
  out.lengths_.resize(static_cast<size_t>(num_datasets));
  out.gpt_.sequence_length = options.sequence_length;
  out.gpt_.random_seed = options.random_seed;
  out.gpt_.add_extra_token = options.add_extra_token;
  out.gpt_.drop_last_partial =
      split != MegatronSplit::kValid || options.drop_last_partial_validation_sequence;

  PF_ASSIGN_OR_RETURN(const DatasetAsks asks, AsksOf(options, num_datasets, requested, split_name));
  const std::optional<std::vector<double>>& weights = asks.weights;
  const std::vector<std::optional<int64_t>>& asked = asks.asked;
  const int64_t blend_size = asks.blend_size;

  // A weighted blend's interleaving needs only the weights: at corpus scale
  // (10^3 datasets, 10^7 samples) it is the longest single task, so it runs
  // beside the datasets' builds instead of after them.
  std::optional<BlendIndices> weighted_blend;
  std::jthread blender;
  if (weights.has_value()) {
    blender = std::jthread([&] { weighted_blend = BuildBlendIndices(*weights, blend_size); });
  }

  const MegatronCacheDescriptions cache = options.cache_dir.empty()
                                              ? MegatronCacheDescriptions()
                                              : MegatronCacheDescriptions::Read(options.cache_dir);

  // Each dataset's indices are independent (their own random stream):
  // built on up to `threads` threads, results in dataset order.
  out.ranges_.resize(static_cast<size_t>(num_datasets));
  std::vector<absl::StatusOr<GptIndices>> built(static_cast<size_t>(num_datasets),
                                                absl::UnknownError("not built"));
  std::vector<absl::Status> fetched(static_cast<size_t>(num_datasets));
  std::vector<char> from_cache(static_cast<size_t>(num_datasets), 0);
  std::atomic<int> next{0};
  auto work = [&] {
    for (int d = next++; d < num_datasets; d = next++) {
      absl::StatusOr<absl::Span<const int32_t>> fetch = lengths_of(d);
      if (!fetch.ok()) {
        fetched[static_cast<size_t>(d)] = fetch.status();
        continue;
      }
      const absl::Span<const int32_t> lengths = *fetch;
      out.lengths_[static_cast<size_t>(d)] = lengths;
      const auto range = SplitSequences(*matrix[s], static_cast<int64_t>(lengths.size()));
      out.ranges_[static_cast<size_t>(d)] = range;
      bool cached = false;
      built[static_cast<size_t>(d)] =
          DatasetIndices(options, cache, split, d, lengths, range, asked[static_cast<size_t>(d)],
                         out.gpt_, cached);
      from_cache[static_cast<size_t>(d)] = cached;
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < std::min(threads, num_datasets); ++t) workers.emplace_back(work);
  work();
  for (std::thread& worker : workers) worker.join();
  if (blender.joinable()) blender.join();
  for (const absl::Status& status : fetched) PF_RETURN_IF_ERROR(status);
  for (int d = 0; d < num_datasets; ++d) {
    auto& result = built[static_cast<size_t>(d)];
    if (!result.ok()) {
      return absl::Status(
          result.status().code(),
          absl::StrCat("dataset ", d, ", ", split_name, " split: ", result.status().message()));
    }
    out.datasets_.push_back(*std::move(result));
    out.from_cache_.push_back(from_cache[static_cast<size_t>(d)] != 0);
  }

  if (num_datasets == 1 && !weights.has_value()) {
    out.num_samples_ = out.datasets_[0].num_samples();
    return out;
  }
  if (weights.has_value()) {
    out.blend_ = std::move(weighted_blend);
  } else {
    PF_ASSIGN_OR_RETURN(out.blend_, BlendBySize(out.datasets_, requested));
  }
  PF_RETURN_IF_ERROR(
      CheckBlendDraws(*out.blend_, out.datasets_, split_name, options.mid_level_dataset_surplus));
  out.num_samples_ = static_cast<int64_t>(out.blend_->dataset_index.size());
  return out;
}

PretrainingIndices::Sample PretrainingIndices::Locate(int64_t i) const {
  int d = 0;
  int64_t sample = i;
  if (blend_.has_value()) {
    d = blend_->dataset_index[static_cast<size_t>(i)];
    sample = blend_->dataset_sample_index[static_cast<size_t>(i)];
  }
  return {d, RunsOfSample(datasets_[static_cast<size_t>(d)], lengths_[static_cast<size_t>(d)], gpt_,
                          sample)};
}

int64_t PretrainingIndices::sample_tokens() const {
  return gpt_.sequence_length + (gpt_.add_extra_token ? 1 : 0);
}

}  // namespace packfeed::dataset
