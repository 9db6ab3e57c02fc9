// Where an attach starts: a step, or (pretraining) Megatron's consumed
// sample count turned into the step that begins there.

#include "server/control/attach_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "packfeed/dataset/dataset_generator.h"
#include "server/config/daemon_config.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

class AttachStartStepTest : public ::testing::Test {
 protected:
  // A job over 64 generated sequences of 100 tokens; `kind_and_rest` ends
  // the dataset entry and adds the job's own fields.
  std::unique_ptr<Job> MakeJob(const std::string& kind_and_rest) {
    const std::string prefix = temp_.Prefix("data");
    EXPECT_TRUE(dataset::WriteGeneratedDataset(prefix, std::vector<int64_t>(64, 100), {}).ok());
    absl::StatusOr<v1::DaemonConfig> config =
        ParseDaemonConfig(absl::StrCat("jobs { name: \"gpt\" datasets { prefix: \"", prefix, "\"",
                                       kind_and_rest, " }"),
                          "test");
    EXPECT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<Job>> job = JobOfConfig(config->jobs(0));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : nullptr;
  }

  std::unique_ptr<Job> PretrainingJob() {
    return MakeJob(
        " kind: DATASET_KIND_PRETRAINING } global_batch: 4 seq_length: 64 eod_id: 0 "
        "pretraining { split: \"1,0,0\" train_samples: 40 micro_batch_size: 1 "
        "consumed_samples: 8 }");
  }

  static v1::AttachRequest At(int64_t sample) {
    v1::AttachRequest request;
    request.set_start_step(99);  // ignored once start_sample is set
    request.set_start_sample(sample);
    return request;
  }

  testing::ScopedTempDir temp_;
};

TEST_F(AttachStartStepTest, WithoutStartSampleTheStepIsTheRequests) {
  std::unique_ptr<Job> job = PretrainingJob();
  ASSERT_NE(job, nullptr);
  v1::AttachRequest request;
  request.set_start_step(3);
  EXPECT_EQ(AttachStartStep(*job, request).value(), 3);
}

TEST_F(AttachStartStepTest, ASampleCountBecomesTheStepThatBeginsThere) {
  std::unique_ptr<Job> job = PretrainingJob();
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(AttachStartStep(*job, At(8)).value(), 0);  // the job's consumed_samples
  EXPECT_EQ(AttachStartStep(*job, At(20)).value(), 3);
}

TEST_F(AttachStartStepTest, ASampleBeforeTheJobsFirstStepIsRefused) {
  std::unique_ptr<Job> job = PretrainingJob();
  ASSERT_NE(job, nullptr);
  const absl::StatusOr<int64_t> step = AttachStartStep(*job, At(4));
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(step.status().message(), HasSubstr("from sample 8 (consumed_samples)"));
  EXPECT_THAT(step.status().message(), HasSubstr("sample 4 lies before its first step"));
}

TEST_F(AttachStartStepTest, ASampleInsideAStepIsRefused) {
  std::unique_ptr<Job> job = PretrainingJob();
  ASSERT_NE(job, nullptr);
  const absl::StatusOr<int64_t> step = AttachStartStep(*job, At(10));
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(step.status().message(), HasSubstr("global batches of 4; sample 10 lies inside"));
}

TEST_F(AttachStartStepTest, OtherKindsCountInStepsOnly) {
  std::unique_ptr<Job> job = MakeJob(
      " } global_batch: 4 seq_length: 256 eod_id: 0 "
      "scheduler { kind: \"balanced\" max_tokens_per_rank: 256 }");
  ASSERT_NE(job, nullptr);
  const absl::StatusOr<int64_t> step = AttachStartStep(*job, At(8));
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(step.status().message(), HasSubstr("start_sample is for pretraining jobs"));
}

}  // namespace
}  // namespace packfeed::server
