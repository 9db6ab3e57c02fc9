#include "server/control/peer_admin.h"

#include "packfeed/common/status_macros.h"
#include "server/config/admin_tls.h"

namespace packfeed::server {

absl::StatusOr<std::vector<PeerAdmin>> PeerAdmins(const v1::DaemonConfig& config,
                                                  const grpc::ChannelArguments& arguments) {
  const v1::AdminTls& tls = config.admin_tls();
  PF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      AdminChannelCredentials(tls.ca_file(), tls.cert_file(), tls.key_file()));
  std::vector<PeerAdmin> out;
  for (const std::string& address : config.peers()) {
    out.push_back(
        {address, v1::Admin::NewStub(grpc::CreateCustomChannel(address, credentials, arguments))});
  }
  return out;
}

void PeerCall(grpc::ClientContext& context, const std::string& token,
              std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) context.set_deadline(std::chrono::system_clock::now() + timeout);
  context.AddMetadata(kAdminTokenMetadata, token);
}

}  // namespace packfeed::server
