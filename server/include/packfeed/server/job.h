#ifndef PACKFEED_SERVER_JOB_H_
#define PACKFEED_SERVER_JOB_H_

// One training job as the daemon serves it: its datasets, sampler, planner
// and sample rules, and the three stages of a step that touch data — plan
// (pure), read (this node's samples, each once) and pack (one rank's
// microbatch). Immutable after Create; every const method is thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/scheduler/sampler.h"
#include "packfeed/server/indexed_dataset.h"
#include "packfeed/server/microbatch_packer.h"
#include "packfeed/transport/wire.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed {

// A rank's place in the job: global rank = tp + TP·(cp + CP·(dp + DP·pp)).
struct RankCoords {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
  int dp_cp_rank = 0;  // cp + CP·dp
};

struct JobLayout {
  int tp = 1, pp = 1, cp = 1, dp = 1;
  bool sequence_parallel = false;

  int world_size() const { return tp * pp * cp * dp; }
  int dp_cp_size() const { return cp * dp; }
  RankCoords Coords(int global_rank) const;
  int GlobalRank(int tp_rank, int dp_cp_rank, int pp_rank) const {
    return tp_rank + tp * (dp_cp_rank + dp_cp_size() * pp_rank);
  }
};

// The plan of one step, and which stored sample each planned one is.
struct StepPlan {
  int64_t step = 0;
  GlobalPlan plan;
  std::vector<SampleRef> samples;  // by PlannedSequence::sample
};

// The token runs of the samples some ranks need for one step.
struct StepData {
  StepPlan plan;
  std::map<int64_t, std::vector<int64_t>> runs;  // by planned sample
  uint64_t bytes_read = 0;    // fetched from .bin for this step
  uint64_t unique_bytes = 0;  // the distinct samples' bytes needed
};

class Job {
 public:
  // Opens and validates the datasets (NotFound / DataLoss naming the file)
  // and computes the fingerprint. REQUIRES: `config` passed
  // ValidateJobConfig (defaults filled).
  static absl::StatusOr<std::unique_ptr<Job>> Create(const v1::JobConfig& config);

  const std::string& name() const { return config_.name(); }
  const v1::JobConfig& config() const { return config_; }
  const JobLayout& layout() const { return layout_; }
  const std::string& fingerprint() const { return fingerprint_; }
  const PlannerOptions& planner_options() const { return planner_; }
  // Global ranks this node hosts, ascending.
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  bool IsLocal(int global_rank) const;
  // The largest slot any rank of this job can need, in bytes.
  uint64_t required_slot_bytes() const { return required_slot_bytes_; }

  // Samples and plan of `step` (>= 0): a pure function of the config.
  absl::StatusOr<StepPlan> Plan(int64_t step) const;

  // Reads, once each, the samples the given global ranks need.
  absl::StatusOr<StepData> Read(StepPlan plan, absl::Span<const int> global_ranks) const;

  // The slot `global_rank` receives for `microbatch` of `data`: fields of its
  // PP stage, in wire layout order, with their bytes.
  absl::StatusOr<PackedMicrobatch> Pack(const StepData& data, int microbatch,
                                        int global_rank) const;

 private:
  Job() = default;
  absl::StatusOr<std::vector<int64_t>> ReadRun(const SampleRef& sample, uint64_t& bytes) const;
  int64_t StoredTokens(const SampleRef& sample) const;

  v1::JobConfig config_;
  JobLayout layout_;
  PlannerOptions planner_;
  SampleRules rules_;
  std::vector<IndexedDataset> datasets_;
  std::unique_ptr<Sampler> sampler_;
  std::string fingerprint_;
  std::vector<int> local_ranks_;
  uint64_t required_slot_bytes_ = 0;
};

// The samples dp-cp rank `dp_cp_rank` processes in `microbatch` of `plan`
// (its CP group's sequences), in order.
std::vector<SampleRef> MicrobatchSamples(const StepPlan& plan, int microbatch, int dp_cp_rank);

// The wire fields of a packed microbatch for a rank of PP stage `pp_rank`
// of `pp_size` (DESIGN.md §3), and their bytes.
struct SlotFields {
  std::vector<transport::FieldSpec> specs;
  std::vector<const void*> data;
};
SlotFields MicrobatchFields(const PackedMicrobatch& packed, int pp_rank, int pp_size);

}  // namespace packfeed

#endif  // PACKFEED_SERVER_JOB_H_
