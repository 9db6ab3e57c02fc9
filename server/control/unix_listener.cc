#include "server/control/unix_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/server_posix.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

absl::StatusOr<ScopedFd> ListenOnUnixSocket(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  PF_RETURN_IF_ERROR(CheckUnixSocketPath(path));
  std::memcpy(address.sun_path, path.data(), path.size());
  ScopedFd listening(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listening.valid()) return ErrnoToStatus(errno, "socket", path);
  if (bind(listening.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return ErrnoToStatus(errno, "bind", path);
  }
  // Only the owner and its group may attach or administer.
  if (chmod(path.c_str(), 0660) != 0) return ErrnoToStatus(errno, "chmod", path);
  if (listen(listening.get(), SOMAXCONN) != 0) return ErrnoToStatus(errno, "listen", path);
  return listening;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Start(const std::string& path,
                                                                  grpc::Server& server) {
  std::unique_ptr<UnixListener> listener(new UnixListener());
  listener->server_ = &server;
  PF_ASSIGN_OR_RETURN(listener->listening_, ListenOnUnixSocket(path));
  listener->wake_ = ScopedFd(eventfd(0, EFD_CLOEXEC));
  if (!listener->wake_.valid()) return ErrnoToStatus(errno, "eventfd", path);
  listener->acceptor_ = std::thread([raw = listener.get()] { raw->Accept(); });
  return listener;
}

UnixListener::~UnixListener() {
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    acceptor_.join();
  }
}

void UnixListener::Accept() {
  pollfd fds[2] = {{listening_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("unix socket: poll: {}; no more connections accepted", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // gRPC's endpoints want non-blocking sockets.
    const int fd = accept4(listening_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("unix socket: accept: {}", std::strerror(errno));
      }
      continue;
    }
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns the fd from here
  }
}

std::optional<PeerCredentials> UnixListener::CallerOf(
    const grpc::ServerContextBase& context) const {
  const std::string peer = context.peer();
  int fd = -1;
  if (!absl::StartsWith(peer, "fd:") || !absl::SimpleAtoi(peer.substr(3), &fd)) {
    return std::nullopt;
  }
  // Asked of the connection itself while the call is on it: the call's
  // stream holds gRPC's transport, and the transport its descriptor, so fd
  // cannot have been closed and its number given to another connection.
  // The kernel keeps the credentials with the socket (taken at connect).
  int domain = 0;
  socklen_t domain_length = sizeof(domain);
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &domain_length) != 0 || domain != AF_UNIX ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0 ||
      length != sizeof(credentials)) {
    return std::nullopt;
  }
  return PeerCredentials{credentials.pid, credentials.uid, credentials.gid};
}

bool IsUnixCaller(const grpc::ServerContextBase& context) {
  return absl::StartsWith(context.peer(), "fd:");
}

absl::Status CheckCaller(const UnixListener& listener, const grpc::ServerContextBase& context,
                         const std::set<uid_t>& allowed_uids, absl::string_view action) {
  const std::string peer = context.peer();
  if (!IsUnixCaller(context)) return absl::OkStatus();  // not the Unix socket
  const std::optional<PeerCredentials> caller = listener.CallerOf(context);
  if (!caller.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat(action, ": the caller's credentials are unknown (", peer, ")"));
  }
  if (allowed_uids.count(caller->uid) > 0) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", caller->uid, " (pid ", caller->pid, ") may not ", action, ": allowed uids are ",
      absl::StrJoin(allowed_uids, ", "), " (config allowed_uids)"));
}

}  // namespace packfeed::server
