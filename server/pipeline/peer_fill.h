#ifndef PACKFEED_SERVER_PIPELINE_PEER_FILL_H_
#define PACKFEED_SERVER_PIPELINE_PEER_FILL_H_

// What TP peers at the same position share when their side rows are read
// straight into their slots (docs/ARCHITECTURE.md, "The runner"): the
// storage reads the rows once, into the first peer's slot, and each peer
// that joins gets the same bytes copied into its own slot before any of
// them is announced. A peer joins only when its reads are the same rows in
// the same places of its slot (slots of rings of another size lay out
// otherwise). PeerFills keeps which fills are in flight and who waits on
// each; RereadMarks which reads are re-reads, which the storage counts.
//
// Pure: no I/O, no threads.

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "server/storage/ledger.h"
#include "server/storage/storage.h"

namespace packfeed::server {

// Where a slot's reads write: (offset in the slot, bytes), one per read.
using SlotRegions = std::vector<std::pair<uint64_t, uint64_t>>;
SlotRegions RegionsOf(const std::vector<SlotRead>& reads, const uint8_t* slot);

// Whether `b` (into `b_slot`) reads the same rows into the same places as
// `a` (into `a_slot`).
bool SameReads(const std::vector<SlotRead>& a, const uint8_t* a_slot,
               const std::vector<SlotRead>& b, const uint8_t* b_slot);

// The leader's read bytes into a peer's slot, region by region.
void CopyRegions(const SlotRegions& regions, const uint8_t* from, uint8_t* to);

// A rank's connection: the rank attached again is another member.
struct FillMember {
  int global_rank = -1;
  uint64_t connection_id = 0;
  auto operator<=>(const FillMember&) const = default;
};

// The fills in flight of one runner. A fill is led by the member whose
// slot the storage reads the side rows into; the peers that joined it wait
// for those bytes, copied into their own slots when the reads end. A fill
// is in flight from Begin until End (the reads ended, well or not) or
// Withdraw (the leader's state is gone, its reads withdrawn): a peer whose
// fill is no longer in flight waits on nothing and fills its slot itself.
class PeerFills {
 public:
  // `leader`'s reads write `regions` of its slot; `peers` wait for them.
  void Begin(FillMember leader, SlotRegions regions, std::vector<FillMember> peers);

  struct Ended {
    SlotRegions regions;            // to copy from the leader's slot
    std::vector<FillMember> peers;  // that waited, as they joined
  };
  // The leader's reads ended: its fill is over. Nothing when it had none
  // in flight (withdrawn since).
  std::optional<Ended> End(FillMember leader);
  // The leader's fill is abandoned: its peers wait on nothing.
  void Withdraw(FillMember leader);
  void Clear();

  // Whether `member` leads a fill in flight or waits on one.
  bool InFlight(FillMember member) const;

 private:
  struct Fill {
    SlotRegions regions;
    std::vector<FillMember> peers;
  };
  std::map<FillMember, Fill> by_leader_;
  std::map<FillMember, FillMember> leader_of_;  // each waiting peer's
};

// Per (dp-cp rank, pipeline stage), the furthest position whose side rows
// were read into a slot: reading one at or before it again is a re-read
// (a peer that missed a fill, a rank attached again).
class RereadMarks {
 public:
  // Marks the rows of `at` read for the rank and stage; true when they
  // were read before.
  bool Mark(int dp_cp_rank, int stage, LedgerPosition at);

 private:
  std::map<std::pair<int, int>, LedgerPosition> furthest_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_PEER_FILL_H_
