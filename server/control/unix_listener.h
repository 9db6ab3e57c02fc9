#ifndef PACKFEED_SERVER_CONTROL_UNIX_LISTENER_H_
#define PACKFEED_SERVER_CONTROL_UNIX_LISTENER_H_

// The daemon's Unix socket, served by packfeedd itself rather than by gRPC:
// each connection is accepted here and handed to gRPC
// (AddInsecureChannelFromFd), which names such a connection's peer "fd:N".
// A call asks who made its connection of the connection itself (SO_PEERCRED
// on N: pid, uid, gid, which the kernel keeps with the socket and the peer
// cannot forge), never of a table kept by number. gRPC 1.51 offers no other
// way to learn a Unix peer's credentials.

#include <sys/types.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server.h"
#include "grpcpp/server_context.h"
#include "packfeed/common/posix_file.h"

namespace packfeed::server {

// Binds a Unix socket at `path` (mode 0660: the owner and its group may
// connect), non-blocking, and listens on it.
absl::StatusOr<ScopedFd> ListenOnUnixSocket(const std::string& path);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class UnixListener {
 public:
  // Binds `path` (mode 0660: the owner and its group may connect) and
  // accepts connections for `server`, which must outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Start(const std::string& path,
                                                             grpc::Server& server);
  ~UnixListener();  // stops accepting; connections handed over stay gRPC's

  // Who opened the connection a call came on; nullopt for a call that did
  // not come through this listener (the admin TCP server's). Only while the
  // call is being served (its connection is open).
  std::optional<PeerCredentials> CallerOf(const grpc::ServerContextBase& context) const;

 private:
  UnixListener() = default;
  void Accept();

  grpc::Server* server_ = nullptr;
  ScopedFd listening_;
  ScopedFd wake_;  // an eventfd: written to stop the acceptor
  std::thread acceptor_;
};

// Whether a call came through a UnixListener (gRPC names such a peer "fd:N")
// rather than a TCP listener.
bool IsUnixCaller(const grpc::ServerContextBase& context);

// PermissionDenied naming the caller unless its uid is in `allowed_uids`;
// OK for a call from elsewhere than `listener` (it has its own checks).
absl::Status CheckCaller(const UnixListener& listener, const grpc::ServerContextBase& context,
                         const std::set<uid_t>& allowed_uids, absl::string_view action);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_UNIX_LISTENER_H_
