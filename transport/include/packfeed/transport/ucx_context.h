#ifndef PACKFEED_TRANSPORT_UCX_CONTEXT_H_
#define PACKFEED_TRANSPORT_UCX_CONTEXT_H_

// RAII owners of a UCP context and a UCP worker, configured the way packfeed
// needs them (docs/TRANSPORT.md): peer-failure detection on *with* shared memory
// kept, and a short keepalive so a dead peer is noticed in about a second.

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace packfeed::transport {

struct UcxOptions {
  // Transports UCX may use, as UCX_TLS spells them ("sm,self", "tcp,self").
  // Empty (the default) keeps UCX's own choice, i.e. UCX_TLS when set.
  std::string transports;
  // How often UCX probes a peer it has not heard from. Default 1 s (UCX's
  // default is 20 s, far too long to notice a dead rank).
  std::string keepalive_interval = "1s";
};

struct UcpContextDeleter {
  void operator()(ucp_context_h context) const { ucp_cleanup(context); }
};
struct UcpWorkerDeleter {
  void operator()(ucp_worker_h worker) const { ucp_worker_destroy(worker); }
};

// A UCP context with RMA, active messages and wakeup. Thread-safe to share
// between workers. Move-only.
class UcpContext {
 public:
  // Reads UCX's configuration, then forces what correctness needs: shared
  // memory that supports peer-failure handling (without it UCX silently drops
  // shm and falls back to TCP loopback at a tenth of the speed) and the
  // keepalive interval of `options`.
  static absl::StatusOr<UcpContext> Create(const UcxOptions& options);

  ucp_context_h get() const { return context_.get(); }
  // True when this UCX build can register CUDA device memory.
  bool supports_cuda_memory() const { return supports_cuda_memory_; }
  // "1.13.1"
  static std::string LibraryVersion();

 private:
  UcpContext(ucp_context_h context, bool cuda) : context_(context), supports_cuda_memory_(cuda) {}
  std::unique_ptr<ucp_context, UcpContextDeleter> context_;
  bool supports_cuda_memory_ = false;
};

// A UCP worker used by one thread only (UCS_THREAD_MODE_SINGLE); other threads
// may only call Signal(). REQUIRES: the context outlives the worker.
class UcpWorker {
 public:
  static absl::StatusOr<UcpWorker> Create(const UcpContext& context);

  ucp_worker_h get() const { return worker_.get(); }
  // The worker's address, for a peer's ucp_ep_create.
  const std::string& address() const { return address_; }

  // One round of progress; true when something happened.
  bool Progress() { return ucp_worker_progress(worker_.get()) != 0; }
  // Progresses until idle, then sleeps until UCX has an event, Signal() is
  // called, or `timeout` passes. Never spins while idle.
  void ProgressOrWait(absl::Duration timeout);
  // Routes active messages with `id` to `callback(arg, ...)`, run inside
  // Progress() on this worker's thread.
  absl::Status SetMessageHandler(unsigned id, ucp_am_recv_callback_t callback, void* arg);
  // Wakes a thread blocked in ProgressOrWait. Safe from any thread.
  void Signal() { ucp_worker_signal(worker_.get()); }

  // Progresses until `request` (the result of a ucp_*_nbx call) completes,
  // then frees it. Returns the operation's status, named by `call`.
  absl::Status Wait(ucs_status_ptr_t request, absl::string_view call);
  // The same, but once `deadline` passes calls `on_deadline` (which must make
  // the request complete, e.g. by force-closing its endpoint) and goes on.
  absl::Status Wait(ucs_status_ptr_t request, absl::string_view call, absl::Time deadline,
                    absl::FunctionRef<void()> on_deadline);

 private:
  UcpWorker(ucp_worker_h worker, std::string address, int event_fd)
      : worker_(worker), address_(std::move(address)), event_fd_(event_fd) {}
  std::unique_ptr<ucp_worker, UcpWorkerDeleter> worker_;
  std::string address_;
  int event_fd_ = -1;  // owned by the worker
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_UCX_CONTEXT_H_
