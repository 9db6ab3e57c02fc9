#include "packfeed/dataset/megatron_cache.h"

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "test_paths.h"

namespace packfeed::dataset {
namespace {

GptCacheKey Key(const std::string& path, MegatronSplit split) {
  return {path, int64_t{100}, split, 1234, 4096, "969,30,1"};
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(MegatronCacheTest, DescriptionsAreFoundBySplitAndTextWithoutTheTokenizer) {
  packfeed::testing::ScopedTempDir dir;
  const std::string root = dir.path().string();
  const std::string tokenizer = "{\n        \"class\": \"T\"\n    }\n}";
  Write(root + "/aaa-GPTDataset-train-description.txt",
        GptDescriptionPrefix(Key("/d/one", MegatronSplit::kTrain)) + tokenizer);
  Write(root + "/bbb-GPTDataset-train-description.txt",
        GptDescriptionPrefix(Key("/d/two", MegatronSplit::kTrain)) + tokenizer);
  Write(root + "/ccc-GPTDataset-valid-description.txt",
        GptDescriptionPrefix(Key("/d/two", MegatronSplit::kValid)) + tokenizer);
  Write(root + "/ddd-GPTDataset-train-document_index.npy", "not a description");

  const MegatronCacheDescriptions cache = MegatronCacheDescriptions::Read(root);
  EXPECT_EQ(
      cache.Find(MegatronSplit::kTrain, GptDescriptionPrefix(Key("/d/two", MegatronSplit::kTrain))),
      root + "/bbb-GPTDataset-train-");
  EXPECT_EQ(
      cache.Find(MegatronSplit::kValid, GptDescriptionPrefix(Key("/d/two", MegatronSplit::kValid))),
      root + "/ccc-GPTDataset-valid-");
  // Another split's file, or another sample count, is not it.
  EXPECT_EQ(
      cache.Find(MegatronSplit::kTest, GptDescriptionPrefix(Key("/d/two", MegatronSplit::kValid))),
      std::nullopt);
  GptCacheKey more = Key("/d/one", MegatronSplit::kTrain);
  more.num_samples = 101;
  EXPECT_EQ(cache.Find(MegatronSplit::kTrain, GptDescriptionPrefix(more)), std::nullopt);
}

TEST(MegatronCacheTest, AMissingDirectoryHoldsNoDescription) {
  const MegatronCacheDescriptions cache = MegatronCacheDescriptions::Read("/nonexistent/cache");
  EXPECT_EQ(
      cache.Find(MegatronSplit::kTrain, GptDescriptionPrefix(Key("/d/one", MegatronSplit::kTrain))),
      std::nullopt);
}

}  // namespace
}  // namespace packfeed::dataset
