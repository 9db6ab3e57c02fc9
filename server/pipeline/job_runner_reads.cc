// What the runner asks its readers for: the steps HeldSteps holds (from
// the slowest rank's to prefetch_steps past it and, while ranks are still
// to attach, from where the first one began), and the ranks the side-row
// window reads side rows for.

#include <algorithm>

#include "server/pipeline/job_runner.h"

namespace packfeed::server {

bool JobRunner::AwaitingRanks() const {
  return ranks_.size() < job_.local_ranks().size() && first_start_.has_value() &&
         absl::Now() - first_attach_ < kAttachGrace;
}

void JobRunner::Evict() {
  int64_t keep_from = SlowestStep();
  // Ranks attach over a few seconds; the first ones are pushed steps ahead
  // before the last arrive. Keep what those will need (from where the first
  // rank began) for a while, so that a staggered start reads nothing twice.
  if (AwaitingRanks()) keep_from = std::min(keep_from, *first_start_);
  steps_->EvictBefore(keep_from);
}

void JobRunner::OnStepHeld(int64_t step, const StepData& data) {
  cost_learner_.Planned(step, data.plan.plan);
}

void JobRunner::FetchAhead() {
  const int64_t slowest = SlowestStep();
  if (slowest == INT64_MAX) return;
  steps_->FetchAhead(slowest, slowest + options_.prefetch_steps, SlowestRank());
}

const SideRows* JobRunner::SideRowsFor(int64_t step, int microbatch, const RankState& rank,
                                       bool urgent) {
  const std::shared_ptr<const StepData> data = steps_->Held(step);
  if (!rank.side_rows_held()) return &data->side;
  return sides_->RowsFor(data, microbatch, rank.coords.dp_cp_rank, rank.global_rank, urgent);
}

SideReaders JobRunner::Readers() const {
  SideReaders readers;
  for (const auto& [global_rank, rank] : ranks_) {
    if (!rank.live() || !rank.side_rows_held()) continue;
    readers.live.push_back({global_rank,
                            rank.coords.dp_cp_rank,
                            {rank.next_step, rank.next_microbatch},
                            rank.ring_slots});
  }
  // Kept for the ranks still to attach, as their steps are (Evict).
  if (AwaitingRanks()) {
    readers.awaited_from = *first_start_;
    for (int global_rank : job_.local_ranks()) {
      if (ranks_.count(global_rank) == 0) {
        readers.awaited.push_back(job_.layout().Coords(global_rank).dp_cp_rank);
      }
    }
  }
  return readers;
}

void JobRunner::FetchSidesAhead() {
  const int64_t slowest = SlowestStep();
  if (slowest == INT64_MAX) return;
  sides_->ReadAhead(Readers(), *steps_, slowest + options_.prefetch_steps,
                    options_.side_rows_read_ahead_bytes);
}

}  // namespace packfeed::server
