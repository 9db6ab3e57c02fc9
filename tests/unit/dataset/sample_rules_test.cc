#include "packfeed/dataset/sample_rules.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::dataset {
namespace {

using ::testing::ElementsAre;

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

}  // namespace
}  // namespace packfeed::dataset
