#ifndef PACKFEED_SERVER_CONFIG_ADMIN_TLS_H_
#define PACKFEED_SERVER_CONFIG_ADMIN_TLS_H_

// Credentials of the TCP admin listener and of calls to it (peer daemons,
// packfeedctl --address): gRPC's own TLS, mutual when configured, read from
// PEM files. Plaintext without TLS settings.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace packfeed::v1 {
class DaemonConfig;
}  // namespace packfeed::v1

namespace packfeed::server {

// The gRPC metadata key that carries admin_tcp_token on the TCP listener.
inline constexpr const char* kAdminTokenMetadata = "x-packfeed-admin-token";

// The listener's credentials for `config.admin_tls()`; insecure when the
// configuration has none. NotFound naming an unreadable file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> AdminServerCredentials(
    const v1::DaemonConfig& config);

// A caller's credentials: TLS verified against `ca_file`, presenting
// `cert_file`/`key_file` when given (mutual TLS); insecure when `ca_file` is
// empty. NotFound naming an unreadable file; InvalidArgument for a
// certificate without its key.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> AdminChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_ADMIN_TLS_H_
