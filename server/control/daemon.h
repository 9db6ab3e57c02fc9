#ifndef PACKFEED_SERVER_CONTROL_DAEMON_H_
#define PACKFEED_SERVER_CONTROL_DAEMON_H_

// packfeedd: the jobs of a configuration, a JobRunner each, and the gRPC
// Control and Admin services (callback API) on a Unix socket.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "packfeed/v1/config.pb.h"
#include "server/control/cost_model_sync.h"
#include "server/control/metrics.h"
#include "server/control/peer_forward.h"
#include "server/control/rank_watches.h"
#include "server/control/shared_ring_listener.h"
#include "server/control/unix_listener.h"
#include "server/ingest/ingest_server.h"
#include "server/ingest/ingest_stream.h"
#include "server/pipeline/job.h"
#include "server/pipeline/job_runner.h"
#include "server/storage/storage.h"

namespace packfeed::server {

struct DaemonOptions {
  // Passed to every job's sender: UCX transports ("" = UCX's choice).
  std::string ucx_transports;
  // Called while start-up waits for the peer daemons, before each attempt
  // to reach one (they are at most 2.25 s apart), with a line saying which
  // peer it waits for: a supervisor extends its start timeout on it
  // (systemd's EXTEND_TIMEOUT_USEC). Null: nobody is told.
  std::function<void(const std::string& status)> on_peer_wait;
  // Notified (a SIGTERM while starting): start-up stops waiting for peers
  // and between jobs, and Start returns CANCELLED. A supervisor stopping a
  // node whose peer has gone must not wait out peer_timeout_seconds. Null:
  // start-up runs to its end.
  const absl::Notification* stop = nullptr;
};

class Daemon {
 public:
  // Opens every job's datasets, starts its runner, then serves on the
  // configured socket (created mode 0660; a stale socket file is replaced).
  // Returns once the socket answers. Errors name the job or the socket.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const v1::DaemonConfig& config,
                                                       const DaemonOptions& options = {});
  ~Daemon();  // Shutdown(), then stops gRPC and every runner.

  // Stops accepting attaches; Wait() returns. Safe from any thread, repeatable.
  void Shutdown();
  void Wait() { shutdown_.WaitForNotification(); }
  bool draining() const { return shutdown_.HasBeenNotified(); }
  // False while start-up still checks the peer daemons (the socket already
  // answers, so that peers can check this one): no attach until then.
  bool started() const { return started_.load(); }
  // True when every job's runner went round its loop within `within` and no
  // dataset read has been outstanding for longer.
  bool Healthy(absl::Duration within) const;

  const v1::DaemonConfig& config() const { return config_; }
  // nullptr when no job has that name.
  JobRunner* runner(const std::string& job) const;
  const std::vector<std::unique_ptr<JobRunner>>& runners() const { return runners_; }
  const Storage& storage() const { return *storage_; }
  // Adds every ingest stream's stats to `reply`.
  void AddIngestStats(v1::GetStatsReply& reply) const;
  // The ingest streams' transfers; nullptr without ingest_streams.
  IngestServer* ingest() const { return ingest_.get(); }
  // Sends steps sealed here to the peer daemons; nullptr without peers.
  PeerForwarder* forwarder() const { return forwarder_.get(); }
  RankWatches& watches() { return watches_; }
  // Every job's stats, asked of each runner as Admin.GetStats does; waits
  // up to `timeout` for them (DeadlineExceeded past it).
  absl::StatusOr<v1::GetStatsReply> CollectStats(absl::Duration timeout) const;
  // The port metrics are served on; 0 without metrics_address.
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }
  // PermissionDenied naming the caller when a call over the Unix socket
  // comes from a uid not in allowed_uids (`action`: what it asked).
  absl::Status CheckCaller(const grpc::ServerContextBase& context, absl::string_view action) const;
  // The ring shared under `token`, for the call `context` (only the
  // process that shared it may take it; see SharedRingListener::Take).
  absl::StatusOr<std::shared_ptr<transport::SharedRing>> TakeSharedRing(
      absl::string_view token, const grpc::ServerContextBase& context) const;
  // The process that made a call over the Unix socket; PermissionDenied
  // for a call that came another way.
  absl::StatusOr<transport::PeerIdentity> CallerOf(const grpc::ServerContextBase& context) const;

 private:
  Daemon() = default;
  // The configured ingest streams and their transfer thread.
  absl::Status StartIngest(const DaemonOptions& options);
  absl::Status StartJobs(const DaemonOptions& options);
  absl::Status ServeUnixSocket();
  absl::Status ServeAdminTcp();

  v1::DaemonConfig config_;
  std::unique_ptr<Storage> storage_;                    // outlives the jobs and runners that use it
  std::vector<std::unique_ptr<IngestStream>> streams_;  // the same for the ingest jobs
  std::unique_ptr<IngestServer> ingest_;
  std::unique_ptr<PeerForwarder> forwarder_;
  RankWatches watches_;
  std::vector<std::unique_ptr<Job>> jobs_;
  std::vector<std::unique_ptr<JobRunner>> runners_;
  std::map<std::string, JobRunner*> by_name_;
  std::once_flag shutdown_once_;
  absl::Notification shutdown_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::unique_ptr<grpc::Server> server_;  // Control + Admin, Unix socket
  std::unique_ptr<UnixListener> unix_;    // accepts server_'s connections
  std::set<uid_t> allowed_uids_;
  std::unique_ptr<SharedRingListener> shared_rings_;  // SOCKET.rings
  std::unique_ptr<grpc::Server> tcp_server_;          // admin_tcp_address: Admin (+ Control)
  std::unique_ptr<MetricsServer> metrics_;            // metrics_address
  std::unique_ptr<CostModelSync> cost_sync_;          // this daemon leads learned models
  std::atomic<bool> started_{false};
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_DAEMON_H_
