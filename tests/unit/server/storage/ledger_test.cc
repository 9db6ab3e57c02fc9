// The consumption ledger's bookkeeping and its journal: what is counted as
// consumed, duplicated, skipped and rewound, and that a replayed journal
// gives back the same ledger, whatever state the file was left in.

#include "server/storage/ledger.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

std::vector<EpochShare> Shares(std::initializer_list<int64_t> documents) {
  std::vector<scheduler::SampleRef> samples;
  for (int64_t d : documents) samples.push_back({0, d, 0});
  return SharesOf(samples);
}

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pf-ledger-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "job.ledger").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::string path_;
};

RankLedgerFigures RankOf(const LedgerSnapshot& ledger, int rank) {
  for (const RankLedgerFigures& r : ledger.ranks) {
    if (r.global_rank == rank) return r;
  }
  return {};
}

// Every figure of a snapshot as text: compared across a fork below.
std::string Describe(const LedgerSnapshot& ledger) {
  std::string out = absl::StrCat(ledger.name, " ", ledger.journal, "\n");
  for (const RankLedgerFigures& r : ledger.ranks) {
    absl::StrAppend(&out, r.global_rank, ": ", r.first_step, " ", r.next_step, ".",
                    r.next_microbatch, " ", r.microbatches, " ", r.samples, " ", r.duplicates, " ",
                    r.gaps, " ", r.rewinds, " ", r.claimed);
    for (const EpochShare& e : r.epochs) {
      absl::StrAppend(&out, " [", e.dataset, " ", e.epoch, " ", e.samples, " ", e.digest, "]");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

TEST(SampleDigestTest, IsSplitmix64OfDatasetAndIndex) {
  // Values a Python reimplementation in the integration tests relies on.
  EXPECT_EQ(SampleDigest(0, 0), 0ull);
  EXPECT_EQ(SampleDigest(0, 1), 0x5692161d100b05e5ull);
  EXPECT_NE(SampleDigest(1, 0), SampleDigest(0, 1));
}

TEST(SampleDigestTest, SharesSumPerDatasetEpoch) {
  const std::vector<EpochShare> shares = SharesOf({{0, 3, 0}, {1, 3, 2}, {0, 5, 0}});
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_EQ(shares[0].dataset, 0);
  EXPECT_EQ(shares[0].samples, 2u);
  EXPECT_EQ(shares[0].digest, SampleDigest(0, 3) + SampleDigest(0, 5));
  EXPECT_EQ(shares[1].dataset, 1);
  EXPECT_EQ(shares[1].epoch, 2);
}

TEST_F(LedgerTest, ConsumptionAdvancesThePositionAcrossSteps) {
  auto ledger = *Ledger::Open("");
  ASSERT_EQ(ledger->Attach(3, {5, 0})->kind, Ledger::AttachKind::kFirst);
  ASSERT_TRUE(ledger->Consume(3, {5, 0}, 2, Shares({1, 2})).ok());
  ASSERT_TRUE(ledger->Consume(3, {5, 1}, 2, Shares({3})).ok());
  ASSERT_TRUE(ledger->Consume(3, {6, 0}, 1, Shares({4})).ok());
  const RankLedgerFigures rank = RankOf(ledger->Snapshot("j"), 3);
  EXPECT_EQ(rank.first_step, 5);
  EXPECT_EQ(rank.next_step, 7);
  EXPECT_EQ(rank.next_microbatch, 0u);
  EXPECT_EQ(rank.microbatches, 3u);
  EXPECT_EQ(rank.samples, 4u);
  EXPECT_EQ(rank.duplicates + rank.gaps + rank.rewinds, 0u);
  ASSERT_EQ(rank.epochs.size(), 1u);
  EXPECT_EQ(rank.epochs[0].digest,
            SampleDigest(0, 1) + SampleDigest(0, 2) + SampleDigest(0, 3) + SampleDigest(0, 4));
}

TEST_F(LedgerTest, ADuplicateAndAGapAreCountedNotHidden) {
  auto ledger = *Ledger::Open("");
  ASSERT_TRUE(ledger->Attach(0, {0, 0}).ok());
  ASSERT_TRUE(ledger->Consume(0, {0, 0}, 4, Shares({1})).ok());
  ASSERT_TRUE(ledger->Consume(0, {0, 0}, 4, Shares({1})).ok());  // again
  ASSERT_TRUE(ledger->Consume(0, {0, 3}, 4, Shares({4})).ok());  // 1 and 2 skipped
  const RankLedgerFigures rank = RankOf(ledger->Snapshot("j"), 0);
  EXPECT_EQ(rank.duplicates, 1u);
  EXPECT_EQ(rank.gaps, 2u);
  EXPECT_EQ(rank.samples, 2u);  // the duplicate is not counted twice
}

TEST_F(LedgerTest, AttachPositionsAreClassified) {
  auto ledger = *Ledger::Open("");
  ASSERT_TRUE(ledger->Attach(1, {0, 0}).ok());
  for (int m = 0; m < 4; ++m) ASSERT_TRUE(ledger->Consume(1, {0, m}, 4, Shares({m})).ok());
  EXPECT_EQ(ledger->Attach(1, {1, 0})->kind, Ledger::AttachKind::kContinue);
  EXPECT_EQ(ledger->Attach(1, {1, 2})->kind, Ledger::AttachKind::kAhead);
  // A rewind drops what follows the position: it will be consumed again.
  const Ledger::AttachResult rewind = *ledger->Attach(1, {0, 2});
  EXPECT_EQ(rewind.kind, Ledger::AttachKind::kRewind);
  EXPECT_EQ(rewind.before, (LedgerPosition{1, 0}));
  const RankLedgerFigures rank = RankOf(ledger->Snapshot("j"), 1);
  EXPECT_EQ(rank.microbatches, 2u);
  EXPECT_EQ(rank.rewinds, 1u);
  EXPECT_EQ(rank.next_step, 0);
  EXPECT_EQ(rank.next_microbatch, 2u);
}

TEST_F(LedgerTest, ClaimsAndJumps) {
  auto ledger = *Ledger::Open("");
  ASSERT_TRUE(ledger->Attach(2, {0, 0}).ok());
  ASSERT_TRUE(ledger->Claim(2, {0, 0}, 2, Shares({9})).ok());
  ASSERT_TRUE(ledger->Jump(2, {5, 0}, 7).ok());
  const RankLedgerFigures rank = RankOf(ledger->Snapshot("j"), 2);
  EXPECT_EQ(rank.claimed, 1u);
  EXPECT_EQ(rank.gaps, 7u);
  EXPECT_EQ(rank.next_step, 5);
}

TEST_F(LedgerTest, TheJournalReplaysToTheSameLedger) {
  LedgerSnapshot before;
  {
    auto ledger = *Ledger::Open(path_);
    ASSERT_TRUE(ledger->Attach(0, {0, 0}).ok());
    ASSERT_TRUE(ledger->Attach(1, {0, 0}).ok());
    for (int m = 0; m < 3; ++m) {
      ASSERT_TRUE(ledger->Consume(0, {0, m}, 3, Shares({m, m + 10})).ok());
      ASSERT_TRUE(ledger->Consume(1, {0, m}, 3, Shares({m + 20})).ok());
    }
    ASSERT_TRUE(ledger->Attach(0, {0, 1}).ok());  // rewind
    ASSERT_TRUE(ledger->Claim(0, {0, 1}, 3, Shares({1, 11})).ok());
    ASSERT_TRUE(ledger->Consume(1, {0, 0}, 3, Shares({20})).ok());  // duplicate
    before = ledger->Snapshot("j");
  }
  auto replayed = Ledger::Open(path_);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(Describe((*replayed)->Snapshot("j")), Describe(before));
  // And it goes on appending.
  ASSERT_TRUE((*replayed)->Consume(0, {0, 2}, 3, Shares({2, 12})).ok());
  auto again = *Ledger::Open(path_);
  EXPECT_EQ(RankOf(again->Snapshot("j"), 0).microbatches, 3u);
}

TEST_F(LedgerTest, ATornLastLineIsDropped) {
  {
    auto ledger = *Ledger::Open(path_);
    ASSERT_TRUE(ledger->Attach(0, {0, 0}).ok());
    ASSERT_TRUE(ledger->Consume(0, {0, 0}, 2, Shares({1})).ok());
  }
  std::ofstream(path_, std::ios::app) << "C 0 0 1 2 c 0:0:1:00";  // a crash mid-write
  auto ledger = Ledger::Open(path_);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(RankOf((*ledger)->Snapshot("j"), 0).microbatches, 1u);
  // The torn bytes are cut off: the next record is a line of its own.
  ASSERT_TRUE((*ledger)->Consume(0, {0, 1}, 2, Shares({2})).ok());
  auto again = Ledger::Open(path_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(RankOf((*again)->Snapshot("j"), 0).microbatches, 2u);
}

// The journal's lines, and the file rewritten from them.
std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}
void WriteLines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& line : lines) out << line << "\n";
}

TEST_F(LedgerTest, EveryRecordIsSealedWithAChecksum) {
  {
    auto ledger = *Ledger::Open(path_);
    ASSERT_TRUE(ledger->Attach(0, {0, 0}).ok());
    ASSERT_TRUE(ledger->Consume(0, {0, 0}, 3, Shares({1})).ok());
    ASSERT_TRUE(ledger->Consume(0, {0, 1}, 3, Shares({2})).ok());
  }
  std::vector<std::string> lines = ReadLines(path_);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "packfeed-ledger 2");
  for (size_t i = 1; i < lines.size(); ++i)
    EXPECT_THAT(lines[i], ::testing::MatchesRegex(".* ~[0-9a-f]{8}"));

  // A flipped digit in a line before the last: DataLoss naming the line.
  std::vector<std::string> flipped = lines;
  flipped[2][2] = flipped[2][2] == '0' ? '1' : '0';
  WriteLines(path_, flipped);
  absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::Open(path_);
  EXPECT_TRUE(absl::IsDataLoss(ledger.status())) << ledger.status();
  EXPECT_THAT(ledger.status().message(), HasSubstr("line 3: checksum mismatch"));

  // In the last line: a write the crash left half on disk, cut off.
  flipped = lines;
  flipped[3][2] = flipped[3][2] == '0' ? '1' : '0';
  WriteLines(path_, flipped);
  ledger = Ledger::Open(path_);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(RankOf((*ledger)->Snapshot("j"), 0).microbatches, 1u);
  EXPECT_EQ(ReadLines(path_).size(), 3u);
  ASSERT_TRUE((*ledger)->Consume(0, {0, 1}, 3, Shares({2})).ok());
  EXPECT_EQ(ReadLines(path_), lines);  // the same record, sealed again
}

TEST_F(LedgerTest, AVersion1JournalIsStillRead) {
  WriteLines(path_, {"packfeed-ledger 1", "A 0 0 0", "C 0 0 0 2 c 0:0:1:0000000000000001"});
  absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::Open(path_);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(RankOf((*ledger)->Snapshot("j"), 0).microbatches, 1u);
  ASSERT_TRUE((*ledger)->Consume(0, {0, 1}, 2, Shares({2})).ok());
  EXPECT_THAT(ReadLines(path_).back(), ::testing::MatchesRegex(".* ~[0-9a-f]{8}"));
  EXPECT_EQ(RankOf((*Ledger::Open(path_))->Snapshot("j"), 0).microbatches, 2u);
}

TEST_F(LedgerTest, CorruptJournalsAreRefusedNamingTheLine) {
  WriteLines(path_, {"packfeed-ledger 1", "A 0 0 0", "C 0 zero 0 2 c 0:0:1:0000000000000001"});
  absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::Open(path_);
  EXPECT_TRUE(absl::IsDataLoss(ledger.status())) << ledger.status();
  EXPECT_THAT(ledger.status().message(), HasSubstr("line 3"));

  std::ofstream(path_, std::ios::trunc) << "some other file\nC 0 0 0 1 c\n";
  ledger = Ledger::Open(path_);
  EXPECT_TRUE(absl::IsDataLoss(ledger.status())) << ledger.status();
  EXPECT_THAT(ledger.status().message(), HasSubstr("not a packfeed ledger"));

  for (const char* bad : {"C 0 0 5 2 c\n",            // microbatch beyond its step
                          "C 0 0 0 2 x\n",            // unknown kind
                          "C 0 0 0 2 c 0:0:1:xyz\n",  // bad digest
                          "A -1 0 0\n",               // negative rank
                          "J 0 0 0\n",                // missing count
                          "Q 0 0 0\n"}) {             // unknown record
    std::ofstream(path_, std::ios::trunc) << "packfeed-ledger 1\n" << bad;
    ledger = Ledger::Open(path_);
    EXPECT_TRUE(absl::IsDataLoss(ledger.status())) << bad << ": " << ledger.status();
  }
}

TEST_F(LedgerTest, AnUnwritableJournalIsAClearError) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  std::filesystem::permissions(
      dir_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::Open(path_);
  EXPECT_TRUE(absl::IsPermissionDenied(ledger.status())) << ledger.status();
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
}

// Consumes `steps` steps of `per_step` microbatches for `rank`, from step
// `first`, each microbatch holding one sample of its own.
void ConsumeSteps(Ledger& ledger, int rank, int64_t first, int64_t steps, int per_step) {
  for (int64_t step = first; step < first + steps; ++step) {
    for (int m = 0; m < per_step; ++m) {
      ASSERT_TRUE(ledger.Consume(rank, {step, m}, per_step, Shares({step * per_step + m})).ok());
    }
  }
}

TEST_F(LedgerTest, FoldsOldStepsWithoutChangingWhatItReports) {
  LedgerOptions bounded;
  bounded.keep_steps = 10;
  auto folded = Ledger::Open(path_, bounded);
  auto whole = Ledger::Open("");  // keeps every entry
  ASSERT_TRUE(folded.ok() && whole.ok());
  for (Ledger* ledger : {folded->get(), whole->get()}) {
    ASSERT_TRUE(ledger->Attach(0, {0, 0}).ok());
    ConsumeSteps(*ledger, 0, 0, 100, 3);
  }
  EXPECT_LE((*folded)->entries(), 11u * 3);
  EXPECT_EQ((*whole)->entries(), 300u);
  const RankLedgerFigures a = RankOf((*folded)->Snapshot("j"), 0);
  const RankLedgerFigures b = RankOf((*whole)->Snapshot("j"), 0);
  EXPECT_EQ(Describe({"j", "", {a}}), Describe({"j", "", {b}}));
  EXPECT_EQ(a.microbatches, 300u);
  // A rewind within the kept steps is exact; one before them restarts.
  ASSERT_TRUE((*folded)->Attach(0, {95, 0}).ok());
  EXPECT_EQ(RankOf((*folded)->Snapshot("j"), 0).microbatches, 285u);
  ASSERT_TRUE((*folded)->Attach(0, {50, 0}).ok());
  const RankLedgerFigures restarted = RankOf((*folded)->Snapshot("j"), 0);
  EXPECT_EQ(restarted.first_step, 50);
  EXPECT_EQ(restarted.microbatches, 0u);
  EXPECT_EQ(restarted.rewinds, 2u);
}

TEST_F(LedgerTest, CompactsItsJournalAndReplaysTheSameLedger) {
  LedgerOptions bounded;
  bounded.keep_steps = 4;
  bounded.compact_after_lines = 50;
  {
    auto ledger = Ledger::Open(path_, bounded);
    ASSERT_TRUE(ledger.ok());
    for (int rank : {0, 1}) ASSERT_TRUE((*ledger)->Attach(rank, {0, 0}).ok());
    ConsumeSteps(**ledger, 0, 0, 200, 2);
    ConsumeSteps(**ledger, 1, 0, 150, 2);
    ASSERT_TRUE((*ledger)->Jump(1, {160, 0}, 20).ok());
    ConsumeSteps(**ledger, 1, 160, 5, 2);
    EXPECT_LE((*ledger)->journal_lines(), 2u * 5 * 2 + 2 + 50);
    ASSERT_TRUE((*ledger)->Sync().ok());
    const std::string before = Describe((*ledger)->Snapshot("j"));
    auto replayed = Ledger::Open(path_, bounded);
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    EXPECT_EQ(Describe((*replayed)->Snapshot("j")), before);
    EXPECT_EQ(RankOf((*replayed)->Snapshot("j"), 0).microbatches, 400u);
    EXPECT_EQ(RankOf((*replayed)->Snapshot("j"), 1).gaps, 20u);
  }
  // The journal stays small: one compaction's lines plus what followed.
  EXPECT_LT(std::filesystem::file_size(path_), 50u * 200);
  EXPECT_FALSE(std::filesystem::exists(path_ + ".compacting"));
}

// A process that dies at each step of a compaction (a crash, a SIGKILL)
// leaves a journal that replays to every record it had written. The child
// compacts its journal; at the chosen step it sends the parent what its
// ledger held and ends at once (_exit: no destructor, no flush). A process
// ending does not lose the page cache, so this does not test the syncs
// against a power loss; it tests that no step leaves a journal, or an aside
// file, that the next Open misreads.
TEST_F(LedgerTest, ACrashAtAnyStepOfACompactionLosesNoRecord) {
  for (const char* point :
       {"aside created", "aside synced", "renamed", "folder synced", "reopened"}) {
    SCOPED_TRACE(point);
    std::filesystem::remove(path_);
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(pipe_fds[0]);
      Ledger* live = nullptr;
      LedgerOptions options;
      options.keep_steps = 4;
      options.compact_after_lines = 30;
      int compactions = 0;
      options.compaction_step = [&](const char* at) {
        // The second compaction: the first already replaced the journal.
        if (std::string(at) != point || ++compactions < 2) return;
        const std::string held = Describe(live->Snapshot("j"));
        if (write(pipe_fds[1], held.data(), held.size()) != static_cast<ssize_t>(held.size())) {
          _exit(2);
        }
        _exit(0);
      };
      auto ledger = Ledger::Open(path_, options);
      if (!ledger.ok()) _exit(3);
      live = ledger->get();
      for (int rank : {0, 1}) {
        if (!live->Attach(rank, {0, 0}).ok()) _exit(4);
      }
      for (int64_t step = 0; step < 200; ++step) {
        for (int rank : {0, 1}) {
          if (!live->Consume(rank, {step, 0}, 1, Shares({step * 2 + rank})).ok()) _exit(5);
        }
      }
      _exit(6);  // never compacted twice
    }
    close(pipe_fds[1]);
    std::string held;
    char buffer[4096];
    for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) held.append(buffer, n);
    close(pipe_fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    ASSERT_FALSE(held.empty());

    LedgerOptions options;
    options.keep_steps = 4;
    options.compact_after_lines = 30;
    auto replayed = Ledger::Open(path_, options);
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    EXPECT_EQ(Describe((*replayed)->Snapshot("j")), held);
    EXPECT_FALSE(std::filesystem::exists(path_ + ".compacting"));
    // And it goes on: the next records and compactions land as before.
    ConsumeSteps(**replayed, 0, 1000, 40, 1);
    ASSERT_TRUE((*replayed)->Sync().ok());
    const std::string after = Describe((*replayed)->Snapshot("j"));
    auto again = Ledger::Open(path_, options);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(Describe((*again)->Snapshot("j")), after);
  }
}

}  // namespace
}  // namespace packfeed::server
