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

absl::StatusOr<IndexView> ParseOnUse(const std::string& bytes) {
  return ParseIndex(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "x.idx",
      IndexValidation::kOnUse);
}

TEST(IndexFormatTest, OnUseAgreesWithFullOnAValidIndex) {
  const std::string bytes =
      RawIndex::Contiguous(DType::kInt32, {3, 0, 5, 2}, {0, 2, 2, 4}).Serialize();
  absl::StatusOr<IndexView> full = Parse(bytes);
  absl::StatusOr<IndexView> lazy = ParseOnUse(bytes);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  EXPECT_EQ(lazy->data_bytes(), full->data_bytes());
  EXPECT_EQ(lazy->total_tokens(), full->total_tokens());
  for (uint64_t d = 0; d < lazy->num_documents(); ++d) {
    EXPECT_TRUE(CheckDocument(*lazy, d, "x.idx").ok()) << d;
  }
  EXPECT_TRUE(absl::IsOutOfRange(CheckDocument(*lazy, 3, "x.idx")));
}

TEST(IndexFormatTest, OnUseFindsAMiddleCorruptionWhenItsDocumentIsUsed) {
  // Sequence 2's pointer is off: kFull refuses the file; kOnUse opens it and
  // refuses document 1 (sequences 2..3) only, naming the sequence.
  RawIndex raw = RawIndex::Contiguous(DType::kUint16, {4, 4, 4, 4, 4}, {0, 2, 4, 5});
  raw.pointers[2] += 2;
  const std::string bytes = raw.Serialize();
  EXPECT_TRUE(absl::IsDataLoss(Parse(bytes).status()));
  absl::StatusOr<IndexView> lazy = ParseOnUse(bytes);
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  EXPECT_TRUE(CheckDocument(*lazy, 0, "x.idx").ok());
  const absl::Status bad = CheckDocument(*lazy, 1, "x.idx");
  EXPECT_TRUE(absl::IsDataLoss(bad));
  EXPECT_THAT(bad.message(), HasSubstr("sequence 2 starts at byte 18"));
  // Document 2 starts at sequence 4, whose predecessor is sequence 3: it is
  // consistent with its neighbour, so it is served.
  EXPECT_TRUE(CheckDocument(*lazy, 2, "x.idx").ok());
}

TEST(IndexFormatTest, OnUseRefusesBadDocumentEntriesAndNegativeLengths) {
  RawIndex decreasing = RawIndex::Contiguous(DType::kUint8, {1, 1, 1}, {0, 2, 1, 3});
  const std::string decreasing_bytes = decreasing.Serialize();
  absl::StatusOr<IndexView> view = ParseOnUse(decreasing_bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_THAT(CheckDocument(*view, 1, "x.idx").message(), HasSubstr("spans sequences [2, 1)"));

  RawIndex negative = RawIndex::Contiguous(DType::kUint8, {1, 1, 1}, {0, 1, 2, 3});
  negative.lengths[1] = -1;
  const std::string negative_bytes = negative.Serialize();
  view = ParseOnUse(negative_bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_THAT(CheckDocument(*view, 1, "x.idx").message(), HasSubstr("negative length -1"));

  // The ends are checked at open.
  RawIndex wrong_end = RawIndex::Contiguous(DType::kUint8, {1, 1}, {0, 1, 1});
  const std::string wrong_end_bytes = wrong_end.Serialize();
  EXPECT_THAT(ParseOnUse(wrong_end_bytes).status().message(), HasSubstr("runs from 0 to 1"));
}

uint64_t DigestOf(const std::string& bytes) {
  return IndexDigest({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

TEST(IndexDigestTest, IsFixedForFixedBytes) {
  // Job fingerprints hold it (journals, checkpoints): a change of it would
  // refuse every resume. Values made by this code.
  EXPECT_EQ(DigestOf(""), 0x2d06800538d394c2u);
  EXPECT_EQ(DigestOf(RawIndex::Contiguous(DType::kInt32, {3, 0, 5}, {0, 2, 3}).Serialize()),
            0xca44f458b8f9b6d1u);
}

TEST(IndexDigestTest, ALargeIndexIsSampled) {
  // Past 4 MiB: the size and 64 blocks of 64 KiB spread over the file.
  std::string bytes(std::size_t{8} << 20, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4099) bytes[i] = static_cast<char>(i % 251);
  const uint64_t digest = DigestOf(bytes);
  std::string in_a_block = bytes;
  in_a_block[10] ^= 1;  // the first block starts at 0
  EXPECT_NE(DigestOf(in_a_block), digest);
  std::string between_blocks = bytes;
  between_blocks[(64 << 10) + 10] ^= 1;  // the second block starts near 130 KiB
  EXPECT_EQ(DigestOf(between_blocks), digest);
  EXPECT_NE(DigestOf(bytes + '\0'), digest);
}

}  // namespace
}  // namespace packfeed::dataset
