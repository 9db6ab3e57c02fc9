#ifndef PACKFEED_SERVER_INGEST_INGEST_SERVER_H_
#define PACKFEED_SERVER_INGEST_INGEST_SERVER_H_

// The daemon's ingest streams and the thread that moves put samples into
// them (docs/INGEST.md). A put names its samples over gRPC; their bytes stay
// in the producer's UCX-registered memory, and this thread reads them with
// one-sided gets (on one node a copy out of shared memory) into the
// stream, then answers. A put that finds the stream's budget full waits
// here, puts of other streams going on, until consumers free a step or its
// timeout passes.
//
// With peer daemons (docs/INGEST.md, Several nodes) each put's samples are
// kept in one region registered with UCX, so that the peers can get them
// once the step is sealed; a step forwarded by a peer is fetched by the
// same thread, only the samples this node's ranks are planned.
//
// Thread-safe; `done` callbacks run on the transfer thread.

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "packfeed/transport/ucx_context.h"
#include "packfeed/transport/ucx_endpoint.h"
#include "packfeed/v1/service.pb.h"
#include "server/ingest/ingest_stream.h"

namespace packfeed::server {

class IngestServer {
 public:
  // `for_peers`: put samples into memory peer daemons can get.
  static absl::StatusOr<std::unique_ptr<IngestServer>> Start(std::vector<IngestStream*> streams,
                                                             const transport::UcxOptions& ucx,
                                                             bool for_peers);
  ~IngestServer() { Stop(); }
  // Refuses the puts still waiting, and every later one, as Unavailable;
  // joins the transfer thread. Idempotent.
  void Stop();

  // nullptr when none has that name.
  IngestStream* stream(const std::string& name) const;

  // Checks `put` (its stream's token is the caller's business), waits for
  // room, reads its bytes and adds its samples. `put` must stay valid
  // until `done`.
  void Put(const v1::PutRequest& put, std::function<void(absl::StatusOr<v1::PutReply>)> done);
  // A step a peer sealed (its token is the caller's business): plans it,
  // waits for room, gets the samples this node's ranks are planned, and
  // seals it here. A step sealed or consumed here before is left as it is.
  // `forward` must stay valid until `done`.
  void Forward(const v1::ForwardStepRequest& forward,
               std::function<void(absl::StatusOr<v1::ForwardStepReply>)> done);

 private:
  // A put, or a forwarded step, waiting for room in its stream.
  struct PendingPut {
    IngestStream* stream = nullptr;
    uint64_t bytes = 0;
    uint32_t timeout_ms = 0;
    absl::Time deadline;
    bool waited = false;
    // With the room reserved (OK), moves the bytes in and answers; or
    // answers why there is no room.
    std::function<void(absl::Status room)> run;
  };
  // A producer's worker, connected once.
  struct Producer {
    bool failed = false;  // set by UCX's error callback
    std::optional<transport::UcpEndpoint> endpoint;
    // The last staging region's key, unpacked. Kept while the producer puts
    // from the same region: unpacking maps the region (shared memory on one
    // node) and dropping the key unmaps it, which cost more than the copy.
    std::string packed_key;
    transport::RemoteKey key;  // declared after the endpoint: freed first
  };

  IngestServer(std::vector<IngestStream*> streams,
               std::shared_ptr<const transport::UcpContext> context, transport::UcpWorker worker,
               bool for_peers);
  void Enqueue(PendingPut pending);
  void Loop();
  // Admits what fits, in arrival order per stream; refuses what waited past
  // its deadline.
  void ServePending();
  // The put's samples, read from its producer. `wanted` (by sample; null =
  // all): the others are kept without bytes.
  absl::StatusOr<std::vector<IngestedSample>> Transfer(const v1::PutRequest& put,
                                                       const IngestStream& stream,
                                                       const std::vector<bool>* wanted);
  // Memory for `bytes` of samples: registered (its region described in
  // `region`) when `for_peers` may get it (a driver's put, not a step a
  // peer forwarded).
  absl::StatusOr<std::shared_ptr<char[]>> AllocateSamples(
      uint64_t bytes, bool for_peers, std::shared_ptr<const SampleRegion>& region);
  absl::StatusOr<Producer*> ProducerAt(const std::string& address);

  const std::vector<IngestStream*> streams_;
  // Shared with the registered sample memory, which may outlive the server.
  const std::shared_ptr<const transport::UcpContext> context_;
  const bool for_peers_;
  transport::UcpWorker worker_;                                 // transfer thread only
  std::map<std::string, std::unique_ptr<Producer>> producers_;  // transfer thread only
  std::deque<PendingPut> pending_;                              // transfer thread only

  absl::Mutex mutex_;
  std::deque<PendingPut> arrived_ ABSL_GUARDED_BY(mutex_);
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INGEST_INGEST_SERVER_H_
