#ifndef PACKFEED_SERVER_PIPELINE_JOB_RUNNER_STATE_H_
#define PACKFEED_SERVER_PIPELINE_JOB_RUNNER_STATE_H_

// The runner's state of each rank it serves, shared by its files:
// job_runner.cc (the loop, attaches, serving), job_runner_reads.cc (what
// the held steps and the side-row window are asked for), job_runner_fill.cc
// (side rows read into TP peers' slots), job_runner_ledger.cc (what the
// trainers consumed) and job_runner_stats.cc (the figures). Runner thread
// only.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/slot_sender.h"
#include "server/pipeline/job.h"
#include "server/pipeline/job_figures.h"
#include "server/pipeline/peer_fill.h"
#include "server/storage/ledger.h"
#include "server/storage/storage.h"

namespace packfeed::server {

struct RankState {
  int global_rank = 0;
  RankCoords coords;
  uint64_t connection_id = 0;
  transport::ConnectionKey key{};  // its connection's (Sender::Key)
  bool failed = false;             // its connection broke
  bool detached = false;           // it said goodbye; kept for its figures
  int64_t next_step = 0;
  int next_microbatch = 0;
  uint64_t pushed = 0;
  uint64_t bytes_sent = 0;
  // As last seen from its connection: microbatches its trainer took
  // (consumed, for the ledger) and released (no tensor of them alive).
  uint64_t taken = 0;
  uint64_t released = 0;
  // Pushed and not yet taken, oldest first, with what the ledger needs.
  struct InFlight {
    LedgerPosition at;
    int num_microbatches = 0;
    std::vector<EpochShare> shares;
  };
  std::deque<InFlight> in_flight;
  uint64_t ledgered = 0;  // microbatches taken and moved into the ledger
  uint32_t ring_slots = 0;
  std::string ring;                  // RankStats.ring
  bool mapped = false;               // its slots are written in place (Sender::MapNextSlot)
  std::string device_ring_fallback;  // AttachArgs'
  // How a dataset job's side rows reach this rank.
  enum class SideRows {
    kNone,  // its stage receives none, or an ingest job's (in memory already)
    kHeld,  // fetched and held for it, copied into each push
    // Read from their files straight into its slots (SideRowsIntoSlot):
    // nothing is held for it. `ring_memory` keeps its ring mapped until
    // `filling` (declared after it, so destroyed first) has waited for the
    // reads writing into it, whatever its connection does.
    kIntoSlot,
  };
  SideRows side_rows = SideRows::kNone;
  bool side_rows_held() const { return side_rows == SideRows::kHeld; }
  bool side_rows_into_slot() const { return side_rows == SideRows::kIntoSlot; }
  std::shared_ptr<transport::SharedRing> ring_memory;
  // A slot written but for its side rows, announced (CommitMapped) once
  // they are in. The rank that leads the fill reads them into its own slot
  // (`pin`; destroying it withdraws the reads); the TP peers that joined
  // get them copied (the runner's PeerFills keeps who waits on whom).
  struct Filling {
    // Defined below: clang cannot default-construct a nested class with
    // member initializers inside std::optional while RankState is
    // incomplete.
    Filling();
    std::unique_ptr<FetchPin> pin;
    uint8_t* slot = nullptr;
    transport::SlotContent content;
    InFlight sent;
  };
  std::optional<Filling> filling;
  // Since when it has waited for a TP peer's free slot, to fill both.
  std::optional<absl::Time> peer_wait_since;
  // The trainer's time as its client reported it: this connection's latest
  // figures, and the sum of the rank's earlier connections'.
  TrainerTimes times;
  TrainerTimes earlier_times;

  bool live() const { return !failed && !detached; }
  FillMember fill_member() const { return {global_rank, connection_id}; }
  TrainerTimes all_times() const {
    TrainerTimes all = earlier_times;
    all.wait_seconds += times.wait_seconds;
    all.busy_seconds += times.busy_seconds;
    all.calls += times.calls;
    all.copied_out += times.copied_out;
    return all;
  }
};

inline RankState::Filling::Filling() = default;

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_RUNNER_STATE_H_
