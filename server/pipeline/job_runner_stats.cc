// The runner's figures: per-rank trainer times and the job's JobStats.

#include <algorithm>
#include <optional>

#include "packfeed/scheduler/plan_stats.h"
#include "server/pipeline/job_runner.h"
#include "server/pipeline/job_runner_state.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

void JobRunner::TakeTimes(RankState& rank, const v1::RankTimes& times) {
  // Figures only grow over a connection: an older report arriving late
  // changes nothing.
  if (times.calls() >= rank.times.calls()) rank.times = times;
}

void JobRunner::Stats(std::function<void(v1::JobStats)> done) {
  Post([this, done = std::move(done)] {
    v1::JobStats stats;
    stats.set_name(job_.name());
    stats.set_steps_planned(steps_planned_);
    stats.set_documents_split(job_.split_documents());
    stats.set_samples_truncated(samples_truncated_);
    stats.set_tokens_truncated(tokens_truncated_);
    stats.set_plan_seconds(plan_seconds_);
    stats.set_read_seconds(read_seconds_);
    if (steps_planned_ > 0) {
      stats.set_mean_step_over_ideal(step_over_ideal_sum_ / static_cast<double>(steps_planned_));
    }
    const Storage::JobIo io = storage_.JobFigures(job_.name());
    stats.set_bytes_read(io.bytes_read);
    stats.set_unique_bytes_needed(io.distinct_bytes);
    if (io.distinct_bytes > 0) {
      stats.set_io_amplification(static_cast<double>(io.bytes_read) /
                                 static_cast<double>(io.distinct_bytes));
    }
    int64_t served = INT64_MAX;
    // Slowest and fastest by what the ranks consumed (the ledger's position),
    // not by what was pushed to them: a stalled rank's ring is full too.
    std::optional<std::pair<LedgerPosition, int>> slowest, fastest;
    std::optional<std::pair<double, int>> most_waiting;
    double wait_seconds = 0;
    for (int global_rank : job_.local_ranks()) {
      v1::RankStats* out = stats.add_ranks();
      out->set_global_rank(global_rank);
      auto it = ranks_.find(global_rank);
      if (it == ranks_.end()) {
        served = 0;
        continue;
      }
      RankState& rank = it->second;
      if (rank.live()) AccountTaken(rank);
      absl::StatusOr<transport::ConnectionStats> connection = sender_->Stats(rank.connection_id);
      const bool attached = rank.live() && connection.ok();
      out->set_attached(attached);
      out->set_next_step(rank.next_step);
      out->set_slots_pushed(rank.pushed);
      out->set_bytes_sent(rank.bytes_sent);
      out->set_slots_released(rank.released);
      if (attached) out->set_slots_in_flight(static_cast<uint32_t>(rank.pushed - rank.released));
      const v1::RankTimes times = rank.all_times();
      out->set_wait_seconds(times.wait_seconds());
      out->set_busy_seconds(times.busy_seconds());
      out->set_copied_out(times.copied_out());
      out->set_calls(times.calls());
      out->set_ring(rank.ring);
      wait_seconds += times.wait_seconds();
      if (const double total = times.wait_seconds() + times.busy_seconds(); total > 0) {
        out->set_input_bound(times.wait_seconds() / total);
        if (!most_waiting.has_value() || out->input_bound() > most_waiting->first) {
          most_waiting = {out->input_bound(), global_rank};
        }
      }
      served = std::min(served, rank.next_step);
      const std::optional<LedgerPosition> consumed = ledger_->next(global_rank);
      if (!consumed.has_value()) continue;
      out->set_consumed_step(consumed->step);
      out->set_consumed_microbatch(static_cast<uint32_t>(consumed->microbatch));
      const std::pair<LedgerPosition, int> here{*consumed, global_rank};
      if (!slowest.has_value() || here < *slowest) slowest = here;
      if (!fastest.has_value() || *fastest < here) fastest = here;
    }
    stats.set_steps_served(served == INT64_MAX ? 0 : served);
    stats.set_wait_seconds(wait_seconds);
    if (most_waiting.has_value()) {
      stats.set_input_bound(most_waiting->first);
      stats.set_most_waiting_rank(static_cast<uint32_t>(most_waiting->second));
    }
    stats.set_cached_bytes(CachedBytes());
    if (slowest.has_value()) {
      stats.set_slowest_rank(static_cast<uint32_t>(slowest->second));
      stats.set_slowest_rank_steps_behind(fastest->first.step - slowest->first.step);
    }
    done(std::move(stats));
  });
}

uint64_t JobRunner::CachedBytes() const {
  uint64_t bytes = 0;
  for (const auto& [_, held] : steps_) {
    if (held.data == nullptr) continue;
    for (const auto& [_, run] : held.data->runs) bytes += run.size() * sizeof(int64_t);
  }
  return bytes;
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
