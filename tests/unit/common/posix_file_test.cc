#include "packfeed/common/posix_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_paths.h"

namespace packfeed {
namespace {

using ::testing::HasSubstr;

TEST(PosixFileTest, MissingFileIsNotFoundNamingPath) {
  absl::StatusOr<ScopedFd> fd = OpenForRead("/nonexistent/packfeed/file");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(fd.status().message(), HasSubstr("/nonexistent/packfeed/file"));
}

TEST(PosixFileTest, DirectoryIsRejected) {
  testing::ScopedTempDir dir;
  absl::StatusOr<ScopedFd> fd = OpenForRead(dir.path().string());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fd.status().message(), HasSubstr("not a regular file"));
}

TEST(PosixFileTest, PreadPastEndIsDataLoss) {
  testing::ScopedTempDir dir;
  testing::WriteFileBytes(dir.path() / "f", "abcdef");
  absl::StatusOr<ScopedFd> fd = OpenForRead((dir.path() / "f").string());
  ASSERT_TRUE(fd.ok());
  char buffer[4];
  EXPECT_TRUE(PreadFully(fd->get(), "f", 2, absl::MakeSpan(buffer, 4)).ok());
  EXPECT_EQ(std::string(buffer, 4), "cdef");
  absl::Status past = PreadFully(fd->get(), "f", 4, absl::MakeSpan(buffer, 4));
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(past.message(), HasSubstr("end of file at byte 6"));
}

TEST(PosixFileTest, ReadsWholeFilesAndNamesWhatIsMissing) {
  testing::ScopedTempDir dir;
  testing::WriteFileBytes(dir.path() / "f", "line one\nline two\n");
  absl::StatusOr<std::string> text = ReadWholeFile((dir.path() / "f").string());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "line one\nline two\n");
  testing::WriteFileBytes(dir.path() / "empty", "");
  EXPECT_EQ(*ReadWholeFile((dir.path() / "empty").string()), "");
  absl::StatusOr<std::string> missing = ReadWholeFile((dir.path() / "nope").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));
}

// /proc and /sys files report a size of 0 (or 4096) whatever they hold:
// reading up to the reported size read nothing of /proc/self/cgroup, and
// the default memory budget never saw a cgroup's limit.
TEST(PosixFileTest, ReadsFilesWhoseReportedSizeIsNotTheirs) {
  absl::StatusOr<std::string> status = ReadWholeFile("/proc/self/status");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(*status, HasSubstr("Pid:\t" + std::to_string(getpid()) + "\n"));
  // Longer than its first guess (the reported size + 1): grown as it reads.
  testing::ScopedTempDir dir;
  const std::string big(100000, 'x');
  testing::WriteFileBytes(dir.path() / "big", big);
  EXPECT_EQ(*ReadWholeFile((dir.path() / "big").string()), big);
}

TEST(PosixFileTest, MapsEmptyAndNonEmptyFiles) {
  testing::ScopedTempDir dir;
  testing::WriteFileBytes(dir.path() / "empty", "");
  testing::WriteFileBytes(dir.path() / "full", "xyz");
  absl::StatusOr<MappedFile> empty = MappedFile::Open((dir.path() / "empty").string());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->bytes().empty());
  absl::StatusOr<MappedFile> full = MappedFile::Open((dir.path() / "full").string());
  ASSERT_TRUE(full.ok()) << full.status();
  MappedFile moved = std::move(*full);
  ASSERT_EQ(moved.bytes().size(), 3u);
  EXPECT_EQ(moved.bytes()[2], 'z');
}

TEST(PosixFileTest, ScopedFdClosesOnDestruction) {
  int raw;
  {
    ScopedFd fd(::open("/dev/null", O_RDONLY));
    raw = fd.get();
    ASSERT_GE(raw, 0);
  }
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
}

TEST(PosixFileTest, SyncsTheFolderOfAPathAndNamesAMissingOne) {
  testing::ScopedTempDir dir;
  EXPECT_TRUE(SyncDirectoryOf(dir.Prefix("journal")).ok());
  EXPECT_TRUE(SyncDirectoryOf("relative-name").ok());  // the working folder
  const absl::Status missing = SyncDirectoryOf(dir.Prefix("gone/journal"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("gone"));
}

}  // namespace
TEST(PosixFileTest, UnixSocketPathsUpTo107BytesFit) {
  EXPECT_TRUE(CheckUnixSocketPath("/run/packfeed.sock").ok());
  EXPECT_TRUE(CheckUnixSocketPath(std::string(107, 'a')).ok());
  const absl::Status long_path = CheckUnixSocketPath(std::string(108, 'a'));
  EXPECT_TRUE(absl::IsInvalidArgument(long_path)) << long_path;
  EXPECT_THAT(long_path.message(), HasSubstr("108 bytes, longer than a Unix socket path may be"));
}

}  // namespace packfeed
