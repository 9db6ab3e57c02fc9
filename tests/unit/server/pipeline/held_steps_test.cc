// HeldSteps on a real job and the node's real Storage.
#include "server/pipeline/held_steps.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <vector>

#include "absl/synchronization/notification.h"
#include "runner_parts_fixture.h"
#include "server/pipeline/plan.h"

namespace packfeed::server {
namespace {

class HeldStepsTest : public RunnerPartsTest {
 protected:
  void SetUp() override { MakeJob(); }
  void TearDown() override {
    StopPosting();
    steps_.reset();
  }

  void Make(StepPlanner::Plan plan_step = {}) {
    steps_ = std::make_unique<HeldSteps>(
        *job_, storage_, Poster(), [this](int64_t step, const StepData&) { held_.push_back(step); },
        std::move(plan_step));
  }

  std::vector<int64_t> held_;  // OnHeld's steps, in order
  std::unique_ptr<HeldSteps> steps_;
};

TEST_F(HeldStepsTest, HoldsTheStepItsPlanSaysWithEverySampleTheRanksNeed) {
  Make();
  EXPECT_EQ(steps_->At(0, /*rank=*/0, /*urgent=*/true), nullptr);  // planned on its thread
  EXPECT_EQ(steps_->Held(0), nullptr);
  ASSERT_TRUE(RunUntil([&] { return steps_->At(0, 0, true) != nullptr; }));

  const StepData& data = *steps_->At(0, 0, true);
  absl::StatusOr<StepPlan> expected = PlanStep(*job_, 0);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(data.plan.plan, expected->plan);
  const std::set<int64_t> needed = SamplesOfRanks(*job_, *expected, job_->local_ranks());
  std::set<int64_t> runs;
  for (const auto& [sample, _] : data.runs) runs.insert(sample);
  EXPECT_EQ(runs, needed);
  EXPECT_TRUE(data.failed.empty());
  EXPECT_EQ(steps_->Held(0).get(), &data);
  EXPECT_EQ(held_, std::vector<int64_t>{0});
  EXPECT_EQ(steps_->figures().steps_held, 1);
  EXPECT_GT(steps_->TokenBytes(), 0u);
  EXPECT_EQ(steps_->failed_step(), -1);
}

TEST_F(HeldStepsTest, FetchesAheadThenEvictsWhatIsBeforeAStep) {
  Make();
  steps_->FetchAhead(0, 2, /*rank=*/1);
  ASSERT_TRUE(RunUntil([&] {
    return steps_->Held(0) != nullptr && steps_->Held(1) != nullptr && steps_->Held(2) != nullptr;
  }));
  EXPECT_EQ(steps_->Held(3), nullptr);
  EXPECT_EQ(std::set<int64_t>(held_.begin(), held_.end()), (std::set<int64_t>{0, 1, 2}));
  const uint64_t three = steps_->TokenBytes();

  steps_->EvictBefore(2);
  EXPECT_EQ(steps_->Held(0), nullptr);
  EXPECT_EQ(steps_->Held(1), nullptr);
  ASSERT_NE(steps_->Held(2), nullptr);
  EXPECT_LT(steps_->TokenBytes(), three);
  EXPECT_EQ(steps_->figures().steps_held, 3);
}

TEST_F(HeldStepsTest, AFailedPlanIsKeptForTheRanksAndPlannedAgainWhenNextAskedFor) {
  // Owned by the planner too: it may still be planning when the body returns.
  auto calls = std::make_shared<std::atomic<int>>(0);
  Make([calls](const Job& job, int64_t step) -> absl::StatusOr<StepPlan> {
    if (calls->fetch_add(1) == 0) return absl::InternalError("the planner broke");
    return PlanStep(job, step);
  });
  EXPECT_EQ(steps_->At(1, 0, true), nullptr);
  ASSERT_TRUE(RunUntil([&] { return steps_->failed_step() == 1; }));
  EXPECT_TRUE(absl::IsInternal(steps_->failure())) << steps_->failure();
  EXPECT_EQ(steps_->Held(1), nullptr);
  // Not begun again by reading ahead...
  steps_->FetchAhead(1, 1, 0);
  EXPECT_EQ(calls->load(), 1);
  // ...but when a rank asks for it.
  EXPECT_EQ(steps_->At(1, 0, true), nullptr);
  ASSERT_TRUE(RunUntil([&] { return steps_->At(1, 0, true) != nullptr; }));
  EXPECT_EQ(calls->load(), 2);
  EXPECT_EQ(held_, std::vector<int64_t>{1});
}

TEST_F(HeldStepsTest, APlanThatComesBackAfterItsStepWasEvictedIsDropped) {
  auto go = std::make_shared<absl::Notification>();  // see above
  Make([go](const Job& job, int64_t step) -> absl::StatusOr<StepPlan> {
    go->WaitForNotification();
    return PlanStep(job, step);
  });
  EXPECT_EQ(steps_->At(0, 0, true), nullptr);
  steps_->EvictBefore(1);
  go->Notify();
  // The plan's one task runs, and neither holds nor fetches the step.
  ASSERT_TRUE(RunUntil([&] { return ran_ == 1; }));
  EXPECT_FALSE(RunUntilFor(absl::Milliseconds(300)));
  EXPECT_EQ(steps_->Held(0), nullptr);
  EXPECT_TRUE(held_.empty());
  EXPECT_EQ(steps_->figures().steps_held, 0);
}

}  // namespace
}  // namespace packfeed::server
