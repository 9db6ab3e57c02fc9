// Admin: what operators and `packfeedctl` ask a running daemon.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "packfeed/common/version.h"
#include "packfeed/proto/grpc_status.h"
#include "packfeed/scheduler/plan_stats.h"
#include "server/config/admin_tls.h"
#include "server/control/attach_check.h"
#include "server/control/cost_model_sync.h"
#include "server/control/daemon.h"
#include "server/control/ingest_messages.h"
#include "server/control/services.h"
#include "server/control/stats_proto.h"
#include "server/pipeline/plan.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// Collects one answer per runner (JobStats, JobLedger), each arriving on its
// runner's thread, and finishes the call with the last, jobs by name.
template <typename Item, typename Reply>
struct PerJobCollector {
  grpc::ServerUnaryReactor* reactor;
  Reply* reply;
  absl::Mutex mutex;
  std::vector<Item> items ABSL_GUARDED_BY(mutex);
  size_t expected = 0;

  void Add(Item item) {
    absl::MutexLock lock(&mutex);
    items.push_back(std::move(item));
    if (items.size() < expected) return;
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.name() < b.name(); });
    for (Item& i : items) *reply->add_jobs() = std::move(i);
    reactor->Finish(grpc::Status::OK);
  }
};

// A runner's answer as the admin API sends it.
v1::JobStats JobProto(const JobFigures& stats) { return JobStatsProto(stats); }
v1::JobLedger JobProto(const LedgerSnapshot& ledger) { return JobLedgerProto(ledger); }

// Asks each runner `job` names (every one for an empty name) through `ask`
// and finishes the call with all the answers: NotFound for an unknown job.
template <typename Item, typename Reply>
grpc::ServerUnaryReactor* AskEveryRunner(grpc::CallbackServerContext* context, const Daemon& daemon,
                                         const std::string& job, Reply* reply,
                                         void (JobRunner::*ask)(std::function<void(Item)>)) {
  using Proto = decltype(JobProto(std::declval<Item>()));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::vector<JobRunner*> runners;
  for (const auto& runner : daemon.runners()) {
    if (job.empty() || runner->job().name() == job) runners.push_back(runner.get());
  }
  if (runners.empty()) {
    reactor->Finish(proto::ToGrpc(absl::NotFoundError(absl::StrCat("no job '", job, "'"))));
    return reactor;
  }
  auto collector = std::make_shared<PerJobCollector<Proto, Reply>>();
  collector->reactor = reactor;
  collector->reply = reply;
  collector->expected = runners.size();
  for (JobRunner* runner : runners) {
    (runner->*ask)([collector](Item item) { collector->Add(JobProto(std::move(item))); });
  }
  return reactor;
}

class AdminService final : public v1::Admin::CallbackService {
 public:
  AdminService(Daemon& daemon, std::string required_token)
      : daemon_(daemon), required_token_(std::move(required_token)) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest*,
                                     v1::ListJobsReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    for (const auto& runner : daemon_.runners()) {
      const Job& job = runner->job();
      v1::JobSummary* summary = reply->add_jobs();
      summary->set_name(job.name());
      summary->set_fingerprint(job.fingerprint());
      summary->set_scheduler(job.spec().scheduler_kind);
      summary->set_world_size(job.layout().world_size());
      for (int rank : job.local_ranks()) summary->add_local_ranks(rank);
      summary->set_required_slot_bytes(job.required_slot_bytes());
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    *reply->mutable_storage() = StorageStatsProto(daemon_.storage().Stats());
    daemon_.AddIngestStats(*reply);
    return AskEveryRunner<JobFigures>(context, daemon_, request->job(), reply, &JobRunner::Stats);
  }

  grpc::ServerUnaryReactor* GetLedger(grpc::CallbackServerContext* context,
                                      const v1::GetLedgerRequest* request,
                                      v1::GetLedgerReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    return AskEveryRunner<LedgerSnapshot>(context, daemon_, request->job(), reply,
                                          &JobRunner::GetLedger);
  }

  // A dry run: plans the step (no data is read) on the gRPC thread; planning
  // is CPU-bound and takes milliseconds.
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::GetPlanReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    JobRunner* runner = daemon_.runner(request->job());
    absl::Status status;
    if (runner == nullptr) {
      status = absl::NotFoundError(absl::StrCat("no job '", request->job(), "'"));
    } else if (request->step() < 0) {
      status = absl::InvalidArgumentError(absl::StrCat("step ", request->step(), " < 0"));
    } else {
      const Job& job = runner->job();
      absl::StatusOr<StepPlan> plan = PlanStep(job, request->step(), /*serving=*/false);
      status = plan.status();
      if (plan.ok()) FillPlan(job, *plan, *reply);
    }
    reactor->Finish(proto::ToGrpc(status));
    return reactor;
  }

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context, const v1::HealthRequest*,
                                   v1::HealthReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!daemon_.started()) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting: checking the peer daemons"));
      return reactor;
    }
    reply->set_serving(!daemon_.draining());
    reply->set_version(kPackfeedVersion);
    reply->set_jobs(static_cast<uint32_t>(daemon_.runners().size()));
    uint32_t attached = 0;
    for (const auto& runner : daemon_.runners()) attached += runner->attached_ranks();
    reply->set_attached_ranks(attached);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // From a peer daemon: a step sealed there, for this node's ranks.
  grpc::ServerUnaryReactor* ForwardStep(grpc::CallbackServerContext* context,
                                        const v1::ForwardStepRequest* request,
                                        v1::ForwardStepReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    IngestStream* stream =
        daemon_.ingest() != nullptr ? daemon_.ingest()->stream(request->stream()) : nullptr;
    absl::Status status = daemon_.CheckCaller(*context, "forward an ingest step");
    if (status.ok() && stream == nullptr) {
      status = absl::NotFoundError(
          absl::StrCat("no ingest stream '", request->stream(), "' on this daemon"));
    }
    for (const v1::PutRequest& put : request->puts()) {
      if (status.ok()) status = stream->CheckToken(put.auth_token());
    }
    if (!status.ok()) {
      spdlog::warn("ingest: forwarded step {} refused: {}", request->step(), status.ToString());
      reactor->Finish(proto::ToGrpc(status));
      return reactor;
    }
    daemon_.ingest()->Forward(ForwardedStepOf(*request),
                              [reactor, reply](absl::StatusOr<ForwardFetched> done) {
                                if (done.ok()) *reply = ForwardStepReplyOf(*done);
                                reactor->Finish(proto::ToGrpc(done.status()));
                              });
    return reactor;
  }

  // From the job's leader daemon (or one starting): this node's measured
  // cost rows, how far it planned, and its learned model versions.
  grpc::ServerUnaryReactor* ShareCostRows(grpc::CallbackServerContext* context,
                                          const v1::ShareCostRowsRequest* request,
                                          v1::ShareCostRowsReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<JobRunner*> runner = LearningRunner(request->job());
    if (!runner.ok()) {
      reactor->Finish(proto::ToGrpc(runner.status()));
      return reactor;
    }
    int64_t last = request->after_row();
    const size_t max_rows = request->max_rows() == 0 ? 4096 : request->max_rows();
    for (const CostLearner::Row& row :
         (*runner)->cost_learner().RowsAfter(request->after_row(), max_rows, last)) {
      v1::CostRow* out = reply->add_rows();
      for (double term : row.terms) out->add_terms(term);
      out->set_seconds(row.seconds);
    }
    reply->set_last_row(last);
    const CostModelVersions& versions = *(*runner)->job().cost_models();
    reply->set_planned_through(versions.planned_through());
    for (const CostModelVersion& version : versions.All()) {
      *reply->add_versions() = CostModelVersionProto(version);
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // From the job's leader daemon: a new version of its learned cost model.
  grpc::ServerUnaryReactor* AdoptCostModel(grpc::CallbackServerContext* context,
                                           const v1::AdoptCostModelRequest* request,
                                           v1::AdoptCostModelReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<JobRunner*> runner = LearningRunner(request->job());
    absl::Status status = runner.status();
    if (status.ok()) status = daemon_.CheckCaller(*context, "adopt a cost model");
    if (!status.ok()) {
      reactor->Finish(proto::ToGrpc(status));
      return reactor;
    }
    CostModelVersions& versions = *(*runner)->job().cost_models();
    const CostModelVersion version = CostModelVersionOf(request->version());
    absl::StatusOr<CostModelVersions::Offered> offered = versions.Offer(version);
    if (!offered.ok()) {
      spdlog::error("job {}: learned cost model version {} refused: {}", request->job(),
                    version.version, offered.status().ToString());
      reactor->Finish(proto::ToGrpc(offered.status()));
      return reactor;
    }
    if (*offered == CostModelVersions::Offered::kAdopted) {
      spdlog::info("job {}: learned cost model version {} plans every step from {}", request->job(),
                   version.version, version.from_step);
    } else if (*offered == CostModelVersions::Offered::kTooLate) {
      spdlog::error(
          "job {}: learned cost model version {} (from step {}) came after this node planned "
          "step {}; it keeps planning by version {}, so its plans may differ from its peers' "
          "until the next version",
          request->job(), version.version, version.from_step, versions.planned_through(),
          versions.Latest().version);
    }
    reply->set_adopted(*offered != CostModelVersions::Offered::kTooLate);
    reply->set_planned_through(versions.planned_through());
    reply->set_latest_version(versions.Latest().version);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // From the peer daemon that forwards this one steps: what the stream holds
  // here and how far its consumer jobs got.
  grpc::ServerUnaryReactor* IngestStatus(grpc::CallbackServerContext* context,
                                         const v1::IngestStatusRequest* request,
                                         v1::IngestStatusReply* reply) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    IngestStream* stream =
        daemon_.ingest() != nullptr ? daemon_.ingest()->stream(request->stream()) : nullptr;
    if (stream == nullptr) {
      reactor->Finish(proto::ToGrpc(absl::NotFoundError(
          absl::StrCat("no ingest stream '", request->stream(), "' on this daemon"))));
      return reactor;
    }
    *reply->mutable_stream() = IngestStreamStatsProto(stream->Stats());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Drain needs the token of every job that has one: it stops them all.
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainRequest* request, v1::DrainReply*) override {
    if (grpc::ServerUnaryReactor* refused = RefuseWithoutToken(context)) return refused;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (absl::Status caller = daemon_.CheckCaller(*context, "drain the daemon"); !caller.ok()) {
      spdlog::warn("drain refused: {}", caller.ToString());
      reactor->Finish(proto::ToGrpc(caller));
      return reactor;
    }
    for (const auto& runner : daemon_.runners()) {
      absl::Status token = CheckToken(
          request->auth_token(), runner->job().spec().auth_token,
          absl::StrCat("auth token for job ", runner->job().name(), " (drain needs every job's)"));
      if (!token.ok()) {
        reactor->Finish(proto::ToGrpc(token));
        return reactor;
      }
    }
    spdlog::info("drain requested over the admin API");
    daemon_.Shutdown();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  static void FillPlan(const Job& job, const StepPlan& step, v1::GetPlanReply& reply) {
    const scheduler::GlobalPlan& plan = step.plan;
    const scheduler::CostModel model = job.PlannerOptionsFor(step.step, false).cost_model;
    reply.set_job(job.name());
    reply.set_step(step.step);
    reply.set_cost_model_version(step.cost_model_version);
    reply.set_num_microbatches(static_cast<uint32_t>(plan.num_microbatches()));
    reply.set_step_over_ideal(
        scheduler::ComputePlanStats(plan, model, job.planner_options().max_tokens_per_rank)
            .step_over_ideal);
    reply.set_padded_sum(plan.flops.padded_sum);
    reply.set_real_sum(plan.flops.real_sum);
    for (const scheduler::PlannedMicrobatch& microbatch : plan.microbatches) {
      v1::PlannedMicrobatchInfo* out = reply.add_microbatches();
      for (const scheduler::CpGroup& group : microbatch.groups) {
        v1::PlannedGroup* g = out->add_groups();
        g->set_first_rank(group.first_rank);
        g->set_size(group.size);
        for (const scheduler::PlannedSequence& s : group.sequences) {
          v1::PlannedSequenceInfo* info = g->add_sequences();
          const dataset::SampleTable::Piece piece = job.PieceOf(step.samples[s.sample]);
          info->set_dataset(step.samples[s.sample].dataset);
          info->set_document(piece.document);
          info->set_first_token(piece.first_token);
          info->set_length(s.length);
          info->set_padded_length(s.padded_length);
          info->set_epoch(step.samples[s.sample].epoch);
        }
      }
    }
    for (int r = 0; r < plan.dp_cp_size; ++r) {
      v1::PlannedRank* rank = reply.add_ranks();
      rank->set_dp_cp_rank(r);
      for (const scheduler::PlannedMicrobatch& microbatch : plan.microbatches) {
        const scheduler::CpGroup& group = scheduler::GroupOfRank(microbatch, r);
        int64_t tokens = 0;
        double work = 0;
        for (const scheduler::PlannedSequence& s : group.sequences) {
          tokens += s.padded_length;
          work += model.Cost(s.padded_length, group.size);
        }
        rank->add_tokens(tokens / group.size);
        rank->add_cp_size(group.size);
        rank->add_work(work);
      }
    }
  }

  // The runner of a job that learns its cost model; NotFound or
  // FailedPrecondition naming why not.
  absl::StatusOr<JobRunner*> LearningRunner(const std::string& job) const {
    JobRunner* runner = daemon_.runner(job);
    if (runner == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job, "'"));
    if (runner->job().cost_models() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job, "' does not learn its cost model (scheduler.learn_cost_model)"));
    }
    return runner;
  }

  // On the TCP listener every call carries the admin token (metadata
  // kAdminTokenMetadata); nullptr when this call may proceed.
  grpc::ServerUnaryReactor* RefuseWithoutToken(grpc::CallbackServerContext* context) const {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kAdminTokenMetadata);
    const std::string presented =
        it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
    absl::Status token = CheckToken(presented, required_token_, "admin token (admin_tcp_token)");
    if (token.ok()) return nullptr;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(proto::ToGrpc(token));
    return reactor;
  }

  Daemon& daemon_;
  const std::string required_token_;  // empty: none (the Unix socket)
};

}  // namespace

std::unique_ptr<v1::Admin::CallbackService> MakeAdminService(Daemon& daemon,
                                                             std::string required_token) {
  return std::make_unique<AdminService>(daemon, std::move(required_token));
}

}  // namespace packfeed::server
