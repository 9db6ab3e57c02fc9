#ifndef PACKFEED_SERVER_CONTROL_SHARED_RING_LISTENER_H_
#define PACKFEED_SERVER_CONTROL_SHARED_RING_LISTENER_H_

// Where a client of another uid than the daemon's hands over its ring
// (docs/TRANSPORT.md, "Rings shared by file descriptor"): a second Unix
// socket beside the daemon's, `SOCKET.rings`. A client connects, sends
// "packfeed-ring BYTES" with its sealed memfd (SCM_RIGHTS), and gets back
// "token T", which its Attach names; the uid (SO_PEERCRED) must be one
// allowed to attach. gRPC cannot carry a file descriptor, hence this socket.
//
// A token is no bearer secret: it is bound to the process that shared the
// ring (uid and pid, as the kernel reports them on both sockets), taken at
// most once, and expires. One thread serves every pending connection at
// once (poll), so a client that connects and stays silent delays nobody;
// pending connections and unclaimed rings are bounded per uid and in all.

#include <sys/types.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/transport/shared_ring.h"

namespace packfeed::server {

struct SharedRingLimits {
  // A connection that has sent no ring by then is closed.
  absl::Duration receive_timeout = absl::Seconds(2);
  // An unclaimed ring is dropped this long after it was shared.
  absl::Duration token_lifetime = absl::Minutes(1);
  // Connections waiting for their message: past either bound the oldest
  // (of the uid, or of all) is closed to make room. A real client sends
  // right after connecting, so a flood of silent ones ages out first.
  int max_pending_per_uid = 16;
  int max_pending = 128;
  // Rings shared and not yet attached: past either bound a new share is
  // refused (ResourceExhausted), so one uid cannot pin the daemon's
  // descriptors and maps, nor crowd out another uid.
  int max_unclaimed_per_uid = 64;
  int max_unclaimed = 1024;
  // Bytes of one host ring (or staging arena) and of all unclaimed ones
  // together: a larger offer is refused before it is mapped, so no peer can
  // take the daemon's address space. 0 = the machine's physical memory
  // (a staging arena is at most half of it), and 4 times max_ring_bytes.
  uint64_t max_ring_bytes = 0;
  uint64_t max_unclaimed_bytes = 0;
};

class SharedRingListener {
 public:
  // Binds `path` (mode 0660, like the daemon's socket) and serves it on a
  // thread of its own.
  static absl::StatusOr<std::unique_ptr<SharedRingListener>> Start(
      const std::string& path, std::set<uid_t> allowed_uids, const SharedRingLimits& limits = {});
  ~SharedRingListener();  // stops accepting; removes the socket file

  // The ring shared under `token` by process `pid` of `uid` (the Attach's
  // caller), once. NotFound for a token never given, taken already, or
  // older than the limits' token_lifetime; PermissionDenied, leaving the
  // ring to its owner, when another process presents it.
  absl::StatusOr<std::shared_ptr<transport::SharedRing>> Take(absl::string_view token, uid_t uid,
                                                              pid_t pid);

  // Rings shared and not yet taken (expired ones included until the next
  // share or take drops them).
  int unclaimed() const;

 private:
  struct Pending {
    ScopedFd connection;
    transport::PeerIdentity peer;
    absl::Time deadline;
  };
  struct Shared {
    std::shared_ptr<transport::SharedRing> ring;
    transport::PeerIdentity owner;
    absl::Time when;
  };

  SharedRingListener() = default;
  void Loop();
  // Accepts every connection waiting on the listening socket.
  void AcceptAll();
  // Closes the oldest pending connection of `uid` (any uid when nullopt).
  void DropOldestPending(const uid_t* uid, absl::string_view why);
  // A pending connection's message: its ring and the reply. Errors are the
  // client's.
  absl::StatusOr<std::string> Serve(const Pending& pending);
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  std::string path_;
  std::set<uid_t> allowed_uids_;
  SharedRingLimits limits_;
  ScopedFd listening_;
  ScopedFd wake_;  // an eventfd: written to stop the loop
  std::thread thread_;
  std::list<Pending> pending_;  // oldest first; the loop's thread only
  mutable absl::Mutex mutex_;
  std::map<std::string, Shared> rings_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_SHARED_RING_LISTENER_H_
