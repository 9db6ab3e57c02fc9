#include "server/config/batch_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed::server {

BatchSchedule::BatchSchedule(const std::vector<Entry>& entries, int64_t start) {
  int64_t step = 0;
  int64_t sample = start;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t batch = entries[i].global_batch;
    if (i + 1 == entries.size()) {
      runs_.push_back({step, sample, batch});
      break;
    }
    // Megatron picks a step's batch when the step starts, so the last step
    // of an entry may end past the next entry's threshold.
    const int64_t end = entries[i + 1].from_sample;
    if (sample >= end) continue;
    const int64_t steps = (end - sample + batch - 1) / batch;
    runs_.push_back({step, sample, batch});
    step += steps;
    sample += steps * batch;
  }
}

BatchSchedule BatchSchedule::Of(const v1::JobConfig& job) {
  const v1::Pretraining& p = job.pretraining();
  std::vector<Entry> entries;
  for (const v1::BatchSizeStep& entry : p.batch_schedule()) {
    entries.push_back({entry.from_sample(), entry.global_batch()});
  }
  if (entries.empty()) entries.push_back({0, job.global_batch()});
  return BatchSchedule(entries, p.consumed_samples());
}

const BatchSchedule::Run& BatchSchedule::RunOfStep(int64_t step) const {
  auto after = std::upper_bound(runs_.begin(), runs_.end(), step,
                                [](int64_t s, const Run& run) { return s < run.first_step; });
  return after == runs_.begin() ? runs_.front() : *(after - 1);
}

BatchSchedule::Step BatchSchedule::At(int64_t step) const {
  const Run& run = RunOfStep(step);
  return {run.first_sample + (step - run.first_step) * run.global_batch, run.global_batch};
}

std::optional<int64_t> BatchSchedule::StepStartingAt(int64_t sample) const {
  auto after = std::upper_bound(runs_.begin(), runs_.end(), sample,
                                [](int64_t s, const Run& run) { return s < run.first_sample; });
  if (after == runs_.begin()) return std::nullopt;
  const Run& run = *(after - 1);
  const int64_t offset = sample - run.first_sample;
  if (offset % run.global_batch != 0) return std::nullopt;
  return run.first_step + offset / run.global_batch;
}

int64_t BatchSchedule::StepsStartingBefore(int64_t sample) const {
  auto after = std::upper_bound(runs_.begin(), runs_.end(), sample,
                                [](int64_t s, const Run& run) { return s <= run.first_sample; });
  if (after == runs_.begin()) return 0;
  const Run& run = *(after - 1);
  return run.first_step + (sample - run.first_sample + run.global_batch - 1) / run.global_batch;
}

absl::Status ValidateBatchSchedule(const v1::JobConfig& job) {
  const v1::Pretraining& p = job.pretraining();
  if (p.batch_schedule().empty()) return absl::OkStatus();
  auto error = [](int i, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("pretraining.batch_schedule[", i, "]: ", why));
  };
  if (p.hybrid_context_parallel()) {
    return absl::InvalidArgumentError(
        "pretraining.batch_schedule: not with hybrid_context_parallel (Megatron's "
        "HybridCPMegatronPretrainingSampler holds the one --global-batch-size)");
  }
  const int64_t per_microbatch =
      std::max<int64_t>(1, p.micro_batch_size()) * int64_t{job.topology().dp()};
  int64_t largest = 0;
  for (int i = 0; i < p.batch_schedule_size(); ++i) {
    const v1::BatchSizeStep& entry = p.batch_schedule(i);
    if (i == 0 && entry.from_sample() != 0) return error(i, "the first entry is from sample 0");
    if (i > 0 && entry.from_sample() <= p.batch_schedule(i - 1).from_sample()) {
      return error(i, "from_sample must be after the entry before");
    }
    if (entry.global_batch() < 1) return error(i, "global_batch must be >= 1");
    largest = std::max(largest, entry.global_batch());
    // Megatron checks a batch when a step takes it; an entry that ends
    // before consumed_samples is never taken.
    const bool taken = i + 1 == p.batch_schedule_size() ||
                       p.batch_schedule(i + 1).from_sample() > p.consumed_samples();
    if (taken && entry.global_batch() % per_microbatch != 0) {
      return error(i,
                   absl::StrCat(entry.global_batch(),
                                " is not a multiple of micro_batch_size x dp = ", per_microbatch));
    }
  }
  if (job.global_batch() != largest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global_batch: ", job.global_batch(), " must be the batch_schedule's largest, ", largest));
  }
  return absl::OkStatus();
}

}  // namespace packfeed::server
