// The runner's fills: a dataset job's side rows read from their files
// straight into the slots of ranks whose rings it shares by descriptor, so
// the daemon holds no copy of them (docs/ARCHITECTURE.md, "The runner").
// TP peers at the same position are filled together: the rows are read
// once, into one slot, and copied into the others before any is announced.

#include "server/pipeline/job_runner.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/peer_fill.h"
#include "server/pipeline/push.h"

namespace packfeed::server {

bool JobRunner::SideRowsIntoSlot(const RankCoords& coords) const {
  for (const SideSlice& slice : SideSlicesOfStage(job_.side_fields(), job_.stages(), coords.pp)) {
    if (slice.field->loss_mask) return false;
  }
  return true;
}

bool JobRunner::GatherPeers(RankState& rank, std::vector<RankState*>& members) {
  auto is_peer = [&rank](const RankCoords& coords) {
    return coords.dp_cp_rank == rank.coords.dp_cp_rank && coords.pp == rank.coords.pp;
  };
  // A peer still to attach (within kAttachGrace of the first rank): its
  // trainer is needed before the rank's can use anything.
  if (AwaitingRanks()) {
    for (int global_rank : job_.local_ranks()) {
      if (ranks_.count(global_rank) == 0 && is_peer(job_.layout().Coords(global_rank))) {
        return false;
      }
    }
  }
  bool waits = false;
  for (auto& [_, peer] : ranks_) {
    if (&peer == &rank || !peer.live() || !peer.side_rows_into_slot() || peer.filling.has_value() ||
        !is_peer(peer.coords) || peer.next_step != rank.next_step ||
        peer.next_microbatch != rank.next_microbatch) {
      continue;
    }
    absl::StatusOr<uint32_t> credits = sender_->Credits(peer.connection_id);
    if (!credits.ok()) continue;  // its own turn ends it
    if (*credits == 0) {
      waits = true;
      continue;
    }
    members.push_back(&peer);
  }
  if (waits) {
    const absl::Time now = absl::Now();
    if (!rank.peer_wait_since.has_value()) rank.peer_wait_since = now;
    if (now - *rank.peer_wait_since < kPeerWait) return false;
  }
  rank.peer_wait_since.reset();
  return true;
}

bool JobRunner::StartFill(RankState& rank, const StepData& data) {
  std::vector<RankState*> members = {&rank};
  if (!GatherPeers(rank, members)) return false;
  const LedgerPosition at{rank.next_step, rank.next_microbatch};
  const StepPlan& plan = data.plan;
  std::vector<SlotRead> reads;  // into the first member's slot
  std::vector<RankState*> filled;
  for (RankState* member : members) {
    absl::StatusOr<MicrobatchSource> source =
        SourceForRank(job_, data, at.microbatch, member->global_rank, /*side_rows=*/nullptr);
    if (!source.ok()) {
      EndRank(*member, source.status());
      continue;
    }
    std::vector<SlotRead> own;
    absl::StatusOr<MappedWrite> written = WriteMappedSlot(*sender_, member->connection_id, plan,
                                                          at.microbatch, *source, &packers_, own);
    if (!written.ok()) {
      PushFailed(*member, written.status());
      continue;
    }
    if (!filled.empty() && !SameReads(own, written->slot, reads, filled[0]->filling->slot)) {
      continue;  // fills its own slot on its next turn
    }
    if (filled.empty()) reads = std::move(own);
    RankState::Filling& fill = member->filling.emplace();
    fill.slot = written->slot;
    fill.content = std::move(written->content);
    fill.sent = {at, plan.plan.num_microbatches(),
                 SharesOf(MicrobatchSamples(plan, at.microbatch, member->coords.dp_cp_rank))};
    filled.push_back(member);
  }
  if (filled.empty()) return false;
  RankState& leader = *filled[0];
  if (reads.empty()) {  // no stored row at this position: pads only
    for (RankState* member : filled) AnnounceFilled(*member);
    return true;
  }
  const bool again = reread_marks_.Mark(leader.coords.dp_cp_rank, leader.coords.pp, at);
  RankState::Filling& fill = *leader.filling;
  for (SlotRead& read : reads) read.again = again;
  std::vector<FillMember> peers;
  for (size_t i = 1; i < filled.size(); ++i) peers.push_back(filled[i]->fill_member());
  fills_.Begin(leader.fill_member(), RegionsOf(reads, fill.slot), std::move(peers));
  const int global_rank = leader.global_rank;
  const uint64_t connection_id = leader.connection_id;
  fill.pin =
      storage_.ReadInto({job_.name(), global_rank, at.step}, std::move(reads),
                        /*urgent=*/true, [this, global_rank, connection_id](absl::Status status) {
                          Post([this, global_rank, connection_id, status] {
                            OnSlotFilled(global_rank, connection_id, status);
                          });
                        });
  return false;
}

void JobRunner::OnSlotFilled(int global_rank, uint64_t connection_id, absl::Status status) {
  std::optional<PeerFills::Ended> ended = fills_.End({global_rank, connection_id});
  auto it = ranks_.find(global_rank);
  if (!ended.has_value() || it == ranks_.end() || it->second.connection_id != connection_id ||
      !it->second.filling.has_value()) {
    return;  // attached again since: the reads were withdrawn
  }
  RankState& leader = it->second;
  leader.filling->pin.reset();
  for (const FillMember& waited : ended->peers) {
    auto peer = ranks_.find(waited.global_rank);
    if (peer == ranks_.end() || peer->second.fill_member() != waited ||
        !peer->second.filling.has_value()) {
      continue;
    }
    RankState& member = peer->second;
    if (!member.live() || !status.ok()) {
      member.filling.reset();
      if (member.live()) EndRank(member, status);
      continue;
    }
    CopyRegions(ended->regions, leader.filling->slot, member.filling->slot);
    AnnounceFilled(member);
  }
  if (!leader.live() || !status.ok()) {
    leader.filling.reset();
    if (leader.live()) EndRank(leader, status);
    return;
  }
  AnnounceFilled(leader);
}

void JobRunner::DropOrphanedFill(RankState& rank) {
  if (rank.filling.has_value() && !fills_.InFlight(rank.fill_member())) rank.filling.reset();
}

bool JobRunner::AnnounceFilled(RankState& rank) {
  RankState::Filling fill = *std::move(rank.filling);
  rank.filling.reset();
  const absl::Status status = sender_->CommitMapped(rank.connection_id, fill.content);
  if (!status.ok()) {
    PushFailed(rank, status);
    return false;
  }
  rank.in_flight.push_back(std::move(fill.sent));
  Advance(rank);
  return true;
}

}  // namespace packfeed::server
