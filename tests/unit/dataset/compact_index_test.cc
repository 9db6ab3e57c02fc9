#include "packfeed/dataset/compact_index.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index_test_util.h"

namespace packfeed::dataset {
namespace {

using ::testing::HasSubstr;

IndexView ParseOrDie(const std::string& bytes, IndexValidation validation) {
  absl::StatusOr<IndexView> view =
      ParseIndex(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                 "x.idx", validation);
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

// Every entry of `compact` is the parsed view's.
void ExpectSameEntries(const IndexView& parsed, const IndexView& compact) {
  ASSERT_EQ(compact.num_sequences(), parsed.num_sequences());
  ASSERT_EQ(compact.num_documents(), parsed.num_documents());
  EXPECT_EQ(compact.dtype(), parsed.dtype());
  EXPECT_EQ(compact.multimodal(), parsed.multimodal());
  EXPECT_EQ(compact.total_tokens(), parsed.total_tokens());
  EXPECT_EQ(compact.data_bytes(), parsed.data_bytes());
  for (uint64_t i = 0; i < parsed.num_sequences(); ++i) {
    EXPECT_EQ(compact.length(i), parsed.length(i)) << i;
    EXPECT_EQ(compact.pointer(i), parsed.pointer(i)) << i;
    EXPECT_EQ(compact.mode(i), parsed.mode(i)) << i;
  }
  for (uint64_t d = 0; d <= parsed.num_documents(); ++d) {
    EXPECT_EQ(compact.document_index(d), parsed.document_index(d)) << d;
  }
}

// Lengths 0, 1, ..., n-1 (varied, some empty), one sequence per document.
RawIndex OneSequencePerDocument(DType dtype, int n) {
  std::vector<int32_t> lengths(n);
  std::vector<int64_t> documents(n + 1);
  for (int i = 0; i < n; ++i) lengths[i] = (i * 37) % 101;
  for (int d = 0; d <= n; ++d) documents[d] = d;
  return RawIndex::Contiguous(dtype, lengths, documents);
}

TEST(CompactIndexTest, AMegatronIndexKeepsItsLengthsAndLittleElse) {
  // 1000 sequences: more than one stride of derived pointers, and a last
  // stride that is not full.
  const std::string bytes = OneSequencePerDocument(DType::kUint16, 1000).Serialize();
  const IndexView parsed = ParseOrDie(bytes, IndexValidation::kFull);
  const CompactIndex compact = CompactIndex::From(parsed);
  ExpectSameEntries(parsed, compact.view());
  EXPECT_EQ(compact.lengths().size(), 1000u);
  EXPECT_EQ(compact.lengths()[999], parsed.length(999));
  // 4 bytes per length and one pointer in 64: against 20 per sequence in the file.
  EXPECT_LT(compact.bytes(), 1000u * 4 + 1000u / 64 * 8 + 64);
}

TEST(CompactIndexTest, ViewsOutliveAMove) {
  const std::string bytes = OneSequencePerDocument(DType::kInt32, 200).Serialize();
  const IndexView parsed = ParseOrDie(bytes, IndexValidation::kFull);
  CompactIndex first = CompactIndex::From(parsed);
  const CompactIndex moved = std::move(first);
  ExpectSameEntries(parsed, moved.view());
}

TEST(CompactIndexTest, DocumentsOfSeveralSequencesAndModesAreKept) {
  RawIndex raw = RawIndex::Contiguous(DType::kUint8, {3, 0, 5, 2, 7}, {0, 2, 2, 5});
  raw.modes = {0, 1, 2, 3, 4};
  const std::string bytes = raw.Serialize();
  const IndexView parsed = ParseOrDie(bytes, IndexValidation::kFull);
  ASSERT_TRUE(parsed.multimodal());
  ExpectSameEntries(parsed, CompactIndex::From(parsed).view());
}

TEST(CompactIndexTest, PointersThatAreNotRunningEndsAreKeptForCheckDocument) {
  // kOnUse opens an index whose sequence 2 starts off its predecessor's end;
  // the compact view must still answer that pointer, so that the document
  // using it is refused when it is used.
  RawIndex raw = RawIndex::Contiguous(DType::kUint16, {4, 4, 4, 4, 4}, {0, 2, 4, 5});
  raw.pointers[2] += 2;
  const std::string bytes = raw.Serialize();
  const IndexView parsed = ParseOrDie(bytes, IndexValidation::kOnUse);
  const CompactIndex compact = CompactIndex::From(parsed);
  ExpectSameEntries(parsed, compact.view());
  EXPECT_TRUE(CheckDocument(compact.view(), 0, "x.idx").ok());
  EXPECT_THAT(CheckDocument(compact.view(), 1, "x.idx").message(),
              HasSubstr("sequence 2 starts at byte 18"));
}

TEST(CompactIndexTest, AnEmptyIndexHoldsNothing) {
  const std::string bytes = RawIndex::Contiguous(DType::kUint16, {}, {0}).Serialize();
  const IndexView parsed = ParseOrDie(bytes, IndexValidation::kFull);
  const CompactIndex compact = CompactIndex::From(parsed);
  ExpectSameEntries(parsed, compact.view());
  EXPECT_TRUE(compact.lengths().empty());
}

}  // namespace
}  // namespace packfeed::dataset
