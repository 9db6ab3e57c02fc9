#include "server/control/cost_model_sync.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cost_fit.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

constexpr size_t kRecentTerms = 1024;  // the rows WorthAdopting judges a fit on
constexpr uint32_t kRowsPerCall = 4096;
constexpr auto kCallDeadline = std::chrono::seconds(2);

std::vector<JobRunner*> LearningRunners(const std::vector<JobRunner*>& runners) {
  std::vector<JobRunner*> out;
  for (JobRunner* runner : runners) {
    if (runner->job().cost_models() != nullptr) out.push_back(runner);
  }
  return out;
}

std::unique_ptr<grpc::ClientContext> PeerContext(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  PeerCall(*context, token, kCallDeadline);
  return context;
}

}  // namespace

v1::CostModelVersion CostModelVersionProto(const CostModelVersion& version) {
  v1::CostModelVersion out;
  out.set_version(version.version);
  out.set_from_step(version.from_step);
  out.set_alpha(version.model.alpha);
  out.set_beta(version.model.beta);
  out.set_kappa(version.model.kappa);
  out.set_lambda(version.model.lambda);
  out.set_microbatch(version.model.microbatch);
  out.set_bubble(version.model.bubble);
  return out;
}

CostModelVersion CostModelVersionOf(const v1::CostModelVersion& proto) {
  CostModelVersion out;
  out.version = proto.version();
  out.from_step = proto.from_step();
  out.model.alpha = proto.alpha();
  out.model.beta = proto.beta();
  out.model.kappa = proto.kappa();
  out.model.lambda = proto.lambda();
  out.model.microbatch = proto.microbatch();
  out.model.bubble = proto.bubble();
  return out;
}

bool LeadsCostModels(const v1::DaemonConfig& config) {
  for (const std::string& peer : config.peers()) {
    if (peer < config.admin_tcp_address()) return false;
  }
  return true;
}

struct CostModelSync::LearnedJob {
  LearnedJob(JobRunner* r, size_t peers)
      : runner(r),
        lead_steps(r->job().spec().learned_model_lead_steps),
        fit(r->cost_learner().prior()),
        peer_after(peers, -1),
        peer_missed(peers, 0) {}

  JobRunner* runner;
  uint32_t lead_steps;
  scheduler::CostFit fit;
  std::deque<scheduler::CostTerms> recent;
  int64_t local_after = -1;
  std::vector<int64_t> peer_after;  // per peer
  // Per peer: the last version it could not adopt (it had planned that
  // step); not sent again, so neither side logs it each second.
  std::vector<uint32_t> peer_missed;
  bool warned_unanswered = false;  // "a peer did not answer" logged

  void Add(const scheduler::CostTerms& terms, double seconds) {
    fit.Add(terms, seconds);
    recent.push_back(terms);
    if (recent.size() > kRecentTerms) recent.pop_front();
  }
};

absl::StatusOr<std::unique_ptr<CostModelSync>> CostModelSync::Start(
    const v1::DaemonConfig& config, const std::vector<JobRunner*>& runners,
    absl::Duration interval) {
  const std::vector<JobRunner*> learning = LearningRunners(runners);
  if (learning.empty() || !LeadsCostModels(config)) return nullptr;
  std::unique_ptr<CostModelSync> sync(new CostModelSync());
  sync->token_ = config.admin_tcp_token();
  sync->interval_ = interval;
  PF_ASSIGN_OR_RETURN(sync->peers_, PeerAdmins(config));
  for (JobRunner* runner : learning) {
    sync->jobs_.push_back(std::make_unique<LearnedJob>(runner, sync->peers_.size()));
    spdlog::info("job {}: this daemon leads its learned cost model ({} peer(s))",
                 runner->job().name(), sync->peers_.size());
  }
  sync->thread_ = std::thread([s = sync.get()] { s->Loop(); });
  return sync;
}

CostModelSync::~CostModelSync() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void CostModelSync::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(interval_)) {
    for (const auto& job : jobs_) Tick(*job);
  }
}

void CostModelSync::Tick(LearnedJob& learned) {
  const Job& job = learned.runner->job();
  CostModelVersions& versions = *job.cost_models();
  int64_t planned = versions.planned_through();
  for (const CostLearner::Row& row : learned.runner->cost_learner().RowsAfter(
           learned.local_after, kRowsPerCall, learned.local_after)) {
    learned.Add(row.terms, row.seconds);
  }
  // Each peer's new rows, how far it planned and the latest version it holds.
  bool all_answered = true;
  std::vector<bool> answered(peers_.size(), false);
  std::vector<uint32_t> peer_latest(peers_.size(), 0);
  for (size_t p = 0; p < peers_.size(); ++p) {
    v1::ShareCostRowsRequest request;
    request.set_job(job.name());
    request.set_after_row(learned.peer_after[p]);
    request.set_max_rows(kRowsPerCall);
    v1::ShareCostRowsReply reply;
    const grpc::Status status =
        peers_[p].stub->ShareCostRows(PeerContext(token_).get(), request, &reply);
    if (!status.ok()) {
      if (!learned.warned_unanswered) {
        spdlog::warn(
            "job {}: peer {} did not share its cost rows ({}); no new model version "
            "is announced until every peer answers",
            job.name(), peers_[p].address, status.error_message());
      }
      all_answered = false;
      continue;
    }
    for (const v1::CostRow& row : reply.rows()) {
      if (row.terms_size() != scheduler::kCostTerms) continue;
      scheduler::CostTerms terms;
      std::copy(row.terms().begin(), row.terms().end(), terms.begin());
      learned.Add(terms, row.seconds());
    }
    answered[p] = true;
    learned.peer_after[p] = reply.last_row();
    planned = std::max(planned, reply.planned_through());
    if (!reply.versions().empty()) peer_latest[p] = reply.versions().rbegin()->version();
  }
  learned.warned_unanswered = !all_answered;

  CostModelVersion latest = versions.Latest();
  const scheduler::FittedCost fit = learned.fit.Fit();
  const bool in_seconds = latest.version > 0 || learned.runner->cost_learner().prior_in_seconds();
  const std::vector<scheduler::CostTerms> recent(learned.recent.begin(), learned.recent.end());
  if (all_answered && scheduler::WorthAdopting(fit, latest.model, in_seconds, recent)) {
    CostModelVersion next{latest.version + 1,
                          std::max(latest.from_step + 1, planned + learned.lead_steps), fit.model};
    next.model.bubble = latest.model.bubble;  // not fitted: the pipeline's shape
    absl::StatusOr<CostModelVersions::Offered> offered = versions.Offer(next);
    if (offered.ok() && *offered == CostModelVersions::Offered::kAdopted) {
      spdlog::info("job {}: learned cost model version {} plans every step from {}: {}", job.name(),
                   next.version, next.from_step, scheduler::DescribeFit(fit));
      latest = next;
    } else if (!offered.ok()) {
      spdlog::error("job {}: learned cost model version {} not adopted here: {}", job.name(),
                    next.version, offered.status().ToString());
    }
  }
  // Every peer that answered and lacks the latest version gets it (one
  // that did not answer gets it once it answers again).
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (latest.version == 0 || !answered[p] || peer_latest[p] >= latest.version ||
        learned.peer_missed[p] == latest.version) {
      continue;
    }
    v1::AdoptCostModelRequest request;
    request.set_job(job.name());
    *request.mutable_version() = CostModelVersionProto(latest);
    v1::AdoptCostModelReply reply;
    const grpc::Status status =
        peers_[p].stub->AdoptCostModel(PeerContext(token_).get(), request, &reply);
    if (status.ok() && !reply.adopted()) learned.peer_missed[p] = latest.version;
    if (!status.ok() || !reply.adopted()) {
      spdlog::warn("job {}: peer {} did not adopt learned cost model version {} (from step {}): {}",
                   job.name(), peers_[p].address, latest.version, latest.from_step,
                   status.ok()
                       ? absl::StrCat("it had planned through step ", reply.planned_through())
                       : status.error_message());
    }
  }
}

void CostModelSync::TakeUpPeerVersions(const v1::DaemonConfig& config,
                                       const std::vector<JobRunner*>& runners) {
  const std::vector<JobRunner*> learning = LearningRunners(runners);
  if (learning.empty() || config.peers().empty()) return;
  absl::StatusOr<std::vector<PeerAdmin>> peers = PeerAdmins(config);
  if (!peers.ok()) {
    spdlog::warn("learned cost models: no peer channel: {}", peers.status().ToString());
    return;
  }
  for (JobRunner* runner : learning) {
    const Job& job = runner->job();
    for (const PeerAdmin& peer : *peers) {
      v1::ShareCostRowsRequest request;
      request.set_job(job.name());
      request.set_after_row(std::numeric_limits<int64_t>::max() - 1);  // versions only
      v1::ShareCostRowsReply reply;
      const grpc::Status status =
          peer.stub->ShareCostRows(PeerContext(config.admin_tcp_token()).get(), request, &reply);
      if (!status.ok()) {
        spdlog::warn("job {}: peer {} did not share its learned cost model versions: {}",
                     job.name(), peer.address, status.error_message());
        continue;
      }
      for (const v1::CostModelVersion& proto : reply.versions()) {
        if (proto.version() == 0) continue;
        absl::StatusOr<CostModelVersions::Offered> offered =
            job.cost_models()->Offer(CostModelVersionOf(proto));
        if (!offered.ok()) {
          spdlog::error("job {}: peer {}'s learned cost model version {}: {}", job.name(),
                        peer.address, proto.version(), offered.status().ToString());
        } else if (*offered == CostModelVersions::Offered::kAdopted) {
          spdlog::info("job {}: learned cost model version {} (from step {}) taken up from peer {}",
                       job.name(), proto.version(), proto.from_step(), peer.address);
        }
      }
    }
  }
}

}  // namespace packfeed::server
