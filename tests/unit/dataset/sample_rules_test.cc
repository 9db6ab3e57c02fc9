#include "packfeed/dataset/sample_rules.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index_test_util.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/dataset/indexed_dataset_writer.h"
#include "test_paths.h"

namespace packfeed::dataset {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

SampleRules Varlen() { return {SampleKind::kVarlen, 8, 99, 98, false}; }
SampleRules Sft() { return {SampleKind::kSft, 8, 99, 98, false}; }

TEST(SampleRulesTest, TruncatesWithEodForcedLast) {
  // varlen holds seq_length + 1 tokens; longer keeps seq_length − 1 and EOD.
  EXPECT_EQ(ShapeOfSample(9, Varlen()).run_length, 9);
  EXPECT_EQ(ShapeOfSample(10, Varlen()).read_tokens, 7);
  EXPECT_EQ(ShapeOfSample(10, Varlen()).run_length, 8);
  EXPECT_EQ(ShapeOfSample(9, Sft()).run_length, 8);
  std::vector<int64_t> stored = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_THAT(
      MakeTokenRun(absl::MakeSpan(stored).subspan(0, 7), ShapeOfSample(10, Varlen()), Varlen()),
      ElementsAre(1, 2, 3, 4, 5, 6, 7, 99));
  SampleRules append = Varlen();
  append.append_eod = true;
  EXPECT_THAT(MakeTokenRun(absl::MakeSpan(stored).subspan(0, 3), ShapeOfSample(3, append), append),
              ElementsAre(1, 2, 3, 99));
  EXPECT_THAT(
      MakeTokenRun(absl::MakeSpan(stored).subspan(0, 3), ShapeOfSample(3, Varlen()), Varlen()),
      ElementsAre(1, 2, 3));
  EXPECT_EQ(RealLength(4, Varlen()), 3);
  EXPECT_EQ(RealLength(4, Sft()), 4);
}

SampleRules Split() {
  SampleRules rules = Varlen();
  rules.append_eod = true;
  rules.split_long_documents = true;
  return rules;
}

// A document of 20 stored tokens + its EOD under seq_length 8: pieces of 8
// inputs each with the next token as their last label, so labels t1 … t20
// are each trained once.
TEST(SampleRulesTest, SplitsALongDocumentIntoPiecesThatTrainEveryLabelOnce) {
  EXPECT_EQ(PiecesOfDocument(20, Split()), 3);
  EXPECT_EQ(PiecesOfDocument(8, Split()), 1);  // 8 inputs + the EOD label
  EXPECT_EQ(PiecesOfDocument(9, Split()), 2);
  EXPECT_EQ(PiecesOfDocument(20, Varlen()), 1);  // truncated instead
  std::vector<int64_t> stored(20);
  for (int i = 0; i < 20; ++i) stored[static_cast<size_t>(i)] = i + 1;
  std::vector<int64_t> labels;
  for (int64_t first : {0, 8, 16}) {
    const SampleShape shape = ShapeOfSample(20, Split(), first);
    EXPECT_EQ(shape.first_token, first);
    const std::vector<int64_t> run =
        MakeTokenRun(absl::MakeSpan(stored).subspan(static_cast<size_t>(first),
                                                    static_cast<size_t>(shape.read_tokens)),
                     shape, Split());
    EXPECT_LE(RealLength(shape.run_length, Split()), 8);
    labels.insert(labels.end(), run.begin() + 1, run.end());
  }
  EXPECT_THAT(labels,
              ElementsAre(2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 99));
}

TEST(SampleRulesTest, SampleTableNumbersEveryPieceAfterItsDocument) {
  testing::ScopedTempDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir.Prefix("d"), DType::kInt32);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int64_t length : {3, 20, 4, 17}) {  // documents 1 and 3 are long
    ASSERT_TRUE(writer->AddSequence(std::vector<int64_t>(static_cast<size_t>(length), 1)).ok());
    writer->EndDocument();
  }
  ASSERT_TRUE(writer->Finish().ok());
  absl::StatusOr<IndexedDataset> data = IndexedDataset::Open(dir.Prefix("d"));
  ASSERT_TRUE(data.ok()) << data.status();
  const absl::StatusOr<SampleTable> built = SampleTable::Build(data->index(), Split(), "d.idx");
  ASSERT_TRUE(built.ok()) << built.status();
  const SampleTable& table = *built;
  EXPECT_EQ(table.num_samples(), 1 + 3 + 1 + 3);
  EXPECT_EQ(table.split_documents(), 2);
  std::vector<std::pair<int64_t, int64_t>> located;
  for (int64_t s = 0; s < table.num_samples(); ++s) {
    const SampleTable::Piece piece = table.Locate(s);
    located.emplace_back(piece.document, piece.first_token);
  }
  EXPECT_THAT(located,
              ElementsAre(std::pair{0, 0}, std::pair{1, 0}, std::pair{1, 8}, std::pair{1, 16},
                          std::pair{2, 0}, std::pair{3, 0}, std::pair{3, 8}, std::pair{3, 16}));
  EXPECT_EQ(SampleTable::Build(data->index(), Varlen(), "d.idx")->num_samples(), 4);
}

// A document index entry far past the sequences (10^12) must be refused by
// name when the table is built, not followed: opened with on-use
// validation, only the index's first and last entries were checked.
TEST(SampleRulesTest, SampleTableRefusesACorruptDocumentIndexByName) {
  RawIndex raw = RawIndex::Contiguous(DType::kInt32, {3, 20, 4, 17}, {0, 1, 2, 3, 4});
  raw.documents[2] = 1'000'000'000'000;
  const std::string bytes = raw.Serialize();
  absl::StatusOr<IndexView> index =
      ParseIndex(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                 "corrupt.idx", IndexValidation::kOnUse);
  ASSERT_TRUE(index.ok()) << index.status();
  absl::StatusOr<SampleTable> table = SampleTable::Build(*index, Split(), "corrupt.idx");
  EXPECT_EQ(table.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(table.status().message(), HasSubstr("corrupt.idx"));
}

}  // namespace
}  // namespace packfeed::dataset
