#include "server/config/fingerprint.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

FingerprintInputs Inputs() {
  return {"idx:1;bin:2;pretraining;1|", "tp1 pp1 cp2 dp4", "gb64 seq4096", "dynamic_cp",
          "sequential seed 1234"};
}

TEST(FingerprintTest, NamesEveryPartWithEightHexDigits) {
  EXPECT_THAT(MakeFingerprint(Inputs()),
              MatchesRegex("pf1-d[0-9a-f]{8}-t[0-9a-f]{8}-b[0-9a-f]{8}-s[0-9a-f]{8}-r[0-9a-f]{8}"));
}

TEST(FingerprintTest, IsTheSameInEveryProcessAndRelease) {
  // Journals and checkpoints hold fingerprints: a change of encoding or hash
  // would refuse every resume. These values were made by this code; a test
  // that fails here means that change, not a bug to paper over.
  EXPECT_EQ(MakeFingerprint(Inputs()), "pf1-dbc68b121-t2070daa7-b7f836f3a-s7bfee370-r9836c893");
  EXPECT_EQ(MakeFingerprint({"", "", "", "", ""}),
            "pf1-d38d394c2-t38d394c2-b38d394c2-s38d394c2-r38d394c2");
}

TEST(FingerprintTest, AMismatchNamesWhatDiffers) {
  FingerprintInputs other = Inputs();
  other.topology = "tp1 pp1 cp2 dp8";
  other.sampler = "sequential seed 1";
  const absl::Status status =
      CompareFingerprints(MakeFingerprint(Inputs()), MakeFingerprint(other));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("topology, sampler differ"));
  EXPECT_THAT(status.message(), Not(HasSubstr("datasets")));
  EXPECT_TRUE(CompareFingerprints(MakeFingerprint(Inputs()), MakeFingerprint(Inputs())).ok());
}

TEST(FingerprintTest, AnElasticResumeComparesOnlyWhatChoosesTheSamples) {
  FingerprintInputs elastic = Inputs();
  elastic.topology = "tp2 pp1 cp1 dp2";
  elastic.scheduler = "balanced";
  EXPECT_TRUE(CompareFingerprints(MakeFingerprint(Inputs()), MakeFingerprint(elastic),
                                  /*data_only=*/true)
                  .ok());
  FingerprintInputs other_data = elastic;
  other_data.batch = "gb128 seq4096";
  const absl::Status status = CompareFingerprints(MakeFingerprint(Inputs()),
                                                  MakeFingerprint(other_data), /*data_only=*/true);
  EXPECT_THAT(status.message(), HasSubstr("batch differ (an elastic resume may change only"));
}

TEST(FingerprintTest, SomethingElseIsNotAFingerprint) {
  for (const char* bad :
       {"", "garbage", "pf1", "pf2-d00000000-t00000000-b00000000-s00000000-r00000000",
        "pf1-d0000000-t00000000-b00000000-s00000000-r00000000",
        "pf1-t00000000-d00000000-b00000000-s00000000-r00000000"}) {
    const absl::Status status = CompareFingerprints(bad, MakeFingerprint(Inputs()));
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << bad;
    EXPECT_THAT(status.message(), HasSubstr("is not a packfeed job fingerprint")) << bad;
  }
}

}  // namespace
}  // namespace packfeed::server
