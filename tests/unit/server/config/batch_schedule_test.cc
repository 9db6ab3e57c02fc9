#include "server/config/batch_schedule.h"

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/daemon_config.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;
using Entry = BatchSchedule::Entry;

// Megatron's training loop, step by step: each step takes the batch of the
// last entry at or below the samples consumed when it starts.
std::vector<BatchSchedule::Step> Walk(const std::vector<Entry>& entries, int64_t start, int steps) {
  std::vector<BatchSchedule::Step> out;
  int64_t consumed = start;
  for (int s = 0; s < steps; ++s) {
    int64_t batch = entries.front().global_batch;
    for (const Entry& entry : entries) {
      if (consumed >= entry.from_sample) batch = entry.global_batch;
    }
    out.push_back({consumed, batch});
    consumed += batch;
  }
  return out;
}

TEST(BatchScheduleTest, AConstantBatchIsArithmetic) {
  const BatchSchedule schedule({{0, 16}}, 48);
  EXPECT_TRUE(schedule.constant());
  EXPECT_EQ(schedule.At(0).first_sample, 48);
  EXPECT_EQ(schedule.At(5).first_sample, 48 + 5 * 16);
  EXPECT_EQ(schedule.At(5).global_batch, 16);
  EXPECT_EQ(schedule.StepStartingAt(48 + 32), 2);
  EXPECT_EQ(schedule.StepStartingAt(48 + 33), std::nullopt);  // inside step 2
  EXPECT_EQ(schedule.StepStartingAt(32), std::nullopt);       // before step 0
  EXPECT_EQ(schedule.StepsStartingBefore(48), 0);
  EXPECT_EQ(schedule.StepsStartingBefore(49), 1);
}

TEST(BatchScheduleTest, AStepTakesTheBatchInForceWhenItStarts) {
  // Step 2 starts at 8 (< 10) and holds 4; step 5 starts at 28 (< 30).
  const BatchSchedule schedule({{0, 4}, {10, 8}, {30, 16}}, 0);
  const std::vector<int64_t> firsts = {0, 4, 8, 12, 20, 28, 36, 52};
  const std::vector<int64_t> batches = {4, 4, 4, 8, 8, 8, 16, 16};
  for (size_t s = 0; s < firsts.size(); ++s) {
    EXPECT_EQ(schedule.At(static_cast<int64_t>(s)).first_sample, firsts[s]) << s;
    EXPECT_EQ(schedule.At(static_cast<int64_t>(s)).global_batch, batches[s]) << s;
    EXPECT_EQ(schedule.StepStartingAt(firsts[s]), static_cast<int64_t>(s));
  }
  EXPECT_FALSE(schedule.constant());
}

TEST(BatchScheduleTest, EqualsMegatronsLoopForAnySchedulesAndResumePoints) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Entry> entries = {{0, static_cast<int64_t>(1 + random() % 9)}};
    const int more = static_cast<int>(random() % 5);
    for (int i = 0; i < more; ++i) {
      // Some thresholds closer than one step, so a step skips an entry.
      entries.push_back({entries.back().from_sample + 1 + static_cast<int64_t>(random() % 40),
                         static_cast<int64_t>(1 + random() % 20)});
    }
    const auto start = static_cast<int64_t>(random() % 60);
    const BatchSchedule schedule(entries, start);
    const std::vector<BatchSchedule::Step> walked = Walk(entries, start, 60);
    std::vector<bool> starts_step(static_cast<size_t>(walked.back().first_sample + 1), false);
    for (int s = 0; s < 60; ++s) {
      const BatchSchedule::Step step = schedule.At(s);
      ASSERT_EQ(step.first_sample, walked[static_cast<size_t>(s)].first_sample)
          << "trial " << trial << " step " << s;
      ASSERT_EQ(step.global_batch, walked[static_cast<size_t>(s)].global_batch);
      starts_step[static_cast<size_t>(step.first_sample)] = true;
    }
    int64_t before = 0;
    for (int64_t sample = 0; sample <= walked.back().first_sample; ++sample) {
      const std::optional<int64_t> step = schedule.StepStartingAt(sample);
      ASSERT_EQ(step.has_value(), starts_step[static_cast<size_t>(sample)]) << sample;
      if (step) {
        EXPECT_EQ(schedule.At(*step).first_sample, sample);
      }
      ASSERT_EQ(schedule.StepsStartingBefore(sample), before) << "trial " << trial << " " << sample;
      before += starts_step[static_cast<size_t>(sample)] ? 1 : 0;
    }
  }
}

std::string ScheduledJob(absl::string_view global_batch, absl::string_view pretraining) {
  return absl::StrCat(R"(jobs { name: "gpt" seq_length: 64 global_batch: )", global_batch,
                      R"( topology { dp: 2 }
    datasets { prefix: "/a" kind: DATASET_KIND_PRETRAINING }
    pretraining { micro_batch_size: 2 serve_every_split: true )",
                      pretraining, " } }");
}

std::string Message(absl::string_view text) {
  return std::string(ParseDaemonConfig(text, "c.textproto").status().message());
}

TEST(BatchScheduleTest, TheConfigurationIsCheckedAsMegatronChecksIt) {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseDaemonConfig(ScheduledJob("16", R"(batch_schedule { from_sample: 0 global_batch: 4 }
                            batch_schedule { from_sample: 100 global_batch: 16 })"),
                        "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  // Evaluation keeps its one batch.
  ASSERT_EQ(config->jobs_size(), 3);
  EXPECT_EQ(config->jobs(1).pretraining().batch_schedule_size(), 0);
  EXPECT_EQ(config->jobs(1).global_batch(), 16);

  const std::string later = R"(batch_schedule { from_sample: 100 global_batch: 16 })";
  EXPECT_THAT(Message(ScheduledJob("16", later)),
              HasSubstr("jobs[0].pretraining.batch_schedule[0]: the first entry is from sample 0"));
  EXPECT_THAT(Message(ScheduledJob("16", R"(batch_schedule { global_batch: 4 }
      batch_schedule { global_batch: 16 })")),
              HasSubstr("batch_schedule[1]: from_sample must be after the entry before"));
  EXPECT_THAT(Message(ScheduledJob("16", R"(batch_schedule { global_batch: 0 })")),
              HasSubstr("batch_schedule[0]: global_batch must be >= 1"));
  EXPECT_THAT(Message(ScheduledJob("16", R"(batch_schedule { global_batch: 6 }
      batch_schedule { from_sample: 100 global_batch: 16 })")),
              HasSubstr("batch_schedule[0]: 6 is not a multiple of micro_batch_size x dp = 4"));
  // An entry a resumed run is past is never taken, so never checked.
  EXPECT_TRUE(ParseDaemonConfig(ScheduledJob("16", R"(consumed_samples: 100
      batch_schedule { global_batch: 6 } batch_schedule { from_sample: 100 global_batch: 16 })"),
                                "c.textproto")
                  .ok());
  EXPECT_THAT(Message(ScheduledJob("8", R"(batch_schedule { global_batch: 4 }
      batch_schedule { from_sample: 100 global_batch: 16 })")),
              HasSubstr("global_batch: 8 must be the batch_schedule's largest, 16"));
  EXPECT_THAT(Message(ScheduledJob("16", R"(inter_document_masking: true
      hybrid_context_parallel: true batch_schedule { global_batch: 16 })")),
              HasSubstr("not with hybrid_context_parallel"));
}

}  // namespace
}  // namespace packfeed::server
