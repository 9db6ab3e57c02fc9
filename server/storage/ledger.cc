#include "server/storage/ledger.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "packfeed/common/status_macros.h"
#include "spdlog/spdlog.h"
#include "xxhash.h"

namespace packfeed::server {
namespace {

// Version 2 seals every record with a checksum; version 1 journals (before
// checksums) are still read, and records appended to them are sealed.
constexpr absl::string_view kHeader = "packfeed-ledger 2";

// Where a compaction writes the new journal before renaming it over.
std::string AsidePath(const std::string& journal_path) { return journal_path + ".compacting"; }
constexpr absl::string_view kHeaderV1 = "packfeed-ledger 1";

uint32_t RecordChecksum(absl::string_view record) {
  return static_cast<uint32_t>(XXH3_64bits(record.data(), record.size()));
}

// A journal line: the record, then " ~" and its checksum in 8 hex digits.
std::string Sealed(absl::string_view record) {
  return absl::StrCat(record, " ~", absl::StrFormat("%08x", RecordChecksum(record)));
}

// The record of a sealed line; nullopt when the seal is missing or wrong.
std::optional<absl::string_view> Unsealed(absl::string_view line) {
  const size_t mark = line.rfind(" ~");
  uint32_t checksum = 0;
  if (mark == absl::string_view::npos || line.size() - mark != 10 ||
      !absl::SimpleHexAtoi(line.substr(mark + 2), &checksum)) {
    return std::nullopt;
  }
  const absl::string_view record = line.substr(0, mark);
  if (checksum != RecordChecksum(record)) return std::nullopt;
  return record;
}

std::string FormatShares(const std::vector<EpochShare>& shares) {
  std::string out;
  for (const EpochShare& share : shares) {
    absl::StrAppend(&out, " ", share.dataset, ":", share.epoch, ":", share.samples, ":",
                    absl::StrFormat("%016x", share.digest));
  }
  return out;
}

bool ParseShare(absl::string_view text, EpochShare& share) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  return parts.size() == 4 && absl::SimpleAtoi(parts[0], &share.dataset) && share.dataset >= 0 &&
         absl::SimpleAtoi(parts[1], &share.epoch) && absl::SimpleAtoi(parts[2], &share.samples) &&
         parts[3].size() == 16 && absl::SimpleHexAtoi(parts[3], &share.digest);
}

}  // namespace

uint64_t SampleDigest(int dataset, int64_t index) {
  uint64_t z = (static_cast<uint64_t>(dataset) << 40) + static_cast<uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<EpochShare> SharesOf(const std::vector<scheduler::SampleRef>& samples) {
  std::vector<EpochShare> shares;
  for (const scheduler::SampleRef& sample : samples) {
    auto it = std::find_if(shares.begin(), shares.end(), [&](const EpochShare& s) {
      return s.dataset == sample.dataset && s.epoch == sample.epoch;
    });
    if (it == shares.end()) it = shares.insert(shares.end(), {sample.dataset, sample.epoch, 0, 0});
    ++it->samples;
    it->digest += SampleDigest(sample.dataset, sample.index);
  }
  std::sort(shares.begin(), shares.end(), [](const EpochShare& a, const EpochShare& b) {
    return std::tie(a.dataset, a.epoch) < std::tie(b.dataset, b.epoch);
  });
  return shares;
}

absl::StatusOr<std::unique_ptr<Ledger>> Ledger::Open(const std::string& journal_path,
                                                     const LedgerOptions& options) {
  std::unique_ptr<Ledger> ledger(new Ledger(journal_path, options));
  if (journal_path.empty()) return ledger;
  // A compaction that crashed before its rename left the new journal aside;
  // the old one, still in place, holds every record.
  if (::unlink(AsidePath(journal_path).c_str()) == 0) {
    spdlog::warn("ledger {}: removed {} left by a compaction that did not finish", journal_path,
                 AsidePath(journal_path));
  }
  // Read, not mapped: a journal truncated by hand meanwhile must not SIGBUS.
  absl::StatusOr<std::string> existing = ReadWholeFile(journal_path);
  if (existing.ok()) {
    const std::string& text = *existing;
    PF_ASSIGN_OR_RETURN(const size_t whole, ledger->Replay(text));
    // Cut a torn or corrupt last line off, so that the next record starts a
    // line of its own.
    if (whole < text.size() && truncate(journal_path.c_str(), static_cast<off_t>(whole)) != 0) {
      return ErrnoToStatus(errno, "truncate", journal_path);
    }
    if (whole == 0) existing = absl::NotFoundError("empty");  // write the header again
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }
  const int fd = open(journal_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return ErrnoToStatus(errno, "open", journal_path);
  ledger->journal_ = ScopedFd(fd);
  if (!existing.ok()) {
    PF_RETURN_IF_ERROR(
        WriteFully(ledger->journal_.get(), journal_path, absl::StrCat(kHeader, "\n")));
    // A new journal's name must outlive a crash as its lines do.
    PF_RETURN_IF_ERROR(SyncDirectoryOf(journal_path));
  }
  return ledger;
}

absl::StatusOr<size_t> Ledger::Replay(const std::string& text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // The text ends with '\n' when its last line is whole: StrSplit then
  // yields an empty last piece. Anything else is a line torn by a crash.
  if (!lines.back().empty()) {
    spdlog::warn("ledger {}: dropping a torn last line ({} bytes), written when the daemon died",
                 journal_path_, lines.back().size());
  }
  lines.pop_back();
  if (lines.empty()) return 0;  // only a torn header: start afresh
  const bool v1 = lines[0] == kHeaderV1;
  if (lines[0] != kHeader && !v1) {
    return absl::DataLossError(absl::StrCat("ledger ", journal_path_, ": not a packfeed ledger (",
                                            "first line '", lines[0].substr(0, 40), "')"));
  }
  size_t whole = lines[0].size() + 1;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::optional<absl::string_view> record = Unsealed(lines[i]);
    if (!record.has_value() && v1 && lines[i].find(" ~") == absl::string_view::npos) {
      record = lines[i];  // written before records were sealed
    }
    if (!record.has_value()) {
      const std::string where = absl::StrCat("ledger ", journal_path_, " line ", i + 1);
      if (i + 1 < lines.size()) {
        return absl::DataLossError(absl::StrCat(where, ": checksum mismatch"));
      }
      // The last line only: a write the crash left half on disk.
      spdlog::warn("{}: dropping a corrupt last line (checksum mismatch)", where);
      return whole;
    }
    absl::Status status = ReplayLine(std::string(*record));
    if (!status.ok())
      return absl::DataLossError(
          absl::StrCat("ledger ", journal_path_, " line ", i + 1, ": ", status.message()));
    whole += lines[i].size() + 1;
    ++journal_lines_;
  }
  return whole;
}

absl::Status Ledger::ReplayLine(const std::string& line) {
  const std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
  int rank = 0;
  LedgerPosition at;
  const bool position_ok = words.size() >= 4 && absl::SimpleAtoi(words[1], &rank) && rank >= 0 &&
                           absl::SimpleAtoi(words[2], &at.step) && at.step >= 0 &&
                           absl::SimpleAtoi(words[3], &at.microbatch) && at.microbatch >= 0;
  if (position_ok && words[0] == "A" && words.size() == 4) {
    ApplyAttach(rank, at);
    return absl::OkStatus();
  }
  uint64_t skipped = 0;
  if (position_ok && words[0] == "J" && words.size() == 5 && absl::SimpleAtoi(words[4], &skipped)) {
    ApplyJump(rank, at, skipped);
    return absl::OkStatus();
  }
  Entry entry;
  // A compacted rank: S rank first next_step next_mb folded_step folded_mb
  // folded_microbatches duplicates gaps rewinds claimed shares...
  if (position_ok && words[0] == "S" && words.size() >= 12) {
    RankRecord record;
    record.first_step = at.step;
    const bool ok = absl::SimpleAtoi(words[3], &record.next.step) &&
                    absl::SimpleAtoi(words[4], &record.next.microbatch) &&
                    absl::SimpleAtoi(words[5], &record.folded_to.step) &&
                    absl::SimpleAtoi(words[6], &record.folded_to.microbatch) &&
                    absl::SimpleAtoi(words[7], &record.folded_microbatches) &&
                    absl::SimpleAtoi(words[8], &record.duplicates) &&
                    absl::SimpleAtoi(words[9], &record.gaps) &&
                    absl::SimpleAtoi(words[10], &record.rewinds) &&
                    absl::SimpleAtoi(words[11], &record.claimed);
    if (!ok) return absl::InvalidArgumentError("bad compacted rank record");
    for (size_t i = 12; i < words.size(); ++i) {
      EpochShare share;
      if (!ParseShare(words[i], share)) return absl::InvalidArgumentError("bad sample digest");
      record.folded[{share.dataset, share.epoch}] = share;
    }
    ranks_[rank] = std::move(record);
    return absl::OkStatus();
  }
  // An entry kept by a compaction: E rank step microbatch count shares...
  if (position_ok && words[0] == "E" && words.size() >= 5 &&
      absl::SimpleAtoi(words[4], &entry.num_microbatches) &&
      at.microbatch < entry.num_microbatches && ranks_.count(rank) != 0) {
    for (size_t i = 5; i < words.size(); ++i) {
      EpochShare share;
      if (!ParseShare(words[i], share)) return absl::InvalidArgumentError("bad sample digest");
      entry.shares.push_back(share);
    }
    ranks_[rank].consumed[at] = std::move(entry);
    return absl::OkStatus();
  }
  if (position_ok && words[0] == "C" && words.size() >= 6 &&
      absl::SimpleAtoi(words[4], &entry.num_microbatches) &&
      at.microbatch < entry.num_microbatches && (words[5] == "c" || words[5] == "l")) {
    for (size_t i = 6; i < words.size(); ++i) {
      EpochShare share;
      if (!ParseShare(words[i], share)) return absl::InvalidArgumentError("bad sample digest");
      entry.shares.push_back(share);
    }
    ApplyConsume(rank, at, std::move(entry), words[5] == "l");
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unreadable record '", line.substr(0, 60), "'"));
}

absl::Status Ledger::Append(const std::string& line) {
  if (!journal_.valid()) return absl::OkStatus();
  // Compacted first: `line` takes effect in memory after it is written, so
  // the new journal must not lose it.
  if (journal_lines_ >= entries() + ranks_.size() + options_.compact_after_lines) {
    PF_RETURN_IF_ERROR(Compact());
  }
  PF_RETURN_IF_ERROR(WriteFully(journal_.get(), journal_path_, Sealed(line) + "\n"));
  ++journal_lines_;
  unsynced_ = true;
  return absl::OkStatus();
}

absl::Status Ledger::Sync() {
  if (!journal_.valid() || !unsynced_) return absl::OkStatus();
  if (::fdatasync(journal_.get()) != 0) return ErrnoToStatus(errno, "fdatasync", journal_path_);
  unsynced_ = false;
  return absl::OkStatus();
}

uint64_t Ledger::entries() const {
  uint64_t count = 0;
  for (const auto& [_, record] : ranks_) count += record.consumed.size();
  return count;
}

absl::Status Ledger::Compact() {
  std::string text = absl::StrCat(kHeader, "\n");
  uint64_t lines = 0;
  for (const auto& [rank, record] : ranks_) {
    std::vector<EpochShare> folded;
    for (const auto& [_, share] : record.folded) folded.push_back(share);
    absl::StrAppend(
        &text,
        Sealed(absl::StrCat("S ", rank, " ", record.first_step, " ", record.next.step, " ",
                            record.next.microbatch, " ", record.folded_to.step, " ",
                            record.folded_to.microbatch, " ", record.folded_microbatches, " ",
                            record.duplicates, " ", record.gaps, " ", record.rewinds, " ",
                            record.claimed, FormatShares(folded))),
        "\n");
    ++lines;
    for (const auto& [at, entry] : record.consumed) {
      absl::StrAppend(&text,
                      Sealed(absl::StrCat("E ", rank, " ", at.step, " ", at.microbatch, " ",
                                          entry.num_microbatches, FormatShares(entry.shares))),
                      "\n");
      ++lines;
    }
  }
  // Written aside, made durable, then renamed over: a crash leaves the old
  // journal or the new one, whole.
  const auto step_done = [this](const char* point) {
    if (options_.compaction_step) options_.compaction_step(point);
  };
  const std::string aside = AsidePath(journal_path_);
  {
    const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0) return ErrnoToStatus(errno, "open", aside);
    ScopedFd file(fd);
    step_done("aside created");
    PF_RETURN_IF_ERROR(WriteFully(file.get(), aside, text));
    if (::fdatasync(file.get()) != 0) return ErrnoToStatus(errno, "fdatasync", aside);
    step_done("aside synced");
  }
  if (::rename(aside.c_str(), journal_path_.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename", aside);
  }
  step_done("renamed");
  // Until the folder is synced the rename itself may be lost in a crash.
  PF_RETURN_IF_ERROR(SyncDirectoryOf(journal_path_));
  step_done("folder synced");
  const int fd = ::open(journal_path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", journal_path_);
  journal_ = ScopedFd(fd);
  step_done("reopened");
  spdlog::info("ledger {}: compacted {} lines into {}", journal_path_, journal_lines_, lines);
  journal_lines_ = lines;
  unsynced_ = false;
  return absl::OkStatus();
}

absl::StatusOr<Ledger::AttachResult> Ledger::Attach(int rank, LedgerPosition at) {
  PF_RETURN_IF_ERROR(Append(absl::StrCat("A ", rank, " ", at.step, " ", at.microbatch)));
  return ApplyAttach(rank, at);
}

absl::Status Ledger::Jump(int rank, LedgerPosition at, uint64_t skipped) {
  PF_RETURN_IF_ERROR(
      Append(absl::StrCat("J ", rank, " ", at.step, " ", at.microbatch, " ", skipped)));
  ApplyJump(rank, at, skipped);
  return absl::OkStatus();
}

void Ledger::ApplyJump(int rank, LedgerPosition at, uint64_t skipped) {
  RankRecord& record = ranks_[rank];
  record.gaps += skipped;
  record.next = at;
}

absl::Status Ledger::Consume(int rank, LedgerPosition at, int num_microbatches,
                             std::vector<EpochShare> shares) {
  return Record(rank, at, num_microbatches, std::move(shares), /*claimed=*/false);
}

absl::Status Ledger::Claim(int rank, LedgerPosition at, int num_microbatches,
                           std::vector<EpochShare> shares) {
  return Record(rank, at, num_microbatches, std::move(shares), /*claimed=*/true);
}

absl::Status Ledger::Record(int rank, LedgerPosition at, int num_microbatches,
                            std::vector<EpochShare> shares, bool claimed) {
  PF_RETURN_IF_ERROR(
      Append(absl::StrCat("C ", rank, " ", at.step, " ", at.microbatch, " ", num_microbatches,
                          claimed ? " l" : " c", FormatShares(shares))));
  ApplyConsume(rank, at, {num_microbatches, std::move(shares)}, claimed);
  return absl::OkStatus();
}

Ledger::AttachResult Ledger::ApplyAttach(int rank, LedgerPosition at) {
  auto [it, first] = ranks_.try_emplace(rank);
  RankRecord& record = it->second;
  const LedgerPosition before = record.next;
  if (first) {
    record.first_step = at.step;
    record.next = at;
    return {AttachKind::kFirst, at};
  }
  if (at == before) return {AttachKind::kContinue, before};
  if (at < before) {
    if (record.folded_microbatches > 0 && at < record.folded_to) {
      spdlog::warn(
          "ledger: rank {} rewinds to step {}, before its folded record (steps before {}): its "
          "record restarts at step {}",
          rank, at.step, record.folded_to.step, at.step);
      const uint64_t rewinds = record.rewinds;
      record = RankRecord();
      record.first_step = at.step;
      record.rewinds = rewinds;
    }
    record.consumed.erase(record.consumed.lower_bound(at), record.consumed.end());
    record.next = at;
    ++record.rewinds;
    return {AttachKind::kRewind, before};
  }
  return {AttachKind::kAhead, before};
}

void Ledger::ApplyConsume(int rank, LedgerPosition at, Entry entry, bool claimed) {
  auto [it, first] = ranks_.try_emplace(rank);
  RankRecord& record = it->second;
  if (first) {
    record.first_step = at.step;
    record.next = at;
  }
  if (at < record.next) {
    ++record.duplicates;
    spdlog::error(
        "ledger: rank {} consumed step {} microbatch {} again (its position is step {} "
        "microbatch {})",
        rank, at.step, at.microbatch, record.next.step, record.next.microbatch);
    return;
  }
  if (record.next < at) {
    // Microbatches between were never consumed: within one step, how many;
    // across steps (whose counts the ledger may not know), at least one.
    const uint64_t skipped = at.step == record.next.step
                                 ? static_cast<uint64_t>(at.microbatch - record.next.microbatch)
                                 : 1;
    record.gaps += skipped;
    spdlog::error(
        "ledger: rank {} consumed step {} microbatch {} but its position was step {} "
        "microbatch {}: a gap",
        rank, at.step, at.microbatch, record.next.step, record.next.microbatch);
  }
  if (claimed) ++record.claimed;
  const int count = entry.num_microbatches;
  record.consumed[at] = std::move(entry);
  record.next = at.microbatch + 1 == count ? LedgerPosition{at.step + 1, 0}
                                           : LedgerPosition{at.step, at.microbatch + 1};
  Fold(record);
}

void Ledger::Fold(RankRecord& record) {
  const LedgerPosition horizon{record.next.step - options_.keep_steps, 0};
  while (!record.consumed.empty() && record.consumed.begin()->first < horizon) {
    auto oldest = record.consumed.begin();
    for (const EpochShare& share : oldest->second.shares) {
      EpochShare& sum = record.folded[{share.dataset, share.epoch}];
      sum.dataset = share.dataset;
      sum.epoch = share.epoch;
      sum.samples += share.samples;
      sum.digest += share.digest;
    }
    ++record.folded_microbatches;
    record.folded_to = horizon;
    record.consumed.erase(oldest);
  }
}

std::optional<LedgerPosition> Ledger::next(int rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return std::nullopt;
  return it->second.next;
}

LedgerSnapshot Ledger::Snapshot(const std::string& job) const {
  LedgerSnapshot out;
  out.name = job;
  out.journal = journal_path_;
  for (const auto& [rank, record] : ranks_) {
    RankLedgerFigures& r = out.ranks.emplace_back();
    r.global_rank = rank;
    r.first_step = record.first_step;
    r.next_step = record.next.step;
    r.next_microbatch = record.next.microbatch;
    r.microbatches = record.consumed.size() + record.folded_microbatches;
    r.duplicates = record.duplicates;
    r.gaps = record.gaps;
    r.rewinds = record.rewinds;
    r.claimed = record.claimed;
    std::map<std::pair<int, int64_t>, EpochShare> epochs = record.folded;
    for (const auto& [_, share] : record.folded) r.samples += share.samples;
    for (const auto& [_, entry] : record.consumed) {
      for (const EpochShare& share : entry.shares) {
        EpochShare& sum = epochs[{share.dataset, share.epoch}];
        sum.samples += share.samples;
        sum.digest += share.digest;
        r.samples += share.samples;
      }
    }
    for (const auto& [key, sum] : epochs) {
      r.epochs.push_back({key.first, key.second, sum.samples, sum.digest});
    }
  }
  return out;
}

}  // namespace packfeed::server
