#include "client/src/daemon_channel.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::client {
namespace {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(
    const DaemonEndpoint& options) {
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_cert_file and tls_key_file need tls_ca_file (the CA of the daemon's certificate)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.daemon_address.empty()) {
    return absl::InvalidArgumentError(
        "tls_ca_file secures daemon_address, which is not set (the Unix socket needs no TLS)");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs its key, and the key its certificate");
  }
  grpc::SslCredentialsOptions tls;
  PF_ASSIGN_OR_RETURN(tls.pem_root_certs, ReadWholeFile(options.tls_ca_file, "tls_ca_file"));
  if (!options.tls_cert_file.empty()) {
    PF_ASSIGN_OR_RETURN(tls.pem_cert_chain, ReadWholeFile(options.tls_cert_file, "tls_cert_file"));
    PF_ASSIGN_OR_RETURN(tls.pem_private_key, ReadWholeFile(options.tls_key_file, "tls_key_file"));
  }
  return grpc::SslCredentials(tls);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenDaemonChannel(const DaemonEndpoint& options) {
  if (options.daemon_address.empty()) PF_RETURN_IF_ERROR(CheckUnixSocketPath(options.socket_path));
  PF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, Credentials(options));
  // gRPC's own reconnect backoff (1 s growing to 2 min) would refuse calls
  // long after a restarted daemon is back: keep it at Reattach's pace.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  const std::string target =
      options.daemon_address.empty() ? "unix:" + options.socket_path : options.daemon_address;
  return grpc::CreateCustomChannel(target, credentials, arguments);
}

}  // namespace packfeed::client
