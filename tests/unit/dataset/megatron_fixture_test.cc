// Checks the reader and writer against files written by Megatron-LM's own
// IndexedDatasetBuilder (tests/fixtures/megatron).

#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/dataset/indexed_dataset_writer.h"
#include "test_paths.h"

namespace packfeed::server {
namespace {

using nlohmann::json;

class MegatronFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = ::packfeed::testing::FixturesDir() / "megatron";
    std::ifstream in(dir_ / "megatron_written_expected.json");
    ASSERT_TRUE(in) << dir_ << "/megatron_written_expected.json is missing";
    expected_ = json::parse(in)["datasets"][GetParam()];
    prefix_ = (dir_ / expected_["prefix"].get<std::string>()).string();
  }

  std::filesystem::path dir_;
  json expected_;
  std::string prefix_;
};

TEST_P(MegatronFixtureTest, HeaderAndSizes) {
  absl::StatusOr<dataset::IndexedDataset> dataset = dataset::IndexedDataset::Open(prefix_);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const json& header = expected_["header"];
  EXPECT_EQ(static_cast<int>(dataset->dtype()), header["dtype_code"]);
  EXPECT_EQ(dataset->num_sequences(), header["sequence_count"]);
  EXPECT_EQ(dataset->num_documents() + 1, header["document_count_field"]);
  EXPECT_EQ(dataset::DTypeSize(dataset->dtype()), expected_["itemsize"]);
  EXPECT_EQ(std::string(dataset::DTypeName(dataset->dtype())),
            expected_["numpy_dtype"].get<std::string>());
  EXPECT_FALSE(dataset->index().multimodal());
  EXPECT_EQ(dataset->idx_bytes(), expected_["idx_bytes"]);
  EXPECT_EQ(dataset->bin_bytes(), expected_["bin_bytes"]);
  EXPECT_EQ(dataset->num_sequences(), expected_["num_sequences"]);
  EXPECT_EQ(dataset->num_documents(), expected_["num_documents"]);
  EXPECT_EQ(dataset->total_tokens(), expected_["total_tokens"]);
  // The version lives only in the raw header.
  const std::string idx = testing::ReadFileBytes(prefix_ + ".idx");
  uint64_t version;
  std::memcpy(&version, idx.data() + 9, 8);
  EXPECT_EQ(version, header["version"]);
}

TEST_P(MegatronFixtureTest, EveryLengthAndDocumentIndex) {
  absl::StatusOr<dataset::IndexedDataset> dataset = dataset::IndexedDataset::Open(prefix_);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const auto lengths = expected_["sequence_lengths"].get<std::vector<int>>();
  ASSERT_EQ(lengths.size(), dataset->num_sequences());
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_EQ(dataset->sequence_length(i), lengths[i]) << "sequence " << i;
  }
  const auto docs = expected_["document_indices"].get<std::vector<int64_t>>();
  ASSERT_EQ(docs.size(), dataset->num_documents() + 1);
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ(dataset->index().document_index(d), docs[d]) << "entry " << d;
  }
}

TEST_P(MegatronFixtureTest, TokenSumAndProbes) {
  absl::StatusOr<dataset::IndexedDataset> dataset = dataset::IndexedDataset::Open(prefix_);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> all(dataset->total_tokens());
  ASSERT_TRUE(dataset->ReadSequences(0, dataset->num_sequences(), absl::MakeSpan(all)).ok());
  EXPECT_EQ(std::accumulate(all.begin(), all.end(), int64_t{0}),
            expected_["token_sum_all"].get<int64_t>());
  EXPECT_EQ(dataset->bytes_read(), expected_["bin_bytes"].get<uint64_t>());

  const json& probes = expected_["probe_sequences"];
  ASSERT_EQ(probes.size(), 13u);
  for (const auto& [key, probe] : probes.items()) {
    SCOPED_TRACE("probe sequence " + key);
    const uint64_t i = std::stoull(key);
    ASSERT_EQ(dataset->sequence_length(i), probe["length"]);
    EXPECT_EQ(dataset->index().pointer(i), probe["byte_offset_in_bin"]);
    std::vector<int64_t> tokens(probe["length"].get<size_t>());
    ASSERT_TRUE(dataset->Read(i, absl::MakeSpan(tokens)).ok());
    EXPECT_EQ(std::accumulate(tokens.begin(), tokens.end(), int64_t{0}),
              probe["sum"].get<int64_t>());
    const auto first5 = probe["first5"].get<std::vector<int64_t>>();
    const auto last5 = probe["last5"].get<std::vector<int64_t>>();
    EXPECT_EQ(std::vector<int64_t>(tokens.begin(), tokens.begin() + 5), first5);
    EXPECT_EQ(std::vector<int64_t>(tokens.end() - 5, tokens.end()), last5);
    // The mapped path returns the same tokens.
    dataset::IndexedDatasetOptions mapped_options;
    mapped_options.map_data = true;
    absl::StatusOr<dataset::IndexedDataset> mapped =
        dataset::IndexedDataset::Open(prefix_, mapped_options);
    ASSERT_TRUE(mapped.ok());
    std::vector<int64_t> via_map(tokens.size());
    ASSERT_TRUE(mapped->ReadMapped(i, absl::MakeSpan(via_map)).ok());
    EXPECT_EQ(via_map, tokens);
  }
  for (const auto& [key, probe] : expected_["probe_documents"].items()) {
    SCOPED_TRACE("probe document " + key);
    const uint64_t d = std::stoull(key);
    const int64_t first = dataset->index().document_index(d);
    const int64_t end = dataset->index().document_index(d + 1);
    EXPECT_EQ(first, probe["first_sequence"]);
    EXPECT_EQ(end, probe["end_sequence_exclusive"]);
    int64_t sum = 0;
    for (int64_t s = first; s < end; ++s) {
      std::vector<int64_t> tokens(dataset->sequence_length(s));
      ASSERT_TRUE(dataset->Read(s, absl::MakeSpan(tokens)).ok());
      sum = std::accumulate(tokens.begin(), tokens.end(), sum);
    }
    EXPECT_EQ(sum, probe["token_sum"].get<int64_t>());
  }
}

TEST_P(MegatronFixtureTest, WriterIsByteIdenticalToMegatron) {
  absl::StatusOr<dataset::IndexedDataset> dataset = dataset::IndexedDataset::Open(prefix_);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  testing::ScopedTempDir dir;
  const std::string ours = dir.Prefix("ours");
  absl::StatusOr<dataset::IndexedDatasetWriter> writer =
      dataset::IndexedDatasetWriter::Create(ours, dataset->dtype());
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (uint64_t d = 0; d < dataset->num_documents(); ++d) {
    const int64_t first = dataset->index().document_index(d);
    const int64_t end = dataset->index().document_index(d + 1);
    std::vector<int64_t> tokens;
    std::vector<int32_t> lengths;
    for (int64_t s = first; s < end; ++s) {
      const int32_t length = dataset->sequence_length(s);
      const size_t at = tokens.size();
      tokens.resize(at + length);
      ASSERT_TRUE(dataset->Read(s, absl::MakeSpan(tokens).subspan(at, length)).ok());
      lengths.push_back(length);
    }
    ASSERT_TRUE(writer->AddDocument(tokens, lengths).ok());
  }
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_TRUE(testing::ReadFileBytes(ours + ".idx") == testing::ReadFileBytes(prefix_ + ".idx"))
      << ".idx differs from Megatron's";
  EXPECT_TRUE(testing::ReadFileBytes(ours + ".bin") == testing::ReadFileBytes(prefix_ + ".bin"))
      << ".bin differs from Megatron's";
}

INSTANTIATE_TEST_SUITE_P(BothFiles, MegatronFixtureTest, ::testing::Values("int32", "uint16"));

}  // namespace
}  // namespace packfeed::server
