#include "server/pipeline/peer_fill.h"

#include <algorithm>
#include <cstring>

namespace packfeed::server {

SlotRegions RegionsOf(const std::vector<SlotRead>& reads, const uint8_t* slot) {
  SlotRegions regions;
  for (const SlotRead& read : reads) {
    regions.emplace_back(static_cast<uint64_t>(read.destination - slot),
                         read.need.bytes / read.row_bytes * read.kept_row_bytes());
  }
  return regions;
}

bool SameReads(const std::vector<SlotRead>& a, const uint8_t* a_slot,
               const std::vector<SlotRead>& b, const uint8_t* b_slot) {
  if (a.size() != b.size() || RegionsOf(a, a_slot) != RegionsOf(b, b_slot)) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const SampleNeed& x = a[i].need;
    const SampleNeed& y = b[i].need;
    if (x.dataset != y.dataset || x.document != y.document || x.offset != y.offset ||
        x.bytes != y.bytes || a[i].kept != b[i].kept) {
      return false;
    }
  }
  return true;
}

void CopyRegions(const SlotRegions& regions, const uint8_t* from, uint8_t* to) {
  for (const auto& [offset, bytes] : regions) std::memcpy(to + offset, from + offset, bytes);
}

void PeerFills::Begin(FillMember leader, SlotRegions regions, std::vector<FillMember> peers) {
  Withdraw(leader);
  for (const FillMember& peer : peers) leader_of_[peer] = leader;
  by_leader_[leader] = {std::move(regions), std::move(peers)};
}

std::optional<PeerFills::Ended> PeerFills::End(FillMember leader) {
  auto fill = by_leader_.find(leader);
  if (fill == by_leader_.end()) return std::nullopt;
  Ended ended{std::move(fill->second.regions), std::move(fill->second.peers)};
  by_leader_.erase(fill);
  for (const FillMember& peer : ended.peers) {
    auto waits = leader_of_.find(peer);
    if (waits != leader_of_.end() && waits->second == leader) leader_of_.erase(waits);
  }
  return ended;
}

void PeerFills::Withdraw(FillMember leader) { End(leader); }

void PeerFills::Clear() {
  by_leader_.clear();
  leader_of_.clear();
}

bool PeerFills::InFlight(FillMember member) const {
  return by_leader_.count(member) > 0 || leader_of_.count(member) > 0;
}

bool RereadMarks::Mark(int dp_cp_rank, int stage, LedgerPosition at) {
  auto [mark, first] = furthest_.try_emplace({dp_cp_rank, stage}, at);
  const bool again = !first && at <= mark->second;
  mark->second = std::max(mark->second, at);
  return again;
}

}  // namespace packfeed::server
