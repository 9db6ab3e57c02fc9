#include "packfeed/dataset/megatron_blend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/pretraining_indices.h"

namespace packfeed::dataset {
namespace {

TEST(MegatronSplitTest, ParsesAndNormalizesLikeMegatron) {
  auto matrix = ParseMegatronSplit("969, 30, 1");
  ASSERT_TRUE(matrix.ok()) << matrix.status();
  ASSERT_TRUE((*matrix)[0] && (*matrix)[1] && (*matrix)[2]);
  EXPECT_EQ((*matrix)[0]->first, 0.0);
  EXPECT_EQ((*matrix)[0]->second, 969.0 / 1000.0);
  EXPECT_EQ((*matrix)[1]->first, 969.0 / 1000.0);
  EXPECT_EQ((*matrix)[2]->second, 969.0 / 1000.0 + 30.0 / 1000.0 + 1.0 / 1000.0);
  // Missing parts are 0 and a split of weight 0 is absent.
  auto train_only = ParseMegatronSplit("1");
  ASSERT_TRUE(train_only.ok());
  EXPECT_TRUE((*train_only)[0].has_value());
  EXPECT_FALSE((*train_only)[1].has_value());
  EXPECT_FALSE((*train_only)[2].has_value());
  // Python's round, half to even: 0.5 · 5 = 2.5 → 2.
  EXPECT_EQ(SplitSequences({0.0, 0.5}, 5), std::make_pair(int64_t{0}, int64_t{2}));
}

TEST(MegatronSplitTest, RefusesWhatDoesNotParse) {
  for (const char* bad : {"", "a,b", "99,-1", "1,2,3,4", "0,0,0", "1e3", "1,,2", "1.2.3"}) {
    EXPECT_FALSE(ParseMegatronSplit(bad).ok()) << bad;
  }
}

TEST(BlendWeightsTest, NormalizesAndRefusesNonPositive) {
  auto w = NormalizeBlendWeights({30, 70});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (std::vector<double>{0.3, 0.7}));
  EXPECT_FALSE(NormalizeBlendWeights({1, 0}).ok());
  EXPECT_FALSE(NormalizeBlendWeights({1, -2}).ok());
  EXPECT_FALSE(NormalizeBlendWeights({}).ok());
  EXPECT_EQ(SamplesPerDataset({0.3, 0.7}, 1000, 0.005), (std::vector<int64_t>{302, 704}));
}

TEST(BlendIndicesTest, FollowsTheWeightsAndNumbersEachDatasetsSamples) {
  const BlendIndices b = BuildBlendIndices({0.25, 0.75}, 400);
  std::vector<int64_t> next(2, 0);
  for (size_t i = 0; i < b.dataset_index.size(); ++i) {
    const int d = b.dataset_index[i];
    EXPECT_EQ(b.dataset_sample_index[i], next[static_cast<size_t>(d)]++);
  }
  EXPECT_EQ(next[0], 100);
  EXPECT_EQ(next[1], 300);
  const BlendIndices e = BuildExhaustiveBlendIndices(std::vector<int64_t>{3, 5, 1});
  std::vector<int64_t> drawn(3, 0);
  for (int16_t d : e.dataset_index) ++drawn[static_cast<size_t>(d)];
  EXPECT_EQ(drawn, (std::vector<int64_t>{3, 5, 1}));
}

// helpers.cpp's build_blending_indices and build_exhaustive_blending_indices
// as written: every open dataset's error for every sample, the first at the
// maximum.
BlendIndices HelpersScan(const std::vector<double>& weights, int64_t size,
                         const std::vector<int64_t>& sizes) {
  BlendIndices out;
  std::vector<int64_t> drawn(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double at = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = std::numeric_limits<double>::lowest();
    for (size_t d = 0; d < weights.size(); ++d) {
      if (!sizes.empty() && drawn[d] >= sizes[d]) continue;
      const double error = weights[d] * at - static_cast<double>(drawn[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    out.dataset_index.push_back(static_cast<int16_t>(best));
    out.dataset_sample_index.push_back(drawn[best]++);
  }
  return out;
}

// From kBlocksFrom distinct weights on the indices come from blocks, and
// equal weights are drawn as classes, not scanned: the same choices, ties
// and closed datasets included, for weights spread wide, nearly equal and
// equal.
TEST(BlendIndicesTest, ManyDatasetsGetHelpersChoicesExactly) {
  std::mt19937_64 random(7);
  for (const size_t datasets : {kBlocksFrom, size_t{300}, size_t{1000}}) {
    for (const int kind : {0, 1, 2}) {
      std::vector<double> raw;
      for (size_t d = 0; d < datasets; ++d) {
        const double spread = std::exp(static_cast<double>(random() % 4000) / 1000.0 - 2.0);
        raw.push_back(kind == 0 ? spread : kind == 1 ? 1000.0 + static_cast<double>(d % 7) : 1.0);
      }
      const absl::StatusOr<std::vector<double>> weights = NormalizeBlendWeights(raw);
      ASSERT_TRUE(weights.ok());
      const int64_t size = 60000;
      const BlendIndices blocks = BuildBlendIndices(*weights, size);
      const BlendIndices scan = HelpersScan(*weights, size, {});
      EXPECT_EQ(blocks.dataset_index, scan.dataset_index) << datasets << " datasets, kind " << kind;
      EXPECT_EQ(blocks.dataset_sample_index, scan.dataset_sample_index);

      std::vector<int64_t> sizes;
      int64_t total = 0;
      for (size_t d = 0; d < datasets; ++d) {
        sizes.push_back(kind == 2 ? 40 : static_cast<int64_t>(random() % 120));
        total += sizes.back();
      }
      std::vector<double> shares;
      for (int64_t s : sizes) shares.push_back(static_cast<double>(s) / static_cast<double>(total));
      const BlendIndices exhaustive = BuildExhaustiveBlendIndices(sizes);
      const BlendIndices scanned = HelpersScan(shares, total, sizes);
      EXPECT_EQ(exhaustive.dataset_index, scanned.dataset_index);
      EXPECT_EQ(exhaustive.dataset_sample_index, scanned.dataset_sample_index);
    }
  }
}

// Weights as recipes make them, where the blocks' margins matter: values
// that ordinary arithmetic leaves a few ulps apart (0.1 + 0.2 beside 0.3),
// exact repeats, weights 10^-12 of others, and lognormal spreads, mixed.
std::vector<double> AdversarialWeights(size_t datasets, std::mt19937_64& random) {
  const std::vector<double> bases = {0.1 + 0.2, 0.3,   0.7,  0.7000000000000001,
                                     1.0,       1e-12, 1e12, 1.0 / 3.0};
  std::vector<double> out;
  for (size_t d = 0; d < datasets; ++d) {
    double w = bases[random() % bases.size()];
    switch (random() % 4) {
      case 0:  // a few ulps either way
        for (uint64_t k = random() % 4; k > 0; --k)
          w = std::nextafter(w, random() % 2 ? 0.0 : 1e300);
        break;
      case 1:  // a spread
        w *= std::exp(static_cast<double>(random() % 4000) / 1000.0 - 2.0);
        break;
      default:  // the base itself: exact repeats
        break;
    }
    out.push_back(w);
  }
  return out;
}

// Classes and blocks at dataset counts from kBlocksFrom on, on weights
// built to find a lead that rounding overturns. 300 datasets of 0.1 + 0.2,
// 0.3, 0.7 and 0.7000000000000001 alone took another dataset at sample
// 14 250 before (blocks whose leads assumed exact arithmetic). A ladder of
// 600 weights one ulp apart each keeps every block within the rounding
// margin.
TEST(BlendIndicesTest, RoundingNeverOverturnsABlocksLead) {
  std::mt19937_64 random(65);
  std::vector<std::vector<double>> blends;
  std::vector<double> recipe;
  for (size_t d = 0; d < 300; ++d) {
    recipe.push_back(std::vector<double>{0.1 + 0.2, 0.3, 0.7, 0.7000000000000001}[d % 4]);
  }
  blends.push_back(recipe);
  std::vector<double> ladder = {0.3};
  while (ladder.size() < 600) ladder.push_back(std::nextafter(ladder.back(), 1.0));
  std::shuffle(ladder.begin(), ladder.end(), random);
  blends.push_back(ladder);
  for (const size_t datasets : {kBlocksFrom, size_t{300}, size_t{1000}, size_t{1500}}) {
    for (int trial = 0; trial < 3; ++trial) blends.push_back(AdversarialWeights(datasets, random));
  }
  for (const std::vector<double>& raw : blends) {
    const absl::StatusOr<std::vector<double>> weights = NormalizeBlendWeights(raw);
    ASSERT_TRUE(weights.ok());
    const int64_t size = 60150;
    const BlendIndices blocks = BuildBlendIndices(*weights, size);
    const BlendIndices scan = HelpersScan(*weights, size, {});
    const auto differ = std::mismatch(blocks.dataset_index.begin(), blocks.dataset_index.end(),
                                      scan.dataset_index.begin());
    ASSERT_EQ(differ.first, blocks.dataset_index.end())
        << raw.size() << " datasets: first differs at sample "
        << (differ.first - blocks.dataset_index.begin());
    EXPECT_EQ(blocks.dataset_sample_index, scan.dataset_sample_index);
  }
}

TEST(PretrainingIndicesTest, ABlendDrawsItsSamplesFromEveryDataset) {
  std::vector<int32_t> a(200, 30), b(300, 17);
  PretrainingBlendOptions options;
  options.weights = std::vector<double>{1, 3};
  options.split_samples[0] = 500;
  options.sequence_length = 16;
  options.random_seed = 1234;
  auto built = PretrainingIndices::Build({a, b}, options, MegatronSplit::kTrain);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->num_samples(), 125 + 375);
  for (int64_t i = 0; i < built->num_samples(); ++i) {
    const PretrainingIndices::Sample s = built->Locate(i);
    int64_t tokens = 0;
    for (const SampleRun& r : s.runs) tokens += r.length;
    EXPECT_EQ(tokens, 17);
    // The train split's sequences only (969/1000 of each dataset).
    for (const SampleRun& r : s.runs) EXPECT_LT(r.sequence, s.dataset == 0 ? 194 : 291);
  }
}

TEST(PretrainingIndicesTest, RefusesBadBlends) {
  std::vector<int32_t> a(100, 30);
  PretrainingBlendOptions options;
  options.sequence_length = 16;
  options.weights = std::vector<double>{1, 1};
  options.split_samples[0] = 10;
  EXPECT_THAT(PretrainingIndices::Build({a}, options, MegatronSplit::kTrain).status().message(),
              testing::HasSubstr("2 weights for 1 datasets"));
  options.weights = std::vector<double>{0, 1};
  EXPECT_FALSE(PretrainingIndices::Build({a, a}, options, MegatronSplit::kTrain).ok());
  options.weights = std::vector<double>{1, 1};
  options.split_samples[0].reset();
  EXPECT_THAT(PretrainingIndices::Build({a, a}, options, MegatronSplit::kTrain).status().message(),
              testing::HasSubstr("needs the number of train samples"));
  options.weights.reset();
  options.split = "1,0,0";
  EXPECT_THAT(PretrainingIndices::Build({a}, options, MegatronSplit::kValid).status().message(),
              testing::HasSubstr("no share"));
  // 99 % of 3 sequences of 5 tokens: too small for one 17-token sample.
  std::vector<int32_t> tiny(3, 5);
  options.split = "99,1";
  EXPECT_THAT(PretrainingIndices::Build({tiny}, options, MegatronSplit::kTrain).status().message(),
              testing::HasSubstr("dataset 0, train split"));
}

// Lengths fetched by the building threads (a job opens its datasets so):
// the same indices as from spans, every dataset fetched once, and the
// lowest dataset's fetch error returned as it is, before a build error of
// a lower dataset.
TEST(PretrainingIndicesTest, LengthsFetchedByTheBuildersGiveTheSameIndices) {
  std::vector<std::vector<int32_t>> lengths;
  for (int d = 0; d < 40; ++d) lengths.emplace_back(100 + 7 * d, 20 + d);
  PretrainingBlendOptions options;
  options.weights = std::vector<double>(40, 1.0);
  options.split_samples[0] = 400;
  options.sequence_length = 16;
  options.random_seed = 1234;
  std::vector<absl::Span<const int32_t>> spans(lengths.begin(), lengths.end());
  auto from_spans = PretrainingIndices::Build(spans, options, MegatronSplit::kTrain, 1);
  ASSERT_TRUE(from_spans.ok()) << from_spans.status();
  std::vector<std::atomic<int>> fetches(40);
  auto fetched = PretrainingIndices::Build(
      40,
      [&](int d) -> absl::StatusOr<absl::Span<const int32_t>> {
        ++fetches[static_cast<size_t>(d)];
        return spans[static_cast<size_t>(d)];
      },
      options, MegatronSplit::kTrain, 4);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  for (const std::atomic<int>& count : fetches) EXPECT_EQ(count.load(), 1);
  EXPECT_EQ(fetched->blend()->dataset_index, from_spans->blend()->dataset_index);
  for (int d = 0; d < 40; ++d) {
    EXPECT_EQ(fetched->gpt_indices(d).shuffle_index, from_spans->gpt_indices(d).shuffle_index);
  }

  std::vector<int32_t> tiny(3, 5);  // too small for one sample: a build error
  auto failing = PretrainingIndices::Build(
      40,
      [&](int d) -> absl::StatusOr<absl::Span<const int32_t>> {
        if (d == 0) return absl::Span<const int32_t>(tiny);
        if (d == 7 || d == 30) return absl::NotFoundError(absl::StrCat("ds", d, ".idx: missing"));
        return spans[static_cast<size_t>(d)];
      },
      options, MegatronSplit::kTrain, 4);
  EXPECT_EQ(failing.status(), absl::NotFoundError("ds7.idx: missing"));
}

}  // namespace
}  // namespace packfeed::dataset
