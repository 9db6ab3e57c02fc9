// The runner's figures: per-rank trainer times and the job's JobStats.

#include <algorithm>
#include <optional>

#include "server/pipeline/job_runner.h"

namespace packfeed::server {

void JobRunner::TakeTimes(RankState& rank, const TrainerTimes& times) {
  // Figures only grow over a connection: an older report arriving late
  // changes nothing.
  if (times.calls >= rank.times.calls) rank.times = times;
}

void JobRunner::Stats(std::function<void(JobFigures)> done) {
  Post([this, done = std::move(done)] {
    JobFigures stats;
    stats.name = job_.name();
    const HeldSteps::Figures& held = steps_->figures();
    stats.steps_planned = held.steps_held;
    stats.documents_split = job_.split_documents();
    stats.samples_truncated = held.samples_truncated;
    stats.tokens_truncated = held.tokens_truncated;
    stats.plan_seconds = held.plan_seconds;
    stats.read_seconds = held.read_seconds;
    stats.cost_fit = cost_learner_.Figures();
    if (const CostModelVersions* versions = job_.cost_models(); versions != nullptr) {
      const CostModelVersion latest = versions->Latest();
      stats.cost_fit.model_version = latest.version;
      stats.cost_fit.model_from_step = latest.from_step;
      stats.cost_fit.model_versions_missed = versions->missed();
    }
    if (held.steps_held > 0) {
      stats.mean_step_over_ideal = held.step_over_ideal_sum / static_cast<double>(held.steps_held);
    }
    const Storage::JobIo io = storage_.JobFigures(job_.name());
    stats.bytes_read = io.bytes_read;
    stats.unique_bytes_needed = io.distinct_bytes;
    if (io.distinct_bytes > 0) {
      stats.io_amplification =
          static_cast<double>(io.bytes_read) / static_cast<double>(io.distinct_bytes);
    }
    int64_t served = INT64_MAX;
    // Slowest and fastest by what the ranks consumed (the ledger's position),
    // not by what was pushed to them: a stalled rank's ring is full too.
    std::optional<std::pair<LedgerPosition, int>> slowest, fastest;
    std::optional<std::pair<double, int>> most_waiting;
    for (int global_rank : job_.local_ranks()) {
      RankFigures& out = stats.ranks.emplace_back();
      out.global_rank = global_rank;
      auto it = ranks_.find(global_rank);
      if (it == ranks_.end()) {
        served = 0;
        continue;
      }
      RankState& rank = it->second;
      if (rank.live()) AccountTaken(rank);
      absl::StatusOr<transport::ConnectionStats> connection = sender_->Stats(rank.connection_id);
      out.attached = rank.live() && connection.ok();
      out.next_step = rank.next_step;
      out.slots_pushed = rank.pushed;
      out.bytes_sent = rank.bytes_sent;
      out.slots_released = rank.released;
      if (out.attached) out.slots_in_flight = static_cast<uint32_t>(rank.pushed - rank.released);
      out.times = rank.all_times();
      out.ring = rank.ring;
      out.device_ring_fallback = rank.device_ring_fallback;
      stats.wait_seconds += out.times.wait_seconds;
      if (const double total = out.times.wait_seconds + out.times.busy_seconds; total > 0) {
        out.input_bound = out.times.wait_seconds / total;
        if (!most_waiting.has_value() || out.input_bound > most_waiting->first) {
          most_waiting = {out.input_bound, global_rank};
        }
      }
      served = std::min(served, rank.next_step);
      const std::optional<LedgerPosition> consumed = ledger_->next(global_rank);
      if (!consumed.has_value()) continue;
      out.consumed_step = consumed->step;
      out.consumed_microbatch = consumed->microbatch;
      const std::pair<LedgerPosition, int> here{*consumed, global_rank};
      if (!slowest.has_value() || here < *slowest) slowest = here;
      if (!fastest.has_value() || *fastest < here) fastest = here;
    }
    stats.steps_served = served == INT64_MAX ? 0 : served;
    if (most_waiting.has_value()) {
      stats.input_bound = most_waiting->first;
      stats.most_waiting_rank = most_waiting->second;
    }
    stats.cached_bytes = steps_->TokenBytes();
    stats.side_rows_bytes = sides_->bytes();
    stats.peak_side_rows_bytes = sides_->peak_bytes();
    if (slowest.has_value()) {
      stats.slowest_rank = slowest->second;
      stats.slowest_rank_steps_behind = fastest->first.step - slowest->first.step;
    }
    done(std::move(stats));
  });
}

int64_t JobRunner::SlowestStep() const {
  int64_t slowest = INT64_MAX;
  for (const auto& [_, rank] : ranks_) {
    if (rank.live()) slowest = std::min(slowest, rank.next_step);
  }
  return slowest;
}

int JobRunner::SlowestRank() const {
  std::optional<std::pair<int64_t, int>> slowest;
  for (const auto& [id, rank] : ranks_) {
    if (rank.live() && (!slowest.has_value() || rank.next_step < slowest->first)) {
      slowest = {rank.next_step, id};
    }
  }
  return slowest.has_value() ? slowest->second : -1;
}

}  // namespace packfeed::server
