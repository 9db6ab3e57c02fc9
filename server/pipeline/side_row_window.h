#ifndef PACKFEED_SERVER_PIPELINE_SIDE_ROW_WINDOW_H_
#define PACKFEED_SERVER_PIPELINE_SIDE_ROW_WINDOW_H_

// A dataset job's side-field rows held per CP group and microbatch, not
// per step: router replay's rows are 768 B a token, hundreds of times the
// tokens' bytes, so a job's memory must follow its ranks' rings, not its
// read-ahead in steps.
//
//   RowsFor ─▶ read (urgent) ─┐
//   ReadAhead ─▶ read ────────┴▶ held ─▶ DropIfUnneeded / Evict
//
// A group's rows of a microbatch are read when its first rank needs them,
// or ahead (each reader's next microbatch, then the one after, within its
// ring and the window's byte budget), and dropped once no reader of the
// group will be sent that microbatch.
//
// Completions come back through `post`, which must run them on the owner's
// thread; every other call is made on that thread.

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "server/pipeline/held_steps.h"
#include "server/pipeline/job.h"
#include "server/pipeline/read.h"
#include "server/storage/ledger.h"
#include "server/storage/storage.h"

namespace packfeed::server {

// The ranks that will still be sent side rows.
struct SideReaders {
  struct Reader {
    int global_rank = 0;
    int dp_cp_rank = 0;
    LedgerPosition next;      // the microbatch it is sent next
    uint32_t ring_slots = 0;  // how far ahead of `next` it can be sent
  };
  std::vector<Reader> live;
  // Ranks still to attach (dp-cp ranks), sent every microbatch from step
  // `awaited_from` on.
  std::vector<int> awaited;
  int64_t awaited_from = INT64_MAX;
};

class SideRowWindow {
 public:
  // A CP group's rows of one microbatch: step, microbatch, the group's
  // first dp-cp rank.
  using Key = std::tuple<int64_t, int, int>;

  // REQUIRES: `job` and `storage` outlive this; `post` stays callable
  // until this is destroyed.
  SideRowWindow(const Job& job, Storage& storage, HeldSteps::Post post);
  // Unpins every group's rows, waiting for the reads under way (whose
  // completions `post` must drop).
  ~SideRowWindow();
  SideRowWindow(const SideRowWindow&) = delete;
  SideRowWindow& operator=(const SideRowWindow&) = delete;

  // The rows of `dp_cp_rank`'s CP group in `microbatch` of the held step
  // `data` once read; nullptr while they are read (which begins here, for
  // `rank`). An urgent call asks again for rows read ahead and queued
  // behind the storage's budget, and reads once more rows whose read
  // ahead failed (the failure may be stale); what fails then is served as
  // failed.
  const SideRows* RowsFor(const std::shared_ptr<const StepData>& data, int microbatch,
                          int dp_cp_rank, int rank, bool urgent);
  // Reads ahead: each reader's next microbatch, then the one after, within
  // its ring and the held steps up to `last_step`, while the window holds
  // less than `budget_bytes`.
  void ReadAhead(const SideReaders& readers, const HeldSteps& steps, int64_t last_step,
                 uint64_t budget_bytes);
  // Drops `key`'s rows unless a reader will still be sent them (after one
  // was sent them).
  void DropIfUnneeded(const Key& key, const SideReaders& readers);
  // Drops every group's rows no reader will be sent.
  void Evict(const SideReaders& readers);

  // The rows' bytes held or being read, now and at most.
  uint64_t bytes() const { return bytes_; }
  uint64_t peak_bytes() const { return peak_bytes_; }

 private:
  struct Entry {
    uint64_t generation = 0;
    int group_size = 0;  // the group's dp-cp ranks begin at the key's
    uint64_t bytes = 0;  // of its rows
    bool urgent = false;
    bool retried = false;  // read again after a failure
    std::unique_ptr<FetchPin> pin;
    std::shared_ptr<const SideRows> rows;  // once read
  };

  void Fetch(const Key& key, Entry& entry, const scheduler::CpGroup& group,
             std::shared_ptr<const StepData> data, int rank, bool urgent);
  void OnRead(const Key& key, uint64_t generation, std::shared_ptr<const SideRows> rows);
  static bool Needed(const Key& key, const Entry& entry, const SideReaders& readers);

  const Job& job_;
  Storage& storage_;
  const HeldSteps::Post post_;
  std::map<Key, Entry> entries_;
  uint64_t generations_ = 0;
  uint64_t bytes_ = 0;
  uint64_t peak_bytes_ = 0;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_SIDE_ROW_WINDOW_H_
