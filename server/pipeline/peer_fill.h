#ifndef PACKFEED_SERVER_PIPELINE_PEER_FILL_H_
#define PACKFEED_SERVER_PIPELINE_PEER_FILL_H_

// What TP peers at the same position share when their side rows are read
// straight into their slots (docs/ARCHITECTURE.md, "The runner"): the
// storage reads the rows once, into the first peer's slot, and each peer
// that joins gets the same bytes copied into its own slot before any of
// them is announced. A peer joins only when its reads are the same rows in
// the same places of its slot (slots of rings of another size lay out
// otherwise). And which reads are re-reads, which the storage counts.
//
// Pure: no I/O, no threads.

#include <cstdint>
#include <map>
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
