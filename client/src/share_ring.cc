#include "client/src/share_ring.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::client {

absl::StatusOr<std::string> ShareRing(const std::string& path, int ring_fd,
                                      const transport::RingOffer& offer, absl::Duration timeout) {
  ScopedFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  if (!socket.valid() ||
      connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("sharing the ring with the daemon at ", path, ": ", std::strerror(errno)));
  }
  // A daemon that refuses this uid answers before it reads: its reply says
  // why better than the broken pipe the send then meets.
  const absl::Status sent =
      transport::SendWithFd(socket.get(), transport::FormatRingOffer(offer), ring_fd);
  pollfd readable{socket.get(), POLLIN, 0};
  std::string reply(4096, '\0');
  ssize_t got = 0;
  if (poll(&readable, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0 ||
      (got = recv(socket.get(), reply.data(), reply.size(), 0)) <= 0) {
    PF_RETURN_IF_ERROR(sent);
    return absl::UnavailableError(absl::StrCat("the daemon at ", path, " did not answer"));
  }
  reply.resize(static_cast<size_t>(got));
  absl::string_view rest = reply;
  if (absl::ConsumePrefix(&rest, "token ")) return std::string(rest);
  absl::ConsumePrefix(&rest, "error ");
  const std::string refusal = absl::StrCat("the daemon at ", path, " refused the ring: ", rest);
  return offer.device() ? absl::FailedPreconditionError(refusal)
                        : absl::PermissionDeniedError(refusal);
}

}  // namespace packfeed::client
