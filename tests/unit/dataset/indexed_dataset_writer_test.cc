#include "packfeed/dataset/indexed_dataset_writer.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "test_paths.h"

namespace packfeed::dataset {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kUint8, DType::kInt8,    DType::kInt16,   DType::kInt32,
                                DType::kInt64, DType::kFloat64, DType::kFloat32, DType::kUint16};

// Values spanning the dtype's range, ends included.
std::vector<int64_t> SampleValues(DType dtype, size_t count) {
  const int64_t lo = DTypeMinValue(dtype);
  const int64_t hi = DTypeMaxValue(dtype);
  std::vector<int64_t> values = {lo, hi, 0};
  for (size_t i = 0; values.size() < count; ++i) {
    values.push_back(lo / 3 + static_cast<int64_t>(i * 7919) % (hi / 2 + 1));
  }
  values.resize(count);
  return values;
}

TEST(IndexedDatasetWriterTest, RoundTripsEveryDType) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    testing::ScopedTempDir dir;
    const std::string prefix = dir.Prefix("rt");
    const std::vector<int64_t> a = SampleValues(dtype, 5);
    const std::vector<int64_t> b = SampleValues(dtype, 300);
    {
      absl::StatusOr<IndexedDatasetWriter> writer = IndexedDatasetWriter::Create(prefix, dtype);
      ASSERT_TRUE(writer.ok()) << writer.status();
      ASSERT_TRUE(writer->AddSequence(a).ok());
      ASSERT_TRUE(writer->AddSequence({}).ok());  // empty sequences are legal
      writer->EndDocument();
      ASSERT_TRUE(writer->AddDocument(b, {100, 200}).ok());
      ASSERT_TRUE(writer->Finish().ok());
    }
    absl::StatusOr<IndexedDataset> dataset = IndexedDataset::Open(prefix);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ(dataset->dtype(), dtype);
    EXPECT_EQ(dataset->num_sequences(), 4u);
    EXPECT_EQ(dataset->num_documents(), 2u);
    EXPECT_EQ(dataset->index().document_index(1), 2);
    std::vector<int64_t> read(5);
    ASSERT_TRUE(dataset->Read(0, absl::MakeSpan(read)).ok());
    EXPECT_EQ(read, a);
    std::vector<int64_t> all(300);
    ASSERT_TRUE(dataset->ReadSequences(2, 2, absl::MakeSpan(all)).ok());
    EXPECT_EQ(all, b);
  }
}

TEST(IndexedDatasetWriterTest, WritesModesWhenMultimodal) {
  testing::ScopedTempDir dir;
  const std::string prefix = dir.Prefix("mm");
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(prefix, DType::kInt32, true);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->AddSequence(std::vector<int64_t>{1, 2}, 0).ok());
  ASSERT_TRUE(writer->AddSequence(std::vector<int64_t>{3}, 1).ok());
  ASSERT_TRUE(writer->Finish().ok());  // closes the open document
  absl::StatusOr<IndexedDataset> dataset = IndexedDataset::Open(prefix);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_TRUE(dataset->index().multimodal());
  EXPECT_EQ(dataset->index().mode(1), 1);
  EXPECT_EQ(dataset->num_documents(), 1u);
}

TEST(IndexedDatasetWriterTest, RejectsTokensOutsideTheDType) {
  testing::ScopedTempDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir.Prefix("w"), DType::kUint16);
  ASSERT_TRUE(writer.ok());
  absl::Status status = writer->AddSequence(std::vector<int64_t>{5, 65536});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("token 1 = 65536 does not fit dtype uint16"));
  EXPECT_EQ(writer->num_sequences(), 0u);
  EXPECT_EQ(writer->AddSequence(std::vector<int64_t>{-1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer->AddDocument(std::vector<int64_t>{1, 2}, {1}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IndexedDatasetWriterTest, UnfinishedWriteLeavesNoDataset) {
  testing::ScopedTempDir dir;
  const std::string prefix = dir.Prefix("partial");
  {
    absl::StatusOr<IndexedDatasetWriter> writer =
        IndexedDatasetWriter::Create(prefix, DType::kUint8);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->AddSequence(std::vector<int64_t>{1}).ok());
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_EQ(IndexedDataset::Open(prefix).status().code(), absl::StatusCode::kNotFound);
}

TEST(IndexedDatasetWriterTest, FinishTwiceIsFailedPrecondition) {
  testing::ScopedTempDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir.Prefix("twice"), DType::kUint8);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(writer->Finish().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(IndexedDatasetWriterTest, UnwritableDirectoryIsAnError) {
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create("/nonexistent-dir/x", DType::kUint8);
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(writer.status().message(), HasSubstr("/nonexistent-dir/x.bin"));
}

}  // namespace
}  // namespace packfeed::dataset
