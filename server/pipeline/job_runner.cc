#include "server/pipeline/job_runner.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "server/pipeline/job_kind.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/push.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

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
  JobRunner* self = runner.get();
  runner->steps_ = std::make_unique<HeldSteps>(
      job, storage, [self](std::function<void()> task) { self->Post(std::move(task)); },
      [self](int64_t step, const StepData& data) { self->OnStepHeld(step, data); },
      options.plan_step);
  runner->sides_ = std::make_unique<SideRowWindow>(
      job, storage, [self](std::function<void()> task) { self->Post(std::move(task)); });
  // From here on only the runner thread touches the sender.
  runner->thread_ = std::thread([r = runner.get()] { r->Loop(); });
  job.kind().Connect(job, [self] { self->Wake(); });
  return runner;
}

JobRunner::JobRunner(const Job& job, Storage& storage, JobRunnerOptions options)
    : job_(job),
      storage_(storage),
      options_(std::move(options)),
      packers_(std::max(1, options_.packing_threads)),
      cost_learner_(job) {}

JobRunner::~JobRunner() {
  {
    // Woken under the lock: the loop cannot see stop_, leave and drop the
    // sender before Wake returns. (No sender and no thread when Start
    // failed before them.)
    absl::MutexLock lock(&mutex_);
    stop_ = true;
    if (sender_ != nullptr) sender_->Wake();
  }
  if (thread_.joinable()) thread_.join();
  // Before the mutex goes: a plan or fetch completing now Posts to this
  // stopped runner, which drops it (FetchPin's destructor waits for
  // that). The loop dropped the fills.
  sides_.reset();
  steps_.reset();
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
  // A rewind serves again what the rank consumed: only for the rank's own
  // process (its connection's key) or a caller who may (AttachArgs).
  const std::optional<LedgerPosition> next = ledger_->next(args.global_rank);
  if (next.has_value() && at < *next && !args.may_rewind) {
    const bool own = existing != ranks_.end() && args.previous_key.has_value() &&
                     transport::SameKey(*args.previous_key, existing->second.key);
    if (!own) {
      return absl::PermissionDeniedError(absl::StrCat(
          "job ", job_.name(), " rank ", args.global_rank, " stands at step ", next->step,
          " microbatch ", next->microbatch, "; attaching at step ", at.step, " microbatch ",
          at.microbatch,
          " would serve again what it consumed, which only its own connection (its key) or the "
          "admin token may ask over TCP"));
    }
  }
  TrainerTimes earlier_times;
  if (existing != ranks_.end()) {
    AccountTaken(existing->second);
    // The rank's earlier process is gone or has given that connection up.
    sender_->Abandon(existing->second.connection_id).IgnoreError();
    earlier_times = existing->second.all_times();
    fills_.Withdraw(existing->second.fill_member());  // erasing its filling withdraws the reads
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
  PF_ASSIGN_OR_RETURN(state.key, sender_->Key(connection_id));
  {
    absl::MutexLock lock(&mutex_);
    connections_[args.global_rank] = {connection_id, state.key};
  }
  state.next_step = at.step;
  state.next_microbatch = at.microbatch;
  state.ring_slots = args.ring_slots;
  if (absl::StatusOr<transport::ConnectionStats> stats = sender_->Stats(connection_id);
      stats.ok()) {
    state.ring = stats->device ? "device" : stats->shared ? "memfd" : stats->mapped ? "shm" : "ucx";
    state.mapped = stats->mapped;
  }
  state.device_ring_fallback = args.device_ring_fallback;
  if (!job_.kind().SamplesInMemory() &&
      !SideSlicesOfStage(job_.side_fields(), job_.stages(), state.coords.pp).empty()) {
    state.side_rows = RankState::SideRows::kHeld;
    if (state.ring == "memfd" && args.shared_ring != nullptr && SideRowsIntoSlot(state.coords)) {
      state.side_rows = RankState::SideRows::kIntoSlot;
      state.ring_memory = args.shared_ring;
    }
  }
  if (!args.device_ring_fallback.empty()) {
    spdlog::warn("job {} rank {}: a staged device ring, not one the daemon writes: {}", job_.name(),
                 args.global_rank, args.device_ring_fallback);
  }
  state.earlier_times = std::move(earlier_times);
  ranks_.emplace(args.global_rank, std::move(state));
  if (!first_start_.has_value()) {
    first_start_ = at.step;
    first_attach_ = absl::Now();
  }
  UpdateAttached();
  spdlog::info("job {} rank {}: attached at step {} microbatch {} (connection {:#x}{})",
               job_.name(), args.global_rank, at.step, at.microbatch, connection_id,
               ranks_.at(args.global_rank).side_rows_into_slot()
                   ? "; side rows read straight into its slots"
                   : "");
  return absl::OkStatus();
}

absl::Status JobRunner::CheckConnection(int global_rank, uint64_t connection_id,
                                        absl::string_view key) const {
  absl::MutexLock lock(&mutex_);
  auto known = connections_.find(global_rank);
  if (known == connections_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_.name(), " rank ", global_rank,
                                            " has no connection on this daemon"));
  }
  absl::StatusOr<transport::ConnectionKey> presented = transport::KeyFromBytes(key);
  if (known->second.id != connection_id || !presented.ok() ||
      !transport::SameKey(*presented, known->second.key)) {
    return absl::PermissionDeniedError(
        absl::StrCat("job ", job_.name(), " rank ", global_rank, ": connection ", connection_id,
                     " with that key is not the rank's (the key comes in the AttachReply)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<transport::ConnectionKey> JobRunner::KeyOf(int global_rank) const {
  absl::MutexLock lock(&mutex_);
  auto known = connections_.find(global_rank);
  if (known == connections_.end()) {
    return absl::NotFoundError(absl::StrCat("rank ", global_rank, " has no connection"));
  }
  return known->second.key;
}

void JobRunner::Detach(int global_rank, uint64_t connection_id,
                       std::optional<DetachPosition> consumed_to, std::optional<TrainerTimes> times,
                       std::function<void(absl::Status)> done) {
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

void JobRunner::Report(int global_rank, uint64_t connection_id, TrainerTimes times,
                       std::vector<MeasuredMicrobatch> computed,
                       std::function<void(absl::Status)> done) {
  Post([this, global_rank, connection_id, times = std::move(times), computed = std::move(computed),
        done = std::move(done)] {
    auto rank = ranks_.find(global_rank);
    if (rank == ranks_.end() || rank->second.connection_id != connection_id) {
      done(absl::NotFoundError(absl::StrCat("job ", job_.name(), " rank ", global_rank,
                                            " has no connection ", connection_id)));
      return;
    }
    TakeTimes(rank->second, times);
    cost_learner_.Measured(global_rank, computed);
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
    // Dead or stopped: a goodbye would only wait on it.
    sender_->Abandon(connection_id).IgnoreError();
    rank->second.failed = true;
    UpdateAttached();
  });
}

bool JobRunner::ServeRank(RankState& rank, int64_t slowest) {
  if (rank.live()) AccountTaken(rank);
  DropOrphanedFill(rank);
  // An ended rank's ring is unmapped once no read writes into it (the
  // rank's state stays, for its figures).
  if (!rank.live() && !rank.filling.has_value()) rank.ring_memory.reset();
  if (!rank.live() || rank.filling.has_value()) return false;
  absl::StatusOr<uint32_t> credits = sender_->Credits(rank.connection_id);
  if (!credits.ok()) {
    spdlog::warn("job {} rank {} step {}: connection lost: {}", job_.name(), rank.global_rank,
                 rank.next_step, credits.status().ToString());
    rank.failed = true;
    UpdateAttached();
    return false;
  }
  if (*credits == 0 || rank.next_step > slowest + options_.prefetch_steps) return false;
  const StepData* data = steps_->At(rank.next_step, rank.global_rank, /*urgent=*/true);
  if (data == nullptr) {
    if (steps_->failed_step() == rank.next_step && !IsTransient(steps_->failure())) {
      EndRank(rank, steps_->failure());
    }
    return false;
  }
  // Announced once the rows are in (OnSlotFilled); the runner serves the
  // other ranks meanwhile.
  if (rank.side_rows_into_slot()) return StartFill(rank, *data);
  const SideRows* side_rows =
      SideRowsFor(rank.next_step, rank.next_microbatch, rank, /*urgent=*/true);
  if (side_rows == nullptr) return false;  // being read
  const scheduler::GlobalPlan& plan = data->plan.plan;
  absl::StatusOr<MicrobatchSource> source =
      SourceForRank(job_, *data, rank.next_microbatch, rank.global_rank, side_rows);
  if (!source.ok()) {
    // A sample it needs could not be read: this rank cannot go on; the
    // ranks that need other samples can.
    EndRank(rank, source.status());
    return false;
  }
  absl::Status status =
      PushMicrobatch(*sender_, rank.connection_id, rank.mapped, rank.ring == "device", data->plan,
                     rank.next_microbatch, *source, staging_, &packers_);
  if (absl::IsResourceExhausted(status)) return false;
  if (!status.ok()) {
    PushFailed(rank, status);
    return false;
  }
  const SideRowWindow::Key held{rank.next_step, rank.next_microbatch, source->group->first_rank};
  rank.in_flight.push_back(
      {{rank.next_step, rank.next_microbatch},
       plan.num_microbatches(),
       SharesOf(MicrobatchSamples(data->plan, rank.next_microbatch, rank.coords.dp_cp_rank))});
  Advance(rank);
  if (rank.side_rows_held()) sides_->DropIfUnneeded(held, Readers());
  return true;
}

void JobRunner::PushFailed(RankState& rank, const absl::Status& status) {
  spdlog::error("job {} rank {} step {} microbatch {}: {}", job_.name(), rank.global_rank,
                rank.next_step, rank.next_microbatch, status.ToString());
  rank.failed = true;
  UpdateAttached();
}

void JobRunner::Advance(RankState& rank) {
  absl::StatusOr<transport::ConnectionStats> after = sender_->Stats(rank.connection_id);
  if (after.ok()) rank.bytes_sent = after->bytes;
  ++rank.pushed;
  if (++rank.next_microbatch == rank.in_flight.back().num_microbatches) {
    rank.next_microbatch = 0;
    ++rank.next_step;
  }
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
    // Breadth first: every rank gets its next microbatch before any gets
    // two, so a step's first microbatch reaches the last rank after one
    // pack per rank, not after every rank before it filled its ring.
    bool pushed = false;
    for (bool round = true; round;) {
      round = false;
      const int64_t slowest = SlowestStep();
      for (auto& [_, rank] : ranks_) round |= ServeRank(rank, slowest);
      pushed |= round;
    }
    if (absl::Now() - last_sync_ >= kLedgerSyncInterval) SyncLedger();
    Evict();
    sides_->Evict(Readers());
    ReportConsumed();
    // The storage reads ahead for every rank, so none waits for a read.
    FetchAhead();
    FetchSidesAhead();
    sender_->ProgressOrWait(pushed ? absl::ZeroDuration() : absl::Milliseconds(100));
  }
  SyncLedger();
  // Reads still writing side rows into slots end before the connections
  // go, as a sender may own its slots' memory. A read completing now Posts
  // to this stopped runner, which drops it (FetchPin's destructor waits
  // for that).
  for (auto& [_, rank] : ranks_) rank.filling.reset();
  fills_.Clear();
  // Goodbyes go out from the thread that owns the sender.
  sender_.reset();
}

}  // namespace packfeed::server
