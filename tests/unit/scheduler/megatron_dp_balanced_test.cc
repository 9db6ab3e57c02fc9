// All 157 cases Megatron-LM's own dp_balanced scheduler produced
// (tests/fixtures/golden/dp_balanced_vectors.json), plus edge cases.

#include "packfeed/scheduler/megatron_dp_balanced.h"

#include <fstream>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"

namespace packfeed::scheduler {
namespace {

using ::testing::HasSubstr;

std::vector<std::vector<std::vector<int64_t>>> PerRankSamples(const GlobalPlan& plan) {
  std::vector<std::vector<std::vector<int64_t>>> out;
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    std::vector<std::vector<int64_t>> ranks;
    for (int r = 0; r < plan.dp_cp_size; ++r) {
      std::vector<int64_t> samples;
      for (const PlannedSequence& s : GroupOfRank(microbatch, r).sequences) {
        samples.push_back(s.sample);
      }
      ranks.push_back(samples);
    }
    out.push_back(ranks);
  }
  return out;
}

bool HasEmptyPack(const nlohmann::json& expected) {
  for (const auto& microbatch : expected) {
    for (const auto& rank : microbatch) {
      if (rank.empty()) return true;
    }
  }
  return false;
}

TEST(MegatronDpBalancedTest, ReproducesEveryMegatronVector) {
  std::ifstream in(::packfeed::testing::FixturesDir() / "golden" / "dp_balanced_vectors.json");
  ASSERT_TRUE(in) << "tests/fixtures/golden/dp_balanced_vectors.json is missing";
  const nlohmann::json cases = nlohmann::json::parse(in)["cases"];
  ASSERT_EQ(cases.size(), 157u);
  int matched = 0, errors = 0, empty_packs = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto padded = c["padded_lens"].get<std::vector<int64_t>>();
    MegatronDpBalancedOptions options;
    options.dp = c["DP"];
    options.cp = c["CP"];
    options.max_seqlen_per_dp_cp_rank = c["max_seqlen_per_dp_cp_rank"];
    if (!c["max_num_seqs"].is_null()) options.max_num_seqs = c["max_num_seqs"];
    if (!c["microbatch_group_size_per_vp_stage"].is_null()) {
      options.vpp_group_size = c["microbatch_group_size_per_vp_stage"];
    }
    absl::StatusOr<GlobalPlan> plan = PlanMegatronDpBalanced(padded, padded, options);
    if (!c["error"].is_null()) {
      ASSERT_FALSE(plan.ok());
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(plan.status().message(), HasSubstr("Not enough samples to move"));
      ++errors;
      continue;
    }
    if (HasEmptyPack(c["expected"])) {
      ASSERT_FALSE(plan.ok());
      EXPECT_THAT(plan.status().message(), HasSubstr("empty pack"));
      ++empty_packs;
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(PerRankSamples(*plan),
              (c["expected"].get<std::vector<std::vector<std::vector<int64_t>>>>()));
    EXPECT_TRUE(ValidatePlan(*plan, static_cast<int64_t>(padded.size())).ok());
    ++matched;
  }
  EXPECT_EQ(matched + errors + empty_packs, 157);
  std::printf(
      "dp_balanced vectors: %d identical plans, %d Megatron errors, "
      "%d empty packs refused\n",
      matched, errors, empty_packs);
}

TEST(MegatronDpBalancedTest, EmptyPackIsRefusedWithTheReason) {
  MegatronDpBalancedOptions options;
  options.dp = 2;
  options.max_seqlen_per_dp_cp_rank = 4096;
  std::vector<int64_t> padded = {9000, 100, 100, 100};
  absl::StatusOr<GlobalPlan> plan = PlanMegatronDpBalanced(padded, padded, options);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("sample 0 of padded length 9000 exceeds a pack's "
                                                 "4096 tokens"));
}

TEST(MegatronDpBalancedTest, FlopsInputsCountRealAndPadded) {
  MegatronDpBalancedOptions options;
  options.dp = 1;
  options.cp = 2;
  options.max_seqlen_per_dp_cp_rank = 100;
  std::vector<int64_t> real = {5, 11};
  std::vector<int64_t> padded = {8, 12};
  absl::StatusOr<GlobalPlan> plan = PlanMegatronDpBalanced(real, padded, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->flops, (FlopsInputs{20, 64 + 144, 16, 25 + 121}));
}

TEST(MegatronDpBalancedTest, RejectsBadOptions) {
  std::vector<int64_t> lengths = {4};
  MegatronDpBalancedOptions options;
  EXPECT_THAT(PlanMegatronDpBalanced(lengths, lengths, options).status().message(),
              HasSubstr("max_seqlen_per_dp_cp_rank must be >= 1"));
  options.max_seqlen_per_dp_cp_rank = 8;
  options.dp = 0;
  EXPECT_FALSE(PlanMegatronDpBalanced(lengths, lengths, options).ok());
  options.dp = 1;
  std::vector<int64_t> shorter = {2};
  EXPECT_THAT(PlanMegatronDpBalanced(lengths, shorter, options).status().message(),
              HasSubstr("sample 0 has length 4 and padded length 2"));
}

}  // namespace
}  // namespace packfeed::scheduler
