#ifndef PACKFEED_SERVER_CONTROL_COST_MODEL_SYNC_H_
#define PACKFEED_SERVER_CONTROL_COST_MODEL_SYNC_H_

// One learned cost model on every node of a job (docs/SCHEDULER.md, "One
// learned model on every node"). Each node's daemon plans the whole global
// batch by itself, so a model fitted from one node's ranks would make nodes
// plan differently. Instead one daemon leads: the one whose
// admin_tcp_address is the least among its own and its peers' (a daemon
// without peers leads itself). Once a second it takes every node's new
// measured rows (Admin.ShareCostRows, and its own runner's), fits them
// together, and when the fit is worth it (scheduler::WorthAdopting) and
// every peer answered, announces a new version from the step `lead_steps`
// past the furthest any node has planned (Admin.AdoptCostModel). Each node
// adopts it only while it has not planned that step (CostModelVersions);
// a node that missed it keeps the older version and says so, and the next
// version brings it back in step.
//
// A starting daemon takes up its peers' versions before it serves
// (TakeUpPeerVersions), so that a restart plans by the version in force.

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "packfeed/v1/config.pb.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/control/peer_admin.h"
#include "server/pipeline/job_runner.h"

namespace packfeed::server {

// A CostModelVersion as the Admin API carries it, and back.
v1::CostModelVersion CostModelVersionProto(const CostModelVersion& version);
CostModelVersion CostModelVersionOf(const v1::CostModelVersion& proto);

// Whether this daemon leads the learned models of its jobs.
bool LeadsCostModels(const v1::DaemonConfig& config);

class CostModelSync {
 public:
  // nullptr when no job learns its model or this daemon does not lead.
  // REQUIRES: `runners` outlive the result.
  static absl::StatusOr<std::unique_ptr<CostModelSync>> Start(
      const v1::DaemonConfig& config, const std::vector<JobRunner*>& runners,
      absl::Duration interval = absl::Seconds(1));
  ~CostModelSync();  // stops the thread

  // Every peer's versions of each learning job, offered to this node's in
  // order (a peer that does not answer is skipped, with a warning).
  static void TakeUpPeerVersions(const v1::DaemonConfig& config,
                                 const std::vector<JobRunner*>& runners);

 private:
  struct LearnedJob;

  CostModelSync() = default;
  void Loop();
  void Tick(LearnedJob& job);

  std::string token_;
  absl::Duration interval_;
  std::vector<PeerAdmin> peers_;
  std::vector<std::unique_ptr<LearnedJob>> jobs_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_COST_MODEL_SYNC_H_
