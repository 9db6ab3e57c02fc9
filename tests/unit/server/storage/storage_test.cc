// The node's Storage on real files: one open dataset per file, coalesced
// reads, shared held samples, re-reads counted and named, the memory budget,
// withdrawn fetches, reads straight into the caller's memory.

#include "server/storage/storage.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/dataset_generator.h"
#include "test_paths.h"

namespace packfeed::server {
namespace {

class StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = (std::filesystem::path(dir_.path()) / "data").string();
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, {10, 20, 30, 40, 50}, {}).ok());
  }

  // Needs for documents [first, first + count) of `data`, epoch 0.
  static std::vector<SampleNeed> Needs(const dataset::IndexedDataset& data, int64_t first,
                                       int64_t count, int64_t epoch = 0) {
    std::vector<SampleNeed> needs;
    for (int64_t d = first; d < first + count; ++d) {
      const uint64_t tokens = static_cast<uint64_t>(data.sequence_length(d));
      needs.push_back({&data, d, epoch, 0, tokens * dataset::DTypeSize(data.dtype())});
    }
    return needs;
  }

  // Fetches and waits for the samples; the pin is left in `pin`.
  static std::vector<FetchedSample> FetchAndWait(Storage& storage, FetchCause cause,
                                                 std::vector<SampleNeed> needs,
                                                 std::unique_ptr<FetchPin>& pin) {
    absl::Notification done;
    std::vector<FetchedSample> out;
    pin = storage.Fetch(std::move(cause), std::move(needs), /*urgent=*/true,
                        [&](std::vector<FetchedSample> samples) {
                          out = std::move(samples);
                          done.Notify();
                        });
    done.WaitForNotification();
    return out;
  }

  static const StorageFileFigures& File(const StorageFigures& stats) { return stats.files.at(0); }

  testing::ScopedTempDir dir_;
  std::string prefix_;
};

TEST_F(StorageTest, OpensEachFileOnceHoweverNamed) {
  Storage storage({});
  auto first = storage.Open(prefix_);
  auto second = storage.Open(std::filesystem::path(dir_.path()).string() + "/./data");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(File(storage.Stats()).jobs, 2u);
  EXPECT_TRUE(absl::IsNotFound(storage.Open(prefix_ + "-missing").status()));
}

TEST_F(StorageTest, ReadsAdjacentSamplesWithOneRequestAndReturnsTheirBytes) {
  Storage storage({});
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::unique_ptr<FetchPin> pin;
  // Out of order and not all adjacent: documents 3, 0, 1, 2 are one run.
  std::vector<SampleNeed> needs = Needs(**data, 0, 4);
  std::swap(needs[0], needs[3]);
  std::vector<FetchedSample> samples = FetchAndWait(storage, {"j", 0, 0}, needs, pin);
  ASSERT_EQ(samples.size(), 4u);
  for (size_t i = 0; i < needs.size(); ++i) {
    ASSERT_TRUE(samples[i].status.ok()) << samples[i].status;
    std::vector<char> want(needs[i].bytes);
    ASSERT_TRUE((*data)->ReadRaw(needs[i].document, absl::MakeSpan(want)).ok());
    EXPECT_EQ(std::vector<char>(samples[i].bytes().begin(), samples[i].bytes().end()), want) << i;
  }
  const StorageFigures stats = storage.Stats();
  EXPECT_EQ(File(stats).reads, 1u);
  EXPECT_EQ(File(stats).bytes_read, (10u + 20 + 30 + 40) * 2);
  EXPECT_EQ(File(stats).distinct_bytes, File(stats).bytes_read);
  EXPECT_EQ(stats.io_amplification, 1.0);
}

TEST_F(StorageTest, HeldSamplesAreSharedAndAReReadIsCountedAndNamed) {
  Storage storage({});
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::unique_ptr<FetchPin> first, second;
  FetchAndWait(storage, {"actor", 0, 0}, Needs(**data, 0, 2), first);
  // Another job, same documents and epoch, while they are held: no read.
  FetchAndWait(storage, {"reference", 3, 0}, Needs(**data, 0, 2), second);
  EXPECT_EQ(File(storage.Stats()).reads, 1u);
  EXPECT_EQ(storage.JobFigures("reference").bytes_read, 0u);
  first.reset();
  second.reset();
  // Nothing is held (no budget to keep within): read again, and named.
  std::unique_ptr<FetchPin> again;
  FetchAndWait(storage, {"actor", 5, 7}, Needs(**data, 0, 2), again);
  const StorageFigures stats = storage.Stats();
  EXPECT_EQ(File(stats).reads, 2u);
  EXPECT_EQ(File(stats).reread_bytes, 60u);
  EXPECT_EQ(stats.io_amplification, 2.0);
  ASSERT_EQ(stats.rereads.size(), 1u);
  EXPECT_EQ(stats.rereads[0].job, "actor");
  EXPECT_EQ(stats.rereads[0].rank, 5u);
  EXPECT_EQ(stats.rereads[0].step, 7);
  EXPECT_EQ(stats.rereads[0].samples, 2u);
  // A later epoch of the same documents is distinct, not a re-read.
  std::unique_ptr<FetchPin> next_epoch;
  again.reset();
  FetchAndWait(storage, {"actor", 5, 8}, Needs(**data, 0, 2, /*epoch=*/1), next_epoch);
  EXPECT_EQ(storage.Stats().reread_events, 1u);
  EXPECT_EQ(File(storage.Stats()).distinct_bytes, 120u);
}

TEST_F(StorageTest, ReadAheadWaitsForTheBudgetButAnUrgentFetchDoesNot) {
  StorageOptions options;
  options.memory_budget_bytes = 200;  // less than two documents and their tokens
  Storage storage(options);
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::unique_ptr<FetchPin> held;
  FetchAndWait(storage, {"j", 0, 0}, Needs(**data, 4, 1), held);  // 100 B + 400 B of tokens
  absl::Notification ahead_done;
  std::unique_ptr<FetchPin> ahead =
      storage.Fetch({"j", 0, 1}, Needs(**data, 3, 1), /*urgent=*/false,
                    [&](std::vector<FetchedSample>) { ahead_done.Notify(); });
  EXPECT_FALSE(ahead_done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  std::unique_ptr<FetchPin> urgent;
  FetchAndWait(storage, {"k", 0, 0}, Needs(**data, 2, 1), urgent);
  EXPECT_FALSE(ahead_done.HasBeenNotified());
  held.reset();
  urgent.reset();
  EXPECT_TRUE(ahead_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(storage.Stats().peak_bytes_held, 500u);
}

// A side field's rows (SampleNeed::keep and ::tokens false) cost their bytes
// alone and are dropped when released; token bytes are kept within budget.
TEST_F(StorageTest, RowsThatAreNotTokensCostTheirBytesAndAreNotKept) {
  StorageOptions options;
  options.memory_budget_bytes = 1 << 20;
  Storage storage(options);
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::vector<SampleNeed> rows = Needs(**data, 4, 1);  // 100 B
  rows[0].tokens = false;
  rows[0].keep = false;
  std::unique_ptr<FetchPin> pin;
  FetchAndWait(storage, {"j", 0, 0}, rows, pin);
  EXPECT_EQ(storage.Stats().bytes_held, 100u);
  pin.reset();
  EXPECT_EQ(storage.Stats().bytes_kept, 0u);
  FetchAndWait(storage, {"j", 0, 1}, Needs(**data, 4, 1), pin);  // read again: not kept
  EXPECT_EQ(File(storage.Stats()).reads, 2u);
  EXPECT_EQ(storage.Stats().bytes_held, 500u);  // 100 B and their 400 B of tokens
  pin.reset();
  EXPECT_EQ(storage.Stats().bytes_kept, 100u);
}

TEST_F(StorageTest, AWithdrawnFetchNeverCallsBack) {
  StorageOptions options;
  options.memory_budget_bytes = 1;
  Storage storage(options);
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::unique_ptr<FetchPin> held;
  FetchAndWait(storage, {"j", 0, 0}, Needs(**data, 0, 1), held);
  bool called = false;
  std::unique_ptr<FetchPin> waiting = storage.Fetch(
      {"j", 0, 1}, Needs(**data, 1, 1), false, [&](std::vector<FetchedSample>) { called = true; });
  waiting.reset();  // withdrawn before admission
  held.reset();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(called);
  EXPECT_EQ(storage.Stats().bytes_held, 0u);
}

// A file cut after open is a file changed under the daemon: no sample of it
// is served, not even one whose bytes are still there (the cut may be the
// start of a rewrite). Samples held before stay served.
TEST_F(StorageTest, AFileTruncatedAfterOpenFailsItsSamplesButNotThoseHeld) {
  Storage storage({});
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::unique_ptr<FetchPin> held;
  ASSERT_TRUE(FetchAndWait(storage, {"j", 0, 0}, Needs(**data, 2, 1), held)[0].status.ok());
  std::filesystem::resize_file(prefix_ + ".bin", 100);  // documents 0..2 end at byte 120
  std::unique_ptr<FetchPin> pin;
  std::vector<SampleNeed> needs = Needs(**data, 0, 1);
  needs.push_back(Needs(**data, 4, 1)[0]);  // not adjacent: its own read
  needs.push_back(Needs(**data, 2, 1)[0]);  // held
  std::vector<FetchedSample> samples = FetchAndWait(storage, {"j", 0, 1}, needs, pin);
  EXPECT_TRUE(absl::IsDataLoss(samples[0].status)) << samples[0].status;
  EXPECT_THAT(samples[0].status.message(), ::testing::HasSubstr("changed since it was opened"));
  EXPECT_TRUE(absl::IsDataLoss(samples[1].status)) << samples[1].status;
  EXPECT_TRUE(samples[2].status.ok()) << samples[2].status;
}

// Reads into the caller's memory and waits; returns what `done` said.
absl::Status ReadIntoAndWait(Storage& storage, std::vector<SlotRead> reads) {
  absl::Notification done;
  absl::Status out;
  std::unique_ptr<FetchPin> pin =
      storage.ReadInto({"j", 0, 0}, std::move(reads), /*urgent=*/true, [&](absl::Status status) {
        out = std::move(status);
        done.Notify();
      });
  done.WaitForNotification();
  return out;
}

// Rows of 8 bytes: whole, or cut to their last 4, in pieces smaller than
// one read so that the destination of each is checked.
TEST_F(StorageTest, ReadsRowsStraightIntoTheCallersMemoryWholeOrCut) {
  StorageOptions options;
  options.max_request_bytes = 16;
  Storage storage(options);
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  // Document 2 (30 tokens of 2 bytes) from byte 8: 6 rows.
  SampleNeed need = Needs(**data, 2, 1)[0];
  need.offset = 8;
  need.bytes = 48;
  need.tokens = false;
  std::vector<char> expected(48);
  const uint64_t begin = static_cast<uint64_t>((*data)->index().pointer(2));
  ASSERT_TRUE((*data)->ReadBytes(begin + 8, absl::MakeSpan(expected)).ok());

  std::vector<uint8_t> whole(48, 0xee), cut(24 + 1, 0xee);
  ASSERT_TRUE(
      ReadIntoAndWait(storage, {{need, whole.data(), 8, {}}, {need, cut.data(), 8, {{4, 4}}}})
          .ok());
  EXPECT_EQ(std::vector<char>(whole.begin(), whole.end()), expected);
  for (int row = 0; row < 6; ++row) {
    EXPECT_EQ(std::memcmp(cut.data() + row * 4, expected.data() + row * 8 + 4, 4), 0) << row;
  }
  EXPECT_EQ(cut.back(), 0xee) << "written past the cut rows";
  const StorageFigures stats = storage.Stats();
  EXPECT_EQ(stats.bytes_read, 96u);
  EXPECT_EQ(File(stats).reads, 3u + 1u);  // 48 bytes in 16-byte pieces; cut: one piece
  EXPECT_EQ(stats.bytes_held, 0u);
  EXPECT_EQ(stats.bytes_in_flight, 0u);
}

TEST_F(StorageTest, AReadIntoATruncatedFileFailsNamingTheFile) {
  Storage storage({});
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  std::filesystem::resize_file(prefix_ + ".bin", 100);
  SampleNeed need = Needs(**data, 4, 1)[0];
  std::vector<uint8_t> out(need.bytes);
  const absl::Status status = ReadIntoAndWait(storage, {{need, out.data(), 4, {}}});
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr(prefix_ + ".bin"));
  // With nothing to read, done still comes, OK.
  need.bytes = 0;
  EXPECT_TRUE(ReadIntoAndWait(storage, {{need, out.data(), 4, {}}}).ok());
}

// The only reader is kept busy by a fetch's callback while the read into
// memory is queued behind it, then withdrawn: nothing is written, no call.
TEST_F(StorageTest, AWithdrawnReadIntoWritesNothingAndNeverCallsBack) {
  StorageOptions options;
  options.read_threads = 1;
  Storage storage(options);
  auto data = storage.Open(prefix_);
  ASSERT_TRUE(data.ok());
  absl::Notification busy, release;
  std::unique_ptr<FetchPin> blocker = storage.Fetch(
      {"j", 0, 0}, Needs(**data, 0, 1), /*urgent=*/true, [&](std::vector<FetchedSample>) {
        busy.Notify();
        release.WaitForNotification();
      });
  busy.WaitForNotification();
  std::vector<uint8_t> out(Needs(**data, 3, 1)[0].bytes, 0xee);
  bool called = false;
  std::unique_ptr<FetchPin> pin =
      storage.ReadInto({"j", 0, 1}, {{Needs(**data, 3, 1)[0], out.data(), 4, {}}}, /*urgent=*/true,
                       [&](absl::Status) { called = true; });
  pin.reset();
  release.Notify();
  blocker.reset();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(called);
  EXPECT_EQ(out, std::vector<uint8_t>(out.size(), 0xee));
}

}  // namespace
}  // namespace packfeed::server

namespace packfeed::server {
namespace {

// The memory controller's folder of this process's cgroup (v2 when the
// unified hierarchy has the memory controller, else v1), or "" when none.
std::string OwnMemoryCgroup(std::string& limit_file) {
  std::ifstream groups("/proc/self/cgroup");
  std::string line, v2;
  while (std::getline(groups, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.rfind("0::", 0) == 0) {
      v2 = "/sys/fs/cgroup" + path;
    } else if (controllers.find("memory") != std::string::npos) {
      limit_file = "memory.limit_in_bytes";
      return "/sys/fs/cgroup/memory" + path;
    }
  }
  std::ifstream available(v2 + "/cgroup.controllers");
  std::string controllers;
  std::getline(available, controllers);
  if (controllers.find("memory") == std::string::npos) return "";
  limit_file = "memory.max";
  return v2;
}

// The default budget is a quarter of the cgroup's limit when that is below
// the machine's memory: checked in a real transient cgroup with a limit, by
// a child process moved into it.
TEST(DefaultMemoryBudgetTest, IsAQuarterOfTheCgroupLimitBelowTheMachinesMemory) {
  std::string limit_file;
  const std::string own = OwnMemoryCgroup(limit_file);
  if (own.empty()) GTEST_SKIP() << "no memory cgroup controller on this machine";
  const std::filesystem::path group = own + "/packfeed-budget-test-" + std::to_string(getpid());
  std::error_code error;
  if (!std::filesystem::create_directory(group, error)) {
    GTEST_SKIP() << "cannot create a cgroup under " << own << ": " << error.message();
  }
  constexpr uint64_t kLimit = uint64_t{512} << 20;  // less than any machine that runs this
  ASSERT_LT(kLimit, static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  { std::ofstream(group / limit_file) << kLimit << std::flush; }
  ASSERT_EQ(testing::ReadFileBytes(group / limit_file), std::to_string(kLimit) + "\n");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    { std::ofstream(group / "cgroup.procs") << getpid() << std::flush; }
    // 0 when the move did not take.
    const uint64_t budget =
        testing::ReadFileBytes("/proc/self/cgroup").find(group.filename().string()) !=
                std::string::npos
            ? DefaultMemoryBudget()
            : 0;
    (void)!write(pipe_fds[1], &budget, sizeof(budget));
    _exit(0);
  }
  close(pipe_fds[1]);
  uint64_t budget = 0;
  const ssize_t got = read(pipe_fds[0], &budget, sizeof(budget));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  std::filesystem::remove(group, error);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(budget)));
  EXPECT_EQ(budget, kLimit / 4);
  // Outside it: a quarter of the machine's memory, or of this process's own
  // limit if that is lower; never more.
  const uint64_t machine = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  EXPECT_LE(DefaultMemoryBudget(), machine / 4);
  EXPECT_GT(DefaultMemoryBudget(), kLimit / 4);
}

}  // namespace
}  // namespace packfeed::server
