#include "server/control/shared_ring_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/wire.h"
#include "server/control/unix_listener.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// 128 bits from the CSPRNG, in hex: the same draw as a connection's key.
std::string NewToken() {
  return absl::BytesToHexString(transport::KeyBytes(transport::NewConnectionKey()));
}

void Reply(int connection, const absl::StatusOr<std::string>& token) {
  const std::string reply = token.ok() ? absl::StrCat("token ", *token)
                                       : absl::StrCat("error ", token.status().message());
  (void)!send(connection, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

std::string Who(const transport::PeerIdentity& peer) {
  return absl::StrCat("uid ", peer.uid, " (pid ", peer.pid, ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRingListener>> SharedRingListener::Start(
    const std::string& path, std::set<uid_t> allowed_uids, const SharedRingLimits& limits) {
  std::unique_ptr<SharedRingListener> listener(new SharedRingListener());
  listener->path_ = path;
  listener->allowed_uids_ = std::move(allowed_uids);
  listener->limits_ = limits;
  if (listener->limits_.max_ring_bytes == 0) {
    listener->limits_.max_ring_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }
  if (listener->limits_.max_unclaimed_bytes == 0) {
    listener->limits_.max_unclaimed_bytes = 4 * listener->limits_.max_ring_bytes;
  }
  // A socket file left by a daemon that died is replaced, as the daemon's own.
  struct stat info {};
  if (lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(path.c_str());
  PF_ASSIGN_OR_RETURN(listener->listening_, ListenOnUnixSocket(path));
  listener->wake_ = ScopedFd(eventfd(0, EFD_CLOEXEC));
  if (!listener->wake_.valid()) return ErrnoToStatus(errno, "eventfd", path);
  listener->thread_ = std::thread([raw = listener.get()] { raw->Loop(); });
  return listener;
}

SharedRingListener::~SharedRingListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    thread_.join();
    unlink(path_.c_str());
  }
}

void SharedRingListener::Loop() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{listening_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}});
    for (const Pending& pending : pending_) fds.push_back({pending.connection.get(), POLLIN, 0});
    // Every connection waits as long, so the oldest's deadline comes first.
    int timeout_ms = -1;
    if (!pending_.empty()) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(pending_.front().deadline - absl::Now()) + 1));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("{}: poll: {}; no more rings taken", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Messages first: a connection accepted below is polled next round.
    const absl::Time now = absl::Now();
    int silent = 0;
    auto it = pending_.begin();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        absl::StatusOr<std::string> token = Serve(*it);
        if (!token.ok()) {
          spdlog::warn("{}: refused a shared ring: {}", path_, token.status().ToString());
        }
        Reply(it->connection.get(), token);
        it = pending_.erase(it);
      } else if (it->deadline <= now) {
        Reply(it->connection.get(),
              absl::DeadlineExceededError(absl::StrCat(
                  "sent no ring within ", absl::FormatDuration(limits_.receive_timeout))));
        ++silent;
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    // One line for a crowd, not one each.
    if (silent > 0) {
      spdlog::warn("{}: closed {} connection(s) that sent no ring within {}", path_, silent,
                   absl::FormatDuration(limits_.receive_timeout));
    }
    if (fds[0].revents != 0) AcceptAll();
  }
}

void SharedRingListener::AcceptAll() {
  for (;;) {
    ScopedFd connection(accept4(listening_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!connection.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN: all taken; anything else: tried again next round
    }
    absl::StatusOr<transport::PeerIdentity> peer = transport::PeerOf(connection.get());
    if (!peer.ok()) {
      spdlog::warn("{}: {}; connection closed", path_, peer.status().ToString());
      continue;
    }
    if (allowed_uids_.count(peer->uid) == 0) {
      // Refused before it sends: a stranger holds nothing here.
      const absl::Status refused = absl::PermissionDeniedError(
          absl::StrCat(Who(*peer), " may not attach (it shared a ring): allowed uids are ",
                       absl::StrJoin(allowed_uids_, ", "), " (config allowed_uids)"));
      spdlog::warn("{}: refused a shared ring: {}", path_, refused.ToString());
      Reply(connection.get(), refused);
      continue;
    }
    const int of_uid =
        static_cast<int>(std::count_if(pending_.begin(), pending_.end(),
                                       [&](const Pending& p) { return p.peer.uid == peer->uid; }));
    if (of_uid >= limits_.max_pending_per_uid) {
      DropOldestPending(&peer->uid, "its uid has too many connections waiting");
    } else if (static_cast<int>(pending_.size()) >= limits_.max_pending) {
      DropOldestPending(nullptr, "too many connections waiting");
    }
    pending_.push_back({std::move(connection), *peer, absl::Now() + limits_.receive_timeout});
  }
}

void SharedRingListener::DropOldestPending(const uid_t* uid, absl::string_view why) {
  auto oldest = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) {
    return uid == nullptr || p.peer.uid == *uid;
  });
  if (oldest == pending_.end()) return;
  const absl::Status dropped = absl::ResourceExhaustedError(
      absl::StrCat(Who(oldest->peer), ": closed before it sent a ring: ", why));
  spdlog::warn("{}: {}", path_, std::string(dropped.message()));
  Reply(oldest->connection.get(), dropped);
  pending_.erase(oldest);
}

absl::StatusOr<std::string> SharedRingListener::Serve(const Pending& pending) {
  const transport::PeerIdentity& peer = pending.peer;
  auto received = transport::ReceiveWithFd(pending.connection.get());
  if (!received.ok()) {
    return absl::Status(received.status().code(),
                        absl::StrCat(Who(peer), ": ", received.status().message()));
  }
  absl::StatusOr<transport::RingOffer> offer = transport::ParseRingOffer(received->first);
  if (!offer.ok()) {
    return absl::Status(offer.status().code(),
                        absl::StrCat(Who(peer), ": ", offer.status().message()));
  }
  {
    // Checked before mapping: a refused share costs the daemon nothing.
    absl::MutexLock lock(&mutex_);
    DropExpired(absl::Now());
    const int of_uid =
        static_cast<int>(std::count_if(rings_.begin(), rings_.end(), [&](const auto& entry) {
          return entry.second.owner.uid == peer.uid;
        }));
    if (!offer->device()) {
      uint64_t unclaimed_bytes = 0;
      for (const auto& [_, shared] : rings_) {
        if (shared.ring->device() == nullptr) unclaimed_bytes += shared.ring->bytes();
      }
      if (offer->bytes > limits_.max_ring_bytes ||
          offer->bytes > limits_.max_unclaimed_bytes -
                             std::min(unclaimed_bytes, limits_.max_unclaimed_bytes)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            Who(peer), ": a ring of ", offer->bytes, " bytes: at most ", limits_.max_ring_bytes,
            " (config max_shared_ring_bytes), and ", limits_.max_unclaimed_bytes,
            " for every ring shared and not attached (", unclaimed_bytes, " now)"));
      }
    }
    if (of_uid >= limits_.max_unclaimed_per_uid ||
        static_cast<int>(rings_.size()) >= limits_.max_unclaimed) {
      return absl::ResourceExhaustedError(
          absl::StrCat(Who(peer), ": too many rings shared and not attached (", of_uid,
                       " of this uid, at most ", limits_.max_unclaimed_per_uid, "; ", rings_.size(),
                       " in all, at most ", limits_.max_unclaimed, "); each is dropped ",
                       absl::FormatDuration(limits_.token_lifetime), " after it was shared"));
    }
  }
  // A device ring is imported on the GPU of its UUID (the GPU's context is
  // opened here the first time); what the driver refuses is the client's
  // reason to fall back to its staged ring.
  absl::StatusOr<transport::SharedRing> ring =
      offer->device() ? transport::SharedRing::ImportDevice(std::move(received->second),
                                                            offer->bytes, offer->gpu_uuid)
                      : transport::SharedRing::Map(std::move(received->second), offer->bytes);
  if (!ring.ok()) {
    return absl::Status(ring.status().code(),
                        absl::StrCat(Who(peer), offer->device() ? ": device ring: " : ": ",
                                     ring.status().message()));
  }
  const std::string token = NewToken();
  absl::MutexLock lock(&mutex_);
  rings_[token] = {std::make_shared<transport::SharedRing>(*std::move(ring)), peer, absl::Now()};
  return token;
}

void SharedRingListener::DropExpired(absl::Time now) {
  for (auto it = rings_.begin(); it != rings_.end();) {
    it = now - it->second.when > limits_.token_lifetime ? rings_.erase(it) : std::next(it);
  }
}

absl::StatusOr<std::shared_ptr<transport::SharedRing>> SharedRingListener::Take(
    absl::string_view token, uid_t uid, pid_t pid) {
  absl::MutexLock lock(&mutex_);
  DropExpired(absl::Now());
  auto it = rings_.find(std::string(token));
  if (it == rings_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no ring was shared under that token (or it was taken already, or over ",
                     absl::FormatDuration(limits_.token_lifetime), " ago): share it again"));
  }
  const transport::PeerIdentity& owner = it->second.owner;
  if (owner.uid != uid || owner.pid != pid) {
    // Left in place: the process that shared it may still attach with it.
    return absl::PermissionDeniedError(
        absl::StrCat("uid ", uid, " (pid ", pid, ") named a ring token that ", Who(owner),
                     " was given: a token is good only for the process that shared the ring"));
  }
  std::shared_ptr<transport::SharedRing> ring = std::move(it->second.ring);
  rings_.erase(it);
  return ring;
}

int SharedRingListener::unclaimed() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(rings_.size());
}

}  // namespace packfeed::server
