#ifndef PACKFEED_SERVER_CTL_MEGATRON_BATCHES_H_
#define PACKFEED_SERVER_CTL_MEGATRON_BATCHES_H_

// Megatron's global batch over a run, from pretrain_gpt.py's batch flags:
// constant (--global-batch-size), Megatron-Core 0.18's
// --step-batch-size-schedule, or the --rampup-batch-size of 0.17 and
// earlier (0.18 on parses and ignores it), as the job's batch_schedule, with
// the iteration count Megatron's update_train_iters derives from them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/config/batch_schedule.h"

namespace packfeed::server::ctl {

struct MegatronBatchFlags {
  int64_t micro_batch_size = 1;
  int64_t dp = 1;
  int64_t seq_length = 0;
  std::optional<int64_t> global_batch_size;
  std::optional<std::string> step_batch_size_schedule;
  std::optional<std::vector<std::string>> rampup_batch_size;  // its three values
  std::optional<int64_t> train_samples;
  std::optional<int64_t> train_iters;
  // The Megatron-Core release ("0.16.1"), which the ramp-up flag needs:
  // empty = not said.
  std::string megatron_core;
};

struct MegatronBatches {
  // Empty when every step holds global_batch.
  std::vector<BatchSchedule::Entry> schedule;
  int64_t global_batch = 0;  // the largest a step holds (JobConfig.global_batch)
  // Megatron's args.global_batch_size, which evaluation defaults to: with a
  // step schedule, micro_batch_size x DP (Megatron's default, as the
  // schedule forbids --global-batch-size).
  int64_t args_global_batch = 0;
  int64_t train_iters = 0;
  int64_t train_samples = 0;  // the train split's size Megatron asks for
};

// InvalidArgument naming the flag for what Megatron would refuse or fail
// on (both a schedule and --global-batch-size, a schedule not from 0 or not
// ascending, a ramp-up that does not reach the batch in whole increments,
// iteration-based training with either).
absl::StatusOr<MegatronBatches> MegatronBatchesOf(const MegatronBatchFlags& flags);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_MEGATRON_BATCHES_H_
