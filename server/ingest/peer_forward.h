#ifndef PACKFEED_SERVER_INGEST_PEER_FORWARD_H_
#define PACKFEED_SERVER_INGEST_PEER_FORWARD_H_

// Sends a step sealed on this daemon to every peer daemon (docs/INGEST.md,
// Several nodes): its samples' lengths, groups and tags, and where their
// bytes lie in this daemon's registered memory. Each peer plans the step and
// gets only the samples its own ranks are planned (Admin.ForwardStep over
// the peers' TCP admin listeners).
//
// Thread-safe; `done` runs on a gRPC thread.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "packfeed/v1/config.pb.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/ingest/ingest_stream.h"

namespace packfeed::server {

// The request that forwards `step` of `stream`: its samples in serving
// order, one put per run of samples in the same registered region.
// FailedPrecondition for a step this daemon got from a peer (its samples
// are not in registered memory, some not here at all).
absl::StatusOr<v1::ForwardStepRequest> ForwardRequestOf(const IngestStream& stream,
                                                        const SealedStep& step,
                                                        const std::string& auth_token);

class PeerForwarder {
 public:
  // nullptr when `config` has no peers.
  static absl::StatusOr<std::unique_ptr<PeerForwarder>> Create(const v1::DaemonConfig& config);

  // Sends `request` to every peer; `done` gets OK once each has sealed the
  // step (or held it already), else the first failure naming its peer.
  void Forward(std::shared_ptr<const v1::ForwardStepRequest> request,
               std::function<void(absl::Status)> done);

 private:
  struct Peer {
    std::string address;
    std::unique_ptr<v1::Admin::Stub> stub;
  };
  PeerForwarder(std::vector<Peer> peers, std::string admin_token)
      : peers_(std::move(peers)), admin_token_(std::move(admin_token)) {}

  const std::vector<Peer> peers_;
  const std::string admin_token_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INGEST_PEER_FORWARD_H_
