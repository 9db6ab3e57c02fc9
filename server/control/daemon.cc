#include "server/control/daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/config/admin_tls.h"
#include "server/config/fingerprint.h"
#include "server/config/job_spec.h"
#include "server/control/peer_admin.h"
#include "server/control/rank_partition.h"
#include "server/control/services.h"
#include "server/control/stats_proto.h"
#include "server/pipeline/plan.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

namespace {

// The job `config` describes: resolved by the config layer, then created
// with its datasets opened through `open`.
absl::StatusOr<std::unique_ptr<Job>> CreateJob(const v1::JobConfig& config,
                                               const DatasetOpener& open, IngestStream* stream) {
  PF_ASSIGN_OR_RETURN(JobSpec spec, JobSpecOf(config));
  return Job::Create(std::move(spec), open, stream);
}

// The socket's folder exists (created if need be) and this process may create
// files in it: checked before any job starts, so the error names the folder.
absl::Status PrepareSocketDirectory(const std::string& socket) {
  const std::filesystem::path directory = std::filesystem::path(socket).parent_path().empty()
                                              ? std::filesystem::path(".")
                                              : std::filesystem::path(socket).parent_path();
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("socket directory ", directory.string(),
                                                      " cannot be created: ", error.message()));
  }
  if (access(directory.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket directory ", directory.string(), " is not writable by this user"));
  }
  return absl::OkStatus();
}

constexpr int kRankPingMs = 1000;
constexpr int kRankPingTimeoutMs = 2000;

// HTTP/2 pings on every connection with a call open (each rank's Watch
// stream): a rank's process that stops answering (SIGSTOP, a hung machine)
// breaks its stream within kRankPing + kRankPingTimeout.
void PingRanks(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kRankPingMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kRankPingTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

// CANCELLED, naming what start-up was doing, once a stop was asked for.
absl::Status StopRequested(const DaemonOptions& options, absl::string_view doing) {
  if (options.stop == nullptr || !options.stop->HasBeenNotified()) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("stopped while ", doing));
}

// Each peer daemon serves every job of this one with the same fingerprint.
// Peers start at about the same time: each listens before it checks, and
// an unanswered peer is asked again until the timeout.
absl::Status CheckPeers(const v1::DaemonConfig& config,
                        const std::vector<std::unique_ptr<Job>>& jobs,
                        const DaemonOptions& options) {
  const absl::Time deadline = absl::Now() + absl::Seconds(config.peer_timeout_seconds());
  PF_ASSIGN_OR_RETURN(std::vector<PeerAdmin> peers, PeerAdmins(config));
  // Per job, which node hosts which ranks: this one's first.
  std::map<std::string, std::vector<HostedRanks>> hosted;
  for (const auto& job : jobs) {
    hosted[job->name()].push_back(
        {absl::StrCat("this node (", config.admin_tcp_address(), ")"), job->local_ranks()});
  }
  for (const auto& [peer, admin] : peers) {
    v1::ListJobsReply reply;
    grpc::Status status;
    do {
      PF_RETURN_IF_ERROR(StopRequested(options, absl::StrCat("waiting for peer ", peer)));
      if (options.on_peer_wait) {
        options.on_peer_wait(absl::StrCat(
            "waiting for peer ", peer, " (until ",
            absl::FormatDuration(absl::Trunc(deadline - absl::Now(), absl::Seconds(1))),
            " from now)"));
      }
      grpc::ClientContext context;
      PeerCall(context, config.admin_tcp_token(), std::chrono::seconds(2));
      status = admin->ListJobs(&context, {}, &reply);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
          status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        break;
      }
      if (options.stop != nullptr) {
        options.stop->WaitForNotificationWithTimeout(absl::Milliseconds(250));
      } else {
        absl::SleepFor(absl::Milliseconds(250));
      }
    } while (absl::Now() < deadline);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::UnavailableError(absl::StrCat("peer ", peer, " did not answer within ",
                                                 config.peer_timeout_seconds(),
                                                 " s: ", status.error_message()));
    }
    if (!status.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("peer ", peer, " refused the check: ", status.error_message()));
    }
    for (const auto& job : jobs) {
      auto same = std::find_if(reply.jobs().begin(), reply.jobs().end(),
                               [&](const v1::JobSummary& s) { return s.name() == job->name(); });
      if (same == reply.jobs().end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("peer ", peer, " has no job '", job->name(), "'"));
      }
      absl::Status match = CompareFingerprints(same->fingerprint(), job->fingerprint());
      if (!match.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "peer ", peer, " runs job '", job->name(), "' with fingerprint ", same->fingerprint(),
            ", this node ", job->fingerprint(), ": ", match.message()));
      }
      hosted[job->name()].push_back(
          {absl::StrCat("peer ", peer),
           std::vector<int>(same->local_ranks().begin(), same->local_ranks().end())});
    }
    spdlog::info("peer {}: {} job(s) with the same fingerprints", peer, jobs.size());
  }
  if (config.peers().empty()) return absl::OkStatus();
  for (const auto& job : jobs) {
    PF_RETURN_IF_ERROR(
        CheckRankPartition(job->name(), job->layout().world_size(), hosted[job->name()]));
    spdlog::info("job {}: its {} ranks are hosted once each by {} nodes", job->name(),
                 job->layout().world_size(), config.peers_size() + 1);
  }
  return absl::OkStatus();
}

}  // namespace

// Creates each configured job and starts its runner; an ingest job's
// stream wakes its runner when a step is sealed.
absl::Status Daemon::StartJobs(const DaemonOptions& options) {
  Storage& storage = *storage_;
  const DatasetOpener open = [&storage](const std::string& prefix) { return storage.Open(prefix); };
  for (const v1::JobConfig& job_config : config_.jobs()) {
    PF_RETURN_IF_ERROR(StopRequested(options, absl::StrCat("starting job ", job_config.name())));
    IngestStream* stream = nullptr;
    for (const auto& s : streams_) {
      if (s->name() == job_config.ingest_stream()) stream = s.get();
    }
    absl::StatusOr<std::unique_ptr<Job>> job = CreateJob(job_config, open, stream);
    if (!job.ok()) {
      return absl::Status(job.status().code(),
                          absl::StrCat("job ", job_config.name(), ": ", job.status().message()));
    }
    JobRunnerOptions runner_options;
    runner_options.sender.ucx.transports = options.ucx_transports;
    runner_options.prefetch_steps = static_cast<int>(config_.prefetch_steps());
    runner_options.packing_threads = static_cast<int>(config_.packing_threads());
    runner_options.side_rows_read_ahead_bytes = config_.side_rows_read_ahead_bytes();
    runner_options.ledger.keep_steps = static_cast<int64_t>(config_.ledger_keep_steps());
    runner_options.ledger.compact_after_lines = config_.ledger_compact_after_lines();
    if (!config_.state_dir().empty()) {
      // One ledger per job and fingerprint: another configuration begins
      // its own.
      runner_options.ledger_path = absl::StrCat(config_.state_dir(), "/", job_config.name(), "-",
                                                (*job)->fingerprint(), ".ledger");
    }
    if ((*job)->cost_models() != nullptr && !config_.state_dir().empty()) {
      // The versions this node planned by: a restart plans by them again.
      PF_RETURN_IF_ERROR((*job)->cost_models()->JournalTo(
          absl::StrCat(config_.state_dir(), "/", job_config.name(), "-", (*job)->fingerprint(),
                       ".cost_models")));
    }
    PF_ASSIGN_OR_RETURN(std::unique_ptr<JobRunner> runner,
                        JobRunner::Start(**job, storage, runner_options));
    by_name_[job_config.name()] = runner.get();
    runners_.push_back(std::move(runner));
    spdlog::info("job {}: fingerprint {}, {} ranks ({} on this node), {} scheduler", (*job)->name(),
                 (*job)->fingerprint(), (*job)->layout().world_size(), (*job)->local_ranks().size(),
                 job_config.scheduler().kind());
    jobs_.push_back(*std::move(job));
  }
  return absl::OkStatus();
}

// The Unix socket every local call comes through (a file left by a daemon
// that died is replaced), and the shared rings' socket beside it.
absl::Status Daemon::ServeUnixSocket() {
  const std::string& socket = config_.socket_path();
  PF_RETURN_IF_ERROR(PrepareSocketDirectory(socket));
  // A socket file left by a daemon that died is replaced; anything else in
  // the way is not ours to remove.
  struct stat info;
  if (lstat(socket.c_str(), &info) == 0) {
    if (!S_ISSOCK(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(socket, ": exists and is not a socket; refusing to replace it"));
    }
    unlink(socket.c_str());
  }
  services_.push_back(MakeControlService(*this));
  services_.push_back(MakeAdminService(*this));
  services_.push_back(MakeIngestService(*this));
  // No listening port: UnixListener accepts on `socket` and hands gRPC each
  // connection, knowing who opened it.
  grpc::ServerBuilder builder;
  PingRanks(builder);
  for (auto& service : services_) builder.RegisterService(service.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) return absl::InternalError("the gRPC server did not start");
  absl::StatusOr<std::unique_ptr<UnixListener>> unix = UnixListener::Start(socket, *server_);
  if (!unix.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve on unix:", socket, ": ", unix.status().message(),
                     " (is its directory writable, or another daemon there?)"));
  }
  unix_ = *std::move(unix);
  for (uint32_t uid : config_.allowed_uids()) allowed_uids_.insert(uid);
  if (allowed_uids_.empty()) allowed_uids_ = {0, getuid()};
  SharedRingLimits ring_limits;
  ring_limits.max_ring_bytes = config_.max_shared_ring_bytes();
  absl::StatusOr<std::unique_ptr<SharedRingListener>> shared_rings =
      SharedRingListener::Start(socket + ".rings", allowed_uids_, ring_limits);
  if (!shared_rings.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot take shared rings on unix:", socket,
                                               ".rings: ", shared_rings.status().message()));
  }
  shared_rings_ = *std::move(shared_rings);
  return absl::OkStatus();
}

// With admin_tcp_address: a server of its own with the Admin service, whose
// every call carries the admin token; and with ranks_over_tcp the Control
// service, whose every call carries its job's token (no uid is known
// there).
absl::Status Daemon::ServeAdminTcp() {
  if (config_.admin_tcp_address().empty()) return absl::OkStatus();
  grpc::ServerBuilder tcp;
  int port = 0;
  PF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      AdminServerCredentials(config_));
  tcp.AddListeningPort(config_.admin_tcp_address(), credentials, &port);
  services_.push_back(MakeAdminService(*this, config_.admin_tcp_token()));
  tcp.RegisterService(services_.back().get());
  if (config_.ranks_over_tcp()) {
    if (!config_.has_admin_tls()) {
      spdlog::warn(
          "ranks_over_tcp without admin_tls (ranks_over_tcp_without_tls): job tokens and "
          "connection keys cross {} in cleartext; whoever can read that network can take a "
          "rank's place",
          config_.admin_tcp_address());
    }
    PingRanks(tcp);
    services_.push_back(MakeControlService(*this));
    tcp.RegisterService(services_.back().get());
  }
  tcp_server_ = tcp.BuildAndStart();
  if (tcp_server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on admin_tcp_address ", config_.admin_tcp_address()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const v1::DaemonConfig& config,
                                                      const DaemonOptions& options) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  daemon->config_ = config;
  if (config.memory_budget_bytes() == 0) {
    daemon->config_.set_memory_budget_bytes(DefaultMemoryBudget());
    spdlog::info(
        "memory budget {} MiB: a quarter of this node's memory (memory_budget_bytes "
        "unset)",
        daemon->config_.memory_budget_bytes() >> 20);
  }
  if (config.packing_threads() == 0) {
    daemon->config_.set_packing_threads(static_cast<uint32_t>(std::clamp(UsableCores() / 4, 1, 8)));
  }
  if (!config.state_dir().empty() && mkdir(config.state_dir().c_str(), 0750) != 0 &&
      errno != EEXIST) {
    return ErrnoToStatus(errno, "state_dir: mkdir", config.state_dir());
  }
  StorageOptions storage_options;
  if (config.read_threads() > 0) {
    storage_options.read_threads = static_cast<int>(config.read_threads());
  }
  storage_options.memory_budget_bytes = daemon->config_.memory_budget_bytes();
  daemon->storage_ = std::make_unique<Storage>(storage_options);
  PF_RETURN_IF_ERROR(daemon->StartIngest(options));
  PF_RETURN_IF_ERROR(daemon->StartJobs(options));
  PF_RETURN_IF_ERROR(daemon->ServeUnixSocket());
  PF_RETURN_IF_ERROR(daemon->ServeAdminTcp());
  if (!config.metrics_address().empty()) {
    Daemon* self = daemon.get();
    PF_ASSIGN_OR_RETURN(daemon->metrics_, MetricsServer::Start(config.metrics_address(), [self] {
                          return self->CollectStats(absl::Seconds(5));
                        }));
  }
  PF_RETURN_IF_ERROR(CheckPeers(config, daemon->jobs_, options));
  std::vector<JobRunner*> runners;
  for (const auto& runner : daemon->runners_) runners.push_back(runner.get());
  // Before any rank attaches, so that no step is planned by an older
  // learned model than the peers plan it by.
  CostModelSync::TakeUpPeerVersions(config, runners);
  PF_ASSIGN_OR_RETURN(
      daemon->cost_sync_,
      CostModelSync::Start(config, runners, absl::Milliseconds(config.learned_model_sync_ms())));
  daemon->started_ = true;
  spdlog::info(
      "serving {} job(s) on unix:{}{}{}", daemon->jobs_.size(), config.socket_path(),
      config.admin_tcp_address().empty()
          ? ""
          : absl::StrCat(" (admin also on ", config.admin_tcp_address(), ")"),
      daemon->metrics_ == nullptr ? "" : absl::StrCat(", metrics on ", config.metrics_address()));
  return daemon;
}

absl::StatusOr<v1::GetStatsReply> Daemon::CollectStats(absl::Duration timeout) const {
  // Each runner answers on its own thread.
  struct Collected {
    absl::Mutex mutex;
    std::vector<v1::JobStats> jobs ABSL_GUARDED_BY(mutex);
    bool all_in ABSL_GUARDED_BY(mutex) = false;
  };
  auto collected = std::make_shared<Collected>();
  const size_t expected = runners_.size();
  for (const auto& runner : runners_) {
    runner->Stats([collected, expected](JobFigures figures) {
      absl::MutexLock lock(&collected->mutex);
      collected->jobs.push_back(JobStatsProto(figures));
      collected->all_in = collected->jobs.size() == expected;
    });
  }
  absl::MutexLock lock(&collected->mutex);
  if (expected > 0 &&
      !collected->mutex.AwaitWithTimeout(absl::Condition(&collected->all_in), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("a job's runner did not answer within ", absl::FormatDuration(timeout)));
  }
  std::vector<v1::JobStats> jobs = collected->jobs;
  std::sort(jobs.begin(), jobs.end(),
            [](const v1::JobStats& a, const v1::JobStats& b) { return a.name() < b.name(); });
  v1::GetStatsReply reply;
  for (v1::JobStats& job : jobs) *reply.add_jobs() = std::move(job);
  *reply.mutable_storage() = StorageStatsProto(storage_->Stats());
  AddIngestStats(reply);
  return reply;
}

void Daemon::AddIngestStats(v1::GetStatsReply& reply) const {
  for (const auto& stream : streams_) {
    *reply.add_ingest_streams() = IngestStreamStatsProto(stream->Stats());
  }
}

absl::Status Daemon::StartIngest(const DaemonOptions& options) {
  if (config_.ingest_streams().empty()) return absl::OkStatus();
  std::vector<IngestStream*> streams;
  for (const v1::IngestStream& config : config_.ingest_streams()) {
    PF_ASSIGN_OR_RETURN(ModelStages no_layers, ModelStages::Create({}, 1, 1, config.name()));
    std::vector<SideFieldInfo> fields;
    for (const v1::SideField& field : config.fields()) {
      PF_ASSIGN_OR_RETURN(SideFieldInfo info,
                          ResolveSideField(field, no_layers, config.name() + ".fields"));
      fields.push_back(std::move(info));
    }
    const uint64_t budget = config.memory_budget_bytes() != 0 ? config.memory_budget_bytes()
                                                              : config_.memory_budget_bytes();
    streams_.push_back(std::make_unique<IngestStream>(config.name(), config.auth_token(),
                                                      std::move(fields), budget));
    streams.push_back(streams_.back().get());
  }
  transport::UcxOptions ucx;
  ucx.transports = options.ucx_transports;
  PF_ASSIGN_OR_RETURN(ingest_,
                      IngestServer::Start(std::move(streams), ucx, !config_.peers().empty()));
  PF_ASSIGN_OR_RETURN(forwarder_, PeerForwarder::Create(config_));
  return absl::OkStatus();
}

Daemon::~Daemon() {
  metrics_.reset();    // no scrape asks the runners once they stop
  cost_sync_.reset();  // nor the leader of learned cost models
  Shutdown();
  // Puts and seals still waiting are answered before the server stops.
  if (ingest_ != nullptr) ingest_->Stop();
  if (forwarder_ != nullptr) forwarder_->Stop();
  // The ranks' Watch streams end here, not by the server's deadline; the
  // ranks still get their goodbyes below.
  watches_.FinishAll();
  unix_.reset();  // no new connection
  shared_rings_.reset();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (tcp_server_ != nullptr) tcp_server_->Shutdown(deadline);
  if (server_ != nullptr) server_->Shutdown(deadline);
  runners_.clear();  // goodbyes to every rank
  unlink(config_.socket_path().c_str());
}

void Daemon::Shutdown() {
  std::call_once(shutdown_once_, [this] { shutdown_.Notify(); });
}

bool Daemon::Healthy(absl::Duration within) const {
  const absl::Time now = absl::Now();
  for (const auto& runner : runners_) {
    if (now - runner->last_loop() > within) return false;
  }
  const absl::Time oldest_read = storage_->OldestReadStart();
  return oldest_read == absl::InfiniteFuture() || now - oldest_read <= within;
}

absl::Status Daemon::CheckCaller(const grpc::ServerContextBase& context,
                                 absl::string_view action) const {
  return server::CheckCaller(*unix_, context, allowed_uids_, action);
}

absl::StatusOr<std::shared_ptr<transport::SharedRing>> Daemon::TakeSharedRing(
    absl::string_view token, const grpc::ServerContextBase& context) const {
  PF_ASSIGN_OR_RETURN(const transport::PeerIdentity caller, CallerOf(context));
  return shared_rings_->Take(token, caller.uid, caller.pid);
}

absl::StatusOr<transport::PeerIdentity> Daemon::CallerOf(
    const grpc::ServerContextBase& context) const {
  const std::optional<PeerCredentials> caller = unix_->CallerOf(context);
  if (!caller.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shared memory is handed over only on the Unix socket (caller ", context.peer(), ")"));
  }
  return transport::PeerIdentity{caller->pid, caller->uid, caller->gid};
}

JobRunner* Daemon::runner(const std::string& job) const {
  auto it = by_name_.find(job);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace packfeed::server
