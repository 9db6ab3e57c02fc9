// Control: trainers attach their rings and detach. Every refusal says what is
// wrong and touches nothing of the other ranks.

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/proto/grpc_status.h"
#include "server/control/attach_check.h"
#include "server/control/daemon.h"
#include "server/control/services.h"
#include "server/control/stats_proto.h"
#include "server/control/unix_listener.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// ReportRequest.computed's bound, as the client keeps it.
constexpr int kMostComputedPerReport = 1024;

absl::Status UnknownJob(const Daemon& daemon, const std::string& job) {
  std::vector<std::string> names;
  for (const auto& runner : daemon.runners()) names.push_back(runner->job().name());
  return absl::NotFoundError(
      absl::StrCat("no job '", job, "' on this daemon (jobs: ", absl::StrJoin(names, ", "), ")"));
}

// Everything an attach can get wrong that needs no runner.
absl::Status CheckAttach(const Daemon& daemon, const v1::AttachRequest& request,
                         JobRunner*& runner) {
  if (daemon.draining()) return absl::UnavailableError("the daemon is draining");
  if (!daemon.started()) {
    return absl::UnavailableError("the daemon is starting: it is still checking its peers");
  }
  runner = daemon.runner(request.job());
  if (runner == nullptr) return UnknownJob(daemon, request.job());
  return CheckAttachRequest(runner->job(), request);
}

// The runner of `job` for a rank's call before its attach (describe): the
// caller's uid is allowed, the job exists and `token` is its own.
absl::StatusOr<JobRunner*> RankCallRunner(const Daemon& daemon,
                                          const grpc::CallbackServerContext& context,
                                          const std::string& job, const std::string& token,
                                          const std::string& action) {
  PF_RETURN_IF_ERROR(daemon.CheckCaller(context, absl::StrCat(action, " job ", job)));
  JobRunner* runner = daemon.runner(job);
  if (runner == nullptr) return UnknownJob(daemon, job);
  PF_RETURN_IF_ERROR(
      CheckToken(token, runner->job().spec().auth_token, absl::StrCat("auth token for job ", job)));
  return runner;
}

// The runner of `job` for a call of an attached rank's (detach, report,
// watch): the caller's uid is allowed, and `connection_id` with `key` is
// the rank's connection (the secret its AttachReply gave it; the job's
// token is not sent again).
absl::StatusOr<JobRunner*> ConnectionCallRunner(const Daemon& daemon,
                                                const grpc::CallbackServerContext& context,
                                                const std::string& job, uint32_t rank,
                                                uint64_t connection_id, const std::string& key,
                                                const std::string& action) {
  PF_RETURN_IF_ERROR(daemon.CheckCaller(context, absl::StrCat(action, " job ", job)));
  JobRunner* runner = daemon.runner(job);
  if (runner == nullptr) return UnknownJob(daemon, job);
  PF_RETURN_IF_ERROR(runner->CheckConnection(static_cast<int>(rank), connection_id, key));
  return runner;
}

// A Watch call refused before it starts.
class RefusedWatch final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  explicit RefusedWatch(const absl::Status& status) { Finish(proto::ToGrpc(status)); }
  void OnDone() override { delete this; }
};

class ControlService final : public v1::Control::CallbackService {
 public:
  explicit ControlService(Daemon& daemon) : daemon_(daemon) {}

  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::DescribeReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // A rank's first call: refused as its attach would be.
    absl::StatusOr<JobRunner*> runner =
        RankCallRunner(daemon_, *context, request->job(), request->auth_token(), "attach to");
    if (runner.ok()) {
      reply->set_required_slot_bytes((*runner)->job().required_slot_bytes());
    } else {
      spdlog::warn("job {}: attach refused: {}", request->job(), runner.status().ToString());
    }
    reactor->Finish(proto::ToGrpc(runner.status()));
    return reactor;
  }

  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const v1::AttachRequest* request,
                                   v1::AttachReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    JobRunner* runner = nullptr;
    absl::Status status =
        daemon_.CheckCaller(*context, absl::StrCat("attach to job ", request->job()));
    if (status.ok()) status = CheckAttach(daemon_, *request, runner);
    if (!status.ok()) {
      spdlog::warn("job {} rank {}: attach refused: {}", request->job(), request->global_rank(),
                   status.ToString());
      reactor->Finish(proto::ToGrpc(status));
      return reactor;
    }
    if (!IsUnixCaller(*context)) {
      if (daemon_.config().has_admin_tls()) {
        spdlog::info("job {} rank {}: attaching over TCP from {}", request->job(),
                     request->global_rank(), context->peer());
      } else {
        spdlog::warn(
            "job {} rank {}: attaching over TCP from {} without TLS "
            "(ranks_over_tcp_without_tls): its job token and connection key cross the network "
            "in cleartext",
            request->job(), request->global_rank(), context->peer());
      }
    }
    AttachArgs args;
    args.global_rank = static_cast<int>(request->global_rank());
    args.worker_address = request->worker_address();
    args.ring_descriptor = request->ring().ring_descriptor();
    // CheckAttach has checked it.
    const int64_t start_step = AttachStartStep(runner->job(), *request).value();
    args.start_step = start_step;
    args.start_microbatch = static_cast<int>(request->start_microbatch());
    args.ring_slots = request->ring().slots();
    args.device_ring_fallback = request->ring().device_ring_fallback();
    // Over the Unix socket the caller's uid was checked; over TCP a rewind
    // needs the admin token or the rank's own key (AttachOnThread).
    args.may_rewind =
        IsUnixCaller(*context) ||
        (!daemon_.config().admin_tcp_token().empty() &&
         CheckToken(request->admin_token(), daemon_.config().admin_tcp_token(), "admin token")
             .ok());
    if (!request->previous_connection_key().empty()) {
      absl::StatusOr<transport::ConnectionKey> previous =
          transport::KeyFromBytes(request->previous_connection_key());
      if (previous.ok()) args.previous_key = *previous;
    }
    if (!request->ring().shared_ring_token().empty()) {
      absl::StatusOr<std::shared_ptr<transport::SharedRing>> shared =
          daemon_.TakeSharedRing(request->ring().shared_ring_token(), *context);
      if (!shared.ok()) {
        spdlog::warn("job {} rank {}: attach refused: {}", request->job(), request->global_rank(),
                     shared.status().ToString());
        reactor->Finish(proto::ToGrpc(shared.status()));
        return reactor;
      }
      args.shared_ring = *std::move(shared);
    }
    runner->Attach(std::move(args), [reactor, reply, runner, request,
                                     start_step](absl::StatusOr<uint64_t> connection_id) {
      if (!connection_id.ok()) {
        spdlog::warn("job {} rank {}: attach refused: {}", request->job(), request->global_rank(),
                     connection_id.status().ToString());
        reactor->Finish(proto::ToGrpc(connection_id.status()));
        return;
      }
      const Job& job = runner->job();
      const RankCoords coords = job.layout().Coords(static_cast<int>(request->global_rank()));
      reply->set_sender_address(runner->sender_address());
      reply->set_connection_id(*connection_id);
      absl::StatusOr<transport::ConnectionKey> key =
          runner->KeyOf(static_cast<int>(request->global_rank()));
      if (key.ok()) reply->set_connection_key(transport::KeyBytes(*key));
      reply->set_fingerprint(job.fingerprint());
      reply->set_tp(coords.tp);
      reply->set_pp(coords.pp);
      reply->set_cp(coords.cp);
      reply->set_dp(coords.dp);
      reply->set_required_slot_bytes(job.required_slot_bytes());
      reply->set_vpp(static_cast<uint32_t>(job.stages().vpp()));
      reply->set_start_step(start_step);
      // TP ranks > 0 repeat their TP rank 0's time.
      reply->set_report_compute(runner->measures_compute() && coords.tp == 0);
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Detach(grpc::CallbackServerContext* context,
                                   const v1::DetachRequest* request,
                                   v1::DetachReply* /*reply*/) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // A connection this daemon does not know (it died with an earlier
    // daemon) is proved by the job's token, and only its consumed_to counts.
    absl::StatusOr<JobRunner*> runner =
        ConnectionCallRunner(daemon_, *context, request->job(), request->global_rank(),
                             request->connection_id(), request->connection_key(), "detach from");
    if (absl::IsNotFound(runner.status())) {
      runner =
          RankCallRunner(daemon_, *context, request->job(), request->auth_token(), "detach from");
    }
    if (!runner.ok()) {
      reactor->Finish(proto::ToGrpc(runner.status()));
      return reactor;
    }
    std::optional<JobRunner::DetachPosition> consumed_to;
    if (request->has_consumed_to()) {
      consumed_to = JobRunner::DetachPosition{
          {request->consumed_to().step(), static_cast<int>(request->consumed_to().microbatch())},
          request->ring_slots()};
    }
    std::optional<TrainerTimes> times;
    if (request->has_times()) times = TrainerTimesOf(request->times());
    if (times.has_value() && !request->computed().empty() &&
        request->computed_size() <= kMostComputedPerReport) {
      // The run's last measured microbatches, taken in before the detach
      // (the runner's tasks keep their order; an unknown connection's are
      // refused there and dropped).
      (*runner)->Report(static_cast<int>(request->global_rank()), request->connection_id(), *times,
                        MeasuredOf(request->computed()), [](absl::Status) {});
    }
    (*runner)->Detach(static_cast<int>(request->global_rank()), request->connection_id(),
                      consumed_to, std::move(times),
                      [reactor](absl::Status status) { reactor->Finish(proto::ToGrpc(status)); });
    return reactor;
  }

  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context,
                                   const v1::ReportRequest* request,
                                   v1::ReportReply* /*reply*/) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (request->computed_size() > kMostComputedPerReport) {
      reactor->Finish(proto::ToGrpc(absl::InvalidArgumentError(
          absl::StrCat("report to job ", request->job(), " rank ", request->global_rank(), ": ",
                       request->computed_size(), " measured microbatches, at most ",
                       kMostComputedPerReport, " per report"))));
      return reactor;
    }
    absl::StatusOr<JobRunner*> runner =
        ConnectionCallRunner(daemon_, *context, request->job(), request->global_rank(),
                             request->connection_id(), request->connection_key(), "report to");
    if (!runner.ok()) {
      reactor->Finish(proto::ToGrpc(runner.status()));
      return reactor;
    }
    (*runner)->Report(static_cast<int>(request->global_rank()), request->connection_id(),
                      TrainerTimesOf(request->times()), MeasuredOf(request->computed()),
                      [reactor](absl::Status status) { reactor->Finish(proto::ToGrpc(status)); });
    return reactor;
  }

  grpc::ServerWriteReactor<v1::WatchEvent>* Watch(grpc::CallbackServerContext* context,
                                                  const v1::WatchRequest* request) override {
    absl::StatusOr<JobRunner*> checked =
        ConnectionCallRunner(daemon_, *context, request->job(), request->global_rank(),
                             request->connection_id(), request->connection_key(), "watch");
    if (!checked.ok()) return new RefusedWatch(checked.status());
    JobRunner* runner = *checked;
    const int rank = static_cast<int>(request->global_rank());
    const uint64_t connection_id = request->connection_id();
    Daemon* daemon = &daemon_;
    return daemon_.watches().Start([daemon, runner, rank, connection_id] {
      if (daemon->draining()) return;  // the daemon's own goodbyes follow
      runner->RankGone(rank, connection_id,
                       "its Watch stream broke (the process died or stopped answering pings)");
    });
  }

 private:
  Daemon& daemon_;
};

}  // namespace

std::unique_ptr<v1::Control::CallbackService> MakeControlService(Daemon& daemon) {
  return std::make_unique<ControlService>(daemon);
}

}  // namespace packfeed::server
