#ifndef PACKFEED_TRANSPORT_SHARED_RING_H_
#define PACKFEED_TRANSPORT_SHARED_RING_H_

// A ring the client hands to the daemon over a Unix socket (SCM_RIGHTS).
// Host memory: a sealed memfd, for a trainer whose uid differs from the
// daemon's (UCX 1.13's shared-memory segments are private to their uid, so
// without this such a trainer is served over TCP); the memfd has no name in
// any file system and only processes it is passed to can map it. Device
// memory: a CUDA allocation exported as a descriptor, which the daemon
// imports and copies each slot into (cuda_shared_memory.h).

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/transport/cuda_shared_memory.h"

namespace packfeed::transport {

// Move-only; unmaps (and closes) on destruction. Thread-compatible.
class SharedRing {
 public:
  // The client's side: a zeroed memfd of `bytes`, mapped read-write, sealed
  // against shrinking, growing and further seals.
  static absl::StatusOr<SharedRing> Create(uint64_t bytes);
  // The daemon's side: maps a ring a client sent. InvalidArgument unless it
  // is an ordinary (shmem) memfd, sealed against shrinking, and exactly
  // `bytes` long: a client truncating a mapped file, or draining the pool of
  // a HugeTLB one, would crash the daemon with SIGBUS. A hole the client
  // punches (which no seal but F_SEAL_WRITE stops, and the daemon must
  // write) only costs it its own bytes: the daemon's next write there
  // faults in a new page.
  static absl::StatusOr<SharedRing> Map(ScopedFd fd, uint64_t bytes);
  // The daemon's side of a device ring: `size` bytes exported on the GPU
  // whose UUID is `gpu_uuid` (ExportedDeviceMemory), imported here. data()
  // is then device memory, written only through device()->CopyIn.
  static absl::StatusOr<SharedRing> ImportDevice(ScopedFd fd, uint64_t size,
                                                 absl::string_view gpu_uuid);

  SharedRing(SharedRing&& other) noexcept;
  SharedRing& operator=(SharedRing&&) = delete;
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;
  ~SharedRing();

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }
  // A device ring's memory; nullptr for a host ring.
  ImportedDeviceMemory* device() const { return device_.get(); }

 private:
  SharedRing(ScopedFd fd, uint8_t* data, uint64_t bytes)
      : fd_(std::move(fd)), data_(data), bytes_(bytes) {}
  explicit SharedRing(std::unique_ptr<ImportedDeviceMemory> device);
  ScopedFd fd_;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  std::unique_ptr<ImportedDeviceMemory> device_;
};

// What a client sends with its ring's descriptor: "packfeed-ring BYTES"
// (a host memfd of BYTES) or "packfeed-device-ring BYTES UUID" (device
// memory of BYTES exported on the GPU whose UUID is 32 hex digits).
struct RingOffer {
  uint64_t bytes = 0;
  std::string gpu_uuid;  // device rings only
  bool device() const { return !gpu_uuid.empty(); }
};
std::string FormatRingOffer(const RingOffer& offer);
// InvalidArgument naming both forms for anything else (0 bytes, a UUID that
// is not 32 lowercase hex digits, more words).
absl::StatusOr<RingOffer> ParseRingOffer(absl::string_view message);

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
