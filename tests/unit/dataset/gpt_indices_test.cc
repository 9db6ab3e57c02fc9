#include "packfeed/dataset/gpt_indices.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::dataset {
namespace {

std::vector<int32_t> Lengths(int n, int32_t base) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(base + (i * 37) % 50);
  return out;
}

int64_t Total(const std::vector<SampleRun>& runs) {
  int64_t n = 0;
  for (const SampleRun& r : runs) n += r.length;
  return n;
}

TEST(GptIndicesTest, SamplesRunAcrossSequencesAndShareOneTokenWithTheNext) {
  const std::vector<int32_t> lengths = Lengths(40, 10);
  GptIndexOptions options{.sequence_length = 64, .random_seed = 5};
  auto built = BuildGptIndices(lengths, 0, 40, std::nullopt, options);
  ASSERT_TRUE(built.ok()) << built.status();
  const GptIndices& g = *built;
  EXPECT_EQ(g.num_epochs, 1);
  EXPECT_EQ(g.tokens_per_epoch, std::accumulate(lengths.begin(), lengths.end(), int64_t{0}));
  EXPECT_EQ(g.num_samples(), (g.tokens_per_epoch - 1) / 64);
  std::vector<int64_t> order(g.shuffle_index);
  std::sort(order.begin(), order.end());
  for (int64_t i = 0; i < g.num_samples(); ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  // In unshuffled order, sample j's last token is sample j+1's first.
  for (int64_t i = 0; i < g.num_samples(); ++i) {
    const auto runs = RunsOfSample(g, lengths, options, i);
    EXPECT_EQ(Total(runs), 65) << "sample " << i;
    for (const SampleRun& r : runs) {
      EXPECT_GE(r.offset, 0);
      EXPECT_LE(r.offset + r.length, lengths[static_cast<size_t>(r.sequence)]);
    }
  }
  for (size_t j = 0; j + 1 < g.sample_index.size(); ++j) {
    const SampleStart a = g.sample_index[j];
    const SampleStart b = g.sample_index[j + 1];
    EXPECT_TRUE(b.document_position > a.document_position ||
                (b.document_position == a.document_position && b.offset > a.offset));
  }
}

TEST(GptIndicesTest, MoreSamplesThanOnePassTakeMoreEpochsAndSeparateASmallFinalOne) {
  const std::vector<int32_t> lengths = Lengths(30, 20);
  GptIndexOptions options{.sequence_length = 32, .random_seed = 1};
  auto one = BuildGptIndices(lengths, 0, 30, std::nullopt, options);
  ASSERT_TRUE(one.ok());
  const int64_t per_epoch = one->num_samples();
  // Just over two passes: the third is barely used and shuffled apart.
  auto three = BuildGptIndices(lengths, 0, 30, 2 * per_epoch + 2, options);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->num_epochs, 3);
  EXPECT_TRUE(three->separate_final_epoch);
  EXPECT_EQ(three->document_index.size(), 90u);
  // The final pass holds each sequence once.
  std::vector<int32_t> last(three->document_index.begin() + 60, three->document_index.end());
  std::sort(last.begin(), last.end());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(last[static_cast<size_t>(i)], i);
  // Nearly three full passes: shuffled together.
  auto full = BuildGptIndices(lengths, 0, 30, 3 * per_epoch - 1, options);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->num_epochs, 3);
  EXPECT_FALSE(full->separate_final_epoch);
}

TEST(GptIndicesTest, KeepsAPartialLastSampleOnlyWhenAsked) {
  const std::vector<int32_t> lengths = Lengths(7, 10);
  GptIndexOptions options{.sequence_length = 16, .random_seed = 3};
  auto dropped = BuildGptIndices(lengths, 0, 7, std::nullopt, options);
  options.drop_last_partial = false;
  auto kept = BuildGptIndices(lengths, 0, 7, std::nullopt, options);
  ASSERT_TRUE(dropped.ok() && kept.ok());
  const int64_t tokens = dropped->tokens_per_epoch;
  ASSERT_NE((tokens - 1) % 16, 0) << "the test needs a remainder";
  EXPECT_EQ(kept->num_samples(), dropped->num_samples() + 1);
  int64_t shortest = 1 << 30;
  for (int64_t i = 0; i < kept->num_samples(); ++i) {
    shortest = std::min(shortest, Total(RunsOfSample(*kept, lengths, options, i)));
  }
  EXPECT_LT(shortest, 17);
}

TEST(GptIndicesTest, SameSeedSameIndicesOtherSeedOthers) {
  const std::vector<int32_t> lengths = Lengths(50, 5);
  GptIndexOptions options{.sequence_length = 20, .random_seed = 9};
  auto a = BuildGptIndices(lengths, 10, 50, 100, options);
  auto b = BuildGptIndices(lengths, 10, 50, 100, options);
  options.random_seed = 10;
  auto c = BuildGptIndices(lengths, 10, 50, 100, options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->document_index, b->document_index);
  EXPECT_EQ(a->shuffle_index, b->shuffle_index);
  EXPECT_NE(a->document_index, c->document_index);
  EXPECT_GE(*std::min_element(a->document_index.begin(), a->document_index.end()), 10);
}

TEST(GptIndicesTest, CheckRefusesIndicesThatDoNotFitTheDataset) {
  const std::vector<int32_t> lengths = Lengths(30, 10);
  GptIndexOptions options{.sequence_length = 16, .random_seed = 2};
  auto built = BuildGptIndices(lengths, 5, 30, 100, options);
  ASSERT_TRUE(built.ok());
  EXPECT_TRUE(CheckGptIndices(*built, lengths, 5, 30, options).ok());
  GptIndices outside = *built;
  outside.document_index[3] = 2;
  EXPECT_THAT(CheckGptIndices(outside, lengths, 5, 30, options).message(),
              testing::HasSubstr("document index entry 3"));
  GptIndices past = *built;
  past.sample_index.back().offset = 1000;
  EXPECT_THAT(CheckGptIndices(past, lengths, 5, 30, options).message(),
              testing::HasSubstr("outside its sequence"));
  GptIndices unordered = *built;
  std::swap(unordered.sample_index[1], unordered.sample_index[2]);
  EXPECT_FALSE(CheckGptIndices(unordered, lengths, 5, 30, options).ok());
  GptIndices twice = *built;
  twice.shuffle_index[0] = twice.shuffle_index[1];
  EXPECT_THAT(CheckGptIndices(twice, lengths, 5, 30, options).message(),
              testing::HasSubstr("not a permutation"));
  GptIndices short_shuffle = *built;
  short_shuffle.shuffle_index.pop_back();
  EXPECT_FALSE(CheckGptIndices(short_shuffle, lengths, 5, 30, options).ok());
}

TEST(GptIndicesTest, RefusesWhatCannotMakeASample) {
  const std::vector<int32_t> lengths = {3, 4, 5};
  GptIndexOptions options{.sequence_length = 12};
  EXPECT_THAT(BuildGptIndices(lengths, 0, 3, std::nullopt, options).status().message(),
              testing::HasSubstr("fewer than one sample"));
  options.sequence_length = 4;
  EXPECT_FALSE(BuildGptIndices(lengths, 2, 2, std::nullopt, options).ok());
  EXPECT_FALSE(BuildGptIndices(lengths, 0, 4, std::nullopt, options).ok());
  EXPECT_FALSE(BuildGptIndices(lengths, 0, 3, -1, options).ok());
  // With a count, a small split is repeated over as many epochs as needed.
  options.sequence_length = 12;
  auto repeated = BuildGptIndices(lengths, 0, 1, 10, options);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(repeated->num_epochs, 41);
  options.sequence_length = 1;
  EXPECT_FALSE(BuildGptIndices(lengths, 0, 3, std::nullopt, options).ok());
}

}  // namespace
}  // namespace packfeed::dataset
