#include "packfeed/scheduler/sampler.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/scheduler/permutation.h"

namespace packfeed::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PermutationTest, IsABijectionForAnySize) {
  for (uint64_t n : {1, 2, 3, 5, 16, 17, 1000, 4097, 65536}) {
    const Permutation permutation(n, 42);
    std::vector<char> hit(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t image = permutation(i);
      ASSERT_LT(image, n);
      ASSERT_FALSE(hit[image]) << "n " << n << " image " << image << " twice";
      hit[image] = 1;
    }
  }
}

TEST(PermutationTest, SeedsGiveDifferentOrders) {
  const Permutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  EXPECT_LT(same, 20);
  // Not the identity either.
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += a(i) == i;
  EXPECT_LT(fixed, 20);
}

TEST(PermutationTest, ValuesAreFixedAcrossBuildsAndMachines) {
  // Pinned: a change here reshuffles every job's data order.
  const Permutation permutation(1000, 1234);
  EXPECT_THAT(
      std::vector<uint64_t>({permutation(0), permutation(1), permutation(2), permutation(999)}),
      ElementsAre(40, 580, 571, 737));
}

Sampler Make(std::vector<SamplerDataset> datasets, int64_t global_batch, bool shuffle = true,
             uint64_t seed = 7) {
  absl::StatusOr<Sampler> sampler =
      Sampler::Create({std::move(datasets), global_batch, seed, shuffle});
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

TEST(SamplerTest, ShuffledEpochVisitsEverySampleOnce) {
  const Sampler sampler = Make({{1000, 1.0}}, 100);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int64_t> seen;
    for (int64_t step = epoch * 10; step < epoch * 10 + 10; ++step) {
      for (const SampleRef& ref : sampler.GlobalBatch(step)) {
        EXPECT_EQ(ref.epoch, epoch);
        seen.insert(ref.index);
      }
    }
    ASSERT_EQ(seen.size(), 1000u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 1000u);
  }
  EXPECT_EQ(sampler.EpochAt(0, 25), 2);
  // Epochs are shuffled differently.
  EXPECT_NE(sampler.GlobalBatch(0), sampler.GlobalBatch(10));
}

TEST(SamplerTest, AnyStepIsComputedDirectlyAndAgain) {
  const Sampler a = Make({{1'000'000'000, 1.0}}, 256);
  const Sampler b = Make({{1'000'000'000, 1.0}}, 256);
  // A step deep into training costs what step 0 costs, and a fresh sampler
  // (a restarted daemon, another node) agrees.
  EXPECT_EQ(a.GlobalBatch(3'000'000), b.GlobalBatch(3'000'000));
  EXPECT_EQ(a.GlobalBatch(5), a.GlobalBatch(5));
  EXPECT_NE(a.GlobalBatch(5), a.GlobalBatch(6));
}

TEST(SamplerTest, SequentialIsMegatronsOrder) {
  const Sampler sampler = Make({{10, 1.0}}, 4, /*shuffle=*/false);
  std::vector<int64_t> indices;
  for (const SampleRef& ref : sampler.GlobalBatch(2)) {
    indices.push_back(ref.index);
  }
  // Step 2 covers positions 8, 9, then wraps into epoch 1 at 0, 1.
  EXPECT_THAT(indices, ElementsAre(8, 9, 0, 1));
  EXPECT_EQ(sampler.GlobalBatch(2)[2].epoch, 1);
}

TEST(SamplerTest, BlendGivesEveryBatchTheWeightsMix) {
  const Sampler sampler = Make({{5000, 0.7}, {3000, 0.2}, {700, 0.1}}, 256);
  // 179.2, 51.2, 25.6 → floors 179, 51, 25; the largest remainder (0.6)
  // takes the last sample.
  EXPECT_THAT(sampler.per_batch(), ElementsAre(179, 51, 26));
  for (int64_t step : {0, 1, 99}) {
    std::vector<int64_t> counts(3, 0);
    for (const SampleRef& ref : sampler.GlobalBatch(step)) {
      ++counts[ref.dataset];
    }
    EXPECT_THAT(counts, ElementsAre(179, 51, 26));
  }
  // The small dataset cycles through its epochs, each a full permutation.
  std::set<int64_t> first_epoch;
  for (int64_t step = 0; step * 26 < 700; ++step) {
    for (const SampleRef& ref : sampler.GlobalBatch(step)) {
      if (ref.dataset == 2 && ref.epoch == 0) first_epoch.insert(ref.index);
    }
  }
  EXPECT_EQ(first_epoch.size(), 700u);
  // Shuffled: the datasets are interleaved, not concatenated.
  const std::vector<SampleRef> batch = sampler.GlobalBatch(0);
  EXPECT_FALSE(
      std::is_sorted(batch.begin(), batch.end(),
                     [](const SampleRef& a, const SampleRef& b) { return a.dataset < b.dataset; }));
}

TEST(SamplerTest, BadOptionsAreRefused) {
  const auto error = [](SamplerOptions options) {
    return std::string(Sampler::Create(std::move(options)).status().message());
  };
  EXPECT_THAT(error({{}, 8, 0, true}), HasSubstr("no datasets"));
  EXPECT_THAT(error({{{10, 1.0}}, 0, 0, true}), HasSubstr("global batch"));
  EXPECT_THAT(error({{{0, 1.0}}, 8, 0, true}), HasSubstr("dataset 0 has no samples"));
  EXPECT_THAT(error({{{10, 1.0}, {10, 0.0}}, 8, 0, true}), HasSubstr("dataset 1 has weight 0"));
  EXPECT_THAT(error({{{10, -1.0}}, 8, 0, true}), HasSubstr("weights must be positive"));
  EXPECT_THAT(error({{{10, 1.0}, {10, 0.001}}, 8, 0, true}),
              HasSubstr("dataset 1 (weight 0.001 of 1.001) would get no sample"));
}

}  // namespace
}  // namespace packfeed::scheduler
