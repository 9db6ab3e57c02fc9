#ifndef PACKFEED_TRANSPORT_SHARED_RING_H_
#define PACKFEED_TRANSPORT_SHARED_RING_H_

// A host ring the client creates as a sealed memfd and hands to the daemon
// over a Unix socket (SCM_RIGHTS), for a trainer whose uid differs from the
// daemon's: UCX 1.13's shared-memory segments are private to their uid, so
// without this such a trainer is served over TCP. The memfd has no name in
// any file system; only processes it is passed to can map it.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/common/posix_file.h"

namespace packfeed::transport {

// Move-only; unmaps (and closes) on destruction. Thread-compatible.
class SharedRing {
 public:
  // The client's side: a zeroed memfd of `bytes`, mapped read-write, sealed
  // against shrinking, growing and further seals.
  static absl::StatusOr<SharedRing> Create(uint64_t bytes);
  // The daemon's side: maps a ring a client sent. InvalidArgument unless it
  // is sealed against shrinking (a client truncating a mapped file would
  // crash the daemon with SIGBUS) and is exactly `bytes` long.
  static absl::StatusOr<SharedRing> Map(ScopedFd fd, uint64_t bytes);

  SharedRing(SharedRing&& other) noexcept;
  SharedRing& operator=(SharedRing&&) = delete;
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;
  ~SharedRing();

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }

 private:
  SharedRing(ScopedFd fd, uint8_t* data, uint64_t bytes)
      : fd_(std::move(fd)), data_(data), bytes_(bytes) {}
  ScopedFd fd_;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Who is at the other end of a connected Unix socket, as the kernel says
// (SO_PEERCRED).
struct PeerIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerIdentity> PeerOf(int unix_socket);

// Sends `message` (at most 4 KiB) with a copy of `fd` (SCM_RIGHTS).
absl::Status SendWithFd(int unix_socket, absl::string_view message, int fd);
// Receives one message sent by SendWithFd and the descriptor that came with
// it. InvalidArgument when none came, or more than one.
absl::StatusOr<std::pair<std::string, ScopedFd>> ReceiveWithFd(int unix_socket);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_SHARED_RING_H_
