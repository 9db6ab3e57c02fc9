#include "server/ingest/peer_forward.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "packfeed/common/status_macros.h"
#include "server/config/admin_tls.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// How long a peer waits for room in its stream's budget (its ranks behind
// this node's), and for the whole forward: the driver's seal waits as long.
constexpr uint32_t kPeerRoomWaitMs = 30'000;
constexpr auto kForwardDeadline = std::chrono::milliseconds(kPeerRoomWaitMs + 25'000);

// One forward's calls: `done` with the first failure once all answered.
struct Fanout {
  std::shared_ptr<const v1::ForwardStepRequest> request;
  std::function<void(absl::Status)> done;
  absl::Mutex mutex;
  size_t pending ABSL_GUARDED_BY(mutex) = 0;
  absl::Status first_error ABSL_GUARDED_BY(mutex);

  void Answered(const std::string& peer, const grpc::Status& status,
                const v1::ForwardStepReply& reply) {
    if (status.ok()) {
      spdlog::info("ingest stream {}: step {} forwarded to peer {}: {}", request->stream(),
                   request->step(), peer,
                   reply.held_already() ? std::string("held there already")
                                        : absl::StrCat(reply.samples_fetched(), " of ",
                                                       reply.samples(), " samples fetched"));
    } else {
      spdlog::warn("ingest stream {}: forwarding step {} to peer {} failed: {}", request->stream(),
                   request->step(), peer, status.error_message());
    }
    absl::Status result;
    {
      absl::MutexLock lock(&mutex);
      if (!status.ok() && first_error.ok()) {
        first_error =
            absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                         absl::StrCat("step ", request->step(), " is sealed here, but peer ", peer,
                                      " did not take it: ", status.error_message()));
      }
      if (--pending > 0) return;
      result = first_error;
    }
    done(std::move(result));
  }
};

}  // namespace

absl::StatusOr<v1::ForwardStepRequest> ForwardRequestOf(const IngestStream& stream,
                                                        const SealedStep& step,
                                                        const std::string& auth_token) {
  v1::ForwardStepRequest request;
  request.set_stream(stream.name());
  request.set_step(step.step);
  const v1::IngestRegion* region = nullptr;
  v1::PutRequest* put = nullptr;
  for (const IngestedSample& sample : step.samples) {
    if (sample.region == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("ingest stream ", stream.name(), " step ", step.step,
                       " was forwarded to this daemon by a peer; seal it where it was put"));
    }
    if (put == nullptr || sample.region.get() != region) {
      region = sample.region.get();
      put = request.add_puts();
      put->set_stream(stream.name());
      put->set_auth_token(auth_token);
      put->set_step(step.step);
      put->set_timeout_ms(kPeerRoomWaitMs);
      for (const SideFieldInfo& field : stream.fields()) put->add_fields(field.name);
      *put->mutable_region() = *region;
    }
    v1::IngestSample* out = put->add_samples();
    const uint64_t offset = reinterpret_cast<uint64_t>(sample.data.get()) - region->address();
    out->set_group(sample.group);
    out->set_tag(sample.tag);
    out->set_offset(offset);
    out->set_tokens(static_cast<uint64_t>(sample.num_tokens));
    for (size_t f = 0; f < stream.fields().size(); ++f) {
      out->add_field_offsets(offset + sample.field_offsets[f]);
      out->add_field_bytes(static_cast<uint64_t>(sample.num_tokens) *
                           stream.fields()[f].row_bytes());
    }
  }
  return request;
}

absl::StatusOr<std::unique_ptr<PeerForwarder>> PeerForwarder::Create(
    const v1::DaemonConfig& config) {
  if (config.peers().empty()) return nullptr;
  const v1::AdminTls& tls = config.admin_tls();
  PF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      AdminChannelCredentials(tls.ca_file(), tls.cert_file(), tls.key_file()));
  // A forward fails at once while its peer is down (the driver seals again
  // later); a peer back is reconnected to within a second.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::vector<Peer> peers;
  for (const std::string& address : config.peers()) {
    peers.push_back(
        {address, v1::Admin::NewStub(grpc::CreateCustomChannel(address, credentials, arguments))});
  }
  return std::unique_ptr<PeerForwarder>(
      new PeerForwarder(std::move(peers), config.admin_tcp_token()));
}

void PeerForwarder::Forward(std::shared_ptr<const v1::ForwardStepRequest> request,
                            std::function<void(absl::Status)> done) {
  auto fanout = std::make_shared<Fanout>();
  fanout->request = std::move(request);
  fanout->done = std::move(done);
  {
    absl::MutexLock lock(&fanout->mutex);
    fanout->pending = peers_.size();
  }
  for (const Peer& peer : peers_) {
    struct Call {
      grpc::ClientContext context;
      v1::ForwardStepReply reply;
    };
    auto call = std::make_shared<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + kForwardDeadline);
    call->context.AddMetadata(kAdminTokenMetadata, admin_token_);
    peer.stub->async()->ForwardStep(&call->context, fanout->request.get(), &call->reply,
                                    [fanout, call, address = peer.address](grpc::Status status) {
                                      fanout->Answered(address, status, call->reply);
                                    });
  }
}

}  // namespace packfeed::server
