#include "server/config/admin_tls.h"

#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed::server {
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> AdminServerCredentials(
    const v1::DaemonConfig& config) {
  if (!config.has_admin_tls()) return grpc::InsecureServerCredentials();
  const v1::AdminTls& tls = config.admin_tls();
  grpc::SslServerCredentialsOptions options(
      tls.mutual() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  PF_ASSIGN_OR_RETURN(pair.private_key, ReadWholeFile(tls.key_file(), "admin_tls.key_file"));
  PF_ASSIGN_OR_RETURN(pair.cert_chain, ReadWholeFile(tls.cert_file(), "admin_tls.cert_file"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  PF_ASSIGN_OR_RETURN(options.pem_root_certs, ReadWholeFile(tls.ca_file(), "admin_tls.ca_file"));
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> AdminChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs its key, and the key its "
        "certificate");
  }
  grpc::SslCredentialsOptions options;
  PF_ASSIGN_OR_RETURN(options.pem_root_certs, ReadWholeFile(ca_file, "TLS CA file"));
  if (!cert_file.empty()) {
    PF_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadWholeFile(cert_file, "TLS certificate"));
    PF_ASSIGN_OR_RETURN(options.pem_private_key, ReadWholeFile(key_file, "TLS key"));
  }
  return grpc::SslCredentials(options);
}

}  // namespace packfeed::server
