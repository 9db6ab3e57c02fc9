#ifndef PACKFEED_SERVER_CONTROL_RANK_WATCHES_H_
#define PACKFEED_SERVER_CONTROL_RANK_WATCHES_H_

// The Watch streams attached ranks hold open (Control.Watch): when one
// breaks (the rank's process died, or stopped answering the server's HTTP/2
// keepalive pings), `gone` runs once. Streams the daemon ends itself, at
// shutdown (FinishAll), do not count as breaking. Thread-safe.

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "packfeed/v1/service.pb.h"

namespace packfeed::server {

class RankWatches {
 public:
  // The reactor for one Watch call; gRPC deletes it when the call is done.
  grpc::ServerWriteReactor<v1::WatchEvent>* Start(std::function<void()> gone);
  // Ends every open stream (OK), and every later one at once.
  void FinishAll();

  struct State;

 private:
  absl::Mutex mutex_;
  std::vector<std::weak_ptr<State>> open_ ABSL_GUARDED_BY(mutex_);
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_RANK_WATCHES_H_
