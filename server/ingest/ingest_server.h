#ifndef PACKFEED_SERVER_INGEST_INGEST_SERVER_H_
#define PACKFEED_SERVER_INGEST_INGEST_SERVER_H_

// The daemon's ingest streams and the thread that admits puts into them
// (docs/INGEST.md). A driver's first put comes in two calls. Reserve names
// its samples over gRPC and waits here, puts of other streams going on,
// until its stream's budget and its producer's staging arena
// (staging_arena.h) have room, or its timeout passes; the answer says where
// in the arena to write. The producer copies the samples there and Commit
// adds them to their step: the daemon serves them from that memory, so
// their bytes are copied once, by the producer. Each answer to a put names
// the arena's free spans, and later puts come in one call: the producer
// writes the samples into such a span first and Put adds them once the
// stream has room.
//
// With peer daemons (docs/INGEST.md, Several nodes) each put's span is
// registered with UCX, so that the peers can get its samples once the step
// is sealed; a step forwarded by a peer is fetched by the transfer thread,
// only the samples this node's ranks are planned.
//
// Thread-safe; the `done` of Reserve, Put and Forward may run on the
// transfer thread.

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "packfeed/transport/remote_reader.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/ucx_context.h"
#include "server/ingest/ingest_requests.h"
#include "server/ingest/ingest_stream.h"
#include "server/ingest/staging_arena.h"

namespace packfeed::server {

class IngestServer {
 public:
  // `for_peers`: put samples into memory peer daemons can get.
  static absl::StatusOr<std::unique_ptr<IngestServer>> Start(std::vector<IngestStream*> streams,
                                                             transport::UcxOptions ucx,
                                                             bool for_peers);
  ~IngestServer() { Stop(); }
  // Refuses the puts still waiting, and every later one, as Unavailable;
  // joins the transfer thread. Idempotent.
  void Stop();

  // nullptr when none has that name.
  IngestStream* stream(const std::string& name) const;

  // A driver's put, first call (its stream's token is the caller's
  // business): checks it, waits for room, and answers where to write it.
  // `shared`: the producer's staging memory, taken from SOCKET.rings, when
  // the request names an arena token (a new arena of `caller`); null when
  // it names an arena, which must be `caller`'s. A reservation the arena
  // still holds is cancelled.
  void Reserve(ArenaPut request, const transport::PeerIdentity& caller,
               std::shared_ptr<transport::SharedRing> shared,
               std::function<void(absl::StatusOr<Reservation>)> done);
  // Second call: the put reserved under the request's lease, written, joins
  // its step. NotFound for a lease that is not the arena's (cancelled,
  // committed, never given).
  absl::StatusOr<PutHeld> Commit(const LeaseCommit& request, const transport::PeerIdentity& caller);
  // A put in one call into `caller`'s arena: its region already written at
  // request.written_at, which must lie in a free span. Waits for room as
  // Reserve does, then adds the samples to their step.
  void Put(ArenaPut request, const transport::PeerIdentity& caller,
           std::function<void(absl::StatusOr<PutHeld>)> done);
  // Forgets `caller`'s arena `arena`, cancelling what it reserved.
  absl::Status ReleaseArena(uint64_t arena, const transport::PeerIdentity& caller);
  // A step a peer sealed (its token is the caller's business): plans it,
  // waits for room, gets the samples this node's ranks are planned, and
  // seals it here. A step sealed or consumed here before is left as it is.
  void Forward(ForwardedStep forward, std::function<void(absl::StatusOr<ForwardFetched>)> done);

 private:
  // A put, or a forwarded step, waiting for room in its stream.
  struct PendingPut {
    IngestStream* stream = nullptr;
    uint64_t bytes = 0;
    uint32_t timeout_ms = 0;
    absl::Time deadline;
    bool waited = false;
    // With the budget reserved, takes what else the put needs; false while
    // that has no room either (the put then waits as for the budget).
    std::function<bool()> claim;
    // With the room reserved (OK), moves the bytes in and answers; or
    // answers why there is no room.
    std::function<void(absl::Status room)> run;
  };
  // A reserved put: its samples lie in `span`, written by the producer
  // once Commit comes.
  struct Lease {
    uint64_t id = 0;
    IngestStream* stream = nullptr;
    int64_t step = 0;
    uint64_t bytes = 0;  // reserved in the stream's budget
    std::vector<IngestedSample> samples;
  };
  struct Arena {
    std::shared_ptr<StagingArena> memory;
    std::optional<Lease> lease;  // at most one: a producer puts one at a time
  };

  IngestServer(std::vector<IngestStream*> streams,
               std::shared_ptr<const transport::UcpContext> context, transport::UcpWorker worker,
               bool for_peers);
  // Queues `pending` for the transfer thread; or, `may_run_here`, runs it
  // on this thread when it is admitted at once.
  void Enqueue(PendingPut pending, bool may_run_here);
  void Loop();
  // Admits what fits, in arrival order per stream; refuses what waited past
  // its deadline.
  void ServePending();
  // A forwarded put's samples, read from its origin. `wanted` (by sample):
  // the others are kept without bytes.
  absl::StatusOr<std::vector<IngestedSample>> Transfer(const IngestPut& put,
                                                       const IngestStream& stream,
                                                       const std::vector<bool>& wanted);
  // A put's stream and arena (ArenaFor), once its shape and size are
  // checked: what both ways of putting begin with.
  absl::StatusOr<std::pair<IngestStream*, std::shared_ptr<StagingArena>>> CheckPut(
      const ArenaPut& request, const transport::PeerIdentity& caller,
      std::shared_ptr<transport::SharedRing> shared) ABSL_LOCKS_EXCLUDED(mutex_);
  // The arena `request` names, for `caller`.
  absl::StatusOr<std::shared_ptr<StagingArena>> ArenaFor(
      const ArenaPut& request, const transport::PeerIdentity& caller,
      std::shared_ptr<transport::SharedRing> shared) ABSL_LOCKS_EXCLUDED(mutex_);
  // The put's samples in `span` (registered for peers when they get them).
  absl::StatusOr<std::vector<IngestedSample>> SamplesIn(const IngestPut& put,
                                                        const IngestStream& stream,
                                                        const std::shared_ptr<ArenaSpan>& span);
  // Cancels a reservation: its budget and span are free again.
  static void Cancel(std::optional<Lease>& lease);
  // Forgets the arenas of producers that exited, cancelling what they
  // reserved; the samples they put stay until freed.
  void ForgetExitedProducers() ABSL_LOCKS_EXCLUDED(mutex_);

  const std::vector<IngestStream*> streams_;
  // Shared with the registered sample memory, which may outlive the server.
  const std::shared_ptr<const transport::UcpContext> context_;
  const bool for_peers_;
  transport::UcpWorker worker_;              // transfer thread only
  transport::RemoteReader reader_{worker_};  // forwarded steps' origins
  std::deque<PendingPut> pending_;           // transfer thread only
  absl::Time arenas_checked_;                // transfer thread only

  absl::Mutex mutex_;
  std::deque<PendingPut> arrived_ ABSL_GUARDED_BY(mutex_);
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::map<const IngestStream*, int> queued_ ABSL_GUARDED_BY(mutex_);  // puts not yet run
  std::map<uint64_t, Arena> arenas_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_arena_ ABSL_GUARDED_BY(mutex_) = 1;
  uint64_t next_lease_ ABSL_GUARDED_BY(mutex_) = 1;
  std::thread thread_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INGEST_INGEST_SERVER_H_
