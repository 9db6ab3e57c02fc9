#ifndef PACKFEED_SERVER_INTERNAL_INGEST_SERVER_H_
#define PACKFEED_SERVER_INTERNAL_INGEST_SERVER_H_

// The daemon's ingest streams and the thread that moves put samples into
// them (docs/INGEST.md). A put names its samples over gRPC; their bytes stay
// in the producer's UCX-registered memory, and this thread reads them with
// one-sided gets (on one node a copy out of shared memory) into the
// stream, then answers. A put that finds the stream's budget full waits
// here, puts of other streams going on, until consumers free a step or its
// timeout passes.
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
#include "server/internal/ingest_stream.h"

namespace packfeed::server {

class IngestServer {
 public:
  // REQUIRES: the streams outlive the server.
  static absl::StatusOr<std::unique_ptr<IngestServer>> Start(std::vector<IngestStream*> streams,
                                                             const transport::UcxOptions& ucx);
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

 private:
  struct PendingPut {
    const v1::PutRequest* put = nullptr;
    IngestStream* stream = nullptr;
    uint64_t bytes = 0;
    absl::Time deadline;
    bool waited = false;
    std::function<void(absl::StatusOr<v1::PutReply>)> done;
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

  IngestServer(std::vector<IngestStream*> streams, transport::UcpContext context,
               transport::UcpWorker worker);
  void Loop();
  // Admits what fits, in arrival order per stream; refuses what waited past
  // its deadline.
  void ServePending();
  absl::StatusOr<std::vector<IngestedSample>> Transfer(const v1::PutRequest& put,
                                                       const IngestStream& stream);
  absl::StatusOr<Producer*> ProducerAt(const std::string& address);

  const std::vector<IngestStream*> streams_;
  transport::UcpContext context_;
  transport::UcpWorker worker_;                                 // transfer thread only
  std::map<std::string, std::unique_ptr<Producer>> producers_;  // transfer thread only
  std::deque<PendingPut> pending_;                              // transfer thread only

  absl::Mutex mutex_;
  std::deque<PendingPut> arrived_ ABSL_GUARDED_BY(mutex_);
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INTERNAL_INGEST_SERVER_H_
