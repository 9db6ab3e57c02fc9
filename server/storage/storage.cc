#include "server/storage/storage.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

namespace {

// The memory limit of this process's cgroup, if any: v2's memory.max or
// v1's memory.limit_in_bytes ("max", or a huge number, when unlimited).
std::optional<uint64_t> CgroupMemoryLimit() {
  absl::StatusOr<std::string> groups = ReadWholeFile("/proc/self/cgroup");
  if (!groups.ok()) return std::nullopt;
  std::optional<uint64_t> least;
  for (absl::string_view line : absl::StrSplit(*groups, '\n', absl::SkipEmpty())) {
    // hierarchy-id:controllers:path
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    std::string file;
    if (parts[0] == "0" && parts[1].empty()) {
      file = absl::StrCat("/sys/fs/cgroup", parts[2], "/memory.max");
    } else if (absl::StrContains(parts[1], "memory")) {
      file = absl::StrCat("/sys/fs/cgroup/memory", parts[2], "/memory.limit_in_bytes");
    } else {
      continue;
    }
    absl::StatusOr<std::string> text = ReadWholeFile(file);
    uint64_t limit = 0;
    if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &limit) &&
        limit < (uint64_t{1} << 60)) {
      least = std::min(least.value_or(limit), limit);
    }
  }
  return least;
}

}  // namespace

uint64_t DefaultMemoryBudget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  uint64_t usable = pages > 0 && page_size > 0
                        ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
                        : uint64_t{4} << 30;
  if (std::optional<uint64_t> limit = CgroupMemoryLimit()) usable = std::min(usable, *limit);
  return usable / 4;
}
namespace {

constexpr size_t kLatencyWindow = 4096;
constexpr size_t kReReadsKept = 16;
// A cut row's read goes through a bounce buffer of at most this size.
constexpr uint64_t kCutPieceBytes = uint64_t{256} << 10;

// Where document `document`'s bytes begin in .bin. REQUIRES: its index
// entries passed CheckDocument (PlanStep checks every sample it plans).
uint64_t DocumentBegin(const dataset::IndexedDataset& data, int64_t document) {
  const dataset::IndexView& index = data.index();
  const int64_t first = index.document_index(static_cast<uint64_t>(document));
  if (static_cast<uint64_t>(first) == index.num_sequences()) return index.data_bytes();
  return static_cast<uint64_t>(index.pointer(static_cast<uint64_t>(first)));
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  const size_t at = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  std::nth_element(values.begin(), values.begin() + static_cast<ptrdiff_t>(at), values.end());
  return values[at];
}

}  // namespace

struct Storage::Entry {
  bool done = false;
  FetchedSample sample;
  // The need that made it be read, accounted when the read is issued (so
  // that bytes_read and distinct_bytes move together).
  SampleNeed first_need;
  int pins = 0;                   // needs of admitted requests
  std::vector<uint64_t> waiting;  // requests waiting for it, one per need
  // Set while nobody needs it and it is kept for whoever comes next.
  std::optional<std::list<Key>::iterator> kept;
};

struct Storage::Request {
  FetchCause cause;
  std::vector<SampleNeed> needs;
  bool urgent = false;
  FetchDone done;
  uint64_t cost = 0;
  bool admitted = false;
  int outstanding = 0;  // needs not yet done
  bool completing = false;
};

struct Storage::File {
  std::string path;
  uint32_t jobs = 0;
  uint64_t bytes_read = 0;
  uint64_t reads = 0;
  uint64_t distinct_bytes = 0;
  uint64_t reread_bytes = 0;
  std::vector<double> latencies_ms;  // a ring of the latest kLatencyWindow
  size_t next_latency = 0;
  // Per epoch, what was needed so far (the latest two epochs are kept): the
  // documents read from their start, and the later pieces of split ones.
  struct Needed {
    std::vector<bool> documents;
    std::set<std::pair<int64_t, uint64_t>> pieces;  // document, offset
  };
  std::map<int64_t, Needed> needed;
};

struct Storage::Read {
  const dataset::IndexedDataset* dataset = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::pair<Key, uint64_t>> members;  // and where each starts in the read
  FetchCause cause;  // of the fetch that needed it first, charged with the bytes
};

struct Storage::IntoRequest {
  FetchCause cause;
  bool urgent = false;
  ReadIntoDone done;
  absl::Status status;  // the first piece's error
  int outstanding = 0;  // pieces not yet read
  int running = 0;      // pieces being read now
  bool withdrawn = false;
  bool completing = false;
};

struct Storage::IntoPiece {
  uint64_t id = 0;  // of its IntoRequest
  const dataset::IndexedDataset* dataset = nullptr;
  uint64_t offset = 0;  // in .bin
  uint64_t length = 0;
  uint8_t* destination = nullptr;
  uint64_t row_bytes = 0;
  std::shared_ptr<const std::vector<std::pair<uint64_t, uint64_t>>> kept;
};

FetchPin::~FetchPin() { storage_->Release(id_); }

Storage::Storage(const StorageOptions& options) : options_(options) {
  for (int i = 0; i < std::max(1, options_.read_threads); ++i) {
    threads_.emplace_back([this] { Worker(); });
  }
}

Storage::~Storage() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> Storage::Open(
    const std::string& prefix) {
  struct stat bin {};
  struct stat idx {};
  const std::string bin_path = prefix + ".bin";
  const std::string idx_path = prefix + ".idx";
  if (::stat(idx_path.c_str(), &idx) != 0) return ErrnoToStatus(errno, "stat", idx_path);
  if (::stat(bin_path.c_str(), &bin) != 0) return ErrnoToStatus(errno, "stat", bin_path);
  // The .bin identifies the bytes read; the .idx how they are cut.
  const FileIdentity id{static_cast<uint64_t>(bin.st_dev), static_cast<uint64_t>(bin.st_ino),
                        static_cast<uint64_t>(idx.st_dev), static_cast<uint64_t>(idx.st_ino)};
  {
    absl::MutexLock lock(&mutex_);
    if (auto opened = opened_.find(id); opened != opened_.end()) {
      return ShareOpened(opened->second, bin_path);
    }
  }
  // Opened without the lock: a job opens its datasets on several threads
  // (a thousand indexes at corpus scale). One opened meanwhile by another
  // thread is the one kept.
  dataset::IndexedDatasetOptions open_options;
  open_options.validation = dataset::IndexValidation::kOnUse;
  PF_ASSIGN_OR_RETURN(dataset::IndexedDataset data,
                      dataset::IndexedDataset::Open(prefix, open_options));
  absl::MutexLock lock(&mutex_);
  auto [opened, added] =
      opened_.try_emplace(id, std::make_shared<const dataset::IndexedDataset>(std::move(data)));
  if (!added) return ShareOpened(opened->second, bin_path);
  files_[opened->second.get()].path = bin_path;
  ++files_[opened->second.get()].jobs;
  return opened->second;
}

std::shared_ptr<const dataset::IndexedDataset> Storage::ShareOpened(
    const std::shared_ptr<const dataset::IndexedDataset>& opened, const std::string& bin_path) {
  File& file = files_[opened.get()];
  spdlog::info("{}: already open (as {}), shared", bin_path, file.path);
  ++file.jobs;
  return opened;
}

std::unique_ptr<FetchPin> Storage::Fetch(FetchCause cause, std::vector<SampleNeed> needs,
                                         bool urgent, FetchDone done) {
  absl::MutexLock lock(&mutex_);
  const uint64_t id = next_id_++;
  Request& request = requests_[id];
  for (const SampleNeed& need : needs) {
    const uint64_t item = dataset::DTypeSize(need.dataset->dtype());
    request.cost += need.bytes + (need.tokens ? need.bytes / item * sizeof(int64_t) : 0);
  }
  request.cause = std::move(cause);
  request.needs = std::move(needs);
  request.urgent = urgent;
  request.done = std::move(done);
  const uint64_t budget = options_.memory_budget_bytes;
  if (urgent || budget == 0 || cost_held_ == 0 || cost_held_ + request.cost <= budget) {
    Admit(request, id);
  } else {
    waiting_.push_back(id);
  }
  return std::unique_ptr<FetchPin>(new FetchPin(this, id));
}

void Storage::Admit(Request& request, uint64_t id) {
  request.admitted = true;
  cost_held_ += request.cost;
  peak_cost_held_ = std::max(peak_cost_held_, cost_held_);
  std::vector<Key> missing;
  for (const SampleNeed& need : request.needs) {
    const Key key{need.dataset, need.document, need.offset, need.bytes};
    auto [it, inserted] = held_.try_emplace(key);
    Entry& entry = it->second;
    if (entry.kept.has_value()) {
      kept_bytes_ -= entry.sample.size;
      kept_.erase(*entry.kept);
      entry.kept.reset();
    }
    if (inserted) {
      entry.first_need = need;
    } else if (entry.done || need.epoch != entry.first_need.epoch) {
      // (Not done and the same epoch: the read accounts for it when issued.)
      Account(request.cause, need, /*must_read=*/false);
    }
    ++entry.pins;
    if (!entry.done) {
      entry.waiting.push_back(id);
      ++request.outstanding;
    }
    if (inserted) missing.push_back(key);
  }
  QueueReads(request, std::move(missing));
  if (request.outstanding == 0) QueueCompletion(id, request.urgent);
  TrimKept();
}

void Storage::Unpinned(std::map<Key, Entry>::iterator it) {
  Entry& entry = it->second;
  if (options_.memory_budget_bytes == 0 || !entry.sample.status.ok() || !entry.first_need.keep) {
    held_.erase(it);
    return;
  }
  entry.kept = kept_.insert(kept_.end(), it->first);
  kept_bytes_ += entry.sample.size;
  TrimKept();
}

void Storage::TrimKept() {
  while (!kept_.empty() && cost_held_ + kept_bytes_ > options_.memory_budget_bytes) {
    auto oldest = held_.find(kept_.front());
    kept_bytes_ -= oldest->second.sample.size;
    kept_.pop_front();
    held_.erase(oldest);
  }
}

uint64_t Storage::Account(const FetchCause& cause, const SampleNeed& need, bool must_read) {
  File& file = files_[need.dataset];
  file.needed.try_emplace(need.epoch);
  while (file.needed.size() > 2 && file.needed.begin()->first != need.epoch) {
    file.needed.erase(file.needed.begin());
  }
  File::Needed& seen = file.needed[need.epoch];
  bool first_time = false;
  if (need.offset > 0) {
    first_time = seen.pieces.emplace(need.document, need.offset).second;
  } else {
    if (seen.documents.empty()) seen.documents.resize(need.dataset->num_documents());
    std::vector<bool>::reference bit = seen.documents[static_cast<size_t>(need.document)];
    first_time = !bit;
    bit = true;
  }
  if (first_time) {
    file.distinct_bytes += need.bytes;
    jobs_[cause.job].distinct_bytes += need.bytes;
    return 0;
  }
  if (!must_read || need.bytes == 0) return 0;
  file.reread_bytes += need.bytes;
  return need.bytes;
}

void Storage::RecordReRead(const FetchCause& cause, const std::string& path, uint64_t samples,
                           uint64_t bytes) {
  // One record and one log line per fetch and file, however many requests
  // it took (the reads of a fetch's files interleave, so look a few back).
  const uint32_t rank = static_cast<uint32_t>(std::max(0, cause.rank));
  for (auto it = rereads_.rbegin(); it != rereads_.rend() && it - rereads_.rbegin() < 4; ++it) {
    if (it->job == cause.job && it->rank == rank && it->step == cause.step && it->path == path) {
      it->samples += samples;
      it->bytes += bytes;
      return;
    }
  }
  spdlog::warn(
      "job {} rank {} step {}: reads again {} of {} the node read before (this fetch's further "
      "re-reads of it are counted in stats)",
      cause.job, cause.rank, cause.step,
      samples == 1 ? "1 sample" : absl::StrCat(samples, " samples"), path);
  ++reread_events_;
  rereads_.push_back({cause.job, rank, cause.step, path, samples, bytes});
  if (rereads_.size() > kReReadsKept) rereads_.pop_front();
}

void Storage::QueueReads(const Request& request, std::vector<Key> missing) {
  std::vector<std::pair<uint64_t, Key>> by_offset;  // within a file
  for (const Key& key : missing) {
    const auto& [data, document, offset, bytes] = key;
    if (bytes == 0) {
      Entry& entry = held_.at(key);
      entry.done = true;
      entry.sample.buffer = std::make_shared_for_overwrite<char[]>(0);
      for (uint64_t waiter : entry.waiting) --requests_.at(waiter).outstanding;
      entry.waiting.clear();
      continue;
    }
    by_offset.emplace_back(DocumentBegin(*data, document) + offset, key);
  }
  std::sort(by_offset.begin(), by_offset.end());
  auto& queue = request.urgent ? urgent_work_ : work_;
  std::shared_ptr<Read> read;
  for (const auto& [offset, key] : by_offset) {
    const auto& [data, document, within, bytes] = key;
    const bool extends = read != nullptr && read->dataset == data &&
                         read->offset + read->length == offset &&
                         read->length + bytes <= options_.max_request_bytes;
    if (!extends) {
      if (read != nullptr) queue.push_back([this, read] { DoRead(*read); });
      read = std::make_shared<Read>();
      read->dataset = data;
      read->offset = offset;
      read->cause = request.cause;
    }
    read->members.emplace_back(key, read->length);
    read->length += bytes;
  }
  if (read != nullptr) queue.push_back([this, read] { DoRead(*read); });
}

void Storage::QueueCompletion(uint64_t id, bool urgent) {
  (urgent ? urgent_work_ : work_).push_back([this, id] { Complete(id); });
}

void Storage::Worker() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(this, &Storage::HasWorkOrStop));
      if (stop_) return;
      auto& queue = urgent_work_.empty() ? work_ : urgent_work_;
      task = std::move(queue.front());
      queue.pop_front();
    }
    task();
  }
}

void Storage::DoRead(Read& read) {
  File* file = nullptr;
  {
    absl::MutexLock lock(&mutex_);
    bool wanted = false;
    for (const auto& [key, _] : read.members) wanted |= held_.at(key).pins > 0;
    if (!wanted) {  // every fetch that needed it was withdrawn
      for (const auto& [key, _] : read.members) held_.erase(key);
      return;
    }
    uint64_t reread_bytes = 0;
    uint64_t reread_samples = 0;
    for (const auto& [key, _] : read.members) {
      const uint64_t again = Account(read.cause, held_.at(key).first_need, /*must_read=*/true);
      reread_bytes += again;
      reread_samples += again > 0 ? 1 : 0;
    }
    file = &files_[read.dataset];
    if (reread_bytes > 0) RecordReRead(read.cause, file->path, reread_samples, reread_bytes);
    CountRead(*file, read.cause, read.length);
  }
  // Not zero-filled: the read overwrites it.
  std::shared_ptr<char[]> buffer = std::make_shared_for_overwrite<char[]>(read.length);
  const absl::Time start = absl::Now();
  std::multiset<absl::Time>::iterator started;
  {
    absl::MutexLock lock(&mutex_);
    started = reads_started_.insert(start);
  }
  const absl::Status status =
      read.dataset->ReadBytes(read.offset, absl::MakeSpan(buffer.get(), read.length));
  const double latency_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!status.ok()) {
    spdlog::error("{}: reading bytes [{}, {}) for {} samples: {}", file->path, read.offset,
                  read.offset + read.length, read.members.size(), status.ToString());
  }
  absl::MutexLock lock(&mutex_);
  reads_started_.erase(started);
  bytes_in_flight_ -= read.length;
  RecordLatency(*file, latency_ms);
  for (const auto& [key, offset] : read.members) {
    auto it = held_.find(key);
    Entry& entry = it->second;
    entry.done = true;
    entry.sample = {buffer, offset, std::get<3>(key), status};
    for (uint64_t waiter : entry.waiting) {
      Request& request = requests_.at(waiter);
      if (--request.outstanding == 0) QueueCompletion(waiter, request.urgent);
    }
    entry.waiting.clear();
    if (entry.pins == 0) Unpinned(it);
  }
}

void Storage::Complete(uint64_t id) {
  std::vector<FetchedSample> samples;
  FetchDone done;
  Request* request = nullptr;
  {
    absl::MutexLock lock(&mutex_);
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second.done) return;  // withdrawn, or done already
    request = &it->second;
    for (const SampleNeed& need : request->needs) {
      samples.push_back(held_.at({need.dataset, need.document, need.offset, need.bytes}).sample);
    }
    done = std::move(request->done);
    request->done = nullptr;
    request->completing = true;
  }
  done(std::move(samples));
  absl::MutexLock lock(&mutex_);
  request->completing = false;
}

void Storage::CountRead(File& file, const FetchCause& cause, uint64_t bytes) {
  file.bytes_read += bytes;
  ++file.reads;
  jobs_[cause.job].bytes_read += bytes;
  bytes_in_flight_ += bytes;
}

void Storage::RecordLatency(File& file, double latency_ms) {
  if (file.latencies_ms.size() < kLatencyWindow) {
    file.latencies_ms.push_back(latency_ms);
  } else {
    file.latencies_ms[file.next_latency] = latency_ms;
  }
  file.next_latency = (file.next_latency + 1) % kLatencyWindow;
}

std::unique_ptr<FetchPin> Storage::ReadInto(FetchCause cause, std::vector<SlotRead> reads,
                                            bool urgent, ReadIntoDone done) {
  absl::MutexLock lock(&mutex_);
  const uint64_t id = next_id_++;
  IntoRequest& request = into_[id];
  request.cause = std::move(cause);
  request.urgent = urgent;
  request.done = std::move(done);
  auto& queue = urgent ? urgent_work_ : work_;
  for (SlotRead& read : reads) {
    if (read.need.bytes == 0) continue;
    const bool cut = !read.kept.empty();
    // Whole rows per piece: up to a request's size straight into place, or
    // a small bounce buffer's worth when rows are cut.
    const uint64_t rows_per_piece =
        std::max<uint64_t>(1, (cut ? kCutPieceBytes : options_.max_request_bytes) / read.row_bytes);
    const uint64_t piece_bytes = rows_per_piece * read.row_bytes;
    const uint64_t kept_row_bytes = read.kept_row_bytes();
    auto kept =
        std::make_shared<const std::vector<std::pair<uint64_t, uint64_t>>>(std::move(read.kept));
    const uint64_t begin = DocumentBegin(*read.need.dataset, read.need.document) + read.need.offset;
    for (uint64_t at = 0; at < read.need.bytes; at += piece_bytes) {
      auto piece = std::make_shared<IntoPiece>();
      piece->id = id;
      piece->dataset = read.need.dataset;
      piece->offset = begin + at;
      piece->length = std::min(piece_bytes, read.need.bytes - at);
      piece->destination = read.destination + at / read.row_bytes * kept_row_bytes;
      piece->row_bytes = read.row_bytes;
      piece->kept = kept;
      queue.push_back([this, piece] { DoReadInto(*piece); });
      ++request.outstanding;
    }
    File& file = files_[read.need.dataset];
    if (read.again) {
      file.reread_bytes += read.need.bytes;
      RecordReRead(request.cause, file.path, 1, read.need.bytes);
    } else {
      file.distinct_bytes += read.need.bytes;
      jobs_[request.cause.job].distinct_bytes += read.need.bytes;
    }
  }
  if (request.outstanding == 0) queue.push_back([this, id] { CompleteInto(id); });
  return std::unique_ptr<FetchPin>(new FetchPin(this, id));
}

void Storage::DoReadInto(const IntoPiece& piece) {
  File* file = nullptr;
  const absl::Time start = absl::Now();
  std::multiset<absl::Time>::iterator started;
  {
    absl::MutexLock lock(&mutex_);
    auto it = into_.find(piece.id);
    if (it == into_.end() || it->second.withdrawn) return;
    ++it->second.running;
    file = &files_[piece.dataset];
    CountRead(*file, it->second.cause, piece.length);
    started = reads_started_.insert(start);
  }
  absl::Status status;
  if (piece.kept->empty()) {
    status = piece.dataset->ReadBytes(
        piece.offset, absl::MakeSpan(reinterpret_cast<char*>(piece.destination), piece.length));
  } else {
    // At most kCutPieceBytes per reader thread, whatever the job.
    thread_local std::vector<char> bounce;
    bounce.resize(piece.length);
    status = piece.dataset->ReadBytes(piece.offset, absl::MakeSpan(bounce.data(), piece.length));
    uint8_t* out = piece.destination;
    for (uint64_t row = 0; status.ok() && row < piece.length; row += piece.row_bytes) {
      for (const auto& [offset, bytes] : *piece.kept) {
        std::memcpy(out, bounce.data() + row + offset, bytes);
        out += bytes;
      }
    }
  }
  const double latency_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!status.ok()) {
    spdlog::error("{}: reading bytes [{}, {}) into a rank's slot: {}", file->path, piece.offset,
                  piece.offset + piece.length, status.ToString());
  }
  absl::MutexLock lock(&mutex_);
  reads_started_.erase(started);
  bytes_in_flight_ -= piece.length;
  RecordLatency(*file, latency_ms);
  IntoRequest& request = into_.at(piece.id);
  --request.running;
  if (!status.ok() && request.status.ok()) {
    request.status = absl::Status(status.code(), absl::StrCat(file->path, ": ", status.message()));
  }
  if (--request.outstanding == 0 && !request.withdrawn) {
    (request.urgent ? urgent_work_ : work_).push_back([this, id = piece.id] { CompleteInto(id); });
  }
}

void Storage::CompleteInto(uint64_t id) {
  ReadIntoDone done;
  absl::Status status;
  IntoRequest* request = nullptr;
  {
    absl::MutexLock lock(&mutex_);
    auto it = into_.find(id);
    if (it == into_.end() || it->second.withdrawn) return;
    request = &it->second;
    done = std::move(request->done);
    request->done = nullptr;
    status = request->status;
    request->completing = true;
  }
  done(std::move(status));
  absl::MutexLock lock(&mutex_);
  request->completing = false;
}

void Storage::Release(uint64_t id) {
  absl::MutexLock lock(&mutex_);
  if (auto into = into_.find(id); into != into_.end()) {
    // Pieces still queued skip themselves once it is gone; those being read
    // write into the caller's memory, so they are waited for.
    IntoRequest& request = into->second;
    request.withdrawn = true;
    mutex_.Await(absl::Condition(
        +[](IntoRequest* r) { return r->running == 0 && !r->completing; }, &request));
    into_.erase(into);
    return;
  }
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& request = it->second;
  // `done` may be running: it must finish before what it captured goes.
  mutex_.Await(absl::Condition(
      +[](Request* r) { return !r->completing; }, &request));
  if (!request.admitted) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    requests_.erase(it);
    return;
  }
  for (const SampleNeed& need : request.needs) {
    auto entry = held_.find({need.dataset, need.document, need.offset, need.bytes});
    --entry->second.pins;
    std::vector<uint64_t>& waiting = entry->second.waiting;
    auto mine = std::find(waiting.begin(), waiting.end(), id);
    if (mine != waiting.end()) waiting.erase(mine);
    // Queued or being read: the read drops it when it returns.
    if (entry->second.pins == 0 && entry->second.done) Unpinned(entry);
  }
  cost_held_ -= request.cost;
  requests_.erase(it);
  AdmitWaiting();
}

void Storage::AdmitWaiting() {
  const uint64_t budget = options_.memory_budget_bytes;
  while (!waiting_.empty()) {
    const uint64_t id = waiting_.front();
    Request& request = requests_.at(id);
    if (budget != 0 && cost_held_ != 0 && cost_held_ + request.cost > budget) return;
    waiting_.pop_front();
    Admit(request, id);
  }
}

absl::Time Storage::OldestReadStart() const {
  absl::MutexLock lock(&mutex_);
  return reads_started_.empty() ? absl::InfiniteFuture() : *reads_started_.begin();
}

Storage::JobIo Storage::JobFigures(const std::string& job) const {
  absl::MutexLock lock(&mutex_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? JobIo{} : it->second;
}

StorageFigures Storage::Stats() const {
  absl::MutexLock lock(&mutex_);
  StorageFigures stats;
  for (const auto& [_, file] : files_) {
    StorageFileFigures& out = stats.files.emplace_back();
    out.path = file.path;
    out.jobs = file.jobs;
    out.bytes_read = file.bytes_read;
    out.reads = file.reads;
    out.distinct_bytes = file.distinct_bytes;
    out.reread_bytes = file.reread_bytes;
    if (file.distinct_bytes > 0) {
      out.io_amplification =
          static_cast<double>(file.bytes_read) / static_cast<double>(file.distinct_bytes);
    }
    out.read_latency_p50_ms = Percentile(file.latencies_ms, 0.50);
    out.read_latency_p99_ms = Percentile(file.latencies_ms, 0.99);
    out.read_latency_max_ms = Percentile(file.latencies_ms, 1.0);
    stats.bytes_read += file.bytes_read;
    stats.distinct_bytes += file.distinct_bytes;
  }
  if (stats.distinct_bytes > 0) {
    stats.io_amplification =
        static_cast<double>(stats.bytes_read) / static_cast<double>(stats.distinct_bytes);
  }
  stats.bytes_in_flight = bytes_in_flight_;
  stats.bytes_held = cost_held_;
  stats.bytes_kept = kept_bytes_;
  stats.peak_bytes_held = peak_cost_held_;
  stats.memory_budget_bytes = options_.memory_budget_bytes;
  stats.read_threads = static_cast<uint32_t>(threads_.size());
  stats.reread_events = reread_events_;
  stats.rereads.assign(rereads_.begin(), rereads_.end());
  return stats;
}

}  // namespace packfeed::server
