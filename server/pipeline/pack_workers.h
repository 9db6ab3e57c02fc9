#ifndef PACKFEED_SERVER_PIPELINE_PACK_WORKERS_H_
#define PACKFEED_SERVER_PIPELINE_PACK_WORKERS_H_

// Threads that help the runner write one large microbatch into its slot
// (DaemonConfig.packing_threads): one thread's copies bound how fast a rank
// is fed, far below what the memory (or a GPU's copy engine behind a
// staged ring) takes. The runner keeps the transport to itself; only the
// writing of disjoint parts of one slot is shared, and Run returns when
// every part is written.

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace packfeed::server {

class PackWorkers {
 public:
  // `threads` in all, the caller of Run included: threads - 1 are started.
  explicit PackWorkers(int threads);
  ~PackWorkers();
  PackWorkers(const PackWorkers&) = delete;
  PackWorkers& operator=(const PackWorkers&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }
  // Calls work(0), ..., work(parts - 1), each once, on the calling thread
  // and the helpers; returns when all returned. One Run at a time.
  void Run(int parts, absl::FunctionRef<void(int)> work);

 private:
  void Help();
  // Takes parts of the current run until none is left.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::Mutex mutex_;
  const absl::FunctionRef<void(int)>* work_ ABSL_GUARDED_BY(mutex_) = nullptr;
  int parts_ ABSL_GUARDED_BY(mutex_) = 0;
  int next_ ABSL_GUARDED_BY(mutex_) = 0;  // the next part to take
  int done_ ABSL_GUARDED_BY(mutex_) = 0;  // parts returned
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> helpers_;
};

// The cores this process may run on (its CPU affinity), at least 1.
int UsableCores();

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_PACK_WORKERS_H_
