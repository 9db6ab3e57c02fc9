#ifndef PACKFEED_SERVER_STORAGE_STORAGE_H_
#define PACKFEED_SERVER_STORAGE_STORAGE_H_

// The node's storage: every dataset file is opened once, however many jobs
// use it (identified by device and inode), and read by a pool of reader
// threads, never by a thread that pushes. Jobs submit what a planned step
// needs (whole stored documents, or a truncated document's kept prefix);
// the storage serves what it holds, coalesces what it must read into large
// requests and calls back when every sample is held or has failed.
//
// Held samples are shared: a second job (or a second step) that needs a
// document while it is held reads nothing. A sample stays held while a fetch
// that needs it lives (FetchPin). When the last one is released it is kept,
// oldest dropped first, while the budget has room (a job lagging another on
// the same files by a few steps then reads nothing either); with no budget
// it goes at once.
//
// Accounting, independent on purpose:
//  - bytes_read: the bytes of every pread, counted per file where it is
//    issued;
//  - distinct_bytes: the bytes of each (file, document, epoch) the node's
//    fetches needed, counted the first time it is needed;
// so a second read of anything shows as amplification > 1, and each such
// re-read is recorded with the job, rank and step it was fetched for (one
// warning line, and one record, per fetch and file).
//
// Memory: a fetch costs its samples' bytes plus, for token bytes, their
// int64 tokens (what a job assembles from them). Fetches wait for admission
// while the admitted ones' cost exceeds the budget, except urgent ones (a
// step some rank needs now), so one job's read-ahead never starves another's
// current step.
//
// Reads run on `read_threads` threads issuing blocking pread: on FUSE, NFS
// and Lustre clients a buffered io_uring read is punted to the kernel's own
// worker threads anyway (docs/ARCHITECTURE.md has the measurement), and the
// requests are large, so a pool costs no more and needs nothing but POSIX.
//
// Thread-safe.

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "packfeed/dataset/indexed_dataset.h"

namespace packfeed::server {

// The storage's figures (control/ turns them into the admin API's
// StorageStats, field for field).
struct ReReadRecord {  // a fetch that read again what the node read before
  std::string job;
  uint32_t rank = 0;  // whose need triggered the fetch
  int64_t step = 0;
  std::string path;
  uint64_t samples = 0;
  uint64_t bytes = 0;
};
struct StorageFileFigures {
  std::string path;  // the .bin, as the first job named it
  uint32_t jobs = 0;
  uint64_t bytes_read = 0;
  uint64_t reads = 0;
  uint64_t distinct_bytes = 0;
  uint64_t reread_bytes = 0;
  double io_amplification = 0;  // bytes_read / distinct_bytes; 0 before any
  // Over the latest reads.
  double read_latency_p50_ms = 0;
  double read_latency_p99_ms = 0;
  double read_latency_max_ms = 0;
};
struct StorageFigures {
  std::vector<StorageFileFigures> files;
  uint64_t bytes_read = 0;
  uint64_t distinct_bytes = 0;
  double io_amplification = 0;
  uint64_t bytes_in_flight = 0;
  uint64_t bytes_held = 0;
  uint64_t peak_bytes_held = 0;
  uint64_t memory_budget_bytes = 0;  // 0 = unbounded
  uint32_t read_threads = 0;
  uint64_t reread_events = 0;
  std::vector<ReReadRecord> rereads;  // the latest few
  uint64_t bytes_kept = 0;
};

// The memory budget when the configuration sets none: a quarter of what
// this process may use, the node's physical memory or its cgroup's limit
// (v1 or v2), whichever is less. Large enough that another job reading the
// same files a few steps behind (or the same job after a restart) reads
// nothing again; small enough to leave the trainers their page cache and
// pinned buffers.
uint64_t DefaultMemoryBudget();

struct StorageOptions {
  int read_threads = 8;
  // Adjacent samples are read with one request up to this size.
  uint64_t max_request_bytes = uint64_t{8} << 20;
  // Bytes the admitted fetches may cost; 0 = unbounded.
  uint64_t memory_budget_bytes = 0;
};

// One stored document's bytes that a step needs.
struct SampleNeed {
  const dataset::IndexedDataset* dataset = nullptr;  // from Storage::Open
  int64_t document = 0;
  int64_t epoch = 0;    // of its dataset; needs in different epochs are distinct
  uint64_t offset = 0;  // into the document's bytes in .bin (a piece of a split one)
  uint64_t bytes = 0;   // from there
  // Token bytes, which the job widens to int64 (they cost that too); a side
  // field's rows are packed as stored.
  bool tokens = true;
  // Kept once released while the budget has room. A side field's rows are
  // not: they are read per microbatch, once, and are hundreds of times the
  // tokens' bytes, so keeping them would only push the tokens out.
  bool keep = true;
};

// What a fetch is for, to name its re-reads.
struct FetchCause {
  std::string job;
  int rank = -1;  // the rank whose need triggered the fetch
  int64_t step = 0;
};

// A fetched sample's bytes (kept alive by `buffer`), or why it failed.
struct FetchedSample {
  std::shared_ptr<const char[]> buffer;
  uint64_t offset = 0;
  uint64_t size = 0;
  absl::Status status;

  absl::Span<const char> bytes() const { return {buffer.get() + offset, size}; }
};

// Stored rows read straight into memory the caller owns (a rank's ring
// slot), so the daemon holds no copy of them: `need`'s bytes (whole rows of
// `row_bytes`), each row whole, or cut to the byte ranges `kept` (offset in
// the row, length), written one after another. `again`: the caller read
// these rows before (for another rank), so they count as a re-read.
struct SlotRead {
  SampleNeed need;
  uint8_t* destination = nullptr;
  uint64_t row_bytes = 0;
  std::vector<std::pair<uint64_t, uint64_t>> kept;  // empty = the whole row
  bool again = false;

  // Bytes one row leaves at the destination.
  uint64_t kept_row_bytes() const {
    uint64_t bytes = kept.empty() ? row_bytes : 0;
    for (const auto& [_, length] : kept) bytes += length;
    return bytes;
  }
};

class Storage;

// Holds a fetch's samples; destroying it releases them, or withdraws a
// fetch not yet done. Waits for a `done` callback running at that moment, so
// after the pin is gone `done` never runs.
class FetchPin {
 public:
  ~FetchPin();
  FetchPin(const FetchPin&) = delete;
  FetchPin& operator=(const FetchPin&) = delete;

 private:
  friend class Storage;
  FetchPin(Storage* storage, uint64_t id) : storage_(storage), id_(id) {}
  Storage* storage_;
  uint64_t id_;
};

class Storage {
 public:
  explicit Storage(const StorageOptions& options);
  ~Storage();  // REQUIRES: every FetchPin is gone.
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // `prefix`.idx/.bin, opened once per node (index validated on use); later
  // calls for the same files, under any path, return the same dataset.
  absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> Open(const std::string& prefix);

  // Holds `needs` (in order; duplicates allowed) and reads those not held.
  // `done` runs once on a reader thread with one FetchedSample per need,
  // unless the pin is destroyed first. Each need's dataset must come from
  // Open and `bytes` must lie within its document.
  using FetchDone = std::function<void(std::vector<FetchedSample>)>;
  std::unique_ptr<FetchPin> Fetch(FetchCause cause, std::vector<SampleNeed> needs, bool urgent,
                                  FetchDone done);

  // Reads `reads` into their destinations on the reader threads (urgent
  // first, as Fetch) and calls `done` once, on a reader thread, with the
  // first error or OK. The bytes count as read, and as distinct unless
  // read `again` (a re-read, named as Fetch names one); nothing is held,
  // kept or charged to the budget,
  // since the memory is the caller's. Destroying the pin withdraws the
  // reads not begun and waits for those running and for `done`: after it,
  // nothing is written into the destinations, which must live until then.
  using ReadIntoDone = std::function<void(absl::Status)>;
  std::unique_ptr<FetchPin> ReadInto(FetchCause cause, std::vector<SlotRead> reads, bool urgent,
                                     ReadIntoDone done);

  // A job's share of the figures: what its fetches read and first needed.
  struct JobIo {
    uint64_t bytes_read = 0;
    uint64_t distinct_bytes = 0;
  };
  JobIo JobFigures(const std::string& job) const;
  StorageFigures Stats() const;
  // When the oldest read still outstanding was issued; InfiniteFuture when
  // none is. A read that never returns (a hung NFS or Lustre server) makes
  // the daemon unhealthy to systemd's watchdog.
  absl::Time OldestReadStart() const;

 private:
  friend class FetchPin;
  // dataset, document, offset, bytes
  using Key = std::tuple<const dataset::IndexedDataset*, int64_t, uint64_t, uint64_t>;
  struct Entry;
  struct Request;
  struct File;
  struct Read;
  struct IntoRequest;
  struct IntoPiece;

  void Release(uint64_t id);
  void Admit(Request& request, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void AdmitWaiting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A done entry nobody needs any more: kept or dropped.
  void Unpinned(std::map<Key, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops kept entries, oldest first, until the budget holds.
  void TrimKept() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Counts `need` as distinct, or, when it must be read again, as a re-read
  // (returning its bytes).
  uint64_t Account(const FetchCause& cause, const SampleNeed& need, bool must_read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RecordReRead(const FetchCause& cause, const std::string& path, uint64_t samples,
                    uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void QueueReads(const Request& request, std::vector<Key> missing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void QueueCompletion(uint64_t id, bool urgent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool HasWorkOrStop() const ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
    return stop_ || !urgent_work_.empty() || !work_.empty();
  }
  void Worker();
  void DoRead(Read& read);
  void Complete(uint64_t id);
  void DoReadInto(const IntoPiece& piece);
  void CompleteInto(uint64_t id);
  // Counts a read of `bytes` of `file` for `cause`, issued now.
  void CountRead(File& file, const FetchCause& cause, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RecordLatency(File& file, double latency_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Open's answer for files already open (as `opened`): counted for one
  // more job, and logged with the path they were first opened under.
  std::shared_ptr<const dataset::IndexedDataset> ShareOpened(
      const std::shared_ptr<const dataset::IndexedDataset>& opened, const std::string& bin_path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const StorageOptions options_;
  mutable absl::Mutex mutex_;
  // The .bin's and the .idx's device and inode.
  using FileIdentity = std::array<uint64_t, 4>;
  std::map<FileIdentity, std::shared_ptr<const dataset::IndexedDataset>> opened_
      ABSL_GUARDED_BY(mutex_);
  std::map<const dataset::IndexedDataset*, File> files_ ABSL_GUARDED_BY(mutex_);
  std::map<Key, Entry> held_ ABSL_GUARDED_BY(mutex_);
  std::list<Key> kept_ ABSL_GUARDED_BY(mutex_);  // unpinned, oldest first
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::map<uint64_t, Request> requests_ ABSL_GUARDED_BY(mutex_);
  std::map<uint64_t, IntoRequest> into_ ABSL_GUARDED_BY(mutex_);  // ReadInto's
  std::deque<uint64_t> waiting_ ABSL_GUARDED_BY(mutex_);          // not yet admitted, in order
  // Work for the readers: urgent first.
  std::deque<std::function<void()>> urgent_work_ ABSL_GUARDED_BY(mutex_);
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, JobIo> jobs_ ABSL_GUARDED_BY(mutex_);
  std::deque<ReReadRecord> rereads_ ABSL_GUARDED_BY(mutex_);  // the latest few
  uint64_t reread_events_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  uint64_t cost_held_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t peak_cost_held_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t bytes_in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
  std::multiset<absl::Time> reads_started_ ABSL_GUARDED_BY(mutex_);
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_STORAGE_STORAGE_H_
