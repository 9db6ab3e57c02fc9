// SideRowWindow on a real side-field job and the node's real Storage.
#include "server/pipeline/side_row_window.h"

#include <gtest/gtest.h>

#include <set>

#include "packfeed/scheduler/plan.h"
#include "runner_parts_fixture.h"

namespace packfeed::server {
namespace {

class SideRowWindowTest : public RunnerPartsTest {
 protected:
  // Steps 0 and 1 held; a window with nothing read.
  void SetUp() override {
    MakeJob(/*side_field=*/true);
    steps_ = std::make_unique<HeldSteps>(*job_, storage_, Poster(), nullptr);
    steps_->FetchAhead(0, 1, 0);
    ASSERT_TRUE(RunUntil([&] { return steps_->Held(0) != nullptr && steps_->Held(1) != nullptr; }));
    step_ = steps_->Held(0);
    ASSERT_EQ(step_->plan.plan.num_microbatches(), 2);
    window_ = std::make_unique<SideRowWindow>(*job_, storage_, Poster());
  }
  void TearDown() override {
    StopPosting();
    window_.reset();
    steps_.reset();
  }

  // The rows of dp rank `dp`'s group in `microbatch` of step 0, once read.
  const SideRows* Read(int microbatch, int dp) {
    const SideRows* rows = nullptr;
    EXPECT_TRUE(RunUntil([&] {
      rows = window_->RowsFor(step_, microbatch, dp, dp, /*urgent=*/true);
      return rows != nullptr;
    }));
    return rows;
  }
  // A live reader of dp rank `dp`, sent `microbatch` of step 0 next.
  static SideReaders ReaderAt(int dp, int microbatch, uint32_t ring_slots = 4) {
    SideReaders readers;
    readers.live.push_back({dp, dp, {0, microbatch}, ring_slots});
    return readers;
  }

  std::unique_ptr<HeldSteps> steps_;
  std::shared_ptr<const StepData> step_;
  std::unique_ptr<SideRowWindow> window_;
};

TEST_F(SideRowWindowTest, ReadsAGroupsRowsOnceAndDropsThemWhenNoReaderWillBeSentThem) {
  const SideRows* rows = Read(0, 1);
  ASSERT_NE(rows, nullptr);
  std::set<int64_t> expected;
  for (const scheduler::PlannedSequence& sequence :
       scheduler::GroupOfRank(step_->plan.plan.microbatches[0], 1).sequences) {
    expected.insert(sequence.sample);
  }
  std::set<int64_t> read;
  for (const auto& [sample, fields] : rows->rows) {
    read.insert(sample);
    EXPECT_EQ(fields.size(), 1u);  // one side field
  }
  EXPECT_EQ(read, expected);
  EXPECT_TRUE(rows->failed.empty());
  const uint64_t bytes = window_->bytes();
  EXPECT_GT(bytes, 0u);
  // Asked for again: the same rows, nothing read again.
  EXPECT_EQ(window_->RowsFor(step_, 0, 1, 1, true), rows);
  EXPECT_EQ(window_->bytes(), bytes);

  const SideRowWindow::Key key{0, 0, 1};
  window_->DropIfUnneeded(key, ReaderAt(1, 0));  // still to be sent them
  EXPECT_EQ(window_->bytes(), bytes);
  window_->DropIfUnneeded(key, ReaderAt(2, 0));  // another group's reader
  EXPECT_EQ(window_->bytes(), 0u);
  EXPECT_EQ(window_->peak_bytes(), bytes);
}

TEST_F(SideRowWindowTest, ReadsAheadWithinEachReadersRingTheHeldStepsAndTheBudget) {
  const std::shared_ptr<const StepData> next_step = steps_->Held(1);
  window_->ReadAhead(ReaderAt(0, 0, /*ring_slots=*/2), *steps_, /*last_step=*/1, UINT64_MAX);
  const uint64_t two = window_->bytes();
  ASSERT_NE(Read(0, 0), nullptr);
  ASSERT_NE(Read(1, 0), nullptr);
  EXPECT_EQ(window_->bytes(), two);  // both were read ahead
  EXPECT_EQ(window_->RowsFor(next_step, 0, 0, 0, false), nullptr);
  const uint64_t three = window_->bytes();
  EXPECT_GT(three, two);  // the third, step 1's first, was not

  window_->Evict(SideReaders{});
  EXPECT_EQ(window_->bytes(), 0u);
  // A ring of three reaches into step 1, when it is held up to last_step.
  window_->ReadAhead(ReaderAt(0, 0, 3), *steps_, 0, UINT64_MAX);
  EXPECT_EQ(window_->bytes(), two);
  window_->ReadAhead(ReaderAt(0, 0, 3), *steps_, 1, UINT64_MAX);
  EXPECT_EQ(window_->bytes(), three);

  window_->Evict(SideReaders{});
  window_->ReadAhead(ReaderAt(0, 0, 2), *steps_, 0, /*budget_bytes=*/1);
  const uint64_t one = window_->bytes();
  EXPECT_GT(one, 0u);
  EXPECT_LT(one, two);
  window_->ReadAhead(ReaderAt(0, 0, 2), *steps_, /*last_step=*/-1, UINT64_MAX);
  EXPECT_EQ(window_->bytes(), one);  // no step held up to last_step
}

TEST_F(SideRowWindowTest, KeepsRowsForRanksStillToAttachFromWhereTheFirstBegan) {
  ASSERT_NE(Read(0, 2), nullptr);
  const uint64_t bytes = window_->bytes();
  SideReaders awaited;
  awaited.awaited = {2};
  awaited.awaited_from = 0;
  window_->Evict(awaited);
  EXPECT_EQ(window_->bytes(), bytes);
  awaited.awaited_from = 1;
  window_->Evict(awaited);
  EXPECT_EQ(window_->bytes(), 0u);
}

}  // namespace
}  // namespace packfeed::server
