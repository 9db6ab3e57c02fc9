#ifndef PACKFEED_SERVER_CONFIG_BATCH_SCHEDULE_H_
#define PACKFEED_SERVER_CONFIG_BATCH_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace packfeed::v1 {
class JobConfig;
}  // namespace packfeed::v1

namespace packfeed::server {

// Which samples each step of a Megatron pretraining job holds: Megatron's
// sampler takes the split's samples in order, and a step takes as many as
// the global batch in force when it starts (Pretraining.batch_schedule,
// else JobConfig.global_batch). Pure arithmetic over the schedule's runs
// of equal steps, so any step is found without walking the ones before it.
class BatchSchedule {
 public:
  struct Entry {
    int64_t from_sample = 0;  // Megatron's consumed count where it starts
    int64_t global_batch = 0;
  };
  struct Step {
    int64_t first_sample = 0;
    int64_t global_batch = 0;
  };

  // `entries` as ValidateBatchSchedule accepts them (the first from 0,
  // ascending, batches > 0); step 0 starts at sample `start`.
  BatchSchedule(const std::vector<Entry>& entries, int64_t start);
  // The train split's schedule of a pretraining job (constant when
  // batch_schedule is empty), from its consumed_samples on.
  static BatchSchedule Of(const v1::JobConfig& job);

  Step At(int64_t step) const;
  // The step that starts at `sample`; nullopt when the sample lies before
  // step 0 or inside a step.
  std::optional<int64_t> StepStartingAt(int64_t sample) const;
  // How many steps start before `sample`.
  int64_t StepsStartingBefore(int64_t sample) const;
  bool constant() const { return runs_.size() == 1; }

 private:
  // Consecutive steps of one global batch; the last run never ends.
  struct Run {
    int64_t first_step = 0;
    int64_t first_sample = 0;
    int64_t global_batch = 0;
  };
  const Run& RunOfStep(int64_t step) const;
  std::vector<Run> runs_;
};

// What Megatron's calculator would refuse in a job's batch_schedule, and
// what packfeed needs besides: InvalidArgument naming the field
// ("pretraining.batch_schedule[i]: ...").
absl::Status ValidateBatchSchedule(const v1::JobConfig& job);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_BATCH_SCHEDULE_H_
