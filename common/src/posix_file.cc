#include "packfeed/common/posix_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"

namespace packfeed {

absl::Status ErrnoToStatus(int error_number, absl::string_view call, absl::string_view path) {
  std::string message = absl::StrCat(call, " ", path, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EISDIR:
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int ScopedFd::Release() { return std::exchange(fd_, -1); }

absl::StatusOr<ScopedFd> OpenForRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  ScopedFd owned(fd);
  struct stat info;
  if (::fstat(fd, &info) != 0) return ErrnoToStatus(errno, "fstat", path);
  // open() succeeds on a directory; reading it fails later with a vaguer error.
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("open ", path, ": not a regular file"));
  }
  return owned;
}

absl::StatusOr<uint64_t> FileSize(int fd, absl::string_view path) {
  struct stat info;
  if (::fstat(fd, &info) != 0) return ErrnoToStatus(errno, "fstat", path);
  return static_cast<uint64_t>(info.st_size);
}

absl::Status PreadFully(int fd, absl::string_view path, uint64_t offset, absl::Span<char> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "pread", path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("pread ", path, ": end of file at byte ",
                                              offset + done, " while reading ", out.size(),
                                              " bytes at offset ", offset));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFully(int fd, absl::string_view path, absl::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status CheckUnixSocketPath(absl::string_view path) {
  constexpr size_t kMost = sizeof(sockaddr_un::sun_path) - 1;
  if (path.size() <= kMost) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", path.size(),
                                                 " bytes, longer than a Unix socket path may be (",
                                                 kMost, " bytes)"));
}

absl::Status SyncDirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", folder);
  ScopedFd owned(fd);
  if (::fsync(owned.get()) != 0) return ErrnoToStatus(errno, "fsync", folder);
  return absl::OkStatus();
}

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  absl::StatusOr<ScopedFd> fd = OpenForRead(path);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<uint64_t> size = FileSize(fd->get(), path);
  if (!size.ok()) return size.status();
  if (*size == 0) return MappedFile(path, nullptr, 0);
  void* data = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd->get(), 0);
  if (data == MAP_FAILED) return ErrnoToStatus(errno, "mmap", path);
  return MappedFile(path, static_cast<const uint8_t*>(data), *size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  PF_ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  PF_ASSIGN_OR_RETURN(const uint64_t size, FileSize(fd.get(), path));
  // Read to the end, the size only a hint: files of /proc and /sys say 0 or
  // 4096 whatever they hold, and a file may grow meanwhile.
  std::string text(size + 1, '\0');
  size_t done = 0;
  for (;;) {
    if (done == text.size()) text.resize(2 * text.size());
    const ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read", path);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(what, " cannot be read: ", text.status().message()));
  }
  return text;
}

}  // namespace packfeed
