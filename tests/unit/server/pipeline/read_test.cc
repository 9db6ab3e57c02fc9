#include "server/pipeline/read.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fetch_needs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/dataset_generator.h"
#include "server/config/daemon_config.h"
#include "server/pipeline/job.h"
#include "server/pipeline/plan.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

constexpr int kRanks = 8;  // CP 4 × DP 2

class ReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = temp_.Prefix("data");
    for (int i = 0; i < 400; ++i) lengths_.push_back(20 + (i * 37) % 181);
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths_, {}).ok());
  }

  std::unique_ptr<Job> MakeJob(const std::string& rules) {
    absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
        absl::StrCat("jobs { name: \"j\" datasets { prefix: \"", prefix_,
                     "\" } global_batch: 32 eod_id: 7 seed: 5 topology { cp: 4 dp: 2 } ", rules,
                     " scheduler { kind: \"dynamic_cp\" max_tokens_per_rank: 64 } }"),
        "test");
    EXPECT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<Job>> job = JobOfConfig(config->jobs(0));
    EXPECT_TRUE(job.ok()) << job.status();
    return *std::move(job);
  }

  static std::vector<int> AllRanks() {
    std::vector<int> ranks(kRanks);
    for (int r = 0; r < kRanks; ++r) ranks[static_cast<size_t>(r)] = r;
    return ranks;
  }

  // The stored tokens of document `d`.
  std::vector<int64_t> Tokens(const Job& job, int64_t d) const {
    std::vector<int64_t> tokens(static_cast<size_t>(lengths_[static_cast<size_t>(d)]));
    EXPECT_TRUE(job.dataset(0).Read(static_cast<uint64_t>(d), absl::MakeSpan(tokens)).ok());
    return tokens;
  }

  packfeed::testing::ScopedTempDir temp_;
  std::string prefix_;
  std::vector<int64_t> lengths_;
};

TEST_F(ReadTest, RanksNeedTheSamplesOfTheirCpGroupsOnly) {
  const std::unique_ptr<Job> job = MakeJob("seq_length: 256");
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int> all = AllRanks();
  const std::set<int64_t> every = SamplesOfRanks(*job, *plan, all);
  EXPECT_EQ(every.size(), 32u);
  std::set<int64_t> expected;
  for (const scheduler::PlannedMicrobatch& microbatch : plan->plan.microbatches) {
    for (const scheduler::CpGroup& group : microbatch.groups) {
      if (group.first_rank <= 2 && 2 < group.first_rank + group.size) {
        for (const scheduler::PlannedSequence& sequence : group.sequences) {
          expected.insert(sequence.sample);
        }
      }
    }
  }
  const std::vector<int> rank2 = {2};
  EXPECT_EQ(SamplesOfRanks(*job, *plan, rank2), expected);
  EXPECT_LT(expected.size(), every.size());
}

TEST_F(ReadTest, EachSampleIsReadOnceWhateverNumberOfRanksShareIt) {
  const std::unique_ptr<Job> job = MakeJob("seq_length: 256");
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const StepNeeds needs = NeedsOfStep(*job, *plan, AllRanks());
  ASSERT_EQ(needs.samples.size(), 32u);
  EXPECT_THAT(needs.counts, Each(1));  // one sequence per document
  ASSERT_EQ(needs.needs.size(), 32u);
  for (size_t i = 0; i < needs.samples.size(); ++i) {
    const scheduler::SampleRef& ref = plan->samples[static_cast<size_t>(needs.samples[i])];
    EXPECT_EQ(needs.needs[i].document, ref.index);
    EXPECT_EQ(needs.needs[i].offset, 0u);
    // In the file's dtype, the whole document.
    EXPECT_EQ(needs.needs[i].bytes,
              static_cast<uint64_t>(lengths_[static_cast<size_t>(ref.index)]) *
                  DTypeSize(job->dataset(0).dtype()));
    EXPECT_TRUE(needs.needs[i].tokens);
  }
}

TEST_F(ReadTest, AssembledRunsAreTheDocumentsUnderTheSampleRules) {
  // seq_length 64: a sample holds up to 65 tokens (64 inputs and the last
  // label). A longer document keeps its first 63 tokens and a forced EOD
  // (7), Megatron's rule. Steps 0-11 hold documents of 62 to 66 tokens.
  const std::unique_ptr<Job> job =
      MakeJob("seq_length: 64 long_documents: LONG_DOCUMENTS_TRUNCATE");
  int truncated = 0;
  int at_the_edge = 0;
  for (int64_t step = 0; step < 12; ++step) {
    absl::StatusOr<StepPlan> plan = PlanStep(*job, step);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const StepNeeds needs = NeedsOfStep(*job, *plan, AllRanks());
    const StepData data = AssembleStep(*job, *plan, needs.samples, needs.counts, FetchNeeds(needs));
    EXPECT_TRUE(data.failed.empty());
    ASSERT_EQ(data.runs.size(), 32u);
    for (const auto& [sample, run] : data.runs) {
      const int64_t document = plan->samples[static_cast<size_t>(sample)].index;
      std::vector<int64_t> expected = Tokens(*job, document);
      at_the_edge += expected.size() == 64 || expected.size() == 65;
      if (expected.size() > 65) {
        expected.resize(63);
        expected.push_back(7);
        ++truncated;
      }
      EXPECT_EQ(std::vector<int64_t>(run.tokens().begin(), run.tokens().end()), expected)
          << "step " << step << ", document " << document;
    }
  }
  EXPECT_GT(truncated, 0);
  EXPECT_GT(at_the_edge, 0);
}

TEST_F(ReadTest, ASampleThatCouldNotBeReadIsReportedWithWhy) {
  const std::unique_ptr<Job> job = MakeJob("seq_length: 256");
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const StepNeeds needs = NeedsOfStep(*job, *plan, AllRanks());
  std::vector<FetchedSample> fetched = FetchNeeds(needs);
  fetched[3].status = absl::DataLossError("data.bin: truncated under the daemon");
  const StepData data = AssembleStep(*job, *plan, needs.samples, needs.counts, fetched);
  ASSERT_EQ(data.failed.size(), 1u);
  EXPECT_EQ(data.failed.begin()->first, needs.samples[3]);
  EXPECT_THAT(data.failed.begin()->second.message(), HasSubstr("truncated under the daemon"));
  EXPECT_EQ(data.runs.count(needs.samples[3]), 0u);
  EXPECT_EQ(data.runs.size(), 31u);
}

}  // namespace
}  // namespace packfeed::server
