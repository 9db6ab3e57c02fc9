#ifndef PACKFEED_CLIENT_SRC_DAEMON_CHANNEL_H_
#define PACKFEED_CLIENT_SRC_DAEMON_CHANNEL_H_

// The gRPC channel to a rank's daemon: its Unix socket on this node, or its
// admin_tcp_address on another (plaintext, or TLS from PEM files).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace packfeed::client {

// Where the daemon is and how to reach it: ClientOptions' fields of the
// same names (client.h).
struct DaemonEndpoint {
  std::string socket_path;
  std::string daemon_address;  // empty: the socket
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

// InvalidArgument for a socket path too long or TLS files without an
// address or a certificate without its key; NotFound naming an unreadable
// PEM file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenDaemonChannel(const DaemonEndpoint& daemon);

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_SRC_DAEMON_CHANNEL_H_
