#ifndef PACKFEED_SERVER_STORAGE_LEDGER_H_
#define PACKFEED_SERVER_STORAGE_LEDGER_H_

// A job's consumption ledger (docs/RELIABILITY.md): per rank, which
// microbatches it consumed and which samples they held, so that "each
// sample of the epoch reached each rank that needs it exactly once" can be
// checked after any fault.
//
// A rank's consumption is a run of positions (step, microbatch) in serving
// order. The runner reports each microbatch the rank released (Consume), and
// each (re-)attach (Attach) with the position the rank says it is at:
//   - its first attach starts the ledger there (consumption before it is
//     not this ledger's to know);
//   - at the ledger's position: it goes on;
//   - before it: a rewind (a restart from a checkpoint), the entries from
//     there on are dropped and will be consumed again;
//   - after it: microbatches the rank consumed whose release never reached
//     the daemon (it or the daemon died). At most the ring's slots can be
//     such; the caller fills them in from the plan (Claim). Farther is a
//     jump (Jump), counted as a gap.
// A release at a position already consumed is a duplicate, one beyond the
// position a gap: both are bugs, logged and counted.
//
// With a journal path, every change is appended to that file as one text
// line, sealed with a checksum, before it takes effect in memory, and Open
// replays it, so the ledger survives a restart of the daemon (a SIGKILL
// loses no line already written: the kernel holds it). A torn or corrupt
// last line is cut off with one warning; a corrupt line before it is
// DataLoss naming the line. Single-threaded: the job runner's thread.
//
// Bounded: a rank's microbatches more than `keep_steps` steps behind its
// position are folded into per-epoch totals (what Snapshot reports stays
// the same), and the journal is rewritten with the folded totals once it
// holds `compact_after_lines` lines more than they need. A rewind to before
// the folded part (a checkpoint older than keep_steps) restarts the rank's
// record there, with a warning.
//
// Durability (group commit): lines reach the kernel as they are written
// and the disk at Sync, which the runner calls at most once per
// sync_interval. A crash of the daemon loses nothing; a crash of the machine
// loses at most the last interval's lines, which the ranks' own positions
// at re-attach restore (Claim).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/scheduler/sampler.h"

namespace packfeed::server {

// splitmix64's finalizer of dataset·2^40 + index: the per-sample term of a
// ledger digest (sums of these are order-free and see a duplicate).
uint64_t SampleDigest(int dataset, int64_t index);

struct LedgerPosition {
  int64_t step = 0;
  int microbatch = 0;
  friend auto operator<=>(const LedgerPosition&, const LedgerPosition&) = default;
};

// The samples of one consumed microbatch, summed per dataset epoch.
struct EpochShare {
  int dataset = 0;
  int64_t epoch = 0;
  uint64_t samples = 0;
  uint64_t digest = 0;
  friend bool operator==(const EpochShare&, const EpochShare&) = default;
};
std::vector<EpochShare> SharesOf(const std::vector<scheduler::SampleRef>& samples);

// One rank's ledger as the admin API shows it (control/ makes its
// RankLedger message field for field). `epochs`: per (dataset, epoch), the
// samples consumed and the sum of their digests, ascending.
struct RankLedgerFigures {
  int global_rank = 0;
  int64_t first_step = 0;  // where the ledger begins for this rank
  int64_t next_step = 0;   // the position after the last consumed
  int next_microbatch = 0;
  uint64_t microbatches = 0;
  uint64_t samples = 0;
  uint64_t duplicates = 0;  // consumed twice without a rewind: a bug
  uint64_t gaps = 0;        // skipped, never consumed: a bug or a jump
  uint64_t rewinds = 0;     // re-attached before its position
  uint64_t claimed = 0;     // consumed per the rank's own position at re-attach
  std::vector<EpochShare> epochs;
  friend bool operator==(const RankLedgerFigures&, const RankLedgerFigures&) = default;
};
struct LedgerSnapshot {
  std::string name;                      // the job's
  std::string journal;                   // the file it survives restarts in; empty = memory only
  std::vector<RankLedgerFigures> ranks;  // ascending
  friend bool operator==(const LedgerSnapshot&, const LedgerSnapshot&) = default;
};

struct LedgerOptions {
  int64_t keep_steps = 1000;
  uint64_t compact_after_lines = uint64_t{1} << 16;
  // Tests only: called at each step of a compaction by the step's name
  // ("aside created", "aside synced", "renamed", "folder synced",
  // "reopened"), so that a crash test can end the process there.
  std::function<void(const char* point)> compaction_step;
};

class Ledger {
 public:
  // An empty `journal_path` keeps the ledger in memory only. DataLoss
  // naming the line when the journal is corrupt (a torn last line, from a
  // crash while writing it, is dropped with a warning, not an error).
  static absl::StatusOr<std::unique_ptr<Ledger>> Open(const std::string& journal_path,
                                                      const LedgerOptions& options = {});

  enum class AttachKind { kFirst, kContinue, kRewind, kAhead };
  struct AttachResult {
    AttachKind kind;
    LedgerPosition before;  // the ledger's position before the attach
  };
  // On kAhead the caller calls Claim for each microbatch in [before, at), or
  // Jump when there are more than the rank's ring could have held.
  absl::StatusOr<AttachResult> Attach(int rank, LedgerPosition at);
  absl::Status Jump(int rank, LedgerPosition at, uint64_t skipped);
  // The rank consumed the microbatch at `at` of a step of `num_microbatches`.
  absl::Status Consume(int rank, LedgerPosition at, int num_microbatches,
                       std::vector<EpochShare> shares);
  // Like Consume, for a microbatch the rank said at re-attach it consumed.
  absl::Status Claim(int rank, LedgerPosition at, int num_microbatches,
                     std::vector<EpochShare> shares);
  struct Claimed {
    LedgerPosition at;
    int num_microbatches = 0;
    std::vector<EpochShare> shares;
  };

  // The rank's position: the microbatch after the last it consumed.
  std::optional<LedgerPosition> next(int rank) const;

  // The ledger as the admin API shows it, ranks ascending.
  LedgerSnapshot Snapshot(const std::string& job) const;
  const std::string& journal_path() const { return journal_path_; }

  // fdatasync of the journal when lines were written since the last Sync.
  absl::Status Sync();
  // Microbatch entries held in memory (not folded), and the journal's lines.
  uint64_t entries() const;
  uint64_t journal_lines() const { return journal_lines_; }

 private:
  struct Entry {
    int num_microbatches = 0;
    std::vector<EpochShare> shares;
  };
  struct RankRecord {
    int64_t first_step = 0;
    LedgerPosition next;
    std::map<LedgerPosition, Entry> consumed;
    uint64_t duplicates = 0, gaps = 0, rewinds = 0, claimed = 0;
    // Microbatches before `folded_to`, summed per (dataset, epoch).
    LedgerPosition folded_to;
    uint64_t folded_microbatches = 0;
    std::map<std::pair<int, int64_t>, EpochShare> folded;
  };

  Ledger(std::string journal_path, const LedgerOptions& options)
      : journal_path_(std::move(journal_path)), options_(options) {}
  // Replays the journal's text; returns the bytes of its whole, intact
  // lines (a torn or corrupt last line is left out).
  absl::StatusOr<size_t> Replay(const std::string& text);
  absl::Status ReplayLine(const std::string& line);
  absl::Status Append(const std::string& line);
  absl::Status Record(int rank, LedgerPosition at, int num_microbatches,
                      std::vector<EpochShare> shares, bool claimed);
  AttachResult ApplyAttach(int rank, LedgerPosition at);
  void ApplyJump(int rank, LedgerPosition at, uint64_t skipped);
  void ApplyConsume(int rank, LedgerPosition at, Entry entry, bool claimed);
  void Fold(RankRecord& record);
  // Rewrites the journal as the folded totals and the entries kept.
  absl::Status Compact();

  std::string journal_path_;
  const LedgerOptions options_;
  ScopedFd journal_;            // invalid: memory only
  uint64_t journal_lines_ = 0;  // records in the journal (not the header)
  bool unsynced_ = false;
  std::map<int, RankRecord> ranks_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_STORAGE_LEDGER_H_
