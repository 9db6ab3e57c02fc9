#include "server/ctl/megatron_batches.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::server::ctl {
namespace {

absl::Status FlagError(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", why));
}

// Megatron's _parse_numeric_value: an optional K/M/B/T suffix, the rest read
// as a Python float, their product truncated to an integer.
absl::StatusOr<int64_t> ScheduleNumber(absl::string_view text) {
  std::string value = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  double multiplier = 1;
  constexpr std::pair<char, double> kSuffixes[] = {{'T', 1e12}, {'B', 1e9}, {'M', 1e6}, {'K', 1e3}};
  for (const auto& [suffix, scale] : kSuffixes) {
    if (!value.empty() && value.back() == suffix) {
      multiplier = scale;
      value.pop_back();
      break;
    }
  }
  // Plain decimal numbers only (Python's float also takes "inf", "nan"
  // and "1_000", which no schedule means).
  const bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'E' || c == '+' ||
           c == '-';
  });
  double number = 0;
  if (!plain || !absl::SimpleAtod(value, &number) || !std::isfinite(number * multiplier) ||
      number * multiplier < 0 || number * multiplier >= 9.2e18) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is no count"));
  }
  return static_cast<int64_t>(number * multiplier);
}

// Megatron's StepBatchsizeNumMicroBatchesCalculator._parse_schedule and
// _validate_schedule: "THRESHOLD:BATCH ..." (commas as spaces), thresholds
// in tokens turned into samples (pretrain_gpt passes its seq_length),
// sorted, from 0, strictly ascending, batches positive.
absl::StatusOr<std::vector<BatchSchedule::Entry>> StepSchedule(const std::string& text,
                                                               int64_t seq_length) {
  constexpr char kFlag[] = "--step-batch-size-schedule";
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::vector<BatchSchedule::Entry> out;
  for (absl::string_view entry : absl::StrSplit(spaced, ' ', absl::SkipWhitespace())) {
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) {
      return FlagError(kFlag, absl::StrCat("'", entry, "' is not THRESHOLD:BATCH_SIZE"));
    }
    absl::StatusOr<int64_t> threshold = ScheduleNumber(entry.substr(0, colon));
    absl::StatusOr<int64_t> batch = ScheduleNumber(entry.substr(colon + 1));
    if (!threshold.ok() || !batch.ok()) {
      return FlagError(
          kFlag, absl::StrCat("in '", entry,
                              "': ", (threshold.ok() ? batch : threshold).status().message()));
    }
    out.push_back({*threshold / seq_length, *batch});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.from_sample < b.from_sample; });
  if (out.empty()) return FlagError(kFlag, "has no entry");
  if (out.front().from_sample != 0) {
    return FlagError(kFlag, absl::StrCat("the first threshold must be 0 (it is ",
                                         out.front().from_sample, " samples)"));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (i > 0 && out[i].from_sample <= out[i - 1].from_sample) {
      return FlagError(kFlag, absl::StrCat("two thresholds are both ", out[i].from_sample,
                                           " samples of ", seq_length, " tokens"));
    }
    if (out[i].global_batch < 1) return FlagError(kFlag, "a batch size is 0");
  }
  return out;
}

struct RampUpFlags {
  int64_t start = 0, increment = 0, samples = 0;
};

// --rampup-batch-size's three values.
absl::StatusOr<RampUpFlags> ParseRampUp(const std::vector<std::string>& values) {
  constexpr char kFlag[] = "--rampup-batch-size";
  RampUpFlags out;
  if (values.size() != 3 || !absl::SimpleAtoi(values[0], &out.start) ||
      !absl::SimpleAtoi(values[1], &out.increment) || !absl::SimpleAtoi(values[2], &out.samples)) {
    return FlagError(kFlag, "takes three integers: start batch, increment, ramp-up samples");
  }
  if (out.start < 1 || out.increment < 1 || out.samples < 1) {
    return FlagError(kFlag, "start batch, increment and ramp-up samples must be positive");
  }
  return out;
}

// Megatron-Core 0.17's RampupBatchsizeNumMicroBatchesCalculator as a step
// schedule: after c consumed samples the batch is start + k·increment with
// k = int(c / (samples / increments)) while c <= samples, then the full
// batch. k's thresholds are found with the same double arithmetic.
absl::StatusOr<std::vector<BatchSchedule::Entry>> RampUp(const RampUpFlags& ramp,
                                                         int64_t global_batch) {
  constexpr char kFlag[] = "--rampup-batch-size";
  const auto [start, increment, samples] = ramp;
  const int64_t span = global_batch - start;
  if (span < 1 || span % increment != 0) {
    return FlagError(kFlag, absl::StrCat("the batch must grow from ", start, " to ", global_batch,
                                         " in whole increments of ", increment));
  }
  const int64_t increments = span / increment;
  const double per_increment = static_cast<double>(samples) / static_cast<double>(increments);
  auto steps_at = [per_increment](int64_t consumed) {
    return static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  };
  std::vector<BatchSchedule::Entry> out = {{0, start}};
  auto add = [&out](int64_t from, int64_t batch) {
    if (batch == out.back().global_batch) return;
    if (from == out.back().from_sample) {
      out.back().global_batch = batch;
    } else {
      out.push_back({from, batch});
    }
  };
  for (int64_t k = 1; k <= increments; ++k) {
    // The first consumed count whose quotient reaches k.
    auto from = static_cast<int64_t>(std::ceil(static_cast<double>(k) * per_increment));
    while (from > 0 && steps_at(from - 1) >= k) --from;
    while (steps_at(from) < k) ++from;
    if (from > samples) break;
    add(from, start + std::min(steps_at(from), increments) * increment);
  }
  add(samples + 1, global_batch);
  return out;
}

// Megatron-Core releases: 0.18 replaced the ramp-up with step schedules.
absl::StatusOr<bool> RampsUp(const std::string& release) {
  int major = 0, minor = 0;
  const std::vector<std::string> parts = absl::StrSplit(release, '.');
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &major) ||
      !absl::SimpleAtoi(parts[1], &minor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--megatron-core: '", release, "' is no release (say 0.16.1)"));
  }
  return major == 0 && minor < 18;
}

}  // namespace

absl::StatusOr<MegatronBatches> MegatronBatchesOf(const MegatronBatchFlags& flags) {
  MegatronBatches out;
  const int64_t per_step_minimum = flags.micro_batch_size * flags.dp;
  out.args_global_batch = flags.global_batch_size.value_or(per_step_minimum);
  out.global_batch = out.args_global_batch;
  std::optional<bool> ramps_up;
  std::optional<RampUpFlags> ramp;  // a live --rampup-batch-size
  if (!flags.megatron_core.empty()) {
    PF_ASSIGN_OR_RETURN(ramps_up, RampsUp(flags.megatron_core));
  }
  if (flags.step_batch_size_schedule) {
    if (ramps_up.value_or(false)) {
      return FlagError("--step-batch-size-schedule",
                       absl::StrCat("Megatron-Core ", flags.megatron_core,
                                    " has no such flag (0.18 brought it)"));
    }
    if (flags.global_batch_size) {
      return FlagError("--step-batch-size-schedule",
                       "not with --global-batch-size (Megatron refuses both)");
    }
    if (!flags.train_samples) {
      return FlagError("--step-batch-size-schedule",
                       "needs --train-samples (with --train-iters Megatron sizes the train split "
                       "as train_iters x micro_batch_size x DP)");
    }
    PF_ASSIGN_OR_RETURN(out.schedule,
                        StepSchedule(*flags.step_batch_size_schedule, flags.seq_length));
  } else if (flags.rampup_batch_size) {
    if (!ramps_up) {
      return FlagError("--rampup-batch-size",
                       "Megatron-Core up to 0.17 ramps the batch up and 0.18 on ignores the flag: "
                       "say which runs with --megatron-core RELEASE");
    }
    if (*ramps_up) {
      if (!flags.train_samples) {
        return FlagError("--rampup-batch-size",
                         "needs --train-samples (Megatron ramps up sample-based training only)");
      }
      PF_ASSIGN_OR_RETURN(ramp, ParseRampUp(*flags.rampup_batch_size));
      PF_ASSIGN_OR_RETURN(out.schedule, RampUp(*ramp, out.global_batch));
    }
  }
  if (!flags.train_samples && !flags.train_iters) {
    return absl::InvalidArgumentError("--train-iters or --train-samples is required");
  }
  if (out.schedule.empty()) {
    // Megatron's update_train_iters.
    out.train_iters = flags.train_iters.value_or(*flags.train_samples / out.global_batch);
    out.train_samples = flags.train_samples.value_or(out.train_iters * out.global_batch);
    return out;
  }
  for (const BatchSchedule::Entry& entry : out.schedule) {
    out.global_batch = std::max(out.global_batch, entry.global_batch);
  }
  out.train_samples = *flags.train_samples;
  const BatchSchedule steps(out.schedule, 0);
  if (flags.step_batch_size_schedule) {
    // update_train_iters: steps until train_samples are consumed.
    out.train_iters = steps.StepsStartingBefore(out.train_samples);
  } else {
    // 0.17's update_train_iters: the ramp-up's steps (those starting by
    // its end, or by train_samples), then whole batches of the full size.
    const int64_t ramp_end = std::min(ramp->samples, out.train_samples);
    out.train_iters = steps.StepsStartingBefore(ramp_end + 1);
    const int64_t consumed = steps.At(out.train_iters).first_sample;
    if (out.train_samples > consumed) {
      out.train_iters += (out.train_samples - consumed) / out.global_batch;
    }
  }
  return out;
}

}  // namespace packfeed::server::ctl
