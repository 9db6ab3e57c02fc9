#ifndef PACKFEED_SERVER_PIPELINE_JOB_RUNNER_H_
#define PACKFEED_SERVER_PIPELINE_JOB_RUNNER_H_

// Serves one job's local ranks: a thread that owns the job's UCX Sender,
// plans steps ahead and fetches their samples through the node's Storage
// (each step's samples once for every local rank; the reads run on the
// storage's threads, never on this one), packs each rank's microbatches and
// pushes them as the rank's credits allow.
//
// Memory: a rank is never served more than `prefetch_steps` steps ahead of
// the slowest attached rank, so the runner holds at most prefetch_steps + 1
// steps' tokens, whatever the dataset size; the storage's budget bounds
// what all jobs read ahead. Side-field rows, hundreds of times the tokens'
// bytes (router replay: 768 B a token), are not held per step: each CP
// group's rows of a microbatch are read when its first rank needs them (or
// ahead, within side_rows_read_ahead_bytes) and dropped once every local
// rank of the group has been sent that microbatch.
//
// Thread-safe: every public method may be called from any thread (gRPC
// reactors); the work runs on the runner's thread and `done` is called there.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "packfeed/transport/sender.h"
#include "server/pipeline/cost_learner.h"
#include "server/pipeline/held_steps.h"
#include "server/pipeline/job.h"
#include "server/pipeline/job_figures.h"
#include "server/pipeline/job_runner_state.h"
#include "server/pipeline/pack_workers.h"
#include "server/pipeline/peer_fill.h"
#include "server/pipeline/plan.h"
#include "server/pipeline/read.h"
#include "server/pipeline/side_row_window.h"
#include "server/storage/ledger.h"
#include "server/storage/storage.h"

namespace packfeed::server {

struct JobRunnerOptions {
  transport::SenderOptions sender;
  // Where the runner's sender comes from; empty = a UCX transport::Sender
  // with `sender`. Tests give a fake here to drive the runner in one process.
  std::function<absl::StatusOr<std::unique_ptr<transport::SlotSender>>()> make_sender;
  int prefetch_steps = 2;  // steps ahead of the slowest attached rank
  // Threads writing one large microbatch, the runner's own included.
  int packing_threads = 1;
  // Side-field rows read ahead of the ranks' current microbatches, at most.
  uint64_t side_rows_read_ahead_bytes = uint64_t{16} << 20;
  // How a dataset job's step is planned (on the planner thread); empty =
  // PlanStep. Tests wrap it to hold a plan back.
  std::function<absl::StatusOr<StepPlan>(const Job&, int64_t)> plan_step;
  // The consumption ledger's journal; empty = in memory only. A journal
  // that cannot be read back is set aside (".corrupt") with one error line
  // and a new one begun: serving never waits on bookkeeping.
  std::string ledger_path;
  LedgerOptions ledger;
};

struct AttachArgs {
  int global_rank = 0;
  std::string worker_address;
  std::string ring_descriptor;
  int64_t start_step = 0;
  int start_microbatch = 0;  // of start_step, already consumed
  uint32_t ring_slots = 0;   // how many microbatches it may hold unreleased
  // A ring the client shared by file descriptor, mapped (or, device
  // memory, imported) here.
  std::shared_ptr<transport::SharedRing> shared_ring;
  // RingInfo.device_ring_fallback: why the client serves a staged ring
  // though it asked for a device ring the daemon writes.
  std::string device_ring_fallback;
  // Whether the caller may rewind the rank (attach before where its ledger
  // stands): a uid allowed on the Unix socket, or the admin token. Else only
  // the rank's own process may, by the key of its connection
  // (previous_key).
  bool may_rewind = false;
  std::optional<transport::ConnectionKey> previous_key;
};

class JobRunner {
 public:
  // REQUIRES: `job` and `storage` outlive the runner; the job's datasets
  // were opened by `storage`.
  static absl::StatusOr<std::unique_ptr<JobRunner>> Start(const Job& job, Storage& storage,
                                                          const JobRunnerOptions& options);
  ~JobRunner();  // Says goodbye to every rank after what was pushed; joins.

  const Job& job() const { return job_; }
  // The sender's UCX worker address, for AttachReply.
  const std::string& sender_address() const { return sender_address_; }

  // Connects a rank's ring. AlreadyExists when the rank is attached and
  // alive; FailedPrecondition for a ring the transport refuses;
  // PermissionDenied for a rewind the caller may not make (AttachArgs).
  void Attach(AttachArgs args, std::function<void(absl::StatusOr<uint64_t> connection_id)> done);
  // Whether `connection_id` is the rank's latest connection on this daemon
  // and `key` its key (what a rank's calls after its attach prove themselves
  // with). NotFound when the rank has no connection here; PermissionDenied
  // for another connection's id or a wrong key. Safe from any thread.
  absl::Status CheckConnection(int global_rank, uint64_t connection_id,
                               absl::string_view key) const;
  // The key of the rank's latest connection (for its AttachReply).
  absl::StatusOr<transport::ConnectionKey> KeyOf(int global_rank) const;
  // NotFound when `connection_id` is not the rank's connection, unless the rank
  // says what it consumed and no process of it is attached: then the ledger
  // takes that in, and OK. `consumed_to`: the rank's own position.
  struct DetachPosition {
    LedgerPosition at;
    uint32_t ring_slots = 0;
  };
  // `times`: the rank's final figures, when its client sent them.
  void Detach(int global_rank, uint64_t connection_id, std::optional<DetachPosition> consumed_to,
              std::optional<TrainerTimes> times, std::function<void(absl::Status)> done);
  // A rank's client reports where its trainer spends its time, and with
  // measures_compute() its microbatches' compute (the cost fit's rows).
  // NotFound when `connection_id` is not the rank's connection.
  void Report(int global_rank, uint64_t connection_id, TrainerTimes times,
              std::vector<MeasuredMicrobatch> computed, std::function<void(absl::Status)> done);
  // Whether ranks are asked for their microbatches' compute
  // (AttachReply.report_compute). Safe from any thread: fixed at
  // construction.
  bool measures_compute() const { return cost_learner_.measures(); }
  // The job's measured rows (CostLearner::RowsAfter) and the prior; safe
  // from any thread for those.
  const CostLearner& cost_learner() const { return cost_learner_; }
  void Stats(std::function<void(JobFigures)> done);
  // The rank's process is gone (its Watch stream broke): ends connection
  // `connection_id` of the rank, when that is still the rank's live one.
  void RankGone(int global_rank, uint64_t connection_id, std::string why);
  void GetLedger(std::function<void(LedgerSnapshot)> done);
  int attached_ranks() const;
  // Makes the runner look again at what it waits for (an ingest step that
  // was sealed). Safe from any thread.
  void Wake() {
    Post([] {});
  }
  // When the runner's loop last went round (at least every 100 ms while it
  // is healthy): what the systemd watchdog is fed from.
  absl::Time last_loop() const { return absl::FromUnixNanos(last_loop_ns_.load()); }

 private:
  JobRunner(const Job& job, Storage& storage, JobRunnerOptions options);
  void Post(std::function<void()> task);
  void Loop();
  absl::Status AttachOnThread(const AttachArgs& args, uint64_t& connection_id);
  // Moves the microbatches the rank's trainer took since the last call into
  // the ledger (taken is consumed; a held one may be released much later).
  void AccountTaken(RankState& rank);
  // Keeps `times` as the rank's connection's latest figures.
  void TakeTimes(RankState& rank, const TrainerTimes& times);
  // Ledger bookkeeping for a rank re-attaching ahead of the ledger.
  absl::Status ClaimUpTo(int global_rank, LedgerPosition from, LedgerPosition to, uint32_t slots);
  void RecordConsumedTo(int global_rank, LedgerPosition to, uint32_t slots);
  // Pushes (or starts filling) the rank's next microbatch when its credits
  // allow and it is within prefetch_steps of `slowest` (SlowestStep(), taken
  // once per round: a rank's own push moves it at most one step); true
  // when it did.
  bool ServeRank(RankState& rank, int64_t slowest);
  // Whether a rank with these coordinates, its ring shared by descriptor,
  // has its side rows read straight into its slots: unless its stage
  // applies a loss-mask field (applied from memory).
  bool SideRowsIntoSlot(const RankCoords& coords) const;
  // Writes the rank's next slot, and its TP peers' at the same position
  // (GatherPeers), and reads the side rows into them (job_runner_fill.cc).
  // True when the slots were announced at once (no rows to read).
  bool StartFill(RankState& rank, const StepData& data);
  // The rank's TP peers at its position with a free slot, for one fill;
  // false while one has none, for up to kPeerWait (the peers' trainers take
  // their microbatches in step: a peer left out reads the rows again), and
  // while one is still to attach (AwaitingRanks).
  bool GatherPeers(RankState& rank, std::vector<RankState*>& members);
  static constexpr absl::Duration kPeerWait = absl::Milliseconds(200);
  // The side rows of the rank's filling slot were read, or failed: its
  // slot and its peers' are announced, or the ranks ended.
  void OnSlotFilled(int global_rank, uint64_t connection_id, absl::Status status);
  // A peer's filling whose fill is no longer in flight (its leader
  // attached again): dropped, so the slot is written once more.
  void DropOrphanedFill(RankState& rank);
  // Announces the rank's filling slot, now whole, and ends its filling;
  // its position moves on. False when the connection refused it.
  bool AnnounceFilled(RankState& rank);
  // A slot was announced: the rank's position moves past in_flight.back().
  void Advance(RankState& rank);
  // Pushing or announcing its slot failed: its connection is broken.
  void PushFailed(RankState& rank, const absl::Status& status);
  static bool IsTransient(const absl::Status& status);
  // Ends the rank's connection, telling it `cause`.
  void EndRank(RankState& rank, const absl::Status& cause);
  // Fetches the steps from the slowest rank's to prefetch_steps past it.
  void FetchAhead();
  // A step's samples are held: the cost learner takes its plan.
  void OnStepHeld(int64_t step, const StepData& data);
  // The rank's side rows of `microbatch` of `step` (a held step) once read;
  // nullptr while they are being read (SideRowWindow). An ingest job's, or
  // a rank's whose stage receives no side field: the step's own.
  const SideRows* SideRowsFor(int64_t step, int microbatch, const RankState& rank, bool urgent);
  // The ranks the side-row window reads for: live ones that hold rows
  // (RankState::SideRows::kHeld), and those still to attach.
  SideReaders Readers() const;
  void FetchSidesAhead();
  // Ranks of the job not attached yet, within kAttachGrace of the first.
  bool AwaitingRanks() const;
  int64_t SlowestStep() const;
  int SlowestRank() const;
  void UpdateAttached();
  void Evict();
  // Tells the job's kind which steps this node's ranks consumed (an ingest
  // job's stream frees them).
  void ReportConsumed();
  // The ledger's group commit (ledger.h): at most once per interval.
  void SyncLedger();
  static constexpr absl::Duration kLedgerSyncInterval = absl::Seconds(1);

  const Job& job_;
  Storage& storage_;
  const JobRunnerOptions options_;
  std::unique_ptr<transport::SlotSender> sender_;  // runner thread only, after Start
  std::vector<uint8_t> staging_;  // a slot's bytes for rings not mapped (runner thread)
  PackWorkers packers_;           // write large slots with the runner thread
  std::string sender_address_;

  // Runner thread only.
  PeerFills fills_;  // the side-row fills in flight, and who waits on each
  std::map<int, RankState> ranks_;
  std::unique_ptr<Ledger> ledger_;
  absl::Time last_sync_;
  // Planned, fetched and held through eviction (held_steps.h).
  std::unique_ptr<HeldSteps> steps_;
  // Side rows per CP group and microbatch (side_row_window.h).
  std::unique_ptr<SideRowWindow> sides_;
  RereadMarks reread_marks_;  // of the side rows read into slots (peer_fill.h)
  // Where the first rank to attach began, and when: steps from there stay
  // held for the local ranks not yet attached, for kAttachGrace at most.
  static constexpr absl::Duration kAttachGrace = absl::Seconds(60);
  std::optional<int64_t> first_start_;
  absl::Time first_attach_;
  CostLearner cost_learner_;
  int64_t reported_consumed_ = -1;  // ReportConsumed's last

  mutable absl::Mutex mutex_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  int attached_ ABSL_GUARDED_BY(mutex_) = 0;
  // Each rank's latest connection and its key, for CheckConnection.
  struct KnownConnection {
    uint64_t id = 0;
    transport::ConnectionKey key{};
  };
  std::map<int, KnownConnection> connections_ ABSL_GUARDED_BY(mutex_);
  std::atomic<int64_t> last_loop_ns_{absl::GetCurrentTimeNanos()};
  std::thread thread_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_RUNNER_H_
