// Ingest: drivers put samples and seal steps (docs/INGEST.md). Every refusal
// says what is wrong and touches no other producer or consumer.

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/proto/grpc_status.h"
#include "server/control/daemon.h"
#include "server/control/ingest_messages.h"
#include "server/control/services.h"
#include "server/control/stats_proto.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

class IngestService final : public v1::Ingest::CallbackService {
 public:
  explicit IngestService(Daemon& daemon) : daemon_(daemon) {}

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const v1::ReserveRequest* request,
                                    v1::ReserveReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<transport::PeerIdentity> caller = CheckPut(*context, request->put());
    absl::Status status = caller.status();
    std::shared_ptr<transport::SharedRing> shared;
    if (status.ok() && !request->arena_token().empty()) {
      absl::StatusOr<std::shared_ptr<transport::SharedRing>> taken =
          daemon_.TakeSharedRing(request->arena_token(), *context);
      if (taken.ok()) shared = *std::move(taken);
      status = taken.status();
    }
    if (!status.ok()) {
      reactor->Finish(proto::ToGrpc(status));
      return reactor;
    }
    daemon_.ingest()->Reserve(ArenaPutOf(*request), *caller, std::move(shared),
                              [reactor, reply](absl::StatusOr<Reservation> done) {
                                if (done.ok()) *reply = ReserveReplyOf(*done);
                                reactor->Finish(proto::ToGrpc(done.status()));
                              });
    return reactor;
  }

  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const v1::CommitRequest* request, v1::PutReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    IngestStream* stream = nullptr;
    absl::Status status =
        Check(*context, request->stream(), request->auth_token(), "commit a put", stream);
    absl::StatusOr<transport::PeerIdentity> caller = daemon_.CallerOf(*context);
    if (status.ok()) status = caller.status();
    if (status.ok()) {
      absl::StatusOr<PutHeld> committed =
          daemon_.ingest()->Commit(LeaseCommitOf(*request), *caller);
      if (committed.ok()) *reply = PutReplyOf(*committed);
      status = committed.status();
      if (!status.ok()) spdlog::warn("ingest: put refused: {}", std::string(status.message()));
    }
    reactor->Finish(proto::ToGrpc(status));
    return reactor;
  }

  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* context,
                                const v1::ReserveRequest* request, v1::PutReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<transport::PeerIdentity> caller = CheckPut(*context, request->put());
    if (!caller.ok()) {
      reactor->Finish(proto::ToGrpc(caller.status()));
      return reactor;
    }
    daemon_.ingest()->Put(ArenaPutOf(*request), *caller,
                          [reactor, reply](absl::StatusOr<PutHeld> done) {
                            if (done.ok()) *reply = PutReplyOf(*done);
                            reactor->Finish(proto::ToGrpc(done.status()));
                          });
    return reactor;
  }

  grpc::ServerUnaryReactor* ReleaseArena(grpc::CallbackServerContext* context,
                                         const v1::ReleaseArenaRequest* request,
                                         v1::ReleaseArenaReply* /*reply*/) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    IngestStream* stream = nullptr;
    absl::Status status = Check(*context, request->stream(), request->auth_token(),
                                "release a staging arena", stream);
    absl::StatusOr<transport::PeerIdentity> caller = daemon_.CallerOf(*context);
    if (status.ok()) status = caller.status();
    if (status.ok()) status = daemon_.ingest()->ReleaseArena(request->arena(), *caller);
    reactor->Finish(proto::ToGrpc(status));
    return reactor;
  }

  grpc::ServerUnaryReactor* Seal(grpc::CallbackServerContext* context,
                                 const v1::SealRequest* request, v1::SealReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    IngestStream* stream = nullptr;
    absl::Status status = Check(*context, request->stream(), request->auth_token(),
                                absl::StrCat("seal step ", request->step()), stream);
    PeerForwarder* forwarder = daemon_.forwarder();
    if (!status.ok()) {
      reactor->Finish(proto::ToGrpc(status));
      return reactor;
    }
    // With peers, the step stays here until every peer's ranks consumed it.
    const int64_t step = request->step();
    absl::StatusOr<SealOutcome> sealed = stream->Seal(step, forwarder != nullptr);
    if (!sealed.ok()) {
      status = sealed.status();
      if (forwarder != nullptr && absl::IsAlreadyExists(status)) {
        status = forwarder->SealedAgain(*stream, step, status);
      }
      spdlog::warn("ingest: seal refused: {}", std::string(status.message()));
      reactor->Finish(proto::ToGrpc(status));
      return reactor;
    }
    reply->set_samples(sealed->samples);
    reply->set_groups(sealed->groups);
    spdlog::info("ingest stream {}: step {} sealed with {} samples in {} groups", stream->name(),
                 step, reply->samples(), reply->groups());
    if (forwarder == nullptr) {
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    status = forwarder->Hand(*stream, step, request->auth_token(),
                             [reactor, reply](std::vector<std::string> behind) {
                               for (std::string& peer : behind) {
                                 reply->add_peers_behind(std::move(peer));
                               }
                               reactor->Finish(grpc::Status::OK);
                             });
    if (!status.ok()) {
      spdlog::warn("ingest: step {} sealed but not forwarded: {}", step,
                   std::string(status.message()));
      reactor->Finish(proto::ToGrpc(status));
    }
    return reactor;
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::IngestStatusRequest* request,
                                   v1::IngestStatusReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    IngestStream* stream =
        daemon_.ingest() != nullptr ? daemon_.ingest()->stream(request->stream()) : nullptr;
    if (stream == nullptr) {
      reactor->Finish(proto::ToGrpc(
          absl::NotFoundError(absl::StrCat("no ingest stream '", request->stream(), "'"))));
    } else {
      *reply->mutable_stream() = IngestStreamStatsProto(stream->Stats());
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

 private:
  // The caller may act on the stream: the daemon serves, the uid is
  // allowed, the stream exists and the token is its own.
  absl::Status Check(const grpc::CallbackServerContext& context, const std::string& name,
                     const std::string& token, const std::string& action,
                     IngestStream*& stream) const {
    if (daemon_.draining()) return absl::UnavailableError("the daemon is draining");
    absl::Status status =
        daemon_.CheckCaller(context, absl::StrCat(action, " of ingest stream ", name));
    if (!status.ok()) return status;
    stream = daemon_.ingest() != nullptr ? daemon_.ingest()->stream(name) : nullptr;
    if (stream == nullptr) {
      return absl::NotFoundError(absl::StrCat("no ingest stream '", name, "' on this daemon"));
    }
    status = stream->CheckToken(token);
    if (!status.ok()) spdlog::warn("ingest: {} refused: {}", action, std::string(status.message()));
    return status;
  }

  // A put's caller, once its stream and token are checked.
  absl::StatusOr<transport::PeerIdentity> CheckPut(const grpc::CallbackServerContext& context,
                                                   const v1::PutRequest& put) const {
    IngestStream* stream = nullptr;
    PF_RETURN_IF_ERROR(Check(context, put.stream(), put.auth_token(),
                             absl::StrCat("put into step ", put.step()), stream));
    return daemon_.CallerOf(context);
  }

  Daemon& daemon_;
};

}  // namespace

std::unique_ptr<v1::Ingest::CallbackService> MakeIngestService(Daemon& daemon) {
  return std::make_unique<IngestService>(daemon);
}

}  // namespace packfeed::server
