#ifndef PACKFEED_SERVER_CONTROL_SHARED_RING_LISTENER_H_
#define PACKFEED_SERVER_CONTROL_SHARED_RING_LISTENER_H_

// Where a client of another uid than the daemon's hands over its ring
// (docs/TRANSPORT.md, "Rings shared by file descriptor"): a second Unix
// socket beside the daemon's, `SOCKET.rings`. A client connects, sends
// "packfeed-ring BYTES" with its sealed memfd (SCM_RIGHTS), and gets back
// "token T", which its Attach names; the uid (SO_PEERCRED) must be one
// allowed to attach. gRPC cannot carry a file descriptor, hence this socket.

#include <sys/types.h>

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

class SharedRingListener {
 public:
  // Binds `path` (mode 0660, like the daemon's socket) and serves it on a
  // thread of its own.
  static absl::StatusOr<std::unique_ptr<SharedRingListener>> Start(const std::string& path,
                                                                   std::set<uid_t> allowed_uids);
  ~SharedRingListener();  // stops accepting; removes the socket file

  // The ring handed over under `token`, once. NotFound for a token never
  // given, taken already, or older than a minute (its client never attached).
  absl::StatusOr<std::shared_ptr<transport::SharedRing>> Take(absl::string_view token);

 private:
  SharedRingListener() = default;
  void Accept();
  // One client: its uid, its ring, the reply. Errors are the client's.
  absl::StatusOr<std::string> Serve(int connection);

  struct Shared {
    std::shared_ptr<transport::SharedRing> ring;
    absl::Time when;
  };
  std::string path_;
  std::set<uid_t> allowed_uids_;
  ScopedFd listening_;
  ScopedFd wake_;  // an eventfd: written to stop the acceptor
  std::thread acceptor_;
  absl::Mutex mutex_;
  std::map<std::string, Shared> rings_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_SHARED_RING_LISTENER_H_
