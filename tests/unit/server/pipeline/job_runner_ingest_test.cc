// An ingest job's runner (job_runner_fixture.h): woken by a seal, and a
// sealed step reaching every rank at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "job_runner_fixture.h"
#include "server/ingest/ingest_stream.h"
#include "server/pipeline/read.h"

namespace packfeed::server {
namespace {

// Puts samples of `lengths` tokens into `step` of `stream` and seals it;
// sample i's tokens are all i + 1 (pads are 0).
void SealStep(IngestStream& stream, int64_t step, const std::vector<int64_t>& lengths) {
  std::vector<IngestedSample> samples;
  uint64_t bytes = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    IngestedSample sample;
    sample.group = static_cast<int64_t>(i);
    sample.num_tokens = lengths[i];
    sample.data_bytes = static_cast<uint64_t>(sample.num_tokens) * sizeof(int64_t);
    auto data = std::make_shared<char[]>(sample.data_bytes);
    const auto token = static_cast<int64_t>(i + 1);
    for (int64_t t = 0; t < sample.num_tokens; ++t) {
      std::memcpy(data.get() + t * sizeof(int64_t), &token, sizeof(token));
    }
    sample.data = std::move(data);
    bytes += sample.bytes();
    samples.push_back(std::move(sample));
  }
  ASSERT_TRUE(stream.Reserve(bytes).ok());
  ASSERT_TRUE(stream.Commit(step, std::move(samples), bytes).ok());
  ASSERT_TRUE(stream.Seal(step).ok());
}

TEST_F(JobRunnerTest, AnIngestJobIsWokenWhenItsStepIsSealed) {
  stream_ = std::make_unique<IngestStream>("rollouts", "", std::vector<SideFieldInfo>{}, 0);
  IngestStream& stream = *stream_;
  Start(ParseJob("ingest_stream: \"rollouts\" global_batch: 8 seq_length: 64 eod_id: 0 "
                 "scheduler { kind: \"balanced\" max_tokens_per_rank: 64 }",
                 " ingest_streams { name: \"rollouts\" }"),
        &stream, /*prefetch_steps=*/1);
  // Slots are never released: a step the rank took would be freed, and
  // planned again below only while the stream holds it.
  const uint64_t id = Attach(0, /*slots=*/4);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(sender_->Pushed(id).empty()) << "a slot of a step not sealed";

  // Four samples of 10..13 tokens; sample i's tokens are all i + 1 (pads
  // are 0).
  SealStep(stream, 0, {10, 11, 12, 13});

  absl::StatusOr<StepPlan> plan = PlanStep(*job_, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const size_t microbatches = static_cast<size_t>(plan->plan.num_microbatches());
  const std::vector<PushedSlot> pushed = sender_->WaitForPushes(id, microbatches);
  ASSERT_EQ(pushed.size(), microbatches);
  // Every token served once; a sample's tokens stay together (the last
  // token of each is not an input: it is the label of the one before).
  std::map<int64_t, int> served;
  for (const PushedSlot& slot : pushed) {
    for (int64_t token : slot.Tokens()) ++served[token];
  }
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(served[i + 1], 9 + i) << "sample " << i;
}

// A sealed step reaches every rank at once: each rank's first microbatch is
// pushed before any rank's second, not after the ranks before it filled
// their rings.
TEST_F(JobRunnerTest, EveryRankGetsItsNextMicrobatchBeforeAnyGetsTwo) {
  stream_ = std::make_unique<IngestStream>("rollouts", "", std::vector<SideFieldInfo>{}, 0);
  IngestStream& stream = *stream_;
  Start(ParseJob("ingest_stream: \"rollouts\" topology { dp: 4 } global_batch: 16 "
                 "seq_length: 64 eod_id: 0 scheduler { kind: \"balanced\" "
                 "max_tokens_per_rank: 64 }",
                 " ingest_streams { name: \"rollouts\" }"),
        &stream, /*prefetch_steps=*/1);
  std::vector<uint64_t> ids;
  for (int rank = 0; rank < 4; ++rank) ids.push_back(Attach(rank, /*slots=*/16));
  std::vector<int64_t> lengths;
  for (int i = 0; i < 16; ++i) lengths.push_back(40 + (i * 7) % 24);
  SealStep(stream, 0, lengths);

  const int microbatches = MicrobatchesOf(0);
  ASSERT_GE(microbatches, 3);
  std::vector<PushedSlot> pushes;
  for (uint64_t id : ids) {
    const std::vector<PushedSlot> pushed = sender_->WaitForPushes(id, microbatches);
    ASSERT_EQ(pushed.size(), static_cast<size_t>(microbatches));
    pushes.insert(pushes.end(), pushed.begin(), pushed.end());
  }
  std::sort(pushes.begin(), pushes.end(),
            [](const PushedSlot& a, const PushedSlot& b) { return a.order < b.order; });
  for (size_t i = 1; i < pushes.size(); ++i) {
    EXPECT_LE(pushes[i - 1].microbatch, pushes[i].microbatch) << "push " << i;
  }
}

}  // namespace
}  // namespace packfeed::server
