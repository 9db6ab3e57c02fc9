// The runner driven step by step in one process: a real job over a
// generated dataset, the node's real Storage, and a fake SlotSender in place
// of UCX, so each rule of the runner is seen at the slot it applies to:
// credits, read-ahead bounded by the slowest rank, re-attach, a failed
// connection, and an ingest job woken by a seal. End-to-end daemons run in
// tests/integration/ and tests/python/.
#include "server/pipeline/job_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/transport/slot_sender.h"
#include "packfeed/v1/service.pb.h"
#include "server/config/daemon_config.h"
#include "server/ingest/ingest_stream.h"
#include "server/pipeline/plan.h"
#include "test_paths.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAreArray;

// One pushed slot, its fields copied.
struct PushedSlot {
  int64_t step = 0;
  uint32_t microbatch = 0;
  std::map<std::string, std::string> fields;
  std::string metadata;  // SlotMetadata, serialized
  uint64_t order = 0;    // of the pushes to every connection of the sender

  std::vector<int64_t> Tokens() const {
    const std::string& bytes = fields.at("tokens");
    std::vector<int64_t> tokens(bytes.size() / sizeof(int64_t));
    std::memcpy(tokens.data(), bytes.data(), bytes.size());
    return tokens;
  }
};

// Rings kept in memory: a connection's ring descriptor is its slot count
// as text. Credits are the ring's slots less those pushed and not released;
// the test releases slots (or lets a ring release everything it is given).
class FakeSlotSender : public transport::SlotSender {
 public:
  std::string worker_address() const override { return "fake"; }

  absl::StatusOr<uint64_t> Connect(absl::string_view, absl::string_view ring) override {
    absl::MutexLock lock(&mutex_);
    const uint64_t id = ++last_id_;
    rings_[id].slots = static_cast<uint64_t>(std::stoul(std::string(ring)));
    return id;
  }
  // The ring's memory is not used: slots are the fake's own (MapNextSlot).
  absl::StatusOr<uint64_t> ConnectShared(absl::string_view address, absl::string_view ring,
                                         std::shared_ptr<transport::SharedRing>) override {
    return Connect(address, ring);
  }
  absl::Status Disconnect(uint64_t id, absl::string_view reason) override {
    absl::MutexLock lock(&mutex_);
    if (rings_.count(id) == 0) return absl::NotFoundError("no such connection");
    rings_[id].closed = true;
    rings_[id].reason = std::string(reason);
    return absl::OkStatus();
  }
  absl::StatusOr<uint32_t> Credits(uint64_t id) const override {
    absl::MutexLock lock(&mutex_);
    const Ring* ring = Find(id);
    if (ring == nullptr) return absl::NotFoundError("no such connection");
    if (ring->failed) return absl::UnavailableError("receiver failed");
    return static_cast<uint32_t>(ring->slots - (ring->pushed.size() - ring->released));
  }
  absl::Status Push(uint64_t id, const transport::SlotContent& content) override {
    absl::MutexLock lock(&mutex_);
    return Record(id, content, /*mapped=*/false);
  }
  // Slots written in place when mapping (as same-node shared memory is):
  // each starts full of 0xEE, so a byte the runner does not write shows.
  // One per connection: another's may be written meanwhile.
  absl::StatusOr<transport::MappedSlot> MapNextSlot(uint64_t id) override {
    absl::MutexLock lock(&mutex_);
    Ring* ring = Find(id);
    if (!mapped_ || ring == nullptr || ring->pushed.size() - ring->released >= ring->slots) {
      return absl::FailedPreconditionError("no mapped slot");
    }
    ring->mapped_slot.assign(slot_bytes_, 0xEE);
    return transport::MappedSlot{ring->mapped_slot.data(), slot_bytes_, ring->pushed.size()};
  }
  absl::Status CommitMapped(uint64_t id, const transport::SlotContent& content) override {
    absl::MutexLock lock(&mutex_);
    return Record(id, content, /*mapped=*/true);
  }
  absl::StatusOr<transport::ConnectionStats> Stats(uint64_t id) const override {
    absl::MutexLock lock(&mutex_);
    const Ring* ring = Find(id);
    if (ring == nullptr) return absl::NotFoundError("no such connection");
    transport::ConnectionStats stats;
    stats.pushed = ring->pushed.size();
    stats.taken = ring->released;
    stats.released = ring->released;
    stats.bytes = ring->bytes;
    stats.credits = static_cast<uint32_t>(ring->slots - (ring->pushed.size() - ring->released));
    stats.mapped = mapped_;
    stats.device = device_;
    stats.shared = device_ || shared_;
    return stats;
  }
  void ProgressOrWait(absl::Duration timeout) override {
    absl::MutexLock lock(&mutex_);
    mutex_.AwaitWithTimeout(absl::Condition(&woken_), timeout);
    woken_ = false;
  }
  void Wake() override {
    absl::MutexLock lock(&mutex_);
    woken_ = true;
  }

  // The test's side: before any connection.
  void set_slot_bytes(uint64_t bytes) { slot_bytes_ = bytes; }
  void set_mapped(bool mapped) { mapped_ = mapped; }
  // As a device ring the daemon copies into: written in place (mapped).
  void set_device(bool device) { device_ = mapped_ = device; }
  // As a host ring shared by descriptor (memfd): written in place.
  void set_shared(bool shared) { shared_ = mapped_ = shared; }

  void Release(uint64_t id, uint64_t count) {
    absl::MutexLock lock(&mutex_);
    rings_[id].released += count;
    woken_ = true;
  }
  void ReleaseEverything(uint64_t id) {
    absl::MutexLock lock(&mutex_);
    rings_[id].release_all = true;
    rings_[id].released = rings_[id].pushed.size();
    woken_ = true;
  }
  void Fail(uint64_t id) {
    absl::MutexLock lock(&mutex_);
    rings_[id].failed = true;
    woken_ = true;
  }
  // Waits up to 10 s for connection `id` to have been pushed `count` slots.
  std::vector<PushedSlot> WaitForPushes(uint64_t id, size_t count) {
    absl::MutexLock lock(&mutex_);
    auto enough = [&] {
      mutex_.AssertHeld();  // absl::Condition runs it under the lock
      return rings_[id].pushed.size() >= count;
    };
    mutex_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return rings_[id].pushed;
  }
  std::vector<PushedSlot> Pushed(uint64_t id) const {
    absl::MutexLock lock(&mutex_);
    return Find(id)->pushed;
  }
  int pushes_without_credit() const {
    absl::MutexLock lock(&mutex_);
    return pushes_without_credit_;
  }
  std::string ClosedWith(uint64_t id) const {
    absl::MutexLock lock(&mutex_);
    const Ring* ring = Find(id);
    return ring->closed ? ring->reason : "<open>";
  }
  // Why connection `id` was closed, once it is (up to 10 s), or "<open>".
  std::string WaitForClose(uint64_t id) {
    absl::MutexLock lock(&mutex_);
    auto closed = [&] {
      mutex_.AssertHeld();
      return rings_[id].closed;
    };
    mutex_.AwaitWithTimeout(absl::Condition(&closed), absl::Seconds(10));
    return rings_[id].closed ? rings_[id].reason : "<open>";
  }

 private:
  // A push (the fields' bytes from `content`, or from the mapped slot at
  // their offsets), refused as the real Sender refuses it.
  absl::Status Record(uint64_t id, const transport::SlotContent& content, bool mapped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    Ring* ring = Find(id);
    if (ring == nullptr) return absl::NotFoundError("no such connection");
    if (ring->failed) return absl::UnavailableError("receiver failed");
    if (ring->pushed.size() - ring->released >= ring->slots) {
      ++pushes_without_credit_;  // the runner asks Credits first
      return absl::ResourceExhaustedError("no free slot");
    }
    std::vector<transport::FieldSpec> specs;
    for (const transport::FieldBuffer& field : content.fields) specs.push_back(field.spec);
    absl::StatusOr<std::vector<transport::FieldDescriptor>> layout =
        transport::LayoutFields(specs, slot_bytes_);
    if (!layout.ok()) return layout.status();
    PushedSlot slot{content.step, content.microbatch, {}, content.inline_metadata, pushes_++};
    for (size_t f = 0; f < specs.size(); ++f) {
      const transport::FieldDescriptor& field = (*layout)[f];
      const char* data =
          mapped ? reinterpret_cast<const char*>(ring->mapped_slot.data()) + field.offset
                 : static_cast<const char*>(content.fields[f].data);
      slot.fields[field.name].assign(data, field.bytes);
      ring->bytes += field.bytes;
    }
    ring->pushed.push_back(std::move(slot));
    if (ring->release_all) ring->released = ring->pushed.size();
    return absl::OkStatus();
  }

  struct Ring {
    uint64_t slots = 0;
    std::vector<PushedSlot> pushed;
    uint64_t released = 0;
    uint64_t bytes = 0;
    bool release_all = false;
    bool failed = false;
    bool closed = false;
    std::string reason;
    std::vector<uint8_t> mapped_slot;
  };
  const Ring* Find(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    auto ring = rings_.find(id);
    return ring == rings_.end() ? nullptr : &ring->second;
  }
  Ring* Find(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    auto ring = rings_.find(id);
    return ring == rings_.end() ? nullptr : &ring->second;
  }

  mutable absl::Mutex mutex_;
  std::map<uint64_t, Ring> rings_ ABSL_GUARDED_BY(mutex_);
  uint64_t last_id_ ABSL_GUARDED_BY(mutex_) = 0;
  bool woken_ ABSL_GUARDED_BY(mutex_) = false;
  int pushes_without_credit_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t pushes_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t slot_bytes_ = UINT64_MAX;
  bool mapped_ = false;
  bool device_ = false;
  bool shared_ = false;
};

// `body` is the job's configuration without its name.
v1::JobConfig ParseJob(const std::string& body, const std::string& extra = "") {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseDaemonConfig("jobs { name: \"j\" " + body + " }" + extra, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config->jobs(0);
}

class JobRunnerTest : public ::testing::Test {
 protected:
  // A job of `dp` DP ranks over 400 generated documents of 20-200 tokens.
  void StartDatasetJob(int dp, int prefetch_steps, JobRunnerOptions options = {}) {
    prefix_ = temp_.Prefix("data");
    std::vector<int64_t> lengths;
    for (int i = 0; i < 400; ++i) lengths.push_back(20 + (i * 37) % 181);
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths, {}).ok());
    Start(ParseJob(absl::StrCat("datasets { prefix: \"", prefix_, "\" } topology { dp: ", dp,
                                " } global_batch: 16 seq_length: 256 eod_id: 0 seed: 3 "
                                "scheduler { kind: \"balanced\" max_tokens_per_rank: 256 }")),
          nullptr, prefetch_steps, std::move(options));
  }

  // The same job with an int16 [2, 2] side field "experts" beside its
  // tokens (PREFIX_experts).
  void StartSideFieldJob(int dp, JobRunnerOptions options, int tp = 1) {
    prefix_ = temp_.Prefix("data");
    std::vector<int64_t> lengths;
    for (int i = 0; i < 400; ++i) lengths.push_back(20 + (i * 37) % 181);
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths, {}).ok());
    dataset::GeneratedSideField experts{"experts", dataset::GeneratedSideField::Kind::kExperts,
                                        /*layers=*/2, /*top_k=*/2, /*experts=*/8};
    ASSERT_TRUE(dataset::WriteGeneratedSideField(prefix_ + "_experts", lengths, experts, 1).ok());
    Start(ParseJob(absl::StrCat("datasets { prefix: \"", prefix_, "\" } topology { dp: ", dp,
                                " tp: ", tp,
                                " } global_batch: 16 seq_length: 256 eod_id: 0 seed: 3 "
                                "scheduler { kind: \"balanced\" max_tokens_per_rank: 256 } "
                                "side_fields { name: \"experts\" dtype: \"int16\" "
                                "inner_shape: [2, 2] pad_value: -1 }")),
          nullptr, /*prefetch_steps=*/2, std::move(options));
  }

  void Start(const v1::JobConfig& config, IngestStream* stream, int prefetch_steps,
             JobRunnerOptions options = {}) {
    // As the daemon does: the storage opens the datasets (and keeps them
    // while its reader threads may still use them).
    const DatasetOpener open = [this](const std::string& prefix) { return storage_.Open(prefix); };
    absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(config, open, stream);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    options.prefetch_steps = prefetch_steps;
    options.make_sender = [this]() -> absl::StatusOr<std::unique_ptr<transport::SlotSender>> {
      auto sender = std::make_unique<FakeSlotSender>();
      // Rings of the size the job asks its ranks for (attach refuses less).
      sender->set_slot_bytes(job_->required_slot_bytes());
      sender->set_mapped(mapped_);
      if (device_) sender->set_device(true);
      if (shared_) sender->set_shared(true);
      sender_ = sender.get();
      return sender;
    };
    absl::StatusOr<std::unique_ptr<JobRunner>> runner = JobRunner::Start(*job_, storage_, options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  // Attaches `rank` with a ring of `slots`; returns the connection id.
  uint64_t Attach(int rank, uint32_t slots, int64_t start_step = 0, int start_microbatch = 0,
                  const std::string& device_ring_fallback = "") {
    AttachArgs args;
    args.device_ring_fallback = device_ring_fallback;
    args.global_rank = rank;
    args.worker_address = "rank";
    args.ring_descriptor = std::to_string(slots);
    args.start_step = start_step;
    args.start_microbatch = start_microbatch;
    args.ring_slots = slots;
    if (shared_) {
      absl::StatusOr<transport::SharedRing> ring = transport::SharedRing::Create(4096);
      EXPECT_TRUE(ring.ok()) << ring.status();
      if (ring.ok()) args.shared_ring = std::make_shared<transport::SharedRing>(*std::move(ring));
    }
    absl::Notification attached;
    absl::StatusOr<uint64_t> id;
    runner_->Attach(args, [&](absl::StatusOr<uint64_t> result) {
      id = std::move(result);
      attached.Notify();
    });
    attached.WaitForNotification();
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  // The runner's stats, as the admin service asks for them.
  JobFigures Figures() {
    absl::Notification done;
    JobFigures stats;
    runner_->Stats([&](JobFigures result) {
      stats = std::move(result);
      done.Notify();
    });
    done.WaitForNotification();
    return stats;
  }

  absl::Status Detach(int rank, uint64_t id, int64_t step, int microbatch, uint32_t slots) {
    absl::Notification detached;
    absl::Status status;
    runner_->Detach(rank, id, JobRunner::DetachPosition{{step, microbatch}, slots}, std::nullopt,
                    [&](absl::Status result) {
                      status = std::move(result);
                      detached.Notify();
                    });
    detached.WaitForNotification();
    return status;
  }

  // The bytes of side-field files the storage read again, so far.
  uint64_t SideRowsReRead() {
    uint64_t bytes = 0;
    for (const StorageFileFigures& file : storage_.Stats().files) {
      if (absl::StrContains(file.path, "_experts")) bytes += file.reread_bytes;
    }
    return bytes;
  }

  // Microbatches of `step` in the job's plan.
  int MicrobatchesOf(int64_t step) {
    absl::StatusOr<StepPlan> plan = PlanStep(*job_, step);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->plan.num_microbatches() : -1;
  }

  testing::ScopedTempDir temp_;
  std::string prefix_;
  Storage storage_{StorageOptions{}};
  std::unique_ptr<IngestStream> stream_;  // an ingest job's; outlives the runner
  std::unique_ptr<Job> job_;
  bool mapped_ = false;               // the sender writes slots in place
  bool device_ = false;               // ... into device rings (copied in)
  bool shared_ = false;               // ... into rings shared by descriptor
  FakeSlotSender* sender_ = nullptr;  // owned by runner_
  std::unique_ptr<JobRunner> runner_;
};

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
// hang here.
TEST_F(JobRunnerTest, APlanUnderWayHoldsNoPushOfTheStepsPlannedBefore) {
  absl::Notification let_go;
  JobRunnerOptions options;
  options.plan_step = [&let_go](const Job& job, int64_t step) {
    if (step >= 2) let_go.WaitForNotification();
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
  let_go.Notify();
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

// Clients report each connection's own figures; the runner adds the
// connections of a rank once each, and a late report of an ended
// connection adds nothing.
TEST_F(JobRunnerTest, ARanksTimesAddUpOverItsConnectionsOnceEach) {
  StartDatasetJob(/*dp=*/1, /*prefetch_steps=*/2);
  auto report = [&](uint64_t id, double wait, uint64_t calls, uint64_t copied) {
    const TrainerTimes times{wait, 2 * wait, calls, copied};
    absl::Notification done;
    absl::Status status;
    runner_->Report(0, id, times, [&](absl::Status result) {
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
  for (uint64_t read_ahead : {uint64_t{0}, uint64_t{16} << 20}) {
    JobRunnerOptions options;
    options.side_rows_read_ahead_bytes = read_ahead;
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
    if (read_ahead == 0) {
      EXPECT_EQ(full.side_rows_bytes, 0u);
      // The rows read for a microbatch are at most the field sent (which
      // adds padding): one microbatch per rank at a time.
      EXPECT_GT(full.peak_side_rows_bytes, 0u);
      EXPECT_LE(full.peak_side_rows_bytes, 2 * largest_field);
    } else {
      uint64_t ahead = full.side_rows_bytes;
      for (int i = 0; i < 100 && ahead == 0; ++i) {
        absl::SleepFor(absl::Milliseconds(10));
        ahead = Figures().side_rows_bytes;
      }
      EXPECT_GT(ahead, 0u);
    }
    for (uint64_t id : ids) sender_->ReleaseEverything(id);
    size_t want = 0;
    for (int64_t step = 0; step < 4; ++step) want += static_cast<size_t>(MicrobatchesOf(step));
    std::vector<PushedSlot>& pushed = runs[read_ahead == 0 ? 0 : 1];
    for (uint64_t id : ids) {
      std::vector<PushedSlot> slots = sender_->WaitForPushes(id, want);
      ASSERT_GE(slots.size(), want);
      pushed.insert(pushed.end(), slots.begin(), slots.begin() + static_cast<ptrdiff_t>(want));
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
  stream.AddConsumer(IngestConsumerOf(*job_), [r = runner_.get()] { r->Wake(); });
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
  stream.AddConsumer(IngestConsumerOf(*job_), [r = runner_.get()] { r->Wake(); });
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
