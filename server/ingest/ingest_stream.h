#ifndef PACKFEED_SERVER_INGEST_INGEST_STREAM_H_
#define PACKFEED_SERVER_INGEST_INGEST_STREAM_H_

// An ingest stream (config.proto IngestStream, docs/INGEST.md): the samples
// drivers put at run time, step by step, held in memory until every
// consumer job has consumed their step.
//
// A step is open while puts add to it and sealed once; consumers plan only
// sealed steps. Its samples are served in the order of their group ids,
// and as put within a group, so that a step sealed with the same samples
// plans the same on every node whatever order concurrent puts arrived in.
// A group lies in one step only.
//
// Memory: the bytes of held samples plus those of puts being transferred
// (reserved) stay within the budget; a put that finds no room is not
// admitted (the caller waits or refuses), never partly kept.
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/planner.h"
#include "server/config/side_fields.h"
#include "server/ingest/ingest_requests.h"

namespace packfeed::server {

// Where ingested samples lie in memory registered with UCX, for peer
// daemons to get them (service.proto's IngestRegion, as the daemon describes
// its own memory).
struct SampleRegion {
  std::string worker_address;  // the daemon's UCX worker
  std::string remote_key;      // packed key of the registered memory
  uint64_t address = 0;        // its base, in the daemon
  uint64_t length = 0;
};

struct IngestedSample {
  int64_t group = 0;
  int64_t tag = 0;
  int64_t num_tokens = 0;
  // The tokens (int64), then every field of the stream back to back in
  // stream order: field f's rows start at field_offsets[f] (from data's
  // start). One buffer, so that side fields are served from it zero-copy.
  std::shared_ptr<const char[]> data;
  std::vector<uint64_t> field_offsets;
  uint64_t data_bytes = 0;
  // Where `data` lies in memory registered with UCX, for peer daemons to
  // get it (a daemon with peers); null otherwise. On a peer, a sample none
  // of its ranks is planned has no data (the step's plan needs only its
  // length).
  std::shared_ptr<const SampleRegion> region;

  absl::Span<const int64_t> tokens() const {
    return {reinterpret_cast<const int64_t*>(data.get()), static_cast<size_t>(num_tokens)};
  }
  uint64_t bytes() const { return data_bytes; }
};

struct SealedStep {
  int64_t step = 0;
  std::vector<IngestedSample> samples;  // in serving order
};

// What a consumer job can take, for the checks at put time.
struct IngestConsumer {
  std::string job;
  int64_t max_samples = 0;            // its global_batch
  dataset::SampleRules rules;         // a sample must be served whole
  scheduler::PlannerOptions planner;  // and fit one of its plans
  // The samples of a sealed step (by index) that this node's ranks of the
  // job are planned: what a peer daemon must fetch of a forwarded step.
  std::function<absl::StatusOr<std::vector<int64_t>>(std::shared_ptr<const SealedStep>)>
      local_samples;
};

// The stream after a put was added.
struct PutOutcome {
  uint64_t samples_held = 0;  // in the step, this put's included
  uint64_t bytes_held = 0;    // by the stream
};

struct SealOutcome {
  uint64_t samples = 0;
  uint64_t groups = 0;
};

// What IngestStream::Stats reports (service.proto's IngestStreamStats).
struct IngestStreamFigures {
  struct Step {
    int64_t step = 0;
    bool sealed = false;
    uint64_t samples = 0;
    uint64_t bytes = 0;
    std::vector<std::string> consumed_by;  // the consumer jobs done with it
  };
  struct Consumer {
    std::string job;
    int64_t consumed_before = 0;  // every local rank consumed the steps before
    uint64_t bytes_pending = 0;   // held steps it has still to consume
  };
  std::string name;
  uint64_t bytes_held = 0;
  uint64_t peak_bytes_held = 0;
  uint64_t budget_bytes = 0;  // 0 = unbounded
  uint64_t samples_put = 0;
  uint64_t bytes_put = 0;
  uint64_t puts_waited = 0;
  uint64_t puts_refused = 0;
  uint64_t puts_in_one_call = 0;
  std::vector<Step> steps;
  std::vector<Consumer> consumers;
};

class IngestStream {
 public:
  // `fields`: config.fields resolved; `budget_bytes` 0 = unbounded.
  IngestStream(std::string name, std::string auth_token, std::vector<SideFieldInfo> fields,
               uint64_t budget_bytes);

  const std::string& name() const { return name_; }
  const std::vector<SideFieldInfo>& fields() const { return fields_; }
  // Index of the field named `name`, or -1.
  int FieldIndex(const std::string& name) const;

  // Before serving: a job that consumes every step; `wake` is called
  // (from any thread) when a step is sealed.
  void AddConsumer(IngestConsumer consumer, std::function<void()> wake);
  // Called (from any thread) whenever bytes are freed.
  void SetOnFree(std::function<void()> on_free);

  // PermissionDenied for a wrong token.
  absl::Status CheckToken(const std::string& token) const;
  // Everything wrong with a put that its description shows (each one an
  // InvalidArgument or FailedPrecondition naming the sample and field);
  // otherwise the bytes it will hold.
  absl::StatusOr<uint64_t> CheckPut(const IngestPut& put) const;

  // Room for `bytes` more: OK (reserved), Unavailable while the budget is
  // full, ResourceExhausted when they could never fit it.
  absl::Status Reserve(uint64_t bytes);
  void Unreserve(uint64_t bytes);
  // Adds a put's samples (the reservation becomes held). Checks again what
  // may have changed since CheckPut (the step sealed, a group put
  // elsewhere); on error the reservation is released.
  absl::StatusOr<PutOutcome> Commit(int64_t step, std::vector<IngestedSample> samples,
                                    uint64_t reserved);
  // AlreadyExists for a step sealed before; FailedPrecondition for a step
  // without samples or consumed already. A `pinned` step is not freed,
  // whoever consumed it, until as many Unpin as pins (peers are getting its
  // bytes).
  absl::StatusOr<SealOutcome> Seal(int64_t step, bool pinned = false);
  void Unpin(int64_t step);
  // Pins a sealed step still held once more; false when there is none.
  bool Pin(int64_t step);
  // The step was sealed here, or every consumer is past it.
  bool SealedOrConsumed(int64_t step) const;
  // Per sample of `step`: whether a local rank of any consumer job is
  // planned it.
  absl::StatusOr<std::vector<bool>> LocalSamples(std::shared_ptr<const SealedStep> step) const;

  // The sealed step; Unavailable while it is not sealed, NotFound once
  // freed.
  absl::StatusOr<std::shared_ptr<const SealedStep>> Sealed(int64_t step) const;
  // Every local rank of `job` consumed the steps before `before`.
  void Consumed(const std::string& job, int64_t before);

  IngestStreamFigures Stats() const;
  // Counted by the transfer thread: a put that waited for room, one
  // refused after its timeout.
  void CountWait();
  void CountRefusal();
  void CountPutInOneCall();

 private:
  struct Step {
    std::vector<IngestedSample> samples;  // as put; sorted at the seal
    std::shared_ptr<const SealedStep> sealed;
    uint64_t bytes = 0;
    int pins = 0;  // forwards to peers under way
  };
  struct Consumer {
    IngestConsumer limits;
    std::function<void()> wake;
    int64_t consumed_before = 0;
  };
  // Consumed by every consumer: steps before it.
  int64_t ConsumedBefore() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Frees every sealed step every consumer is past; true when any.
  bool FreeConsumed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CheckStepOpen(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CheckGroups(int64_t step, const std::vector<int64_t>& groups) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::string name_;
  const std::string auth_token_;
  const std::vector<SideFieldInfo> fields_;
  const uint64_t budget_bytes_;

  mutable absl::Mutex mutex_;
  std::vector<Consumer> consumers_ ABSL_GUARDED_BY(mutex_);
  std::function<void()> on_free_ ABSL_GUARDED_BY(mutex_);
  std::map<int64_t, Step> steps_ ABSL_GUARDED_BY(mutex_);
  std::map<int64_t, int64_t> group_steps_ ABSL_GUARDED_BY(mutex_);  // of held steps
  uint64_t held_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t reserved_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t samples_put_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t bytes_put_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t puts_waited_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t puts_in_one_call_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t puts_refused_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INGEST_INGEST_STREAM_H_
