// The runner's ledger accounting: what each rank's trainer consumed, moved
// into the job's ledger as its client reports it, claimed on re-attach, and
// the consumed point told to the ingest stream.

#include <algorithm>
#include <optional>

#include "packfeed/common/status_macros.h"
#include "server/pipeline/job_kind.h"
#include "server/pipeline/job_runner.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

absl::Status JobRunner::ClaimUpTo(int global_rank, LedgerPosition from, LedgerPosition to,
                                  uint32_t slots) {
  // The rank says it consumed [from, to): releases that never reached the
  // ledger. At most its ring's slots (plus the one it held) can be such.
  const int dp_cp_rank = job_.layout().Coords(global_rank).dp_cp_rank;
  std::vector<Ledger::Claimed> claims;
  std::optional<StepPlan> plan;
  for (LedgerPosition p = from; p < to && claims.size() <= slots;) {
    if (!plan.has_value() || plan->step != p.step) {
      PF_ASSIGN_OR_RETURN(StepPlan next, PlanStep(job_, p.step));
      plan = std::move(next);
    }
    const int count = plan->plan.num_microbatches();
    claims.push_back({p, count, SharesOf(MicrobatchSamples(*plan, p.microbatch, dp_cp_rank))});
    p = p.microbatch + 1 == count ? LedgerPosition{p.step + 1, 0}
                                  : LedgerPosition{p.step, p.microbatch + 1};
  }
  if (claims.size() > slots) {
    spdlog::warn(
        "job {} rank {}: re-attaches at step {} microbatch {}, more than its {} ring "
        "slots past what it consumed (step {} microbatch {}): the ledger counts a gap",
        job_.name(), global_rank, to.step, to.microbatch, slots, from.step, from.microbatch);
    return ledger_->Jump(global_rank, to, claims.size());
  }
  for (Ledger::Claimed& claim : claims) {
    PF_RETURN_IF_ERROR(
        ledger_->Claim(global_rank, claim.at, claim.num_microbatches, std::move(claim.shares)));
  }
  return absl::OkStatus();
}

void JobRunner::AccountTaken(RankState& rank) {
  absl::StatusOr<transport::ConnectionStats> stats = sender_->Stats(rank.connection_id);
  if (stats.ok()) {
    rank.taken = stats->taken;
    rank.released = stats->released;
  }
  while (rank.ledgered < rank.taken && !rank.in_flight.empty()) {
    RankState::InFlight& done = rank.in_flight.front();
    absl::Status status =
        ledger_->Consume(rank.global_rank, done.at, done.num_microbatches, std::move(done.shares));
    if (!status.ok()) {
      spdlog::error("job {} rank {}: ledger: {}", job_.name(), rank.global_rank, status.ToString());
    }
    rank.in_flight.pop_front();
    ++rank.ledgered;
  }
}

void JobRunner::GetLedger(std::function<void(LedgerSnapshot)> done) {
  Post([this, done = std::move(done)] {
    for (auto& [_, rank] : ranks_) {
      if (rank.live()) AccountTaken(rank);
    }
    done(ledger_->Snapshot(job_.name()));
  });
}

void JobRunner::RecordConsumedTo(int global_rank, LedgerPosition to, uint32_t slots) {
  const std::optional<LedgerPosition> ledgered = ledger_->next(global_rank);
  if (!ledgered.has_value() || !(*ledgered < to)) return;
  absl::Status claimed = ClaimUpTo(global_rank, *ledgered, to, slots);
  if (!claimed.ok()) {
    spdlog::error("job {} rank {}: ledger: {}", job_.name(), global_rank, claimed.ToString());
  }
}

void JobRunner::ReportConsumed() {
  // Steps before every local rank's ledger position are consumed on this
  // node (a rank that never attached holds everything).
  int64_t before = INT64_MAX;
  for (int rank : job_.local_ranks()) {
    const std::optional<LedgerPosition> next = ledger_->next(rank);
    if (!next.has_value()) return;
    before = std::min(before, next->step);
  }
  if (before == reported_consumed_) return;
  reported_consumed_ = before;
  job_.kind().Consumed(job_, before);
}

void JobRunner::SyncLedger() {
  last_sync_ = absl::Now();
  absl::Status synced = ledger_->Sync();
  if (!synced.ok()) spdlog::error("job {}: ledger: {}", job_.name(), synced.ToString());
}

}  // namespace packfeed::server
