#ifndef PACKFEED_SERVER_CONTROL_PEER_ADMIN_H_
#define PACKFEED_SERVER_CONTROL_PEER_ADMIN_H_

// This daemon as a client of its peers' Admin API (DaemonConfig.peers):
// the start-up check that they serve the same jobs, learned cost models,
// forwarded ingest steps. One stub per peer, over the admin listener's TLS
// (admin_tls) when configured, and each call carrying admin_tcp_token.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "packfeed/v1/config.pb.h"
#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::server {

struct PeerAdmin {
  std::string address;
  std::unique_ptr<v1::Admin::Stub> stub;
};

// A stub per configured peer, in configuration order, its channel made
// with `arguments`. InvalidArgument when admin_tls names unreadable files.
absl::StatusOr<std::vector<PeerAdmin>> PeerAdmins(const v1::DaemonConfig& config,
                                                  const grpc::ChannelArguments& arguments = {});

// Makes `context` a call to a peer: `token` (admin_tcp_token) attached
// and, unless zero, a deadline `timeout` from now.
void PeerCall(grpc::ClientContext& context, const std::string& token,
              std::chrono::milliseconds timeout);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_PEER_ADMIN_H_
