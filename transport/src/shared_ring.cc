#include "packfeed/transport/shared_ring.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace packfeed::transport {
namespace {

constexpr size_t kMaxMessageBytes = 4096;
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

absl::StatusOr<uint8_t*> MapReadWrite(int fd, uint64_t bytes) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return ErrnoToStatus(errno, "mmap", "shared ring");
  return static_cast<uint8_t*>(data);
}

}  // namespace

absl::StatusOr<SharedRing> SharedRing::Create(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared ring of 0 bytes");
  ScopedFd fd(memfd_create("packfeed-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoToStatus(errno, "memfd_create", "shared ring");
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoToStatus(errno, "ftruncate", "shared ring");
  }
  if (fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) {
    return ErrnoToStatus(errno, "fcntl(F_ADD_SEALS)", "shared ring");
  }
  absl::StatusOr<uint8_t*> data = MapReadWrite(fd.get(), bytes);
  if (!data.ok()) return data.status();
  return SharedRing(std::move(fd), *data, bytes);
}

absl::StatusOr<SharedRing> SharedRing::Map(ScopedFd fd, uint64_t bytes) {
  // Only shmem: a hole punched in it, or a page the kernel cannot find,
  // faults in a new page on the next write. A HugeTLB memfd's pages come
  // from a pool its owner can drain (by punching holes and mapping others),
  // and a write to a page the pool cannot give is SIGBUS in the daemon.
  struct statfs filesystem {};
  if (fstatfs(fd.get(), &filesystem) != 0) return ErrnoToStatus(errno, "fstatfs", "shared ring");
  if (filesystem.f_type != TMPFS_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a shared ring must be an ordinary memfd (memfd_create without MFD_HUGETLB), not a file "
        "of filesystem type 0x",
        absl::Hex(filesystem.f_type),
        filesystem.f_type == HUGETLBFS_MAGIC ? " (HugeTLB: the daemon would die of SIGBUS when "
                                               "the huge-page pool runs dry)"
                                             : ""));
  }
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "a shared ring must be a memfd sealed against shrinking (F_SEAL_SHRINK)");
  }
  struct stat info {};
  if (fstat(fd.get(), &info) != 0) return ErrnoToStatus(errno, "fstat", "shared ring");
  if (static_cast<uint64_t>(info.st_size) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared ring of ", info.st_size, " bytes for a ring descriptor of ", bytes));
  }
  absl::StatusOr<uint8_t*> data = MapReadWrite(fd.get(), bytes);
  if (!data.ok()) return data.status();
  return SharedRing(std::move(fd), *data, bytes);
}

absl::StatusOr<SharedRing> SharedRing::ImportDevice(ScopedFd fd, uint64_t size,
                                                    absl::string_view gpu_uuid) {
  absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> device =
      ImportedDeviceMemory::Import(std::move(fd), size, gpu_uuid);
  if (!device.ok()) return device.status();
  return SharedRing(*std::move(device));
}

SharedRing::SharedRing(std::unique_ptr<ImportedDeviceMemory> device)
    : data_(device->data()), bytes_(device->size()), device_(std::move(device)) {}

SharedRing::SharedRing(SharedRing&& other) noexcept
    : fd_(std::move(other.fd_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(std::move(other.device_)) {}

SharedRing::~SharedRing() {
  if (data_ != nullptr && device_ == nullptr) munmap(data_, bytes_);
}

std::string FormatRingOffer(const RingOffer& offer) {
  return offer.device() ? absl::StrCat("packfeed-device-ring ", offer.bytes, " ", offer.gpu_uuid)
                        : absl::StrCat("packfeed-ring ", offer.bytes);
}

absl::StatusOr<RingOffer> ParseRingOffer(absl::string_view message) {
  RingOffer offer;
  const std::vector<absl::string_view> words = absl::StrSplit(message, ' ');
  const bool host = words.size() == 2 && words[0] == "packfeed-ring";
  const bool device = words.size() == 3 && words[0] == "packfeed-device-ring";
  if ((host || device) && absl::SimpleAtoi(words[1], &offer.bytes) && device) {
    offer.gpu_uuid = std::string(words[2]);
  }
  const bool uuid_ok =
      !device || (offer.gpu_uuid.size() == 32 && absl::c_all_of(offer.gpu_uuid, [](char c) {
                    return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
                  }));
  // Only the canonical spelling (what FormatRingOffer writes) is accepted.
  if (!(host || device) || !uuid_ok || offer.bytes == 0 || FormatRingOffer(offer) != message) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a message \"", absl::CHexEscape(message.substr(0, 96)),
        "\", not \"packfeed-ring BYTES\" or \"packfeed-device-ring BYTES GPU-UUID\" (BYTES > 0 "
        "in decimal, the UUID as 32 lowercase hex digits)"));
  }
  return offer;
}

absl::StatusOr<PeerIdentity> PeerOf(int unix_socket) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(unix_socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    return ErrnoToStatus(errno, "getsockopt(SO_PEERCRED)", "unix socket");
  }
  return PeerIdentity{credentials.pid, credentials.uid, credentials.gid};
}

absl::Status SendWithFd(int unix_socket, absl::string_view message, int fd) {
  if (message.empty() || message.size() > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message of ", message.size(), " bytes (1 to ", kMaxMessageBytes, ")"));
  }
  iovec data{const_cast<char*>(message.data()), message.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr header{};
  header.msg_iov = &data;
  header.msg_iovlen = 1;
  header.msg_control = control;
  header.msg_controllen = sizeof(control);
  cmsghdr* rights = CMSG_FIRSTHDR(&header);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(rights), &fd, sizeof(int));
  ssize_t sent;
  do {
    sent = sendmsg(unix_socket, &header, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return ErrnoToStatus(errno, "sendmsg", "unix socket");
  if (static_cast<size_t>(sent) != message.size()) {
    return absl::UnavailableError(absl::StrCat("sendmsg sent ", sent, " of ", message.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, ScopedFd>> ReceiveWithFd(int unix_socket) {
  std::string message(kMaxMessageBytes, '\0');
  iovec data{message.data(), message.size()};
  // Room for more than one descriptor, so a sender of several is caught
  // (and none of them leaks) rather than truncated.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr header{};
  header.msg_iov = &data;
  header.msg_iovlen = 1;
  header.msg_control = control;
  header.msg_controllen = sizeof(control);
  ssize_t received;
  do {
    received = recvmsg(unix_socket, &header, MSG_CMSG_CLOEXEC);
  } while (received < 0 && errno == EINTR);
  if (received < 0) return ErrnoToStatus(errno, "recvmsg", "unix socket");
  std::vector<ScopedFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if ((header.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0 || fds.size() != 1 || received == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected one message with one descriptor, got ", received, " bytes and ", fds.size(),
        " descriptors", (header.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0 ? " (truncated)" : ""));
  }
  message.resize(static_cast<size_t>(received));
  return std::make_pair(std::move(message), std::move(fds.front()));
}

}  // namespace packfeed::transport
