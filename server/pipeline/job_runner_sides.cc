// The runner's side rows: a dataset job's side fields, read per CP group and
// microbatch rather than per step, so a job's memory follows its ranks'
// rings and not its read-ahead in steps (docs/ARCHITECTURE.md, "The runner").

#include <algorithm>

#include "packfeed/scheduler/plan.h"
#include "server/pipeline/job_runner.h"
#include "server/pipeline/job_runner_state.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

bool AtOrBefore(int64_t step, int microbatch, const std::tuple<int64_t, int, int>& key) {
  return std::make_pair(step, microbatch) <= std::make_pair(std::get<0>(key), std::get<1>(key));
}

}  // namespace

const SideRows* JobRunner::SideRowsFor(int64_t step, int microbatch, const RankState& rank,
                                       bool urgent) {
  const std::shared_ptr<const StepData>& data = steps_.at(step).data;
  if (!rank.side_rows_held()) return &data->side;
  const scheduler::CpGroup& group = scheduler::GroupOfRank(
      data->plan.plan.microbatches[static_cast<size_t>(microbatch)], rank.coords.dp_cp_rank);
  const SideKey key{step, microbatch, group.first_rank};
  auto [found, inserted] = sides_.try_emplace(key);
  HeldSide& held = found->second;
  if (inserted) {
    held.group_size = group.size;
    FetchSide(key, held, group, data, rank.global_rank, urgent);
    return nullptr;
  }
  if (held.rows == nullptr) {
    // Read ahead and maybe queued behind the storage's budget, which only
    // this rank's progress may free: asked for again as urgent. (A read
    // already issued is shared, not repeated.)
    if (urgent && !held.urgent) FetchSide(key, held, group, data, rank.global_rank, urgent);
    return nullptr;
  }
  // As for steps: a failure read ahead may be stale, so it is read once
  // more for the rank that needs it before the rank is told.
  if (urgent && !held.rows->failed.empty() && !held.retried) {
    held.retried = true;
    FetchSide(key, held, group, data, rank.global_rank, urgent);
    return nullptr;
  }
  return held.rows.get();
}

void JobRunner::FetchSide(const SideKey& key, HeldSide& held, const scheduler::CpGroup& group,
                          std::shared_ptr<const StepData> data, int rank, bool urgent) {
  std::vector<int64_t> samples;
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    samples.push_back(sequence.sample);
  }
  std::sort(samples.begin(), samples.end());
  samples.erase(std::unique(samples.begin(), samples.end()), samples.end());
  std::vector<SampleNeed> needs = SideNeedsOf(job_, data->plan, samples);
  side_bytes_ -= held.bytes;
  held.bytes = 0;
  for (const SampleNeed& need : needs) held.bytes += need.bytes;
  side_bytes_ += held.bytes;
  peak_side_bytes_ = std::max(peak_side_bytes_, side_bytes_);
  held.generation = ++fetches_;
  held.urgent = urgent;
  held.rows = nullptr;
  // Fetching again: the previous fetch's pin goes only once this one holds
  // the same rows, which the storage does not keep unpinned.
  std::unique_ptr<FetchPin> previous = std::move(held.pin);
  held.pin = storage_.Fetch(
      {job_.name(), rank, std::get<0>(key)}, std::move(needs), urgent,
      [this, key, generation = held.generation, data = std::move(data),
       samples = std::move(samples)](std::vector<FetchedSample> fetched) {
        auto rows =
            std::make_shared<const SideRows>(AssembleSideRows(job_, data->plan, samples, fetched));
        Post([this, key, generation, rows] { OnSideRead(key, generation, rows); });
      });
}

void JobRunner::OnSideRead(const SideKey& key, uint64_t generation,
                           std::shared_ptr<const SideRows> rows) {
  auto held = sides_.find(key);
  if (held == sides_.end() || held->second.generation != generation) return;  // dropped since
  held->second.rows = std::move(rows);
  const SideRows& ready = *held->second.rows;
  if (!ready.failed.empty()) {
    spdlog::error(
        "job {} step {} microbatch {}: {} sample(s)' side rows could not be read, the ranks that "
        "need them are ended; first: {}",
        job_.name(), std::get<0>(key), std::get<1>(key), ready.failed.size(),
        ready.failed.begin()->second.ToString());
  }
}

void JobRunner::FetchSidesAhead() {
  uint32_t horizon = 0;  // no rank can be sent more than its ring holds
  for (const auto& [_, rank] : ranks_) {
    if (rank.live() && rank.side_rows_held()) horizon = std::max(horizon, rank.ring_slots);
  }
  const int64_t slowest = SlowestStep();
  if (horizon == 0 || slowest == INT64_MAX) return;
  const int64_t last_step = slowest + options_.prefetch_steps;
  for (uint32_t ahead = 0; ahead < horizon; ++ahead) {
    for (const auto& [_, rank] : ranks_) {
      if (side_bytes_ >= options_.side_rows_read_ahead_bytes) return;
      if (!rank.live() || !rank.side_rows_held() || ahead >= rank.ring_slots) continue;
      // The rank's microbatch `ahead` past its next, if its step is held.
      int64_t step = rank.next_step;
      int64_t microbatch = rank.next_microbatch + ahead;
      const StepData* data = nullptr;
      for (; step <= last_step; ++step) {
        auto held = steps_.find(step);
        data = held == steps_.end() ? nullptr : held->second.data.get();
        if (data == nullptr || microbatch < data->plan.plan.num_microbatches()) break;
        microbatch -= data->plan.plan.num_microbatches();
      }
      if (data == nullptr || step > last_step) continue;
      SideRowsFor(step, static_cast<int>(microbatch), rank, /*urgent=*/false);
    }
  }
}

bool JobRunner::SideNeeded(const SideKey& key, const HeldSide& held) const {
  // (Not a structured binding: clang does not let lambdas capture one.)
  const int64_t step = std::get<0>(key);
  const int first_rank = std::get<2>(key);
  auto in_group = [&](const RankCoords& coords) {
    return coords.dp_cp_rank >= first_rank && coords.dp_cp_rank < first_rank + held.group_size;
  };
  // Kept for the group's ranks still to attach, as their steps are (Evict).
  if (AwaitingRanks() && step >= *first_start_) {
    for (int global_rank : job_.local_ranks()) {
      if (ranks_.count(global_rank) == 0 && in_group(job_.layout().Coords(global_rank))) {
        return true;
      }
    }
  }
  return std::any_of(ranks_.begin(), ranks_.end(), [&](const auto& entry) {
    const RankState& rank = entry.second;
    return rank.live() && rank.side_rows_held() && in_group(rank.coords) &&
           AtOrBefore(rank.next_step, rank.next_microbatch, key);
  });
}

void JobRunner::DropSideIfSent(const SideKey& key) {
  auto held = sides_.find(key);
  if (held == sides_.end() || SideNeeded(key, held->second)) return;
  side_bytes_ -= held->second.bytes;
  sides_.erase(held);
}

void JobRunner::EvictSides() {
  for (auto it = sides_.begin(); it != sides_.end();) {
    if (SideNeeded(it->first, it->second)) {
      ++it;
      continue;
    }
    side_bytes_ -= it->second.bytes;
    it = sides_.erase(it);
  }
}

}  // namespace packfeed::server
