#include "packfeed/dataset/index_format.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index_test_util.h"

namespace packfeed::dataset {
namespace {

using ::testing::HasSubstr;

// The view points into `bytes`: keep them alive while it is used.
absl::StatusOr<IndexView> Parse(const std::string& bytes) {
  return ParseIndex(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "x.idx");
}

TEST(IndexFormatTest, ParsesEveryField) {
  RawIndex raw = RawIndex::Contiguous(DType::kInt32, {3, 0, 5}, {0, 2, 3});
  const std::string bytes = raw.Serialize();
  ASSERT_EQ(bytes.size(), 34u + 12 * 3 + 8 * 3);
  absl::StatusOr<IndexView> view = Parse(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->dtype(), DType::kInt32);
  EXPECT_EQ(view->num_sequences(), 3u);
  EXPECT_EQ(view->num_documents(), 2u);
  EXPECT_FALSE(view->multimodal());
  EXPECT_EQ(view->length(2), 5);
  EXPECT_EQ(view->pointer(1), 12);
  EXPECT_EQ(view->pointer(2), 12);
  EXPECT_EQ(view->document_index(1), 2);
  EXPECT_EQ(view->total_tokens(), 8u);
  EXPECT_EQ(view->data_bytes(), 32u);
}

TEST(IndexFormatTest, RecognisesMultimodalBySize) {
  RawIndex raw = RawIndex::Contiguous(DType::kUint8, {1, 2}, {0, 1, 2});
  raw.modes = {0, 3};
  const std::string bytes = raw.Serialize();  // the view points into it
  absl::StatusOr<IndexView> view = Parse(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->multimodal());
  EXPECT_EQ(view->mode(1), 3);
}

TEST(IndexFormatTest, EmptyDatasetIsValid) {
  const std::string bytes = RawIndex::Contiguous(DType::kUint16, {}, {0}).Serialize();
  absl::StatusOr<IndexView> view = Parse(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_sequences(), 0u);
  EXPECT_EQ(view->num_documents(), 0u);
}

TEST(IndexFormatTest, EmptyDocumentsAreAllowed) {
  // Megatron's end_document() may be called twice in a row.
  const std::string bytes = RawIndex::Contiguous(DType::kUint16, {4}, {0, 0, 1, 1}).Serialize();
  absl::StatusOr<IndexView> view = Parse(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_documents(), 3u);
}

TEST(IndexFormatTest, ExpectedSizeOverflowIsDataLoss) {
  absl::StatusOr<uint64_t> size = ExpectedIndexBytes(uint64_t{1} << 62, 1, false);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(size.status().message(), HasSubstr("overflows"));
  EXPECT_EQ(*ExpectedIndexBytes(2, 3, true), 34u + 26 + 24);
}

}  // namespace
}  // namespace packfeed::dataset
