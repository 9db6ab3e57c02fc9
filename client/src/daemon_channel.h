#ifndef PACKFEED_CLIENT_SRC_DAEMON_CHANNEL_H_
#define PACKFEED_CLIENT_SRC_DAEMON_CHANNEL_H_

// The gRPC channel to a rank's daemon: its Unix socket on this node, or its
// admin_tcp_address on another (plaintext, or TLS from PEM files).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "packfeed/client/client.h"

namespace packfeed::client {

// The daemon as messages name it: its socket, or its address.
inline const std::string& DaemonName(const ClientOptions& options) {
  return options.daemon_address.empty() ? options.socket_path : options.daemon_address;
}

// InvalidArgument for a socket path too long or TLS files without an
// address or a certificate without its key; NotFound naming an unreadable
// PEM file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenDaemonChannel(const ClientOptions& options);

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_SRC_DAEMON_CHANNEL_H_
