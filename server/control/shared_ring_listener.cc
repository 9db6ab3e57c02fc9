#include "server/control/shared_ring_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "packfeed/common/status_macros.h"
#include "server/control/unix_listener.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// A client that connects and sends nothing holds the acceptor this long.
constexpr int kReceiveTimeoutMs = 2000;
constexpr absl::Duration kTokenLifetime = absl::Minutes(1);

std::string NewToken() {
  std::random_device random;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(random(), absl::kZeroPad8));
  return token;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRingListener>> SharedRingListener::Start(
    const std::string& path, std::set<uid_t> allowed_uids) {
  std::unique_ptr<SharedRingListener> listener(new SharedRingListener());
  listener->path_ = path;
  listener->allowed_uids_ = std::move(allowed_uids);
  // A socket file left by a daemon that died is replaced, as the daemon's own.
  struct stat info {};
  if (lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(path.c_str());
  PF_ASSIGN_OR_RETURN(listener->listening_, ListenOnUnixSocket(path));
  listener->wake_ = ScopedFd(eventfd(0, EFD_CLOEXEC));
  if (!listener->wake_.valid()) return ErrnoToStatus(errno, "eventfd", path);
  listener->acceptor_ = std::thread([raw = listener.get()] { raw->Accept(); });
  return listener;
}

SharedRingListener::~SharedRingListener() {
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    acceptor_.join();
    unlink(path_.c_str());
  }
}

void SharedRingListener::Accept() {
  pollfd fds[2] = {{listening_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("{}: poll: {}; no more rings taken", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    ScopedFd connection(accept4(listening_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    absl::StatusOr<std::string> token = Serve(connection.get());
    const std::string reply = token.ok() ? absl::StrCat("token ", *token)
                                         : absl::StrCat("error ", token.status().message());
    if (!token.ok())
      spdlog::warn("{}: refused a shared ring: {}", path_, token.status().ToString());
    (void)!send(connection.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
  }
}

absl::StatusOr<std::string> SharedRingListener::Serve(int connection) {
  absl::StatusOr<transport::PeerIdentity> peer = transport::PeerOf(connection);
  if (!peer.ok()) return peer.status();
  if (allowed_uids_.count(peer->uid) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("uid ", peer->uid, " (pid ", peer->pid,
                     ") may not attach (it shared a ring): allowed uids are ",
                     absl::StrJoin(allowed_uids_, ", "), " (config allowed_uids)"));
  }
  pollfd readable{connection, POLLIN, 0};
  if (poll(&readable, 1, kReceiveTimeoutMs) <= 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("pid ", peer->pid, " sent no ring within ", kReceiveTimeoutMs, " ms"));
  }
  auto received = transport::ReceiveWithFd(connection);
  if (!received.ok()) return received.status();
  absl::string_view message = received->first;
  uint64_t bytes = 0;
  if (!absl::ConsumePrefix(&message, "packfeed-ring ") || !absl::SimpleAtoi(message, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("pid ", peer->pid, ": a message \"",
                                                   received->first.substr(0, 64),
                                                   "\", not \"packfeed-ring BYTES\""));
  }
  absl::StatusOr<transport::SharedRing> ring =
      transport::SharedRing::Map(std::move(received->second), bytes);
  if (!ring.ok()) {
    return absl::Status(ring.status().code(),
                        absl::StrCat("pid ", peer->pid, ": ", ring.status().message()));
  }
  const std::string token = NewToken();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mutex_);
  for (auto it = rings_.begin(); it != rings_.end();) {
    it = now - it->second.when > kTokenLifetime ? rings_.erase(it) : std::next(it);
  }
  rings_[token] = {std::make_shared<transport::SharedRing>(*std::move(ring)), now};
  return token;
}

absl::StatusOr<std::shared_ptr<transport::SharedRing>> SharedRingListener::Take(
    absl::string_view token) {
  absl::MutexLock lock(&mutex_);
  auto it = rings_.find(std::string(token));
  if (it == rings_.end() || absl::Now() - it->second.when > kTokenLifetime) {
    return absl::NotFoundError(
        "no ring was shared under that token (or it was over a minute ago): share it again");
  }
  std::shared_ptr<transport::SharedRing> ring = std::move(it->second.ring);
  rings_.erase(it);
  return ring;
}

}  // namespace packfeed::server
