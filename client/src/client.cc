#include "packfeed/client/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/src/daemon_channel.h"
#include "client/src/grpc_status.h"
#include "client/src/share_ring.h"
#include "client/src/watch_stream.h"
#include "packfeed/common/mutex_mode.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/transport_logger.h"
#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::client {

// Either a ring slot of the receiver, released when the last handle goes,
// or the private copy of one. Holds the receiver, so the ring outlives it.
class MicrobatchLease {
 public:
  MicrobatchLease(std::shared_ptr<transport::Receiver> receiver, uint64_t lease, void* stream)
      : receiver_(std::move(receiver)), lease_(lease) {
    streams_.push_back(stream);
  }
  // A copy: owns `host` or `device` memory, and holds no slot.
  MicrobatchLease(std::unique_ptr<uint8_t[]> host,
                  std::optional<transport::CudaDeviceBuffer> device)
      : host_(std::move(host)), device_(std::move(device)) {}
  MicrobatchLease(const MicrobatchLease&) = delete;
  MicrobatchLease& operator=(const MicrobatchLease&) = delete;

  ~MicrobatchLease() {
    if (receiver_ == nullptr) return;
    absl::MutexLock lock(&mutex_);
    if (absl::Status status = receiver_->Release(lease_, streams_); !status.ok()) {
      transport::Logger().warn("releasing a microbatch: {}", std::string(status.message()));
    }
  }

  void RecordStream(void* stream) {
    absl::MutexLock lock(&mutex_);
    if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) {
      streams_.push_back(stream);
    }
  }

 private:
  std::shared_ptr<transport::Receiver> receiver_;
  uint64_t lease_ = 0;
  absl::Mutex mutex_;
  std::vector<void*> streams_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<uint8_t[]> host_;
  std::optional<transport::CudaDeviceBuffer> device_;
};

// The client's state behind the public API: the ring (transport), the
// daemon's stubs (gRPC) and where the rank stands in the serving order.
class Client::Impl {
 public:
  explicit Impl(const ClientOptions& options) : options_(options) {}
  ~Impl() {  // Detaches (best effort) unless Detach() did.
    Detach().IgnoreError();
    EndReport();
  }

  // Opens the channel and the ring, and attaches at the options' start.
  absl::Status Open();
  absl::Status Detach();
  absl::StatusOr<StepInfo> NextStep(absl::Duration timeout);
  absl::StatusOr<Microbatch> Next(absl::Duration timeout, void* cuda_stream);
  ClientState State() const;
  TrainerTimes Times() const { return times_; }
  RingUse Ring() const {
    return {options_.slots, receiver_->stats().held, handed_out_, copied_out_};
  }
  struct Position {
    int64_t step = 0;
    int microbatch = 0;
  };
  // Counts a NextStep or Next call that began at `entered` as waiting, the
  // time since the previous one returned as busy (and, when the daemon
  // asks, as the compute of the microbatch that call handed out), and
  // reports them to the daemon when a report is due. `handed` is the
  // microbatch this call handed out, if any.
  void Measured(absl::Time entered, std::optional<Position> handed);
  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& device_ring_fallback() const { return device_ring_fallback_; }
  const ClientOptions& options() const { return options_; }
  MemoryKind memory_kind() const { return receiver_->memory_kind(); }
  int num_chunks() const { return num_chunks_; }

 private:
  struct Control {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Control::Stub> control;
    std::unique_ptr<WatchStream> watch;  // while attached
  };
  v1::RankTimes RankTimesNow() const;  // the current connection's figures
  void ReportTimes();                  // without waiting for the daemon's answer
  // Moves the microbatches measured since the last report into `out`.
  void TakeComputed(google::protobuf::RepeatedPtrField<v1::MicrobatchCompute>& out);
  void EndReport();  // cancels a report in flight and waits for it
  // The next slot, re-attaching once when the daemon went away.
  absl::StatusOr<transport::ReceivedSlot> Receive(absl::Duration timeout);
  // Attaches from start_step (or, on the first attach, the step beginning
  // at start_sample); resume_step_ is then where serving starts.
  absl::Status AttachAt(int64_t start_step, int start_microbatch,
                        std::optional<int64_t> start_sample = std::nullopt);
  // options_.slot_bytes, or else what the job needs, asked of the daemon.
  absl::StatusOr<uint64_t> SlotBytes() const;
  // Makes `receiver` a staged device ring instead of kDaemonDevice, and
  // records and logs `why`.
  void StageInstead(transport::ReceiverOptions& receiver, const absl::Status& why);
  // Hands the slot to the trainer: its own views, or a private copy when
  // the trainer holds every slot but this one.
  absl::StatusOr<Microbatch> HandOut(const transport::ReceivedSlot& slot, void* cuda_stream);
  void DropPending();  // gives a slot NextStep took back to the ring
  // Re-attaches after `cause` (Unavailable), trying until `give_up`;
  // returns `cause` when it does not apply (another code, or no time left).
  absl::Status Reattach(const absl::Status& cause, absl::Time give_up);

  const ClientOptions options_;
  std::unique_ptr<Control> control_;
  std::shared_ptr<transport::Receiver> receiver_;
  uint64_t handed_out_ = 0;  // microbatches Next returned
  uint64_t copied_out_ = 0;  // of those, private copies
  uint64_t connection_id_ = 0;
  std::string connection_key_;  // AttachReply's: what Detach, Report, Watch carry
  uint64_t slot_bytes_ = 0;
  // The Report call in flight (ReportTimes), freed once answered.
  struct ReportCall {
    grpc::ClientContext context;
    v1::ReportRequest request;
    v1::ReportReply reply;
    absl::Notification done;
  };
  std::unique_ptr<ReportCall> report_;
  std::string shared_token_;          // a ring Open shared, for the first attach
  std::string device_ring_fallback_;  // why kDaemonDevice was not had
  std::string fingerprint_;
  int num_chunks_ = 1;
  std::optional<transport::ReceivedSlot> pending_;  // a step's first slot, taken by NextStep
  std::optional<StepInfo> step_;
  int taken_ = 0;          // microbatches of step_ handed out
  int64_t next_step_ = 0;  // for State()
  // Where the ring begins after an attach inside a step: NextStep of that
  // step starts at this microbatch.
  int64_t resume_step_ = -1;
  int resume_microbatch_ = 0;
  TrainerTimes times_;
  // times_ and copied_out_ when the current connection began: the daemon is
  // told each connection's own figures and adds those of the connections
  // before it, so a re-attach counts nothing twice.
  TrainerTimes times_at_attach_;
  uint64_t copied_out_at_attach_ = 0;
  std::optional<absl::Time> returned_;  // when the last NextStep/Next returned
  absl::Time reported_ = absl::InfinitePast();
  // AttachReply.report_compute: the microbatch the trainer is computing
  // (handed out by the last call) and those measured since the last report.
  bool report_compute_ = false;
  std::optional<Position> computing_;
  struct Computed {
    Position position;
    double seconds;
  };
  std::deque<Computed> computed_;
};

// How often the trainer's times are reported while it takes microbatches.
constexpr absl::Duration kReportEvery = absl::Seconds(1);

namespace {

// The daemon as messages name it: its socket, or its address.
const std::string& DaemonName(const ClientOptions& options) {
  return options.daemon_address.empty() ? options.socket_path : options.daemon_address;
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// Calls `attempt` until it returns OK or a status `again` refuses, or
// `timeout` has passed; sleeps 0.1 s doubling to 2 s between attempts.
absl::Status RetryWithBackoff(absl::Duration timeout, const std::function<absl::Status()>& attempt,
                              const std::function<bool(const absl::Status&)>& again) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::Status status = attempt();
    if (status.ok() || !again(status) || absl::Now() + backoff > deadline) return status;
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
}

}  // namespace

void Microbatch::RecordStream(void* cuda_stream) const {
  if (lease_ != nullptr) lease_->RecordStream(cuda_stream);
}

void Microbatch::Release() {
  fields.clear();
  ready_event_ = nullptr;
  lease_.reset();
}

const FieldView* Microbatch::Field(absl::string_view name) const {
  for (const FieldView& field : fields) {
    if (field.name == name) return &field;
  }
  return nullptr;
}

Microbatch Microbatch::Chunk(int chunk) const {
  Microbatch out = *this;
  out.fields.clear();
  const std::string suffix = absl::StrCat("@", chunk);
  for (const FieldView& field : fields) {
    const size_t at = field.name.rfind('@');
    if (at == std::string::npos) {
      out.fields.push_back(field);
    } else if (absl::string_view(field.name).substr(at) == suffix) {
      out.fields.push_back(field);
      out.fields.back().name.resize(at);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Attach(const ClientOptions& options) {
  if (options.job.empty()) return absl::InvalidArgumentError("ClientOptions.job is required");
  UseReleaseMutexChecks();
  auto impl = std::make_unique<Impl>(options);
  PF_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;
absl::Status Client::Detach() { return impl_->Detach(); }
absl::StatusOr<StepInfo> Client::NextStep(absl::Duration timeout) {
  const absl::Time entered = absl::Now();
  absl::StatusOr<StepInfo> step = impl_->NextStep(timeout);
  impl_->Measured(entered, std::nullopt);
  return step;
}
absl::StatusOr<Microbatch> Client::Next(absl::Duration timeout, void* cuda_stream) {
  const absl::Time entered = absl::Now();
  absl::StatusOr<Microbatch> microbatch = impl_->Next(timeout, cuda_stream);
  impl_->Measured(entered, microbatch.ok() ? std::optional<Impl::Position>(Impl::Position{
                                                 microbatch->step, microbatch->microbatch})
                                           : std::nullopt);
  return microbatch;
}
ClientState Client::State() const { return impl_->State(); }
TrainerTimes Client::Times() const { return impl_->Times(); }
RingUse Client::Ring() const { return impl_->Ring(); }
const std::string& Client::fingerprint() const { return impl_->fingerprint(); }
const std::string& Client::DeviceRingFallback() const { return impl_->device_ring_fallback(); }
const ClientOptions& Client::options() const { return impl_->options(); }
MemoryKind Client::memory_kind() const { return impl_->memory_kind(); }
int Client::num_chunks() const { return impl_->num_chunks(); }

absl::Status Client::Impl::Open() {
  const ClientOptions& options = options_;
  const bool remote = !options.daemon_address.empty();
  if (remote && options.sharing == RingSharing::kFileDescriptor) {
    return absl::InvalidArgumentError(
        "a ring shared by file descriptor needs the daemon on this node, and daemon_address "
        "names one on another");
  }
  control_ = std::make_unique<Control>();
  Control& control = *control_;
  PF_ASSIGN_OR_RETURN(
      control.channel,
      OpenDaemonChannel({options.socket_path, options.daemon_address, options.tls_ca_file,
                         options.tls_cert_file, options.tls_key_file}));
  control.control = v1::Control::NewStub(control.channel);

  PF_ASSIGN_OR_RETURN(const uint64_t slot_bytes, SlotBytes());
  transport::ReceiverOptions receiver;
  receiver.ucx.transports = options.ucx_transports;
  receiver.slots = options.slots;
  receiver.slot_bytes = slot_bytes;
  receiver.placement = options.placement;
  receiver.cuda_device = options.cuda_device;
  struct stat socket_info {};
  const bool other_uid = !remote && stat(options.socket_path.c_str(), &socket_info) == 0 &&
                         socket_info.st_uid != geteuid();
  receiver.shared_by_fd =
      !remote &&
      (options.sharing == RingSharing::kFileDescriptor ||
       (options.sharing == RingSharing::kAuto && options.placement != RingPlacement::kDevice));
  // UCX's shared memory does not connect two uids: notifications go by TCP.
  if (receiver.shared_by_fd && other_uid && receiver.ucx.transports.empty()) {
    receiver.ucx.transports = "tcp";
  }
  // A daemon on another node writes device memory only by a UCX put, which
  // it keeps only where UCX carries it with GPUDirect RDMA (it checks).
  if (remote && options.placement == RingPlacement::kDaemonDevice) {
    receiver.placement = RingPlacement::kDevice;
  }
  absl::StatusOr<std::unique_ptr<transport::Receiver>> created =
      transport::Receiver::Create(receiver);
  if (!remote && options.placement == RingPlacement::kDaemonDevice && created.ok()) {
    // The daemon imports it now: a refusal (no such GPU visible to it, a
    // driver that will not) is the reason to stage, like any local one.
    absl::StatusOr<std::string> token =
        ShareRing(options.socket_path + ".rings", (*created)->ring_fd(), (*created)->ring_offer(),
                  options.attach_timeout);
    if (token.ok()) {
      shared_token_ = *std::move(token);
    } else {
      created = token.status();
    }
  }
  if (options.placement == RingPlacement::kDaemonDevice && !created.ok()) {
    StageInstead(receiver, created.status());
    created = transport::Receiver::Create(receiver);
  }
  if (!created.ok()) return created.status();
  receiver_ = *std::move(created);
  slot_bytes_ = slot_bytes;
  absl::Status attached =
      AttachAt(options.start_step, options.start_microbatch, options.start_sample);
  if (remote && absl::IsFailedPrecondition(attached) &&
      receiver.placement == RingPlacement::kDevice &&
      options.placement == RingPlacement::kDaemonDevice) {
    // The daemon found that UCX would emulate the put (no GPUDirect RDMA).
    // Any other refusal of this code comes back from the staged attach too.
    StageInstead(receiver, attached);
    receiver_ = nullptr;
    PF_ASSIGN_OR_RETURN(receiver_, transport::Receiver::Create(receiver));
    attached = AttachAt(options.start_step, options.start_microbatch, options.start_sample);
  }
  PF_RETURN_IF_ERROR(attached);
  next_step_ = resume_step_;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Client::Impl::SlotBytes() const {
  if (options_.slot_bytes != 0) return options_.slot_bytes;
  v1::DescribeRequest request;
  request.set_job(options_.job);
  request.set_auth_token(options_.auth_token);
  v1::DescribeReply reply;
  // The rank's first call. Once this node's socket exists it waits for the
  // daemon up to attach_timeout: a daemon still starting, or one on a
  // loaded node, answers late rather than never (16 ranks attaching at once
  // to a daemon under ASan on 2 cores met gRPC's 20 s connect timeout).
  // With no socket, or a daemon over TCP (whose refusals, a TLS handshake
  // among them, are final), it fails at once.
  grpc::ClientContext context;
  SetDeadline(context, options_.attach_timeout);
  context.set_wait_for_ready(options_.daemon_address.empty() &&
                             access(options_.socket_path.c_str(), F_OK) == 0);
  grpc::Status status = control_->control->Describe(&context, request, &reply);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    status = grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("nothing answered within ", absl::FormatDuration(options_.attach_timeout)));
  }
  PF_RETURN_IF_ERROR(
      DaemonCallStatus(status, absl::StrCat("describe job ", options_.job), DaemonName(options_)));
  return reply.required_slot_bytes();
}

void Client::Impl::StageInstead(transport::ReceiverOptions& receiver, const absl::Status& why) {
  // Said out loud: here, in the daemon's log and stats (RankStats), and by
  // DeviceRingFallback().
  device_ring_fallback_ = std::string(why.message());
  transport::Logger().warn("a staged device ring, not one the daemon writes: {}",
                           device_ring_fallback_);
  receiver.placement = RingPlacement::kStagedDevice;
}

absl::Status Client::Impl::AttachAt(int64_t start_step, int start_microbatch,
                                    std::optional<int64_t> start_sample) {
  v1::AttachRequest request;
  request.set_job(options_.job);
  request.set_global_rank(static_cast<uint32_t>(options_.global_rank));
  // Once attached, the fingerprint is pinned: a daemon restarted with
  // another configuration is refused on re-attach.
  request.set_fingerprint(fingerprint_.empty() ? options_.fingerprint : fingerprint_);
  request.set_auth_token(options_.auth_token);
  request.set_worker_address(receiver_->worker_address());
  request.mutable_ring()->set_slots(options_.slots);
  request.mutable_ring()->set_slot_bytes(slot_bytes_);
  request.mutable_ring()->set_ring_descriptor(receiver_->ring_descriptor());
  if (!shared_token_.empty()) {
    // Shared by Open (a device ring, to learn whether the daemon takes it).
    request.mutable_ring()->set_shared_ring_token(std::exchange(shared_token_, ""));
  } else if (receiver_->ring_fd() >= 0) {
    PF_ASSIGN_OR_RETURN(std::string token,
                        ShareRing(options_.socket_path + ".rings", receiver_->ring_fd(),
                                  receiver_->ring_offer(), options_.attach_timeout));
    request.mutable_ring()->set_shared_ring_token(token);
  }
  request.mutable_ring()->set_device_ring_fallback(device_ring_fallback_);
  request.set_start_step(start_step);
  request.set_start_microbatch(static_cast<uint32_t>(start_microbatch));
  // This process's own connection, to rewind it over TCP; the admin token,
  // for a new process that must.
  request.set_previous_connection_key(connection_key_);
  request.set_admin_token(options_.admin_token);
  if (start_sample.has_value()) request.set_start_sample(*start_sample);
  // Elastic only for the first attach: a re-attach is to the same job.
  request.set_elastic(options_.elastic && fingerprint_.empty());
  v1::AttachReply reply;
  grpc::ClientContext context;
  SetDeadline(context, options_.attach_timeout);
  PF_RETURN_IF_ERROR(
      DaemonCallStatus(control_->control->Attach(&context, request, &reply),
                       absl::StrCat("attach job ", options_.job, " rank ", options_.global_rank),
                       DaemonName(options_)));
  absl::StatusOr<transport::ConnectionKey> key = transport::KeyFromBytes(reply.connection_key());
  if (!key.ok()) {
    return absl::InternalError(absl::StrCat("attach job ", options_.job, " rank ",
                                            options_.global_rank, ": the daemon's reply has no ",
                                            "connection key: ", key.status().message()));
  }
  PF_RETURN_IF_ERROR(receiver_->Connect(reply.sender_address(), reply.connection_id(), *key));
  connection_id_ = reply.connection_id();
  connection_key_ = reply.connection_key();
  v1::WatchRequest watch;
  watch.set_job(options_.job);
  watch.set_global_rank(static_cast<uint32_t>(options_.global_rank));
  watch.set_connection_id(connection_id_);
  watch.set_connection_key(connection_key_);
  control_->watch.reset();
  control_->watch = std::make_unique<WatchStream>(*control_->control, std::move(watch));
  fingerprint_ = reply.fingerprint();
  times_at_attach_ = times_;
  copied_out_at_attach_ = copied_out_;
  report_compute_ = reply.report_compute();
  computing_.reset();
  computed_.clear();
  num_chunks_ = std::max<int>(1, static_cast<int>(reply.vpp()));
  resume_step_ = reply.start_step();
  resume_microbatch_ = start_microbatch;
  return absl::OkStatus();
}

absl::Status Client::Impl::Reattach(const absl::Status& cause, absl::Time give_up) {
  const absl::Duration left = give_up - absl::Now();
  if (cause.code() != absl::StatusCode::kUnavailable || left <= absl::ZeroDuration()) {
    return cause;
  }
  // NextStep fails between steps (resume at the next one); Next fails inside
  // a step whose first `taken_` microbatches the trainer already has.
  const bool in_step = step_.has_value() && taken_ < step_->num_microbatches;
  const int64_t step = in_step ? step_->step : next_step_;
  const int skip = in_step ? taken_ : 0;
  DropPending();
  connection_id_ = 0;  // that daemon is gone: nothing to detach from
  control_->watch.reset();
  // It may have died inside a write to the worker's shared-memory FIFO.
  PF_RETURN_IF_ERROR(receiver_->RenewWorker());
  absl::Status attached = RetryWithBackoff(
      left, [&] { return AttachAt(step, skip); }, [](const absl::Status&) { return true; });
  if (!attached.ok()) {
    return absl::UnavailableError(absl::StrCat(cause.message(), "; re-attaching for ",
                                               absl::FormatDuration(left),
                                               " failed: ", attached.message()));
  }
  // The plan is deterministic: the daemon serves from microbatch `skip` of
  // `step` on, bit-identical to what the lost connection would have sent.
  return absl::OkStatus();
}

absl::Status Client::Impl::Detach() {
  if (control_ == nullptr || connection_id_ == 0) return absl::OkStatus();
  v1::DetachRequest request;
  request.set_job(options_.job);
  request.set_global_rank(static_cast<uint32_t>(options_.global_rank));
  request.set_connection_id(std::exchange(connection_id_, 0));
  request.set_connection_key(connection_key_);
  const ClientState state = State();
  request.mutable_consumed_to()->set_step(state.next_step);
  request.mutable_consumed_to()->set_microbatch(static_cast<uint32_t>(state.next_microbatch));
  request.set_ring_slots(options_.slots);
  *request.mutable_times() = RankTimesNow();
  TakeComputed(*request.mutable_computed());
  // A daemon that is away (restarting) is waited for a while: what this rank
  // took from its ring after the daemon died reaches the ledger only this way.
  absl::Status detached = RetryWithBackoff(
      std::min(options_.reconnect_timeout, options_.detach_timeout),
      [&] {
        v1::DetachReply reply;
        grpc::ClientContext context;
        SetDeadline(context, absl::Seconds(2));
        absl::Status status = DaemonCallStatus(
            control_->control->Detach(&context, request, &reply),
            absl::StrCat("detach job ", options_.job, " rank ", options_.global_rank),
            DaemonName(options_));
        if ((absl::IsNotFound(status) || absl::IsPermissionDenied(status)) &&
            request.auth_token().empty() && !options_.auth_token.empty()) {
          // A daemon restarted since the attach knows no key of this rank's:
          // the job's token proves it then, and what it consumed counts.
          request.set_auth_token(options_.auth_token);
          return absl::UnavailableError(status.message());  // retried with it
        }
        return status;
      },
      [](const absl::Status& status) { return absl::IsUnavailable(status); });
  // After the detach: the stream's end is then no news to the daemon.
  control_->watch.reset();
  return detached;
}

void Client::Impl::Measured(absl::Time entered, std::optional<Position> handed) {
  const absl::Time now = absl::Now();
  if (returned_.has_value()) times_.busy += entered - *returned_;
  if (report_compute_ && computing_.has_value() && returned_.has_value()) {
    constexpr size_t kMostComputed = 1024;  // ReportRequest.computed's bound
    if (computed_.size() == kMostComputed) computed_.pop_front();
    computed_.push_back({*computing_, absl::ToDoubleSeconds(entered - *returned_)});
  }
  computing_ = handed;
  times_.waited += now - entered;
  ++times_.calls;
  returned_ = now;
  if (now - reported_ >= kReportEvery) {
    reported_ = now;
    ReportTimes();
  }
}

v1::RankTimes Client::Impl::RankTimesNow() const {
  v1::RankTimes times;
  times.set_wait_seconds(absl::ToDoubleSeconds(times_.waited - times_at_attach_.waited));
  times.set_busy_seconds(absl::ToDoubleSeconds(times_.busy - times_at_attach_.busy));
  times.set_calls(times_.calls - times_at_attach_.calls);
  times.set_copied_out(copied_out_ - copied_out_at_attach_);
  return times;
}

void Client::Impl::TakeComputed(google::protobuf::RepeatedPtrField<v1::MicrobatchCompute>& out) {
  for (const Computed& computed : computed_) {
    v1::MicrobatchCompute& row = *out.Add();
    row.set_step(computed.position.step);
    row.set_microbatch(static_cast<uint32_t>(computed.position.microbatch));
    row.set_seconds(static_cast<float>(computed.seconds));
  }
  computed_.clear();
}

void Client::Impl::ReportTimes() {
  if (control_ == nullptr || connection_id_ == 0) return;
  // One report at a time; one due while the last is on its way is skipped
  // (reports are sums: the next carries it). The call is freed here or by
  // EndReport, never inside gRPC's callback: a ClientContext destroyed in
  // its own completion aborted the process under load (gRPC 1.51,
  // "ref_counted.h: prior > 0", when the daemon had been killed).
  if (report_ != nullptr) {
    if (!report_->done.HasBeenNotified()) return;
    report_.reset();
  }
  report_ = std::make_unique<ReportCall>();
  SetDeadline(report_->context, absl::Seconds(5));
  report_->request.set_job(options_.job);
  report_->request.set_global_rank(static_cast<uint32_t>(options_.global_rank));
  report_->request.set_connection_id(connection_id_);
  report_->request.set_connection_key(connection_key_);
  *report_->request.mutable_times() = RankTimesNow();
  TakeComputed(*report_->request.mutable_computed());
  ReportCall* call = report_.get();
  control_->control->async()->Report(&call->context, &call->request, &call->reply,
                                     [call](grpc::Status) { call->done.Notify(); });
}

void Client::Impl::EndReport() {
  if (report_ == nullptr) return;
  report_->context.TryCancel();
  report_->done.WaitForNotification();
  report_.reset();
}

absl::StatusOr<transport::ReceivedSlot> Client::Impl::Receive(absl::Duration timeout) {
  absl::StatusOr<transport::ReceivedSlot> slot = receiver_->Next(timeout);
  // A restarted daemon may die again before its first slot arrives (the
  // soak test kills daemons every second or so): re-attach again, as long as
  // reconnect_timeout allows from the first failure. 0: at once Unavailable.
  const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
  while (!slot.ok() && absl::IsUnavailable(slot.status()) && absl::Now() < give_up) {
    PF_RETURN_IF_ERROR(Reattach(slot.status(), give_up));
    slot = receiver_->Next(timeout);
  }
  return slot;
}

void Client::Impl::DropPending() {
  if (!pending_.has_value()) return;
  receiver_->Release(pending_->lease).IgnoreError();
  pending_.reset();
}

absl::StatusOr<StepInfo> Client::Impl::NextStep(absl::Duration timeout) {
  if (step_.has_value() && taken_ < step_->num_microbatches) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step_->step, ": ", taken_, " of ", step_->num_microbatches,
                     " microbatches taken; take them all before the next step"));
  }
  if (!pending_.has_value()) {
    PF_ASSIGN_OR_RETURN(transport::ReceivedSlot slot, Receive(timeout));
    pending_ = std::move(slot);
  }
  v1::SlotMetadata metadata;
  // The first microbatch of a step, or, right after an attach inside a
  // step, the one it resumed at.
  const uint32_t first =
      pending_->step == resume_step_ ? static_cast<uint32_t>(resume_microbatch_) : 0;
  if (!metadata.ParseFromString(pending_->inline_metadata) || metadata.microbatch() != first ||
      metadata.num_microbatches() <= first || metadata.step() != pending_->step ||
      pending_->microbatch != first) {
    const absl::Status error = absl::DataLossError(
        absl::StrCat("slot ", pending_->seq, ": expected microbatch ", first, " of step ",
                     pending_->step, ", received microbatch ", pending_->microbatch));
    DropPending();
    return error;
  }
  StepInfo info;
  info.step = metadata.step();
  info.num_microbatches = static_cast<int>(metadata.num_microbatches());
  info.first_microbatch = static_cast<int>(first);
  info.padded_sum = metadata.padded_sum();
  info.padded_squared_sum = metadata.padded_squared_sum();
  info.real_sum = metadata.real_sum();
  info.real_squared_sum = metadata.real_squared_sum();
  step_ = info;
  taken_ = static_cast<int>(first);
  next_step_ = info.step;
  resume_step_ = -1;
  return info;
}

absl::StatusOr<Microbatch> Client::Impl::Next(absl::Duration timeout, void* cuda_stream) {
  if (!step_.has_value() || taken_ >= step_->num_microbatches) {
    return absl::OutOfRangeError("no microbatch left in this step; call NextStep()");
  }
  transport::ReceivedSlot slot;
  if (pending_.has_value()) {
    slot = *std::move(pending_);
    pending_.reset();
  } else {
    PF_ASSIGN_OR_RETURN(slot, Receive(timeout));
  }
  if (slot.step != step_->step || static_cast<int>(slot.microbatch) != taken_) {
    receiver_->Release(slot.lease).IgnoreError();
    return absl::DataLossError(absl::StrCat("expected step ", step_->step, " microbatch ", taken_,
                                            ", received step ", slot.step, " microbatch ",
                                            slot.microbatch));
  }
  ++taken_;
  if (taken_ == step_->num_microbatches) next_step_ = step_->step + 1;
  return HandOut(slot, cuda_stream);
}

absl::StatusOr<Microbatch> Client::Impl::HandOut(const transport::ReceivedSlot& slot,
                                                 void* cuda_stream) {
  Microbatch out;
  out.step = slot.step;
  out.microbatch = static_cast<int>(slot.microbatch);
  out.num_microbatches = step_->num_microbatches;
  out.memory_kind = receiver_->memory_kind();
  out.ready_event_ = slot.ready_event;
  // A device ring the daemon writes: its small fields' bytes ride in the
  // metadata, readable without waiting for the device.
  v1::SlotMetadata metadata;
  if (out.memory_kind == MemoryKind::kCuda && slot.ready_event == nullptr) {
    metadata.ParseFromString(slot.inline_metadata);
  }
  for (const transport::FieldView& field : slot.fields) {
    const auto small = metadata.small_fields().find(field.descriptor.name);
    out.fields.push_back({field.descriptor.name, field.descriptor.type, field.descriptor.shape,
                          field.data, field.descriptor.bytes,
                          field.host_copy.empty() && small != metadata.small_fields().end()
                              ? small->second
                              : field.host_copy});
  }
  ++handed_out_;
  absl::Status waits = receiver_->StreamWaitsFor(slot, cuda_stream);
  // The daemon must keep a slot to fill: the receiver counts this one held
  // already, so with all of them held the trainer would wait forever.
  if (!waits.ok() || receiver_->stats().held < options_.slots) {
    // Before any return: the lease is what gives the slot back.
    out.lease_ = std::make_shared<MicrobatchLease>(receiver_, slot.lease, cuda_stream);
    PF_RETURN_IF_ERROR(waits);
    return out;
  }
  uint64_t extent = 0;
  for (const transport::FieldView& field : slot.fields) {
    extent = std::max(extent, field.descriptor.offset + field.descriptor.bytes);
  }
  std::unique_ptr<uint8_t[]> host;
  std::optional<transport::CudaDeviceBuffer> device;
  uint8_t* base = nullptr;
  absl::Status copied;
  if (out.memory_kind == MemoryKind::kCuda) {
    absl::StatusOr<transport::CudaDeviceBuffer> buffer =
        transport::CudaDeviceBuffer::Allocate(options_.cuda_device, std::max<uint64_t>(extent, 1));
    copied = buffer.status();
    if (buffer.ok()) base = static_cast<uint8_t*>(device.emplace(*std::move(buffer)).data());
  } else {
    // new[] aligns to 16 bytes, more than any element type needs.
    host.reset(new uint8_t[std::max<uint64_t>(extent, 1)]);
    base = host.get();
  }
  for (size_t i = 0; copied.ok() && i < slot.fields.size(); ++i) {
    const transport::FieldDescriptor& field = slot.fields[i].descriptor;
    if (out.memory_kind == MemoryKind::kCuda) {
      copied = transport::CudaCopyAsync(base + field.offset, slot.fields[i].data, field.bytes,
                                        cuda_stream);
    } else {
      std::memcpy(base + field.offset, slot.fields[i].data, field.bytes);
    }
    out.fields[i].data = base + field.offset;
  }
  // The copy was queued on cuda_stream: the device buffer waits for it.
  void* const streams[] = {cuda_stream};
  PF_RETURN_IF_ERROR(receiver_->Release(slot.lease, streams));
  PF_RETURN_IF_ERROR(copied);
  out.ready_event_ = nullptr;
  out.copied_out = true;
  out.lease_ = std::make_shared<MicrobatchLease>(std::move(host), std::move(device));
  ++copied_out_;
  return out;
}

ClientState Client::Impl::State() const {
  const bool in_step = step_.has_value() && taken_ < step_->num_microbatches;
  if (in_step) return {options_.job, fingerprint_, step_->step, taken_};
  // Not inside a step: where the ring begins (a mid-step attach not yet
  // begun by NextStep) or the next step.
  if (resume_step_ == next_step_)
    return {options_.job, fingerprint_, next_step_, resume_microbatch_};
  return {options_.job, fingerprint_, next_step_, 0};
}

}  // namespace packfeed::client
