#include "server/pipeline/plan.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/dataset_generator.h"
#include "server/config/daemon_config.h"
#include "server/pipeline/job.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {
namespace {

// 400 one-sequence documents of 20-200 tokens.
std::vector<int64_t> Lengths() {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 400; ++i) lengths.push_back(20 + (i * 37) % 181);
  return lengths;
}

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = temp_.Prefix("data");
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, Lengths(), {}).ok());
  }

  // A job over the dataset; `body` adds to (or overrides) its settings.
  std::unique_ptr<Job> MakeJob(const std::string& body) {
    absl::StatusOr<v1::DaemonConfig> config =
        ParseDaemonConfig(absl::StrCat("jobs { name: \"j\" datasets { prefix: \"", prefix_,
                                       "\" } global_batch: 32 eod_id: 0 seed: 5 ", body, " }"),
                          "test");
    EXPECT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<Job>> job = JobOfConfig(config->jobs(0));
    EXPECT_TRUE(job.ok()) << job.status();
    return *std::move(job);
  }

  // Long sequences need CP groups of 2 or 4 of the 8 dp-cp ranks.
  static constexpr const char* kDynamicCp =
      "topology { cp: 4 dp: 2 } seq_length: 256 "
      "scheduler { kind: \"dynamic_cp\" max_tokens_per_rank: 64 }";

  packfeed::testing::ScopedTempDir temp_;
  std::string prefix_;
};

TEST_F(PlanTest, TheSameStepPlansTheSameInAnotherJobObject) {
  const std::unique_ptr<Job> one = MakeJob(kDynamicCp);
  const std::unique_ptr<Job> other = MakeJob(kDynamicCp);
  for (int64_t step : {0, 1, 7}) {
    absl::StatusOr<StepPlan> a = PlanStep(*one, step);
    absl::StatusOr<StepPlan> b = PlanStep(*other, step);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->plan, b->plan) << "step " << step;
    EXPECT_EQ(a->samples, b->samples) << "step " << step;
  }
  EXPECT_NE(PlanStep(*one, 0)->samples, PlanStep(*one, 1)->samples);
}

TEST_F(PlanTest, EverySampleOfTheBatchIsPlannedOnce) {
  const std::unique_ptr<Job> job = MakeJob(kDynamicCp);
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->samples.size(), 32u);
  std::vector<int> planned(32, 0);
  bool grouped = false;
  for (const scheduler::PlannedMicrobatch& microbatch : plan->plan.microbatches) {
    for (const scheduler::CpGroup& group : microbatch.groups) {
      grouped |= group.size > 1;
      for (const scheduler::PlannedSequence& sequence : group.sequences) {
        ASSERT_GE(sequence.sample, 0);
        ASSERT_LT(sequence.sample, 32);
        ++planned[static_cast<size_t>(sequence.sample)];
        // The sample's document is what is planned: its inputs, all its
        // tokens but the last, which is only a label.
        const scheduler::SampleRef& ref = plan->samples[static_cast<size_t>(sequence.sample)];
        EXPECT_EQ(sequence.length, Lengths()[static_cast<size_t>(ref.index)] - 1);
      }
    }
  }
  EXPECT_THAT(planned, ::testing::Each(1));
  EXPECT_TRUE(grouped) << "no CP group: the test checks nothing of groups";
  EXPECT_EQ(plan->samples_truncated, 0);
}

TEST_F(PlanTest, TheRanksOfACpGroupGetItsSamplesInOrder) {
  const std::unique_ptr<Job> job = MakeJob(kDynamicCp);
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int m = 0; m < plan->plan.num_microbatches(); ++m) {
    for (const scheduler::CpGroup& group : plan->plan.microbatches[static_cast<size_t>(m)].groups) {
      std::vector<scheduler::SampleRef> expected;
      for (const scheduler::PlannedSequence& sequence : group.sequences) {
        expected.push_back(plan->samples[static_cast<size_t>(sequence.sample)]);
      }
      for (int rank = group.first_rank; rank < group.first_rank + group.size; ++rank) {
        EXPECT_EQ(MicrobatchSamples(*plan, m, rank), expected)
            << "microbatch " << m << " rank " << rank;
      }
    }
  }
}

TEST_F(PlanTest, TruncatedDocumentsAreCountedWithTheTokensNotServed) {
  // seq_length 64: a sample holds up to 65 tokens; a longer document keeps
  // its first 63 and a forced EOD (Megatron's rule), and the rest is
  // counted. Steps 0-11 hold documents of 62 to 66 tokens.
  const std::unique_ptr<Job> job = MakeJob(
      "topology { dp: 2 } seq_length: 64 long_documents: LONG_DOCUMENTS_TRUNCATE "
      "scheduler { kind: \"balanced\" max_tokens_per_rank: 64 }");
  for (int64_t step = 0; step < 12; ++step) {
    absl::StatusOr<StepPlan> plan = PlanStep(*job, step);
    ASSERT_TRUE(plan.ok()) << plan.status();
    int64_t samples = 0;
    int64_t tokens = 0;
    for (const scheduler::SampleRef& ref : plan->samples) {
      const int64_t length = Lengths()[static_cast<size_t>(ref.index)];
      if (length > 65) {
        ++samples;
        tokens += length - 63;
      }
    }
    ASSERT_GT(samples, 0);
    EXPECT_EQ(plan->samples_truncated, samples) << "step " << step;
    EXPECT_EQ(plan->tokens_truncated, tokens) << "step " << step;
  }
}

}  // namespace
}  // namespace packfeed::server
