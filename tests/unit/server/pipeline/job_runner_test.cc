// The runner driven step by step in one process: a real job over a
// generated dataset, the node's real Storage, and a fake SlotSender in place
// of UCX, so each rule of the runner is seen at the slot it applies to:
// credits, read-ahead bounded by the slowest rank, re-attach, a failed
// connection. Ingest jobs: job_runner_ingest_test.cc. End-to-end daemons run in
// tests/integration/ and tests/python/.
#include "server/pipeline/job_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "job_runner_fixture.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAreArray;

// The slots pushed to one rank, in order, as (step, microbatch).
std::vector<std::pair<int64_t, uint32_t>> Positions(const std::vector<PushedSlot>& slots) {
  std::vector<std::pair<int64_t, uint32_t>> out;
  for (const PushedSlot& slot : slots) out.emplace_back(slot.step, slot.microbatch);
  return out;
}

// What the plan says rank 0 of a one-rank job receives, in order.
std::vector<std::pair<int64_t, uint32_t>> Expected(const std::vector<int>& microbatches) {
  std::vector<std::pair<int64_t, uint32_t>> out;
  for (size_t step = 0; step < microbatches.size(); ++step) {
    for (int m = 0; m < microbatches[step]; ++m) out.emplace_back(step, m);
  }
  return out;
}

TEST_F(JobRunnerTest, PushesNoMoreSlotsThanTheRingHasFreeAndMoreAsTheyAreReleased) {
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/2);
  const uint64_t id = Attach(0, /*slots=*/2);
  EXPECT_EQ(sender_->WaitForPushes(id, 2).size(), 2u);
  // The runner goes round its loop at least every 100 ms: three rounds
  // without a credit must not push a third slot.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(sender_->Pushed(id).size(), 2u);
  sender_->Release(id, 1);
  EXPECT_EQ(sender_->WaitForPushes(id, 3).size(), 3u);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(sender_->Pushed(id).size(), 3u);
  // Every slot in the plan's order: step by step, microbatch by microbatch.
  sender_->ReleaseEverything(id);
  const std::vector<int> microbatches = {MicrobatchesOf(0), MicrobatchesOf(1), MicrobatchesOf(2)};
  const std::vector<std::pair<int64_t, uint32_t>> want = Expected(microbatches);
  std::vector<PushedSlot> pushed = sender_->WaitForPushes(id, want.size());
  pushed.resize(want.size());
  EXPECT_THAT(Positions(pushed), ElementsAreArray(want));
  EXPECT_EQ(sender_->pushes_without_credit(), 0);
}

// A ring mapped into the daemon is written in place: every byte of every
// field (the slot starts as garbage), the same bytes as a pushed copy.
TEST_F(JobRunnerTest, AStartThatFailsBeforeItsThreadIsAClearErrorNotACrash) {
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/1);
  // No transport: the sender cannot be made.
  JobRunnerOptions no_sender;
  no_sender.make_sender = []() -> absl::StatusOr<std::unique_ptr<transport::SlotSender>> {
    return absl::UnavailableError("no UCX transport here");
  };
  absl::StatusOr<std::unique_ptr<JobRunner>> runner = JobRunner::Start(*job_, storage_, no_sender);
  EXPECT_TRUE(absl::IsUnavailable(runner.status())) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()),
              ::testing::HasSubstr("no UCX transport here"));
  // A ledger journal that cannot be opened (its directory is missing).
  JobRunnerOptions no_ledger;
  no_ledger.ledger_path = temp_.Prefix("missing") + "/dir/ledger";
  runner = JobRunner::Start(*job_, storage_, no_ledger);
  EXPECT_FALSE(runner.ok());
}

TEST_F(JobRunnerTest, AMappedRingIsWrittenInPlaceWithTheSameBytes) {
  std::vector<PushedSlot> runs[2];
  for (bool mapped : {false, true}) {
    mapped_ = mapped;
    StartDatasetJob(/*dp=*/2, /*prefetch_steps=*/1);
    const uint64_t id = Attach(1, /*slots=*/64);
    const size_t want = static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1));
    runs[mapped] = sender_->WaitForPushes(id, want);
    ASSERT_GE(runs[mapped].size(), want);
    runs[mapped].resize(want);
    runner_.reset();
    job_.reset();
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].fields, runs[1][i].fields) << "slot " << i;
  }
}

// Split at every EOD (reset_attention_mask), a microbatch holds far more
// sequences than the global batch: the slot the job asks for still fits
// them (the fake refuses a push that does not fit, as Sender does).
TEST_F(JobRunnerTest, APretrainingSlotFitsOneSequencePerDocument) {
  prefix_ = temp_.Prefix("gpt");
  // Tokens 0 and 1 only, 0 the EOD: about every other token ends a document.
  std::vector<int64_t> lengths(64, 100);
  ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths, {.vocab_size = 2}).ok());
  Start(ParseJob(absl::StrCat("datasets { prefix: \"", prefix_,
                              "\" kind: DATASET_KIND_PRETRAINING } global_batch: 2 "
                              "seq_length: 512 eod_id: 0 pretraining { split: \"1,0,0\" "
                              "train_samples: 8 micro_batch_size: 1 reset_attention_mask: true }")),
        nullptr, /*prefetch_steps=*/1);
  const uint64_t id = Attach(0, /*slots=*/4);
  const std::vector<PushedSlot> pushed = sender_->WaitForPushes(id, 2);
  ASSERT_GE(pushed.size(), 2u) << sender_->ClosedWith(id);
  const size_t boundaries = pushed[0].fields.at("cu_seqlens").size() / sizeof(int32_t);
  EXPECT_GT(boundaries, 64u);
}

// Megatron's hybrid CP: each step's sub-samples (the document pieces of
// its samples) are planned at their own CP size. Both ranks of a group of 2
// hold its sub-samples in the same order, each rank its zigzag part; over
// the step every gid runs once, and the real tokens of all of them are
// every token of the global batch. Over 2 ranks a microbatch's CP groups
// are one of 2 and two of 1, so its hybrid_group is one per CP size.
TEST_F(JobRunnerTest, AHybridCpStepServesEverySubSampleOnceAtItsCpSize) {
  prefix_ = temp_.Prefix("gpt");
  std::vector<int64_t> lengths;
  for (int i = 0; i < 200; ++i) lengths.push_back(5 + (i * 53) % 97);
  ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths, {}).ok());
  Start(ParseJob(absl::StrCat("datasets { prefix: \"", prefix_,
                              "\" kind: DATASET_KIND_PRETRAINING } topology { dp: 2 } "
                              "global_batch: 4 seq_length: 128 eod_id: 0 "
                              "scheduler { max_tokens_per_rank: 64 } "
                              "pretraining { split: \"1,0,0\" train_samples: 8 "
                              "inter_document_masking: true hybrid_context_parallel: true }")),
        nullptr, /*prefetch_steps=*/1);
  const int microbatches = MicrobatchesOf(0);
  ASSERT_GT(microbatches, 0);
  std::vector<PushedSlot> pushed[2];
  for (int rank = 0; rank < 2; ++rank) {
    const uint64_t id = Attach(rank, /*slots=*/64);
    pushed[rank] = sender_->WaitForPushes(id, static_cast<size_t>(microbatches));
    ASSERT_GE(pushed[rank].size(), static_cast<size_t>(microbatches)) << sender_->ClosedWith(id);
  }
  auto ints = [](const std::string& bytes, auto type) {
    std::vector<decltype(type)> out(bytes.size() / sizeof(type));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  };
  std::map<int64_t, int> runs;             // gid: the ranks it ran on
  std::map<int32_t, int32_t> group_of_cp;  // local_cp_size: hybrid_group
  int64_t real_tokens = 0;
  for (int m = 0; m < microbatches; ++m) {
    const int32_t c = ints(pushed[0][m].fields.at("local_cp_size"), int32_t{})[0];
    ASSERT_EQ(ints(pushed[1][m].fields.at("local_cp_size"), int32_t{})[0], c) << "group " << m;
    const int32_t group = ints(pushed[0][m].fields.at("hybrid_group"), int32_t{})[0];
    EXPECT_EQ(ints(pushed[1][m].fields.at("hybrid_group"), int32_t{})[0], group);
    EXPECT_EQ(group_of_cp.emplace(c, group).first->second, group) << "microbatch " << m;
    for (int rank = 0; rank < 2; ++rank) {
      const std::vector<int64_t> gids = ints(pushed[rank][m].fields.at("sample_ids"), int64_t{});
      ASSERT_EQ(gids.size() + 1, ints(pushed[rank][m].fields.at("cu_seqlens"), int32_t{}).size());
      for (int64_t gid : gids) ++runs[gid];
      // Loss is taken on every real token (no EOD mask): a rank's ones are
      // its real positions.
      const std::vector<float> mask = ints(pushed[rank][m].fields.at("loss_mask"), float{});
      for (float one : mask) real_tokens += one == 1.0f ? 1 : 0;
    }
    if (c == 2) {
      EXPECT_EQ(pushed[0][m].fields.at("sample_ids"), pushed[1][m].fields.at("sample_ids"));
    }
  }
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.begin()->first, 0);
  EXPECT_EQ(runs.rbegin()->first, static_cast<int64_t>(runs.size()) - 1);
  // A gid on a group of 2 counts twice, each rank holding half of it.
  EXPECT_EQ(real_tokens, 4 * 128);
  for (const auto& [gid, ranks] : runs) EXPECT_LE(ranks, 2) << "gid " << gid;
  // Numbered from 0 in order of first appearance, one per partition.
  std::set<int32_t> groups;
  for (const auto& [c, group] : group_of_cp) groups.insert(group);
  EXPECT_EQ(groups.size(), group_of_cp.size());
  EXPECT_EQ(*groups.rbegin(), static_cast<int32_t>(groups.size()) - 1);
}

TEST_F(JobRunnerTest, ARankBehindHoldsTheOthersWithinPrefetchSteps) {
  StartDatasetJob(/*dp=*/2, /*prefetch_steps=*/1);
  const uint64_t fast = Attach(0, /*slots=*/4);
  const uint64_t slow = Attach(1, /*slots=*/1);
  sender_->ReleaseEverything(fast);
  // The slow rank holds its one slot of step 0: the fast one may run one
  // step ahead of it, and no further.
  sender_->WaitForPushes(slow, 1);
  sender_->WaitForPushes(fast, static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1)));
  absl::SleepFor(absl::Milliseconds(300));
  int64_t furthest = -1;
  for (const PushedSlot& slot : sender_->Pushed(fast)) furthest = std::max(furthest, slot.step);
  EXPECT_EQ(furthest, 1) << "the fast rank ran to step " << furthest
                         << " while the slow one was in step 0";
  // Once the slow rank takes its slots, both go on.
  sender_->ReleaseEverything(slow);
  const size_t want = static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1) +
                                          MicrobatchesOf(2) + MicrobatchesOf(3));
  EXPECT_GE(sender_->WaitForPushes(fast, want).size(), want);
  EXPECT_GE(sender_->WaitForPushes(slow, want).size(), want);
}

// Plans are made on the planner thread, never on the runner thread that
// pushes: with the plan of step 2 held back (as a 16 384-rank plan takes
// ~170 ms), steps 0 and 1 are pushed in full and the runner answers a stats
// call, and step 2 follows once its plan is let go. Inline planning would
// hang here. The planner goes on to later steps after the test's body
// returns, so the notification is the planner's to keep, not the body's.
TEST_F(JobRunnerTest, APlanUnderWayHoldsNoPushOfTheStepsPlannedBefore) {
  auto let_go = std::make_shared<absl::Notification>();
  JobRunnerOptions options;
  options.plan_step = [let_go](const Job& job, int64_t step) {
    if (step >= 2) let_go->WaitForNotification();
    return PlanStep(job, step);
  };
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/2, std::move(options));
  const uint64_t id = Attach(0, /*slots=*/64);
  sender_->ReleaseEverything(id);
  const size_t first_two = static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1));
  EXPECT_EQ(sender_->WaitForPushes(id, first_two).size(), first_two);
  absl::Notification answered;
  runner_->Stats([&answered](JobFigures) { answered.Notify(); });
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the runner thread is stuck behind a plan";
  EXPECT_EQ(sender_->Pushed(id).size(), first_two);  // step 2 is not planned yet
  let_go->Notify();
  const size_t three = first_two + static_cast<size_t>(MicrobatchesOf(2));
  EXPECT_GE(sender_->WaitForPushes(id, three).size(), three);
}

TEST_F(JobRunnerTest, AReattachedRankGetsTheSameBytesFromWhereItStopped) {
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/2);
  const uint64_t first = Attach(0, /*slots=*/2);
  sender_->ReleaseEverything(first);
  const size_t through_step_2 =
      static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1) + MicrobatchesOf(2));
  std::vector<PushedSlot> before = sender_->WaitForPushes(first, through_step_2);
  ASSERT_GE(before.size(), through_step_2);
  // The rank stops after step 0 and microbatch 0 of step 1 and comes back.
  const size_t resume_at = static_cast<size_t>(MicrobatchesOf(0)) + 1;
  ASSERT_TRUE(Detach(0, first, 1, 1, 2).ok());
  EXPECT_EQ(sender_->ClosedWith(first), "");
  const uint64_t second = Attach(0, /*slots=*/2, /*start_step=*/1, /*start_microbatch=*/1);
  EXPECT_NE(second, first);
  sender_->ReleaseEverything(second);
  const std::vector<PushedSlot> after = sender_->WaitForPushes(second, through_step_2 - resume_at);
  ASSERT_GE(after.size(), through_step_2 - resume_at);
  for (size_t i = 0; i < through_step_2 - resume_at; ++i) {
    const PushedSlot& want = before[resume_at + i];
    EXPECT_EQ(after[i].step, want.step);
    EXPECT_EQ(after[i].microbatch, want.microbatch);
    EXPECT_EQ(after[i].fields, want.fields) << "slot " << i << " after the re-attach";
  }
}

// Over TCP (no uid), a rewind serves again what a rank consumed: only the
// rank's own process, by its connection's key, or the admin token may ask
// for one. Resuming where the rank stands needs neither. Every later call
// proves itself by the connection's id and key.
TEST_F(JobRunnerTest, OverTcpOnlyTheRanksOwnKeyOrTheAdminTokenRewindsIt) {
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/2);
  const uint64_t first = Attach(0, /*slots=*/2);
  const absl::StatusOr<transport::ConnectionKey> key = runner_->KeyOf(0);
  ASSERT_TRUE(key.ok()) << key.status();
  sender_->ReleaseEverything(first);
  const size_t through_step_1 = static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1));
  ASSERT_GE(sender_->WaitForPushes(first, through_step_1).size(), through_step_1);
  ASSERT_TRUE(Detach(0, first, 2, 0, 2).ok());

  auto attach = [&](int64_t step, std::optional<transport::ConnectionKey> previous,
                    bool may_rewind) {
    AttachArgs args;
    args.global_rank = 0;
    args.worker_address = "rank";
    args.ring_descriptor = "2";
    args.ring_slots = 2;
    args.start_step = step;
    args.previous_key = previous;
    args.may_rewind = may_rewind;
    return AttachWith(std::move(args));
  };
  transport::ConnectionKey other = *key;
  other[0] ^= 1;
  const absl::StatusOr<uint64_t> stranger = attach(0, other, /*may_rewind=*/false);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kPermissionDenied) << stranger.status();
  EXPECT_THAT(stranger.status().message(),
              ::testing::HasSubstr("would serve again what it consumed"));
  EXPECT_EQ(attach(0, std::nullopt, false).status().code(), absl::StatusCode::kPermissionDenied);
  // Its own process, by the key of its connection: a rewind.
  const absl::StatusOr<uint64_t> own = attach(0, *key, false);
  ASSERT_TRUE(own.ok()) << own.status();
  // A later call with the new connection's id proves itself by its key only.
  const absl::StatusOr<transport::ConnectionKey> now = runner_->KeyOf(0);
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(runner_->CheckConnection(0, *own, transport::KeyBytes(*now)).ok());
  EXPECT_EQ(runner_->CheckConnection(0, *own, transport::KeyBytes(*key)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(runner_->CheckConnection(0, first, transport::KeyBytes(*key)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(runner_->CheckConnection(0, *own, "short").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(runner_->CheckConnection(1, *own, transport::KeyBytes(*now)).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Detach(0, *own, 0, 0, 2).ok());
  // The admin token (may_rewind), and no rewind at all, need no key.
  EXPECT_TRUE(attach(0, std::nullopt, /*may_rewind=*/true).ok());
}

// Clients report each connection's own figures; the runner adds the
// connections of a rank once each, and a late report of an ended
// connection adds nothing.
TEST_F(JobRunnerTest, ARanksTimesAddUpOverItsConnectionsOnceEach) {
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/2);
  auto report = [&](uint64_t id, double wait, uint64_t calls, uint64_t copied) {
    const TrainerTimes times{wait, 2 * wait, calls, copied};
    absl::Notification done;
    absl::Status status;
    runner_->Report(0, id, times, {}, [&](absl::Status result) {
      status = std::move(result);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  };
  auto rank_stats = [&] { return Figures().ranks.at(0); };
  const uint64_t first = Attach(0, /*slots=*/2);
  ASSERT_TRUE(report(first, 1.0, 10, 1).ok());
  ASSERT_TRUE(report(first, 0.5, 5, 0).ok());  // older, arriving late: ignored
  ASSERT_TRUE(Detach(0, first, 0, 0, 2).ok());
  const uint64_t second = Attach(0, /*slots=*/2);
  EXPECT_EQ(report(first, 9.0, 90, 9).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(report(second, 0.25, 3, 2).ok());
  const RankFigures stats = rank_stats();
  EXPECT_DOUBLE_EQ(stats.times.wait_seconds, 1.25);
  EXPECT_DOUBLE_EQ(stats.times.busy_seconds, 2.5);
  EXPECT_EQ(stats.times.calls, 13u);
  EXPECT_EQ(stats.times.copied_out, 3u);
  EXPECT_DOUBLE_EQ(stats.input_bound, 1.0 / 3);
}

// Into a device ring the daemon writes, the small fields (max_seqlen) also
// ride in the slot's metadata, byte for byte, so the client reads them
// without waiting for the device; into a host ring they do not.
TEST_F(JobRunnerTest, ADeviceRingsSmallFieldsRideInTheMetadata) {
  for (const bool device : {true, false}) {
    device_ = device;
    StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/1);
    const uint64_t id = Attach(0, /*slots=*/4);
    const std::vector<PushedSlot> pushed = sender_->WaitForPushes(id, 2);
    ASSERT_GE(pushed.size(), 2u);
    for (const PushedSlot& slot : pushed) {
      v1::SlotMetadata metadata;
      ASSERT_TRUE(metadata.ParseFromString(slot.metadata));
      if (!device) {
        EXPECT_TRUE(metadata.small_fields().empty());
        continue;
      }
      ASSERT_EQ(metadata.small_fields().count("max_seqlen"), 1u);
      EXPECT_EQ(metadata.small_fields().at("max_seqlen"), slot.fields.at("max_seqlen"));
      EXPECT_EQ(metadata.small_fields().count("tokens"), 0u);  // too large to ride along
    }
    runner_.reset();
    job_.reset();
  }
}

// A client that asked for a device ring the daemon writes and stages its
// own copies says why at attach; the rank's stats carry it.
TEST_F(JobRunnerTest, ADeviceRingFallbackReachesTheRanksStats) {
  StartDatasetJob(/*dp=*/2, /*prefetch_steps=*/1);
  Attach(0, /*slots=*/2, 0, 0, "GPU 0 is in compute mode exclusive-process");
  Attach(1, /*slots=*/2);
  const JobFigures stats = Figures();
  EXPECT_EQ(stats.ranks.at(0).device_ring_fallback, "GPU 0 is in compute mode exclusive-process");
  EXPECT_EQ(stats.ranks.at(1).device_ring_fallback, "");
}

TEST_F(JobRunnerTest, AFailedConnectionIsDroppedAndTheOtherRanksAreServed) {
  StartDatasetJob(/*dp=*/2, /*prefetch_steps=*/1);
  const uint64_t healthy = Attach(0, /*slots=*/2);
  const uint64_t doomed = Attach(1, /*slots=*/2);
  sender_->WaitForPushes(doomed, 2);
  sender_->Fail(doomed);
  // The failed rank no longer holds the others back.
  sender_->ReleaseEverything(healthy);
  const size_t want = static_cast<size_t>(MicrobatchesOf(0) + MicrobatchesOf(1) +
                                          MicrobatchesOf(2) + MicrobatchesOf(3));
  EXPECT_GE(sender_->WaitForPushes(healthy, want).size(), want);
  EXPECT_EQ(runner_->attached_ranks(), 1);
  // The same rank attaches again: a new connection, served at once.
  const uint64_t back = Attach(1, /*slots=*/2);
  EXPECT_EQ(sender_->WaitForPushes(back, 2).size(), 2u);
  EXPECT_EQ(runner_->attached_ranks(), 2);
}

// Side rows are read per CP group and microbatch, not held per step: with
// no read-ahead a rank holds only the rows of the microbatch it is being
// sent, and none while it has no free slot; with read-ahead the rows wait
// for it. The bytes sent are the same either way, and nothing is held once
// the ranks are gone.
TEST_F(JobRunnerTest, SideRowsAreReadPerMicrobatchAndDroppedOnceSent) {
  std::vector<PushedSlot> runs[2];
  // The second run reads ahead within one microbatch's field (as the first
  // run measured it): well below what its rings' free slots would take.
  uint64_t bound = 0;
  for (int run : {0, 1}) {
    JobRunnerOptions options;
    options.side_rows_read_ahead_bytes = bound;
    StartSideFieldJob(/*dp=*/2, std::move(options));
    const uint64_t ids[2] = {Attach(0, /*slots=*/2), Attach(1, /*slots=*/2)};
    uint64_t largest_field = 0;
    for (uint64_t id : ids) {
      for (const PushedSlot& slot : sender_->WaitForPushes(id, 2)) {
        ASSERT_EQ(slot.fields.count("experts"), 1u);
        largest_field = std::max<uint64_t>(largest_field, slot.fields.at("experts").size());
      }
    }
    // Stats run on the runner's thread between its rounds: after the two
    // pushes each ring is full, and nothing more is fetched for it.
    const JobFigures full = Figures();
    uint64_t ahead = full.side_rows_bytes;
    if (run == 0) {
      EXPECT_EQ(ahead, 0u);
      // The rows read for a microbatch are at most the field sent (which
      // adds padding): one microbatch per rank at a time.
      EXPECT_GT(full.peak_side_rows_bytes, 0u);
      EXPECT_LE(full.peak_side_rows_bytes, 2 * largest_field);
      bound = largest_field;
    } else {
      for (int i = 0; i < 100 && ahead == 0; ++i) {
        absl::SleepFor(absl::Milliseconds(10));
        ahead = Figures().side_rows_bytes;
      }
    }
    for (uint64_t id : ids) sender_->ReleaseEverything(id);
    size_t want = 0;
    for (int64_t step = 0; step < 4; ++step) want += static_cast<size_t>(MicrobatchesOf(step));
    std::vector<PushedSlot>& pushed = runs[run];
    for (uint64_t id : ids) {
      std::vector<PushedSlot> slots = sender_->WaitForPushes(id, want);
      ASSERT_GE(slots.size(), want);
      pushed.insert(pushed.end(), slots.begin(), slots.begin() + static_cast<ptrdiff_t>(want));
    }
    if (run == 1) {
      // Reading stops once the bound is reached, so at most one group's
      // rows (one microbatch's field, dp 2 × cp 1) lie past it; the two
      // free slots of each ring alone would have taken four.
      uint64_t group_rows = 0;
      for (const PushedSlot& slot : pushed) {
        group_rows = std::max<uint64_t>(group_rows, slot.fields.at("experts").size());
      }
      EXPECT_GT(ahead, 0u);
      EXPECT_LE(ahead, bound + group_rows);
    }
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(Detach(rank, ids[rank], 0, 0, 2).ok());
    }
    EXPECT_EQ(Figures().side_rows_bytes, 0u);
    runner_.reset();
    job_.reset();
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].fields, runs[1][i].fields) << "slot " << i;
  }
}

// Side rows that cannot be read end the ranks that need them, saying which
// field and why; nothing wrong is sent.
TEST_F(JobRunnerTest, SideRowsThatCannotBeReadEndTheRankWithTheReason) {
  StartSideFieldJob(/*dp=*/1, {});
  std::filesystem::resize_file(prefix_ + "_experts.bin", 0);
  const uint64_t id = Attach(0, /*slots=*/2);
  const std::string reason = sender_->WaitForClose(id);
  EXPECT_THAT(reason, ::testing::HasSubstr("side field experts: "));
  EXPECT_THAT(reason, ::testing::HasSubstr(prefix_ + "_experts document "));
  EXPECT_TRUE(sender_->Pushed(id).empty());
}

// A ring shared by descriptor gets its side rows read from the file
// straight into its slots: the same bytes as rows held and copied, and no
// row is held. TP peers are filled together: the rows are read once.
TEST_F(JobRunnerTest, SideRowsAreReadIntoTheSlotsOfARingSharedByDescriptor) {
  for (const int tp : {1, 2}) {
    std::vector<PushedSlot> runs[2];
    for (bool shared : {false, true}) {
      mapped_ = true;
      shared_ = shared;
      const uint64_t reread_before = SideRowsReRead();
      StartSideFieldJob(/*dp=*/2 / tp, {}, tp);
      const uint64_t ids[2] = {Attach(0, /*slots=*/3), Attach(1, /*slots=*/3)};
      for (uint64_t id : ids) sender_->ReleaseEverything(id);
      size_t want = 0;
      for (int64_t step = 0; step < 4; ++step) want += static_cast<size_t>(MicrobatchesOf(step));
      for (uint64_t id : ids) {
        std::vector<PushedSlot> slots = sender_->WaitForPushes(id, want);
        ASSERT_GE(slots.size(), want);
        runs[shared].insert(runs[shared].end(), slots.begin(),
                            slots.begin() + static_cast<ptrdiff_t>(want));
      }
      EXPECT_EQ(Figures().peak_side_rows_bytes == 0, shared) << "tp " << tp;
      if (shared) {
        EXPECT_EQ(SideRowsReRead(), reread_before) << "tp " << tp;
      }
      runner_.reset();
      job_.reset();
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      ASSERT_EQ(runs[0][i].fields.count("experts"), 1u);
      EXPECT_EQ(runs[0][i].fields, runs[1][i].fields) << "slot " << i << ", tp " << tp;
    }
  }
}

// Read into the slot, rows that cannot be read end the rank with the file
// and the reason; the slot is never announced.
TEST_F(JobRunnerTest, SideRowsThatCannotBeReadIntoTheSlotEndTheRank) {
  mapped_ = shared_ = true;
  StartSideFieldJob(/*dp=*/1, {});
  std::filesystem::resize_file(prefix_ + "_experts.bin", 0);
  const uint64_t id = Attach(0, /*slots=*/2);
  const std::string reason = sender_->WaitForClose(id);
  EXPECT_THAT(reason, ::testing::HasSubstr(prefix_ + "_experts.bin: "));
  EXPECT_TRUE(sender_->Pushed(id).empty());
}

// A rank whose process is gone or stopped (its Watch stream broke) is
// closed without a goodbye, whose flush would wait on it while every other
// rank of the job waits on the runner; a goodbye with a reason still goes to
// a live rank the daemon stops serving (above).
TEST_F(JobRunnerTest, ARankGoneIsClosedWithoutAGoodbyeAndTheOthersGoOn) {
  StartDatasetJob(/*dp=*/2, /*prefetch_steps=*/2);
  const uint64_t gone = Attach(0, /*slots=*/2);
  const uint64_t other = Attach(1, /*slots=*/2);
  EXPECT_GE(sender_->WaitForPushes(gone, 1).size(), 1u);
  runner_->RankGone(0, gone, "its Watch stream broke");
  EXPECT_EQ(sender_->WaitForClose(gone), "");
  EXPECT_TRUE(sender_->Abandoned(gone));
  sender_->ReleaseEverything(other);
  EXPECT_GE(sender_->WaitForPushes(other, 3).size(), 3u);
  EXPECT_FALSE(sender_->Abandoned(other));
}

}  // namespace
}  // namespace packfeed::server
