#include "server/pipeline/job_runner.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/plan_stats.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/push.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

struct JobRunner::RankState {
  int global_rank = 0;
  RankCoords coords;
  uint64_t connection_id = 0;
  bool failed = false;    // its connection broke
  bool detached = false;  // it said goodbye; kept for its figures
  int64_t next_step = 0;
  int next_microbatch = 0;
  uint64_t pushed = 0;
  uint64_t bytes_sent = 0;
  // As last seen from its connection: microbatches its trainer took
  // (consumed, for the ledger) and released (no tensor of them alive).
  uint64_t taken = 0;
  uint64_t released = 0;
  // Pushed and not yet taken, oldest first, with what the ledger needs.
  struct InFlight {
    LedgerPosition at;
    int num_microbatches = 0;
    std::vector<EpochShare> shares;
  };
  std::deque<InFlight> in_flight;
  uint64_t ledgered = 0;  // microbatches taken and moved into the ledger
  uint32_t ring_slots = 0;
  std::string ring;     // RankStats.ring
  bool mapped = false;  // its slots are written in place (Sender::MapNextSlot)
  // The trainer's time as its client reported it: this connection's latest
  // figures, and the sum of the rank's earlier connections'.
  v1::RankTimes times;
  v1::RankTimes earlier_times;

  bool live() const { return !failed && !detached; }
  v1::RankTimes all_times() const {
    v1::RankTimes all = earlier_times;
    all.set_wait_seconds(all.wait_seconds() + times.wait_seconds());
    all.set_busy_seconds(all.busy_seconds() + times.busy_seconds());
    all.set_calls(all.calls() + times.calls());
    all.set_copied_out(all.copied_out() + times.copied_out());
    return all;
  }
};

// A step being fetched or held: its samples stay in the storage while this
// entry of steps_ lives.
struct JobRunner::HeldStep {
  uint64_t generation = 0;
  // Waiting for its plan (StepPlanner), for `rank`'s need, urgent or not.
  bool planning = false;
  int rank = 0;
  bool urgent = false;
  absl::Time fetched;
  std::unique_ptr<FetchPin> pin;
  std::shared_ptr<const StepData> data;  // once every sample is held
  // Samples failed and the step was fetched again for the rank that needed
  // it first: what failed now is served as failed.
  bool retried = false;
};

void JobRunner::UpdateAttached() {
  int live = 0;
  for (const auto& [_, rank] : ranks_) live += rank.live() ? 1 : 0;
  absl::MutexLock lock(&mutex_);
  attached_ = live;
}

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Start(const Job& job, Storage& storage,
                                                            const JobRunnerOptions& options) {
  std::unique_ptr<JobRunner> runner(new JobRunner(job, storage, options));
  absl::StatusOr<std::unique_ptr<Ledger>> ledger =
      Ledger::Open(options.ledger_path, options.ledger);
  if (absl::IsDataLoss(ledger.status())) {
    const std::string aside = options.ledger_path + ".corrupt";
    spdlog::error("job {}: {}; set aside as {}, a new ledger begins", job.name(),
                  std::string(ledger.status().message()), aside);
    if (std::rename(options.ledger_path.c_str(), aside.c_str()) != 0) {
      return ErrnoToStatus(errno, "rename", options.ledger_path);
    }
    ledger = Ledger::Open(options.ledger_path, options.ledger);
  }
  if (!ledger.ok()) return ledger.status();
  runner->ledger_ = *std::move(ledger);
  if (options.make_sender) {
    PF_ASSIGN_OR_RETURN(runner->sender_, options.make_sender());
  } else {
    PF_ASSIGN_OR_RETURN(runner->sender_, transport::Sender::Create(options.sender));
  }
  runner->sender_address_ = runner->sender_->worker_address();
  if (job.ingest() == nullptr) {
    JobRunner* self = runner.get();
    runner->planner_ = std::make_unique<StepPlanner>(
        job,
        [self](int64_t step, absl::StatusOr<StepPlan> plan, absl::Duration took) {
          auto shared = std::make_shared<absl::StatusOr<StepPlan>>(std::move(plan));
          self->Post(
              [self, step, shared, took] { self->OnStepPlanned(step, std::move(*shared), took); });
        },
        options.plan_step);
  }
  // From here on only the runner thread touches the sender.
  runner->thread_ = std::thread([r = runner.get()] { r->Loop(); });
  return runner;
}

JobRunner::JobRunner(const Job& job, Storage& storage, JobRunnerOptions options)
    : job_(job), storage_(storage), options_(std::move(options)) {}

JobRunner::~JobRunner() {
  {
    // Woken under the lock: the loop cannot see stop_, leave and drop the
    // sender before Wake returns.
    absl::MutexLock lock(&mutex_);
    stop_ = true;
    sender_->Wake();
  }
  thread_.join();
  planner_.reset();  // its last plan Posts to a stopped runner: dropped
  // Before the mutex goes: a fetch completing now Posts to this runner
  // (FetchPin's destructor waits for that).
  steps_.clear();
}

void JobRunner::Post(std::function<void()> task) {
  // Also called from the storage's threads.
  absl::MutexLock lock(&mutex_);
  if (stop_) return;
  tasks_.push_back(std::move(task));
  sender_->Wake();
}

int JobRunner::attached_ranks() const {
  absl::MutexLock lock(&mutex_);
  return attached_;
}

void JobRunner::Attach(AttachArgs args, std::function<void(absl::StatusOr<uint64_t>)> done) {
  Post([this, args = std::move(args), done = std::move(done)] {
    uint64_t connection_id = 0;
    absl::Status status = AttachOnThread(args, connection_id);
    if (status.ok()) {
      done(connection_id);
    } else {
      done(status);
    }
  });
}

absl::Status JobRunner::AttachOnThread(const AttachArgs& args, uint64_t& connection_id) {
  auto existing = ranks_.find(args.global_rank);
  if (existing != ranks_.end() && existing->second.live() &&
      sender_->Credits(existing->second.connection_id).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("job ", job_.name(), " rank ", args.global_rank,
                     " is already attached (connection ", existing->second.connection_id,
                     "); detach it first or wait for its failure to be noticed"));
  }
  const LedgerPosition at{args.start_step, args.start_microbatch};
  if (at.microbatch > 0) {
    PF_ASSIGN_OR_RETURN(StepPlan plan, PlanStep(job_, at.step));
    if (at.microbatch >= plan.plan.num_microbatches()) {
      return absl::InvalidArgumentError(
          absl::StrCat("start microbatch ", at.microbatch, " of step ", at.step, ", which has ",
                       plan.plan.num_microbatches(), " microbatches"));
    }
  }
  v1::RankTimes earlier_times;
  if (existing != ranks_.end()) {
    AccountTaken(existing->second);
    sender_->Disconnect(existing->second.connection_id).IgnoreError();
    earlier_times = existing->second.all_times();
    ranks_.erase(existing);
  }
  PF_ASSIGN_OR_RETURN(Ledger::AttachResult resume, ledger_->Attach(args.global_rank, at));
  switch (resume.kind) {
    case Ledger::AttachKind::kRewind:
      spdlog::info(
          "job {} rank {}: rewinds from step {} microbatch {} to step {} microbatch {} "
          "(a restart from a checkpoint): what follows is served again",
          job_.name(), args.global_rank, resume.before.step, resume.before.microbatch, at.step,
          at.microbatch);
      break;
    case Ledger::AttachKind::kAhead:
      PF_RETURN_IF_ERROR(ClaimUpTo(args.global_rank, resume.before, at, args.ring_slots));
      break;
    case Ledger::AttachKind::kFirst:
    case Ledger::AttachKind::kContinue:
      break;
  }
  PF_ASSIGN_OR_RETURN(
      connection_id,
      args.shared_ring != nullptr
          ? sender_->ConnectShared(args.worker_address, args.ring_descriptor, args.shared_ring)
          : sender_->Connect(args.worker_address, args.ring_descriptor));
  RankState state;
  state.global_rank = args.global_rank;
  state.coords = job_.layout().Coords(args.global_rank);
  state.connection_id = connection_id;
  state.next_step = at.step;
  state.next_microbatch = at.microbatch;
  state.ring_slots = args.ring_slots;
  if (absl::StatusOr<transport::ConnectionStats> stats = sender_->Stats(connection_id);
      stats.ok()) {
    state.ring = stats->shared ? "memfd" : stats->mapped ? "shm" : "ucx";
    state.mapped = stats->mapped;
  }
  state.earlier_times = std::move(earlier_times);
  ranks_.emplace(args.global_rank, std::move(state));
  if (!first_start_.has_value()) {
    first_start_ = at.step;
    first_attach_ = absl::Now();
  }
  UpdateAttached();
  spdlog::info("job {} rank {}: attached at step {} microbatch {} (connection {:#x})", job_.name(),
               args.global_rank, at.step, at.microbatch, connection_id);
  return absl::OkStatus();
}

absl::Status JobRunner::ClaimUpTo(int global_rank, LedgerPosition from, LedgerPosition to,
                                  uint32_t slots) {
  // The rank says it consumed [from, to): releases that never reached the
  // ledger. At most its ring's slots (plus the one it held) can be such.
  const int dp_cp_rank = job_.layout().Coords(global_rank).dp_cp_rank;
  std::vector<Ledger::Claimed> claims;
  std::optional<StepPlan> plan;
  for (LedgerPosition p = from; p < to && claims.size() <= slots;) {
    if (!plan.has_value() || plan->step != p.step) {
      PF_ASSIGN_OR_RETURN(StepPlan next, PlanStep(job_, p.step));
      plan = std::move(next);
    }
    const int count = plan->plan.num_microbatches();
    claims.push_back({p, count, SharesOf(MicrobatchSamples(*plan, p.microbatch, dp_cp_rank))});
    p = p.microbatch + 1 == count ? LedgerPosition{p.step + 1, 0}
                                  : LedgerPosition{p.step, p.microbatch + 1};
  }
  if (claims.size() > slots) {
    spdlog::warn(
        "job {} rank {}: re-attaches at step {} microbatch {}, more than its {} ring "
        "slots past what it consumed (step {} microbatch {}): the ledger counts a gap",
        job_.name(), global_rank, to.step, to.microbatch, slots, from.step, from.microbatch);
    return ledger_->Jump(global_rank, to, claims.size());
  }
  for (Ledger::Claimed& claim : claims) {
    PF_RETURN_IF_ERROR(
        ledger_->Claim(global_rank, claim.at, claim.num_microbatches, std::move(claim.shares)));
  }
  return absl::OkStatus();
}

void JobRunner::AccountTaken(RankState& rank) {
  absl::StatusOr<transport::ConnectionStats> stats = sender_->Stats(rank.connection_id);
  if (stats.ok()) {
    rank.taken = stats->taken;
    rank.released = stats->released;
  }
  while (rank.ledgered < rank.taken && !rank.in_flight.empty()) {
    RankState::InFlight& done = rank.in_flight.front();
    absl::Status status =
        ledger_->Consume(rank.global_rank, done.at, done.num_microbatches, std::move(done.shares));
    if (!status.ok()) {
      spdlog::error("job {} rank {}: ledger: {}", job_.name(), rank.global_rank, status.ToString());
    }
    rank.in_flight.pop_front();
    ++rank.ledgered;
  }
}

void JobRunner::GetLedger(std::function<void(v1::JobLedger)> done) {
  Post([this, done = std::move(done)] {
    for (auto& [_, rank] : ranks_) {
      if (rank.live()) AccountTaken(rank);
    }
    done(ledger_->Snapshot(job_.name()));
  });
}

void JobRunner::Detach(int global_rank, uint64_t connection_id,
                       std::optional<DetachPosition> consumed_to,
                       std::optional<v1::RankTimes> times, std::function<void(absl::Status)> done) {
  Post([this, global_rank, connection_id, consumed_to, times = std::move(times),
        done = std::move(done)] {
    auto rank = ranks_.find(global_rank);
    const bool connected = rank != ranks_.end() && rank->second.connection_id == connection_id &&
                           !rank->second.detached;
    if (!connected) {
      // A rank whose connection this daemon does not hold (it died with a
      // daemon that was restarted since, say) may still tell the ledger
      // what it consumed: what it took from its ring after the daemon died.
      // Not while another process of the rank is attached.
      const bool other_attached = rank != ranks_.end() && rank->second.live();
      if (consumed_to.has_value() && !other_attached) {
        RecordConsumedTo(global_rank, consumed_to->at, consumed_to->ring_slots);
        done(absl::OkStatus());
        return;
      }
      done(absl::NotFoundError(absl::StrCat("job ", job_.name(), " rank ", global_rank,
                                            " has no connection ", connection_id)));
      return;
    }
    AccountTaken(rank->second);
    if (consumed_to.has_value()) {
      RecordConsumedTo(global_rank, consumed_to->at, rank->second.ring_slots);
    }
    if (times.has_value()) TakeTimes(rank->second, *times);
    sender_->Disconnect(connection_id).IgnoreError();
    rank->second.detached = true;
    UpdateAttached();
    spdlog::info("job {} rank {}: detached", job_.name(), global_rank);
    done(absl::OkStatus());
  });
}

void JobRunner::TakeTimes(RankState& rank, const v1::RankTimes& times) {
  // Figures only grow over a connection: an older report arriving late
  // changes nothing.
  if (times.calls() >= rank.times.calls()) rank.times = times;
}

void JobRunner::Report(int global_rank, uint64_t connection_id, v1::RankTimes times,
                       std::function<void(absl::Status)> done) {
  Post([this, global_rank, connection_id, times = std::move(times), done = std::move(done)] {
    auto rank = ranks_.find(global_rank);
    if (rank == ranks_.end() || rank->second.connection_id != connection_id) {
      done(absl::NotFoundError(absl::StrCat("job ", job_.name(), " rank ", global_rank,
                                            " has no connection ", connection_id)));
      return;
    }
    TakeTimes(rank->second, times);
    done(absl::OkStatus());
  });
}

void JobRunner::RankGone(int global_rank, uint64_t connection_id, std::string why) {
  Post([this, global_rank, connection_id, why = std::move(why)] {
    auto rank = ranks_.find(global_rank);
    if (rank == ranks_.end() || rank->second.connection_id != connection_id || !rank->second.live())
      return;
    spdlog::warn("job {} rank {}: {}: its connection {:#x} is ended", job_.name(), global_rank, why,
                 connection_id);
    AccountTaken(rank->second);
    sender_->Disconnect(connection_id, why).IgnoreError();
    rank->second.failed = true;
    UpdateAttached();
  });
}

void JobRunner::RecordConsumedTo(int global_rank, LedgerPosition to, uint32_t slots) {
  const std::optional<LedgerPosition> ledgered = ledger_->next(global_rank);
  if (!ledgered.has_value() || !(*ledgered < to)) return;
  absl::Status claimed = ClaimUpTo(global_rank, *ledgered, to, slots);
  if (!claimed.ok()) {
    spdlog::error("job {} rank {}: ledger: {}", job_.name(), global_rank, claimed.ToString());
  }
}

void JobRunner::Stats(std::function<void(v1::JobStats)> done) {
  Post([this, done = std::move(done)] {
    v1::JobStats stats;
    stats.set_name(job_.name());
    stats.set_steps_planned(steps_planned_);
    stats.set_documents_split(job_.split_documents());
    stats.set_samples_truncated(samples_truncated_);
    stats.set_tokens_truncated(tokens_truncated_);
    stats.set_plan_seconds(plan_seconds_);
    stats.set_read_seconds(read_seconds_);
    if (steps_planned_ > 0) {
      stats.set_mean_step_over_ideal(step_over_ideal_sum_ / static_cast<double>(steps_planned_));
    }
    const Storage::JobIo io = storage_.JobFigures(job_.name());
    stats.set_bytes_read(io.bytes_read);
    stats.set_unique_bytes_needed(io.distinct_bytes);
    if (io.distinct_bytes > 0) {
      stats.set_io_amplification(static_cast<double>(io.bytes_read) /
                                 static_cast<double>(io.distinct_bytes));
    }
    int64_t served = INT64_MAX;
    // Slowest and fastest by what the ranks consumed (the ledger's position),
    // not by what was pushed to them: a stalled rank's ring is full too.
    std::optional<std::pair<LedgerPosition, int>> slowest, fastest;
    std::optional<std::pair<double, int>> most_waiting;
    double wait_seconds = 0;
    for (int global_rank : job_.local_ranks()) {
      v1::RankStats* out = stats.add_ranks();
      out->set_global_rank(global_rank);
      auto it = ranks_.find(global_rank);
      if (it == ranks_.end()) {
        served = 0;
        continue;
      }
      RankState& rank = it->second;
      if (rank.live()) AccountTaken(rank);
      absl::StatusOr<transport::ConnectionStats> connection = sender_->Stats(rank.connection_id);
      const bool attached = rank.live() && connection.ok();
      out->set_attached(attached);
      out->set_next_step(rank.next_step);
      out->set_slots_pushed(rank.pushed);
      out->set_bytes_sent(rank.bytes_sent);
      out->set_slots_released(rank.released);
      if (attached) out->set_slots_in_flight(static_cast<uint32_t>(rank.pushed - rank.released));
      const v1::RankTimes times = rank.all_times();
      out->set_wait_seconds(times.wait_seconds());
      out->set_busy_seconds(times.busy_seconds());
      out->set_copied_out(times.copied_out());
      out->set_calls(times.calls());
      out->set_ring(rank.ring);
      wait_seconds += times.wait_seconds();
      if (const double total = times.wait_seconds() + times.busy_seconds(); total > 0) {
        out->set_input_bound(times.wait_seconds() / total);
        if (!most_waiting.has_value() || out->input_bound() > most_waiting->first) {
          most_waiting = {out->input_bound(), global_rank};
        }
      }
      served = std::min(served, rank.next_step);
      const std::optional<LedgerPosition> consumed = ledger_->next(global_rank);
      if (!consumed.has_value()) continue;
      out->set_consumed_step(consumed->step);
      out->set_consumed_microbatch(static_cast<uint32_t>(consumed->microbatch));
      const std::pair<LedgerPosition, int> here{*consumed, global_rank};
      if (!slowest.has_value() || here < *slowest) slowest = here;
      if (!fastest.has_value() || *fastest < here) fastest = here;
    }
    stats.set_steps_served(served == INT64_MAX ? 0 : served);
    stats.set_wait_seconds(wait_seconds);
    if (most_waiting.has_value()) {
      stats.set_input_bound(most_waiting->first);
      stats.set_most_waiting_rank(static_cast<uint32_t>(most_waiting->second));
    }
    stats.set_cached_bytes(CachedBytes());
    if (slowest.has_value()) {
      stats.set_slowest_rank(static_cast<uint32_t>(slowest->second));
      stats.set_slowest_rank_steps_behind(fastest->first.step - slowest->first.step);
    }
    done(std::move(stats));
  });
}

uint64_t JobRunner::CachedBytes() const {
  uint64_t bytes = 0;
  for (const auto& [_, held] : steps_) {
    if (held.data == nullptr) continue;
    for (const auto& [_, run] : held.data->runs) bytes += run.size() * sizeof(int64_t);
  }
  return bytes;
}

int64_t JobRunner::SlowestStep() const {
  int64_t slowest = INT64_MAX;
  for (const auto& [_, rank] : ranks_) {
    if (rank.live()) slowest = std::min(slowest, rank.next_step);
  }
  return slowest;
}

int JobRunner::SlowestRank() const {
  std::optional<std::pair<int64_t, int>> slowest;
  for (const auto& [id, rank] : ranks_) {
    if (rank.live() && (!slowest.has_value() || rank.next_step < slowest->first)) {
      slowest = {rank.next_step, id};
    }
  }
  return slowest.has_value() ? slowest->second : -1;
}

void JobRunner::Evict() {
  int64_t keep_from = SlowestStep();
  // Ranks attach over a few seconds; the first ones are pushed steps ahead
  // before the last arrive. Keep what those will need (from where the first
  // rank began) for a while, so that a staggered start reads nothing twice.
  const bool awaited = ranks_.size() < job_.local_ranks().size() && first_start_.has_value() &&
                       absl::Now() - first_attach_ < kAttachGrace;
  if (awaited) keep_from = std::min(keep_from, *first_start_);
  while (!steps_.empty() && steps_.begin()->first < keep_from) steps_.erase(steps_.begin());
}

const StepData* JobRunner::StepAt(int64_t step, int rank, bool urgent) {
  auto found = steps_.find(step);
  if (found != steps_.end()) {
    HeldStep& held = found->second;
    if (held.planning) {
      held.urgent = held.urgent || urgent;
      return nullptr;
    }
    // A failure read ahead may be stale (an NFS server back since, a
    // transient EIO): a rank is told only once a fetch made for it fails.
    if (held.data != nullptr && !held.data->failed.empty() && !held.retried) {
      auto plan = std::make_shared<StepPlan>(held.data->plan);
      held.data = nullptr;
      held.retried = true;
      StartFetch(step, held, std::move(plan), rank, urgent);
      return nullptr;
    }
    return held.data.get();
  }
  if (planner_ != nullptr) {
    HeldStep& planned = steps_[step];
    planned.generation = ++fetches_;
    planned.planning = true;
    planned.rank = rank;
    planned.urgent = urgent;
    planner_->Request(step);
    return nullptr;
  }
  // An ingest job's step: its samples are in memory already, so it is
  // planned here and served at once.
  const absl::Time start = absl::Now();
  absl::StatusOr<StepPlan> plan = PlanStep(job_, step);
  plan_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  // Not sealed yet: the seal wakes this runner.
  if (absl::IsUnavailable(plan.status())) return nullptr;
  if (!plan.ok()) {
    KeepPlanFailure(step, plan.status());
    return nullptr;
  }
  HeldStep& held = steps_[step];
  held.generation = ++fetches_;
  held.fetched = start;
  OnStepRead(
      step, held.generation,
      std::make_shared<StepData>(AssembleIngestStep(job_, *std::move(plan), job_.local_ranks())));
  return held.data.get();
}

void JobRunner::KeepPlanFailure(int64_t step, const absl::Status& status) {
  if (failed_step_ != step) {
    spdlog::error("job {} step {}: {}", job_.name(), step, status.ToString());
    failed_step_ = step;
  }
  failure_ = status;
}

void JobRunner::OnStepPlanned(int64_t step, absl::StatusOr<StepPlan> plan, absl::Duration took) {
  plan_seconds_ += absl::ToDoubleSeconds(took);
  auto held = steps_.find(step);
  if (held == steps_.end() || !held->second.planning) return;  // evicted since
  if (!plan.ok()) {
    // Planned again when a rank next needs the step.
    steps_.erase(held);
    KeepPlanFailure(step, plan.status());
    return;
  }
  held->second.planning = false;
  StartFetch(step, held->second, std::make_shared<StepPlan>(*std::move(plan)), held->second.rank,
             held->second.urgent);
}

void JobRunner::ReportConsumed() {
  // Steps before every local rank's ledger position are consumed on this
  // node (a rank that never attached holds everything).
  int64_t before = INT64_MAX;
  for (int rank : job_.local_ranks()) {
    const std::optional<LedgerPosition> next = ledger_->next(rank);
    if (!next.has_value()) return;
    before = std::min(before, next->step);
  }
  if (before == reported_consumed_) return;
  reported_consumed_ = before;
  job_.ingest()->Consumed(job_.name(), before);
}

void JobRunner::StartFetch(int64_t step, HeldStep& held, std::shared_ptr<const StepPlan> plan,
                           int rank, bool urgent) {
  StepNeeds needs = NeedsOfStep(job_, *plan, job_.local_ranks());
  held.generation = ++fetches_;
  held.fetched = absl::Now();
  held.pin.reset();  // the previous fetch's, when fetching again
  // Assembled on the storage's thread, handed to this one.
  held.pin = storage_.Fetch(
      {job_.name(), rank, step}, std::move(needs.needs), urgent,
      [this, step, generation = held.generation, plan, samples = std::move(needs.samples),
       counts = std::move(needs.counts)](std::vector<FetchedSample> fetched) {
        std::shared_ptr<const StepData> data =
            std::make_shared<StepData>(AssembleStep(job_, *plan, samples, counts, fetched));
        Post([this, step, generation, data] { OnStepRead(step, generation, data); });
      });
}

void JobRunner::OnStepRead(int64_t step, uint64_t generation,
                           std::shared_ptr<const StepData> data) {
  auto held = steps_.find(step);
  if (held == steps_.end() || held->second.generation != generation) return;  // evicted since
  held->second.data = std::move(data);
  const StepData& ready = *held->second.data;
  read_seconds_ += absl::ToDoubleSeconds(absl::Now() - held->second.fetched);
  ++steps_planned_;
  samples_truncated_ += ready.plan.samples_truncated;
  tokens_truncated_ += ready.plan.tokens_truncated;
  step_over_ideal_sum_ +=
      scheduler::ComputePlanStats(ready.plan.plan, scheduler::CostModel::Megatron(),
                                  job_.planner_options().max_tokens_per_rank)
          .step_over_ideal;
  if (!ready.failed.empty()) {
    spdlog::error(
        "job {} step {}: {} sample(s) could not be read, the ranks that need them "
        "are ended; first: {}",
        job_.name(), step, ready.failed.size(), ready.failed.begin()->second.ToString());
  }
}

void JobRunner::FetchAhead() {
  const int64_t slowest = SlowestStep();
  if (slowest == INT64_MAX) return;
  const int rank = SlowestRank();
  for (int64_t step = slowest; step <= slowest + options_.prefetch_steps; ++step) {
    if (steps_.count(step) == 0 && failed_step_ != step) StepAt(step, rank, step == slowest);
  }
}

bool JobRunner::ServeRank(RankState& rank) {
  bool pushed = false;
  if (rank.live()) AccountTaken(rank);
  while (rank.live()) {
    absl::StatusOr<uint32_t> credits = sender_->Credits(rank.connection_id);
    if (!credits.ok()) {
      spdlog::warn("job {} rank {} step {}: connection lost: {}", job_.name(), rank.global_rank,
                   rank.next_step, credits.status().ToString());
      rank.failed = true;
      UpdateAttached();
      break;
    }
    if (*credits == 0) break;
    if (rank.next_step > SlowestStep() + options_.prefetch_steps) break;
    const StepData* data = StepAt(rank.next_step, rank.global_rank, /*urgent=*/true);
    if (data == nullptr) {
      if (failed_step_ == rank.next_step && !IsTransient(failure_)) EndRank(rank, failure_);
      break;
    }
    const scheduler::GlobalPlan& plan = data->plan.plan;
    absl::StatusOr<MicrobatchSource> source =
        SourceForRank(job_, *data, rank.next_microbatch, rank.global_rank);
    if (!source.ok()) {
      // A sample it needs could not be read: this rank cannot go on; the
      // ranks that need other samples can.
      EndRank(rank, source.status());
      break;
    }
    absl::Status status = PushMicrobatch(*sender_, rank.connection_id, rank.mapped, data->plan,
                                         rank.next_microbatch, *source, staging_);
    if (status.ok()) {
      absl::StatusOr<transport::ConnectionStats> after = sender_->Stats(rank.connection_id);
      if (after.ok()) rank.bytes_sent = after->bytes;
      rank.in_flight.push_back(
          {{rank.next_step, rank.next_microbatch},
           plan.num_microbatches(),
           SharesOf(MicrobatchSamples(data->plan, rank.next_microbatch, rank.coords.dp_cp_rank))});
    }
    if (absl::IsResourceExhausted(status)) break;
    if (!status.ok()) {
      spdlog::error("job {} rank {} step {} microbatch {}: {}", job_.name(), rank.global_rank,
                    rank.next_step, rank.next_microbatch, status.ToString());
      rank.failed = true;
      UpdateAttached();
      break;
    }
    pushed = true;
    ++rank.pushed;
    if (++rank.next_microbatch == plan.num_microbatches()) {
      rank.next_microbatch = 0;
      ++rank.next_step;
    }
  }
  return pushed;
}

bool JobRunner::IsTransient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsResourceExhausted(status) || absl::IsAborted(status);
}

void JobRunner::EndRank(RankState& rank, const absl::Status& cause) {
  // A step that cannot be planned or read will not become servable by
  // waiting: tell the rank, so its trainer stops with the reason instead of
  // timing out.
  const std::string reason = absl::StrCat("job ", job_.name(), " step ", rank.next_step,
                                          " cannot be served: ", cause.ToString());
  spdlog::error("job {} rank {}: connection ended: {}", job_.name(), rank.global_rank, reason);
  AccountTaken(rank);
  sender_->Disconnect(rank.connection_id, reason).IgnoreError();
  rank.failed = true;
  UpdateAttached();
}

void JobRunner::Loop() {
  while (true) {
    last_loop_ns_.store(absl::GetCurrentTimeNanos());
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mutex_);
      if (stop_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    bool pushed = false;
    for (auto& [_, rank] : ranks_) pushed |= ServeRank(rank);
    if (absl::Now() - last_sync_ >= kLedgerSyncInterval) SyncLedger();
    Evict();
    if (job_.ingest() != nullptr) ReportConsumed();
    // The storage reads ahead for every rank, so none waits for a read.
    FetchAhead();
    sender_->ProgressOrWait(pushed ? absl::ZeroDuration() : absl::Milliseconds(100));
  }
  SyncLedger();
  // Goodbyes go out from the thread that owns the sender.
  sender_.reset();
}

void JobRunner::SyncLedger() {
  last_sync_ = absl::Now();
  absl::Status synced = ledger_->Sync();
  if (!synced.ok()) spdlog::error("job {}: ledger: {}", job_.name(), synced.ToString());
}

}  // namespace packfeed::server
