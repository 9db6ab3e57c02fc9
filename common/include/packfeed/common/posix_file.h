#ifndef PACKFEED_COMMON_POSIX_FILE_H_
#define PACKFEED_COMMON_POSIX_FILE_H_

// RAII owners for file descriptors and read-only memory maps, and the one
// place errno becomes an absl::Status.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace packfeed {

// Maps an errno value to a status whose message is "<call> <path>: <strerror>".
// ENOENT becomes NotFound, EACCES/EPERM PermissionDenied, and so on;
// anything unexpected is Internal.
absl::Status ErrnoToStatus(int error_number, absl::string_view call, absl::string_view path);

// Owns one file descriptor. Move-only. Thread-compatible.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.Release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();

 private:
  int fd_ = -1;
};

// Opens `path` read-only (O_CLOEXEC).
absl::StatusOr<ScopedFd> OpenForRead(const std::string& path);

// Size in bytes of the open file.
absl::StatusOr<uint64_t> FileSize(int fd, absl::string_view path);

// Reads exactly `out.size()` bytes at `offset`, retrying short reads and
// EINTR. A read that hits end of file is DataLoss naming the offsets.
absl::Status PreadFully(int fd, absl::string_view path, uint64_t offset, absl::Span<char> out);

// The whole content of the file at `path`, read to its end (whatever size
// it reports: those of /proc and /sys report 0 or 4096). Errors name the
// call and the path (NotFound, PermissionDenied, … from errno).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);
// The same, an error's message beginning "`what` cannot be read: " (what:
// the setting that named the file).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what);

// Writes all of `data`, retrying short writes and EINTR.
absl::Status WriteFully(int fd, absl::string_view path, absl::string_view data);

// OK when `path` fits a Unix socket address (sun_path, 107 bytes on Linux);
// else InvalidArgument naming it and the limit. gRPC would only say that
// it could not make a channel.
absl::Status CheckUnixSocketPath(absl::string_view path);

// Makes the directory entries of the folder holding `path` durable (fsync
// of the folder): a file created or renamed there survives a crash only
// then, not when its own data is synced.
absl::Status SyncDirectoryOf(const std::string& path);

// A read-only, private memory map of a whole file. An empty file maps to an
// empty span (mmap refuses length 0). Move-only. Thread-compatible; the bytes
// may be read from any thread.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void Unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace packfeed

#endif  // PACKFEED_COMMON_POSIX_FILE_H_
