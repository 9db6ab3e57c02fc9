#include "packfeed/dataset/dataset_generator.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "test_paths.h"

namespace packfeed::dataset {
namespace {

using ::testing::HasSubstr;

TEST(DatasetGeneratorTest, LengthsAreDeterministicAndClipped) {
  LengthDistribution dist;  // the SFT trace's parameters
  absl::StatusOr<std::vector<int64_t>> a = GenerateLengths(dist, 20000, 5);
  absl::StatusOr<std::vector<int64_t>> b = GenerateLengths(dist, 20000, 5);
  absl::StatusOr<std::vector<int64_t>> c = GenerateLengths(dist, 20000, 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_EQ(*std::min_element(a->begin(), a->end()), dist.min);
  EXPECT_EQ(*std::max_element(a->begin(), a->end()), dist.max);
}

TEST(DatasetGeneratorTest, MatchesTheSftTraceStatistics) {
  // Megatron's SFT trace (bench/traces/megatron_lognormal.py), numpy's
  // draws of the same rule:
  // 23.8 % at the lower clip, 11.6 % at the upper, median 2200.
  LengthDistribution dist;
  std::vector<int64_t> lengths = *GenerateLengths(dist, 100000, 1);
  const double at_min = std::count(lengths.begin(), lengths.end(), dist.min) / 1e5;
  const double at_max = std::count(lengths.begin(), lengths.end(), dist.max) / 1e5;
  std::nth_element(lengths.begin(), lengths.begin() + 50000, lengths.end());
  EXPECT_NEAR(at_min, 0.238, 0.01);
  EXPECT_NEAR(at_max, 0.1155, 0.01);
  EXPECT_NEAR(static_cast<double>(lengths[50000]), 2200, 80);
}

TEST(DatasetGeneratorTest, RejectsBadDistributions) {
  LengthDistribution dist;
  dist.min = 10;
  dist.max = 5;
  EXPECT_THAT(GenerateLengths(dist, 1, 0).status().message(), HasSubstr("1 <= min <= max"));
  dist = {};
  dist.sigma = -1;
  EXPECT_EQ(GenerateLengths(dist, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DatasetGeneratorTest, ParsesLengthFiles) {
  absl::StatusOr<std::vector<int64_t>> lengths = ParseLengths("# trace\n12\n\n 7 \n", "t.txt");
  ASSERT_TRUE(lengths.ok());
  EXPECT_THAT(*lengths, ::testing::ElementsAre(12, 7));
  absl::StatusOr<std::vector<int64_t>> bad = ParseLengths("5\nabc\n", "t.txt");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("t.txt:2: 'abc'"));
  EXPECT_FALSE(ParseLengths("0\n", "t.txt").ok());
  EXPECT_FALSE(ParseLengths("-4\n", "t.txt").ok());
}

TEST(DatasetGeneratorTest, WritesAReadableDatasetWithTokensInVocabulary) {
  testing::ScopedTempDir dir;
  const std::vector<int64_t> lengths = {5, 1, 300};
  GeneratedDatasetOptions options;
  options.vocab_size = 50;
  options.dtype = DType::kUint8;
  ASSERT_TRUE(WriteGeneratedDataset(dir.Prefix("g"), lengths, options).ok());
  absl::StatusOr<IndexedDataset> dataset = IndexedDataset::Open(dir.Prefix("g"));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_documents(), 3u);
  std::vector<int64_t> tokens(306);
  ASSERT_TRUE(dataset->ReadSequences(0, 3, absl::MakeSpan(tokens)).ok());
  EXPECT_THAT(tokens, ::testing::Each(::testing::AllOf(::testing::Ge(0), ::testing::Lt(50))));
  options.vocab_size = 300;
  EXPECT_THAT(WriteGeneratedDataset(dir.Prefix("h"), lengths, options).message(),
              HasSubstr("does not fit dtype uint8"));
}

}  // namespace
}  // namespace packfeed::dataset
