#ifndef PACKFEED_TRANSPORT_RECEIVER_H_
#define PACKFEED_TRANSPORT_RECEIVER_H_

// The client's side of the data plane: a ring of K slots of B bytes that the
// daemon's Sender puts into, and the notifications that say a slot is ready.
//
// The ring is allocated by UCX, so on one node a put is a single one-sided
// shared-memory copy. With a CUDA device it is host memory registered with
// cudaHostRegister, so a copy to the device is asynchronous: kStagedDevice
// makes that copy itself, one copy-engine transfer per slot as soon as the
// slot arrives, and hands out views of device memory. kDevice asks UCX to
// put straight into device memory (a UCX built with CUDA); without a device,
// plain host memory.
//
// A progress thread owns the UCP worker: it sleeps on the worker's event fd
// (woken by ucp_worker_signal when the trainer releases a slot), waking every
// `idle_wakeup` so UCX keepalive notices a dead sender. Trainer threads never
// call UCX.

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/cuda_shared_memory.h"
#include "packfeed/transport/memory_region.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/ucx_context.h"
#include "packfeed/transport/ucx_endpoint.h"
#include "packfeed/transport/wire.h"

namespace packfeed::transport {

using ::packfeed::RingPlacement;  // packfeed/common/data_types.h

struct ReceiverOptions {
  UcxOptions ucx;
  uint32_t slots = 4;  // K: slots the sender may fill ahead
  // B: the largest slot payload, rounded up to a multiple of kFieldAlignment
  // so that every slot, and every field in it, starts aligned.
  uint64_t slot_bytes = 64ull << 20;
  RingPlacement placement = RingPlacement::kAuto;
  int cuda_device = 0;
  // kStagedDevice: the cudaStream_t to copy on; nullptr: one of the
  // receiver's own.
  void* cuda_copy_stream = nullptr;
  // Longest sleep of the idle progress thread; a dead sender is noticed
  // within about UCX's keepalive interval plus this. Default 100 ms.
  absl::Duration idle_wakeup = absl::Milliseconds(100);
  // After any activity the progress thread polls this long before it sleeps,
  // so a release or a notification that follows soon costs no wake-up.
  // Default 50 µs.
  absl::Duration spin = absl::Microseconds(50);
  // A host ring in a sealed memfd (SharedRing) rather than in UCX's shared
  // memory, for a daemon of another uid: hand ring_fd() to it over its Unix
  // socket (SendWithFd). Notifications and credits still travel over UCX.
  bool shared_by_fd = false;
};

// A field of a received slot: its descriptor and where its bytes are (in
// device memory when the ring is).
struct FieldView {
  FieldDescriptor descriptor;
  uint8_t* data = nullptr;
  // kStagedDevice: the bytes of a small field (at most kHostCopyBytes:
  // max_seqlen, local_cp_size), so a trainer reads them without waiting
  // for the device.
  std::string host_copy;
};
inline constexpr uint64_t kHostCopyBytes = 64;

struct ReceivedSlot {
  // Names the slot to Release; unique for the receiver's life, across
  // connections (seq restarts with each).
  uint64_t lease = 0;
  uint64_t seq = 0;
  uint32_t slot = 0;
  int64_t step = 0;
  uint32_t microbatch = 0;
  std::vector<FieldView> fields;
  std::string inline_metadata;
  // kStagedDevice: the device buffer the fields are in, and the event (a
  // cudaEvent_t) recorded after the copy into it; a stream reading them
  // must wait on it first (StreamWaitsFor).
  uint32_t device_slot = 0;
  void* ready_event = nullptr;
};

struct ReceiverStats {
  uint64_t received = 0;  // slot-ready notifications accepted
  uint64_t released = 0;
  uint32_t held = 0;            // slots handed out and not released, of any connection
  uint64_t stale_messages = 0;  // messages of another connection, dropped
  uint64_t copied = 0;          // kStagedDevice: copies to the device completed
};

// Thread-safe: Next, Release and Connect may be called from any thread, and
// slots are released in any order. A slot handed out stays the trainer's
// until it is released, across reconnects: a new sender never writes it.
class Receiver {
 public:
  static absl::StatusOr<std::unique_ptr<Receiver>> Create(const ReceiverOptions& options);
  ~Receiver();  // Stops the progress thread, closes, frees the ring.

  // The worker address to give the sender (EncodeWorkerAddress).
  std::string worker_address() const;
  // The encoded RingDescriptor the sender connects with.
  const std::string& ring_descriptor() const { return ring_descriptor_; }
  // The ring's length: slots × slot bytes (rounded up to kFieldAlignment).
  uint64_t ring_bytes() const { return options_.slots * options_.slot_bytes; }
  // The descriptor of a ring the daemon maps or imports (a shared memfd,
  // kDaemonDevice's exported device memory), else -1; and what to send with
  // it (SendWithFd of FormatRingOffer).
  int ring_fd() const;
  RingOffer ring_offer() const;
  // Where the views Next hands out are: kCuda for a device or staged ring.
  MemoryKind memory_kind() const { return copier_ != nullptr ? MemoryKind::kCuda : memory_kind_; }
  // True when the host ring is page-locked for asynchronous device copies.
  bool host_ring_registered_with_cuda() const { return host_registration_.has_value(); }

  // Accepts connection `connection_id` (from Sender::Connect) of the sender at
  // `sender_address`, whose key (Sender::Key) every credit then carries.
  // Drops any earlier connection and the slots it announced that Next had
  // not handed out; slots handed out stay held until released.
  absl::Status Connect(absl::string_view sender_address, uint64_t connection_id,
                       const ConnectionKey& key);

  // Replaces the UCX worker, and so worker_address(); call it before
  // re-attaching to a sender that failed. A sender killed inside a write
  // to this worker's shared-memory FIFO leaves that FIFO blocked for every
  // later sender (UCX's mm transport never skips the half-written entry),
  // so the old worker is not reused. The ring, its key and its slots stay.
  absl::Status RenewWorker();

  // The next ready slot, in the order the sender pushed them. Slots already
  // announced are returned even after the sender is gone; then Unavailable
  // (sender died or said goodbye), FailedPrecondition (not connected, or a
  // sender of another protocol version), DataLoss (a malformed notification:
  // nothing of it is handed out), DeadlineExceeded after `timeout`.
  absl::StatusOr<ReceivedSlot> Next(absl::Duration timeout);

  // kStagedDevice: makes `cuda_stream` (a cudaStream_t; nullptr is the
  // legacy default stream) wait, on the GPU, for the copy of `slot`.
  absl::Status StreamWaitsFor(const ReceivedSlot& slot, void* cuda_stream) const;

  // Releases a slot Next returned (its `lease`) and returns it to the
  // sender. InvalidArgument for a lease not held. kStagedDevice: the host
  // slot went back when its copy completed; this frees the device buffer
  // once every stream of `cuda_streams` (cudaStream_t; none: the legacy
  // default stream) has done what it was given so far (its reads of it).
  // kDaemonDevice: the slot goes back to the daemon once those streams are
  // past their reads (the progress thread polls their events).
  absl::Status Release(uint64_t lease, absl::Span<void* const> cuda_streams = {});

  ReceiverStats stats() const;

 private:
  Receiver(ReceiverOptions options, UcpContext context, UcpWorker worker);
  absl::Status CreateRing();
  void ProgressLoop();
  // Runs `task` on the progress thread and returns its status.
  absl::Status RunOnProgressThread(std::function<absl::Status()> task);
  absl::Status Reconnect(const std::string& sender_address, uint64_t connection_id,
                         const ConnectionKey& key);
  absl::Status RouteMessages(UcpWorker& worker);  // to this receiver's handlers
  // Wakes the progress thread from any thread (the worker may be renewed).
  void Wake() ABSL_LOCKS_EXCLUDED(worker_mutex_);
  bool SendCredit();  // true when a credit was sent
  Credit CreditNow() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void DropCreditRequest();
  void CloseFailedEndpoint();
  void CloseEndpoint();
  // `payload`: the slot's bytes, when they came with the notification.
  void OnMessage(absl::string_view bytes, std::optional<absl::string_view> payload);
  // kStagedDevice: starts the copies of arrived slots that have a free
  // device buffer and counts the completed ones; true on any change.
  bool StageArrived();
  // kDaemonDevice: frees the released slots whose readers' streams have
  // passed them; true when any was freed. `pending`: some are still waiting.
  bool DrainReleased(bool& pending);
  // kStagedDevice, on a new connection: waits for the copies in flight and
  // frees every device buffer (those handed out once the consumer's stream
  // is past them).
  void ResetStaging() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CopyPayload(const SlotReady& ready, absl::string_view payload, uint8_t* slot) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void FailConnection(absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static void OnEndpointError(void* arg, ucp_ep_h endpoint, ucs_status_t status);
  static ucs_status_t OnActiveMessage(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnSlotDataMessage(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param);

  const ReceiverOptions options_;
  // Declared parents first: destroyed children first.
  UcpContext context_;
  // Replaced only by the progress thread (RenewWorker), under worker_mutex_;
  // the progress thread reads it freely, other threads under the lock.
  UcpWorker worker_;
  mutable absl::Mutex worker_mutex_;
  std::optional<CudaDeviceBuffer> device_ring_;
  std::optional<MemoryRegion> ring_;
  std::optional<SharedRing> shared_ring_;
  std::optional<ExportedDeviceMemory> exported_ring_;  // kDaemonDevice
  uint8_t* ring_base_ = nullptr;                       // the ring's first slot, whichever holds it
  std::optional<CudaHostRegistration> host_registration_;
  std::unique_ptr<CudaSlotCopier> copier_;  // kStagedDevice only
  MemoryKind memory_kind_ = MemoryKind::kHost;
  std::string ring_descriptor_;
  std::optional<UcpEndpoint> endpoint_;        // progress thread only
  std::optional<Credit> credit_sent_;          // progress thread only
  std::string credit_message_;                 // progress thread only; alive while
  ucs_status_ptr_t credit_request_ = nullptr;  // this send is in flight

  mutable absl::Mutex mutex_;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool connected_ ABSL_GUARDED_BY(mutex_) = false;
  uint64_t connection_id_ ABSL_GUARDED_BY(mutex_) = 0;
  ConnectionKey key_ ABSL_GUARDED_BY(mutex_){};
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
  std::deque<ReceivedSlot> ready_ ABSL_GUARDED_BY(mutex_);
  uint64_t received_ ABSL_GUARDED_BY(mutex_) = 0;    // notifications accepted
  uint64_t handed_out_ ABSL_GUARDED_BY(mutex_) = 0;  // returned by Next
  uint64_t released_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t stale_ ABSL_GUARDED_BY(mutex_) = 0;
  // Host slots announced and not yet free again (released, or for a staged
  // ring copied to the device).
  std::vector<bool> occupied_ ABSL_GUARDED_BY(mutex_);
  // The slots handed out and not released, by lease: the ring slot (or a
  // staged ring's device buffer) and the connection that filled it.
  struct Held {
    uint32_t slot = 0;
    uint64_t connection_id = 0;
  };
  std::map<uint64_t, Held> held_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mutex_) = 1;
  // kStagedDevice: slots waiting for a device buffer; copies in flight (in
  // stream order: device buffer, host slot); copies completed; which device
  // buffers hold a slot not yet released.
  std::deque<ReceivedSlot> arrived_ ABSL_GUARDED_BY(mutex_);
  std::deque<std::pair<uint32_t, uint32_t>> copying_ ABSL_GUARDED_BY(mutex_);
  uint64_t copied_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<bool> device_busy_ ABSL_GUARDED_BY(mutex_);
  // kDaemonDevice: released slots, until their readers' streams pass them.
  std::list<std::pair<uint32_t, CudaStreamMarks>> draining_ ABSL_GUARDED_BY(mutex_);

  std::thread progress_thread_;  // last: started when all else is ready
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_RECEIVER_H_
