// The consumption ledger at a million microbatches: 8 ranks consume 125 000
// microbatches each (4 per step, 4 samples each) into a journaled ledger.
// Prints, with folding and compaction (the defaults) and without (every
// entry kept, the journal never rewritten): the entries held, the process's
// RSS growth, the journal's size, the time per recorded microbatch, and the
// cost of the group commit (fdatasync after a second's worth of lines).
//
//   ledger_bench [--microbatches 1000000] [--dir /tmp] [--json]

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/storage/ledger.h"

namespace packfeed {
namespace {

using server::Ledger;
using server::LedgerOptions;
using server::SharesOf;

constexpr int kRanks = 8;
constexpr int kPerStep = 4;
constexpr int kSamples = 4;

uint64_t RssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

struct Figures {
  uint64_t entries = 0;
  int64_t rss_growth_kib = 0;
  uint64_t journal_bytes = 0;
  double us_per_microbatch = 0;
  double sync_ms = 0;  // mean fdatasync
};

absl::StatusOr<Figures> Run(const std::string& path, const LedgerOptions& options,
                            int64_t microbatches) {
  std::filesystem::remove(path);
  const uint64_t rss_before = RssKib();
  absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::Open(path, options);
  if (!ledger.ok()) return ledger.status();
  for (int rank = 0; rank < kRanks; ++rank) {
    if (absl::Status s = (*ledger)->Attach(rank, {0, 0}).status(); !s.ok()) return s;
  }
  const int64_t steps = microbatches / kRanks / kPerStep;
  // A group commit once per "second": 8 ranks at ~10 microbatches/s each is
  // about 100 lines; 1000 is a busy node.
  constexpr int64_t kLinesPerSync = 1000;
  double sync_seconds = 0;
  int64_t syncs = 0;
  int64_t recorded = 0;
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < steps; ++step) {
    for (int rank = 0; rank < kRanks; ++rank) {
      for (int m = 0; m < kPerStep; ++m) {
        std::vector<scheduler::SampleRef> samples;
        for (int k = 0; k < kSamples; ++k) {
          samples.push_back({0, ((step * kRanks + rank) * kPerStep + m) * kSamples + k, 0});
        }
        absl::Status s = (*ledger)->Consume(rank, {step, m}, kPerStep, SharesOf(samples));
        if (!s.ok()) return s;
        if (++recorded % kLinesPerSync == 0) {
          const absl::Time before = absl::Now();
          if (absl::Status synced = (*ledger)->Sync(); !synced.ok()) return synced;
          sync_seconds += absl::ToDoubleSeconds(absl::Now() - before);
          ++syncs;
        }
      }
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Figures figures;
  figures.entries = (*ledger)->entries();
  figures.rss_growth_kib = static_cast<int64_t>(RssKib()) - static_cast<int64_t>(rss_before);
  figures.journal_bytes = std::filesystem::file_size(path);
  figures.us_per_microbatch = seconds * 1e6 / static_cast<double>(recorded);
  figures.sync_ms = syncs > 0 ? sync_seconds * 1e3 / static_cast<double>(syncs) : 0;
  ledger->reset();
  std::filesystem::remove(path);
  return figures;
}

}  // namespace
}  // namespace packfeed

int main(int argc, char** argv) {
  int64_t microbatches = 1000000;
  std::string dir = std::filesystem::temp_directory_path();
  bool json = false;
  CLI::App app{"the consumption ledger at a million microbatches"};
  app.add_option("--microbatches", microbatches, "microbatches in all")->capture_default_str();
  app.add_option("--dir", dir, "where the journal is written")->capture_default_str();
  app.add_flag("--json", json, "one JSON object per configuration");
  CLI11_PARSE(app, argc, argv);
  const std::string path = absl::StrCat(dir, "/pf-ledger-bench-", getpid(), ".ledger");
  // Bounded first: memory the unbounded run frees stays with the process
  // and would hide the bounded run's growth.
  packfeed::server::LedgerOptions unbounded;
  unbounded.keep_steps = INT64_MAX / 2;
  unbounded.compact_after_lines = UINT64_MAX / 2;
  for (const auto& [name, options] : {std::pair{"bounded", packfeed::server::LedgerOptions{}},
                                      std::pair{"unbounded", unbounded}}) {
    absl::StatusOr<packfeed::Figures> f = packfeed::Run(path, options, microbatches);
    if (!f.ok()) {
      std::fprintf(stderr, "ledger_bench: %s\n", f.status().ToString().c_str());
      return 1;
    }
    if (json) {
      std::printf(
          "{\"ledger\":\"%s\",\"microbatches\":%lld,\"entries_held\":%llu,"
          "\"rss_growth_kib\":%lld,\"journal_bytes\":%llu,\"us_per_microbatch\":%.2f,"
          "\"fdatasync_ms_per_1000_lines\":%.3f}\n",
          name, static_cast<long long>(microbatches), static_cast<unsigned long long>(f->entries),
          static_cast<long long>(f->rss_growth_kib),
          static_cast<unsigned long long>(f->journal_bytes), f->us_per_microbatch, f->sync_ms);
    } else {
      std::printf(
          "%-9s %lld microbatches: %llu entries held, RSS +%.1f MiB, journal %.1f MiB, "
          "%.2f us per microbatch, fdatasync %.3f ms per 1000 lines\n",
          name, static_cast<long long>(microbatches), static_cast<unsigned long long>(f->entries),
          f->rss_growth_kib / 1024.0, f->journal_bytes / 1048576.0, f->us_per_microbatch,
          f->sync_ms);
    }
  }
  return 0;
}
