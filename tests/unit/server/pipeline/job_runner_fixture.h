// The runner's test fixture (job_runner_test.cc, job_runner_ingest_test.cc):
// a real job and the node's real Storage, with a fake SlotSender in place of
// UCX that records every slot it is given.
#ifndef PACKFEED_TESTS_UNIT_SERVER_PIPELINE_JOB_RUNNER_FIXTURE_H_
#define PACKFEED_TESTS_UNIT_SERVER_PIPELINE_JOB_RUNNER_FIXTURE_H_

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
#include "server/pipeline/job_runner.h"
#include "server/pipeline/plan.h"
#include "test_job.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {

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
  // A key of the id's bytes: distinct per connection, as the runner needs.
  absl::StatusOr<transport::ConnectionKey> Key(uint64_t id) const override {
    absl::MutexLock lock(&mutex_);
    if (rings_.count(id) == 0) return absl::NotFoundError("no such connection");
    transport::ConnectionKey key{};
    std::memcpy(key.data(), &id, sizeof(id));
    return key;
  }
  absl::Status Disconnect(uint64_t id, absl::string_view reason) override {
    absl::MutexLock lock(&mutex_);
    if (rings_.count(id) == 0) return absl::NotFoundError("no such connection");
    rings_[id].closed = true;
    rings_[id].reason = std::string(reason);
    return absl::OkStatus();
  }
  absl::Status Abandon(uint64_t id) override {
    absl::MutexLock lock(&mutex_);
    if (rings_.count(id) == 0) return absl::NotFoundError("no such connection");
    rings_[id].closed = true;
    rings_[id].abandoned = true;
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
  bool Abandoned(uint64_t id) const {
    absl::MutexLock lock(&mutex_);
    const Ring* ring = Find(id);
    return ring != nullptr && ring->abandoned;
  }
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
    bool abandoned = false;  // closed without a goodbye
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
inline v1::JobConfig ParseJob(const std::string& body, const std::string& extra = "") {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseDaemonConfig("jobs { name: \"j\" " + body + " }" + extra, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config->jobs(0);
}

class JobRunnerTest : public ::testing::Test {
 protected:
  // A job of `dp` DP ranks over 400 generated documents of 20-200 tokens
  // (test_job.h).
  void StartDatasetJob(int dp, int prefetch_steps, JobRunnerOptions options = {}) {
    prefix_ = temp_.Prefix("data");
    ASSERT_TRUE(WriteTestJobData(prefix_, /*side_field=*/false).ok());
    Start(ParseJob(TestJobBody(prefix_, dp, /*tp=*/1, /*side_field=*/false)), nullptr,
          prefetch_steps, std::move(options));
  }

  // The same job with an int16 [2, 2] side field "experts" beside its
  // tokens (PREFIX_experts).
  void StartSideFieldJob(int dp, JobRunnerOptions options, int tp = 1) {
    prefix_ = temp_.Prefix("data");
    ASSERT_TRUE(WriteTestJobData(prefix_, /*side_field=*/true).ok());
    Start(ParseJob(TestJobBody(prefix_, dp, tp, /*side_field=*/true)), nullptr,
          /*prefetch_steps=*/2, std::move(options));
  }

  void Start(const v1::JobConfig& config, IngestStream* stream, int prefetch_steps,
             JobRunnerOptions options = {}) {
    // As the daemon does: the storage opens the datasets (and keeps them
    // while its reader threads may still use them).
    const DatasetOpener open = [this](const std::string& prefix) { return storage_.Open(prefix); };
    absl::StatusOr<std::unique_ptr<Job>> job = JobOfConfig(config, open, stream);
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
    args.may_rewind = true;  // as a caller on the Unix socket
    if (shared_) {
      absl::StatusOr<transport::SharedRing> ring = transport::SharedRing::Create(4096);
      EXPECT_TRUE(ring.ok()) << ring.status();
      if (ring.ok()) args.shared_ring = std::make_shared<transport::SharedRing>(*std::move(ring));
    }
    absl::StatusOr<uint64_t> id = AttachWith(std::move(args));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  // The runner's answer to an attach of `args`.
  absl::StatusOr<uint64_t> AttachWith(AttachArgs args) {
    absl::Notification attached;
    absl::StatusOr<uint64_t> id;
    runner_->Attach(std::move(args), [&](absl::StatusOr<uint64_t> result) {
      id = std::move(result);
      attached.Notify();
    });
    attached.WaitForNotification();
    return id;
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

}  // namespace packfeed::server

#endif  // PACKFEED_TESTS_UNIT_SERVER_PIPELINE_JOB_RUNNER_FIXTURE_H_
