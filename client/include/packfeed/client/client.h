#ifndef PACKFEED_CLIENT_CLIENT_H_
#define PACKFEED_CLIENT_CLIENT_H_

// The trainer's data iterator (docs/ARCHITECTURE.md): attaches one global rank to
// its node's packfeedd and hands out the rank's microbatches as typed views
// of its ring. Every rank calls it — TP peers and every PP stage — so no
// trainer-side broadcast is needed.
//
//   auto client = Client::Attach({.socket_path = ..., .job = "pretrain", .global_rank = r});
//   for (;;) {
//     StepInfo step = *(*client)->NextStep();       // M and the FLOPs inputs
//     for (int m = 0; m < step.num_microbatches; ++m) {
//       Microbatch mb = *(*client)->Next();         // views, valid while mb lives
//       ... mb.Field("tokens") ...
//     }
//   }
//
// Thread-compatible: one trainer thread drives a Client. The transport (UCX)
// and the control plane (gRPC) stay behind the implementation: this header
// needs Abseil only.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "packfeed/common/data_types.h"
#include "packfeed/common/defaults.h"

namespace packfeed::client {

// How the daemon writes a host ring.
enum class RingSharing {
  // kFileDescriptor for a host ring (not for kDevice placement).
  kAuto,
  // UCX's shared memory (one node) or its network transports.
  kUcx,
  // A sealed memfd handed to the daemon over SOCKET.rings, which it maps:
  // shared memory for a trainer of another uid too, which UCX 1.13 cannot
  // give, and the daemon can read side rows straight into it. UCX carries
  // only the notifications: over its shared memory for the daemon's own
  // uid, over TCP for another (unless ucx_transports says otherwise).
  kFileDescriptor,
};

struct ClientOptions {
  // The daemon's gRPC socket.
  std::string socket_path = kDefaultSocketPath;
  // A daemon on another node instead: its admin_tcp_address ("host:port"),
  // where it takes ranks under ranks_over_tcp (auth_token required). No
  // file descriptor crosses nodes, so the ring is UCX's, written over UCX's
  // network transports; kDaemonDevice then asks for a UCX put into device
  // memory, kept only where UCX writes it with GPUDirect RDMA, and falls
  // back to kStagedDevice saying why (docs/TRANSPORT.md, Ranks on another
  // node).
  std::string daemon_address;
  // With daemon_address, under the daemon's admin_tls: the CA that signed
  // its certificate and, under mutual TLS, this client's certificate and key
  // (PEM files). Plaintext when tls_ca_file is empty.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string job;  // required
  int global_rank = 0;
  // The job fingerprint this trainer expects; empty = accept the daemon's
  // (State() records it, so a resume checks it).
  std::string fingerprint;
  std::string auth_token;
  // Over daemon_address, a start before where the rank's ledger stands (a
  // restart from an earlier checkpoint by a new process) is refused unless
  // this is the daemon's admin_tcp_token (docs/RELIABILITY.md, Who can do
  // what). Not needed on the socket, nor when this client re-attaches.
  std::string admin_token;
  int64_t start_step = 0;  // first step to receive
  // Microbatches of start_step already consumed (a resume inside a step:
  // ClientState::next_microbatch); NextStep then begins the step there.
  int start_microbatch = 0;
  // Pretraining jobs, in place of start_step: Megatron's consumed sample
  // count of the job's split (consumed_train_samples, or
  // consumed_valid_samples for NAME.valid). The daemon starts at the step
  // that begins there; Create fails with InvalidArgument when the count lies
  // before the job's consumed_samples or inside a step, or the job is of
  // another kind.
  std::optional<int64_t> start_sample;
  // An elastic resume: `fingerprint` (required) may differ from the daemon's
  // in topology and scheduler (another DP size), not in data; start at a step
  // boundary. docs/RELIABILITY.md.
  bool elastic = false;
  uint32_t slots = 4;  // ring slots: microbatches the daemon may run ahead
  // Bytes per slot; 0 = exactly what the job's largest microbatch needs
  // (asked from the daemon at attach).
  uint64_t slot_bytes = 0;
  RingPlacement placement = RingPlacement::kAuto;
  RingSharing sharing = RingSharing::kAuto;
  int cuda_device = 0;         // for a device ring
  std::string ucx_transports;  // "" = UCX's choice
  // How long each call of Attach may take. The first waits that long for a
  // daemon on this node's socket once the socket exists (a daemon starting
  // or loaded answers late); with no socket, or over TCP, an unanswered
  // call fails at once.
  absl::Duration attach_timeout = absl::Seconds(30);
  // When the daemon goes away (killed, restarted by systemd, drained),
  // NextStep/Next attach again for up to this long (backoff 0.1 s doubling
  // to 2 s) and go on from the first microbatch not yet taken, bit-identical
  // (the plan is deterministic); then Unavailable. A daemon drained for good
  // therefore costs a rank this long before it hears. 0: Unavailable at once.
  absl::Duration reconnect_timeout = absl::Seconds(kDefaultReconnectSeconds);
  // Detach (and so the destructor) waits at most this long (and at most
  // reconnect_timeout) for a daemon that is away to tell it what this rank
  // consumed; past it the ledger lacks the rank's last releases, which it
  // claims if the rank attaches again. Short: a trainer exiting after its
  // daemon was drained should not hang.
  absl::Duration detach_timeout = absl::Seconds(5);
};

// What the trainer needs before its first microbatch of a step (Megatron's
// wrap_data_iterator result).
struct StepInfo {
  int64_t step = 0;
  int num_microbatches = 0;
  // > 0 only for a step resumed inside (start_microbatch): the microbatches
  // before it were consumed before the resume; Next() starts here.
  int first_microbatch = 0;
  // Σ padded length and Σ padded length² (what Megatron's FLOPs formula
  // consumes), and the same over real lengths.
  int64_t padded_sum = 0;
  int64_t padded_squared_sum = 0;
  int64_t real_sum = 0;
  int64_t real_squared_sum = 0;
};

struct FieldView {
  std::string name;
  ElementType dtype = ElementType::kUInt8;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // in device memory when memory_kind is kCuda
  uint64_t bytes = 0;
  // kStagedDevice: a small field's bytes (at most 64, such as max_seqlen) in
  // host memory, readable at once.
  std::string host_copy;
};

// Holds a microbatch's memory (its ring slot, or a staged ring's device
// buffer, or a copy) for the Microbatch handles that share it.
class MicrobatchLease;

// A microbatch: views of memory that stays the trainer's while this
// Microbatch, or any copy of it (Chunk()s included), lives. When the last one
// is gone the memory goes back to the daemon (for device memory, once the
// streams that read it are past their reads), in any order: a trainer may
// hold as many as it likes (1F1B keeps up to PP in flight). Views must not be
// used after the last handle is gone.
struct Microbatch {
  int64_t step = 0;
  int microbatch = 0;
  int num_microbatches = 0;
  MemoryKind memory_kind = MemoryKind::kHost;
  std::vector<FieldView> fields;
  // The client handed out a private copy, not the ring's memory: the trainer
  // held so many microbatches that the ring had no slot left to fill.
  bool copied_out = false;

  // kStagedDevice: the cudaEvent_t recorded after the copy into device
  // memory. Next's cuda_stream already waits on it; another stream reading
  // the views must wait on it too. nullptr for a copy (copied_out), which is
  // ready in Next's cuda_stream order, and for host memory.
  void* ready_event() const { return ready_event_; }

  // Device memory: `cuda_stream` (a cudaStream_t) reads these views too, so
  // the memory is reused only once it is past what it was given before the
  // last handle goes (Next's cuda_stream is recorded already), as
  // torch.Tensor.record_stream does.
  void RecordStream(void* cuda_stream) const;
  // Drops this handle: its views are cleared, and the memory goes back when
  // no other handle holds it.
  void Release();

  // nullptr when this rank's stage does not receive the field.
  const FieldView* Field(absl::string_view name) const;
  // Under virtual pipelines (Client::num_chunks() > 1): what model chunk
  // `chunk` of this stage receives, as Megatron's interleaved schedule hands
  // each chunk's data iterator the same microbatch: the fields every chunk
  // gets, and those of this chunk only (inputs in the first stage's first
  // chunk, targets in the last stage's last, a layer-axis side field cut to
  // the chunk's layers) under their plain names. Views of the same slot.
  Microbatch Chunk(int chunk) const;

 private:
  friend class Client;  // its Impl hands microbatches out
  void* ready_event_ = nullptr;
  std::shared_ptr<MicrobatchLease> lease_;
};

// Where a rank stands, for checkpoints: resuming with start_step =
// next_step and start_microbatch = next_microbatch reproduces the following
// batches exactly.
struct ClientState {
  std::string job;
  std::string fingerprint;
  int64_t next_step = 0;    // the step in progress, or the next to begin
  int next_microbatch = 0;  // microbatches of next_step already taken
};

// Where the trainer's time went, as this client measured it since Attach
// (across the re-attaches it made itself): blocked in NextStep/Next waiting
// for data, and busy between the return of one call and the next (its own
// forward, backward, optimizer step). The daemon gets each connection's own
// figures about once a second and at detach, and adds up the connections it
// served (`packfeedctl stats`: wait_seconds, busy_seconds, input_bound): a
// daemon that never lost the rank shows these figures exactly; a restarted
// one, those since the rank re-attached to it.
struct TrainerTimes {
  absl::Duration waited;
  absl::Duration busy;
  uint64_t calls = 0;  // NextStep and Next calls measured
  // The share of its time the trainer spent waiting for data.
  double input_bound() const {
    const absl::Duration total = waited + busy;
    return total > absl::ZeroDuration() ? absl::FDivDuration(waited, total) : 0.0;
  }
};

// How the trainer uses its ring, since attach.
struct RingUse {
  uint32_t slots = 0;
  // Ring slots the trainer holds now: microbatches with a live handle
  // (copies hold none), and a step's first one NextStep took.
  uint32_t held = 0;
  uint64_t handed_out = 0;
  // Of those, handed out as private copies (the trainer held slots - 1).
  uint64_t copied_out = 0;
};

class Client {
 public:
  // Attaches to the daemon; errors carry the daemon's message and code:
  // NotFound (no such job), PermissionDenied (wrong auth token),
  // OutOfRange (a rank outside the job), FailedPrecondition (a rank another
  // daemon hosts, or another fingerprint), AlreadyExists (the rank is
  // attached), InvalidArgument (slots too small for the job, a bad start
  // step or start sample, no job name, a socket path longer than a Unix
  // socket allows: 107 bytes; a ring shared by file descriptor with
  // daemon_address). Unavailable when no daemon answers on the socket (or
  // address), or it is starting or draining; Unimplemented from an address
  // that takes no ranks (ranks_over_tcp off). A release build of packfeed
  // turns Abseil's lock-order checks off for the process here
  // (packfeed/common/mutex_mode.h).
  static absl::StatusOr<std::unique_ptr<Client>> Attach(const ClientOptions& options);
  ~Client();  // Detaches (best effort) unless Detach() did.

  // Tells the daemon this rank is gone, so the same rank may attach again at
  // once, and what it consumed (for the ledger); the ring stays mapped
  // (views remain readable) until the client and every Microbatch are gone.
  // A daemon that is away is waited for at most min(reconnect_timeout,
  // detach_timeout); then the error of the last try.
  absl::Status Detach();

  // Begins the next step: waits for its first microbatch. Errors, besides
  // those Next shares: FailedPrecondition when the previous step's
  // microbatches were not all taken.
  absl::StatusOr<StepInfo> NextStep(absl::Duration timeout = absl::InfiniteDuration());
  // The next microbatch of the current step. Errors:
  // - OutOfRange after the step's last microbatch (call NextStep);
  // - DeadlineExceeded when nothing arrived within `timeout` (the client
  //   stays usable: call again);
  // - Unavailable when the daemon went away and re-attaching failed for
  //   reconnect_timeout (0: at once);
  // - FailedPrecondition naming the daemon's reason when it ended this rank
  //   (a sample it needs cannot be read or served, the job was drained);
  // - DataLoss when a slot arrived malformed or out of order (nothing of it
  //   is handed out).
  // Both are called from one thread at a time. When the trainer already holds
  // slots - 1 microbatches, this one is a private copy (copied_out) and its
  // slot goes back at once, so the daemon always has a slot to fill and a
  // trainer holding more than the ring never deadlocks.
  // kStagedDevice: `cuda_stream` (a cudaStream_t; nullptr is the legacy
  // default stream) is the stream that reads the microbatch: it waits, on
  // the GPU, for the copy into device memory (the trainer's thread never
  // waits for it), and the device buffer is reused only after that stream
  // has done what it was given before the last handle went.
  absl::StatusOr<Microbatch> Next(absl::Duration timeout = absl::InfiniteDuration(),
                                  void* cuda_stream = nullptr);

  ClientState State() const;
  TrainerTimes Times() const;
  RingUse Ring() const;
  const std::string& fingerprint() const;
  // Why a device ring the daemon writes (RingPlacement::kDaemonDevice) was
  // asked for and the staged ring serves instead: the local reason (no
  // virtual memory API, descriptor export or second context on this GPU) or
  // the daemon's (no GPU of that UUID visible to it, the driver's refusal).
  // Empty when it was not asked for, or is served.
  const std::string& DeviceRingFallback() const;
  const ClientOptions& options() const;
  MemoryKind memory_kind() const;
  // Model chunks per pipeline stage (the job's VPP size; 1 without).
  int num_chunks() const;

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_CLIENT_H_
