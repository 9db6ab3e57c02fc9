#ifndef PACKFEED_CLIENT_SRC_SHARE_RING_H_
#define PACKFEED_CLIENT_SRC_SHARE_RING_H_

// Handing shared memory to the daemon by file descriptor over its
// SOCKET.rings (docs/TRANSPORT.md, "Rings shared by file descriptor"): a
// trainer's ring, or a producer's staging arena (docs/INGEST.md).

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "packfeed/transport/shared_ring.h"

namespace packfeed::client {

// Hands `ring_fd` (a memfd, or exported device memory) to the daemon at
// `path` (its SOCKET.rings) and returns the token the next call names.
// FailedPrecondition carrying the daemon's reason when it refuses a device
// ring (it cannot import it: the client then stages its own copies);
// PermissionDenied with its reason for a host memfd.
absl::StatusOr<std::string> ShareRing(const std::string& path, int ring_fd,
                                      const transport::RingOffer& offer, absl::Duration timeout);

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_SRC_SHARE_RING_H_
