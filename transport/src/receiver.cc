#include "packfeed/transport/receiver.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/transport_logger.h"

namespace packfeed::transport {

namespace {
// How often released slots of a device ring the daemon writes are checked
// while their readers' streams have not passed them.
constexpr absl::Duration kDrainPoll = absl::Microseconds(200);
}  // namespace

absl::StatusOr<std::unique_ptr<Receiver>> Receiver::Create(const ReceiverOptions& requested) {
  ReceiverOptions options = requested;
  // Every slot starts aligned, so the fields inside it (aligned within the
  // slot by LayoutFields) are aligned in memory.
  if (options.slot_bytes <= UINT64_MAX - kFieldAlignment) {
    options.slot_bytes =
        (options.slot_bytes + kFieldAlignment - 1) / kFieldAlignment * kFieldAlignment;
  }
  if (options.slots == 0 || options.slots > kMaxSlots || options.slot_bytes == 0 ||
      options.slot_bytes > UINT64_MAX / options.slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ring of ", options.slots, " slots of ", options.slot_bytes,
        " bytes: both must be positive, at most ", kMaxSlots, " slots, their product fit 64 bits"));
  }
  PF_ASSIGN_OR_RETURN(UcpContext context, UcpContext::Create(options.ucx));
  PF_ASSIGN_OR_RETURN(UcpWorker worker, UcpWorker::Create(context));
  std::unique_ptr<Receiver> receiver(new Receiver(options, std::move(context), std::move(worker)));
  PF_RETURN_IF_ERROR(receiver->CreateRing());
  PF_RETURN_IF_ERROR(receiver->RouteMessages(receiver->worker_));
  receiver->progress_thread_ = std::thread(&Receiver::ProgressLoop, receiver.get());
  return receiver;
}

Receiver::Receiver(ReceiverOptions options, UcpContext context, UcpWorker worker)
    : options_(std::move(options)), context_(std::move(context)), worker_(std::move(worker)) {}

Receiver::~Receiver() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
  }
  Wake();
  if (progress_thread_.joinable()) progress_thread_.join();
}

absl::Status Receiver::RouteMessages(UcpWorker& worker) {
  PF_RETURN_IF_ERROR(worker.SetMessageHandler(kActiveMessageId, &Receiver::OnActiveMessage, this));
  return worker.SetMessageHandler(kSlotDataMessageId, &Receiver::OnSlotDataMessage, this);
}

std::string Receiver::worker_address() const {
  absl::MutexLock lock(&worker_mutex_);
  return EncodeWorkerAddress(worker_.address());
}

void Receiver::Wake() {
  absl::MutexLock lock(&worker_mutex_);
  worker_.Signal();
}

absl::Status Receiver::RenewWorker() {
  return RunOnProgressThread([this]() -> absl::Status {
    CloseEndpoint();
    {
      absl::MutexLock lock(&mutex_);
      connected_ = false;
    }
    PF_ASSIGN_OR_RETURN(UcpWorker fresh, UcpWorker::Create(context_));
    PF_RETURN_IF_ERROR(RouteMessages(fresh));
    absl::MutexLock lock(&worker_mutex_);
    std::swap(worker_, fresh);
    return absl::OkStatus();  // the old worker goes here, on its own thread
  });
}

absl::Status Receiver::CreateRing() {
  const uint64_t length = options_.slots * options_.slot_bytes;
  const int devices = CudaDeviceCount();
  const bool device_ring_possible =
      devices > options_.cuda_device && context_.supports_cuda_memory();
  if (options_.placement == RingPlacement::kStagedDevice && devices <= options_.cuda_device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a staged device ring needs CUDA device ", options_.cuda_device, " (found ", devices, ")"));
  }
  if (options_.placement == RingPlacement::kDevice && !device_ring_possible) {
    return absl::FailedPreconditionError(
        absl::StrCat("a device ring needs CUDA device ", options_.cuda_device, " (found ", devices,
                     ") and a UCX built with CUDA (UCX ", UcpContext::LibraryVersion(), ": ",
                     context_.supports_cuda_memory() ? "has CUDA" : "no CUDA", ")"));
  }
  if (options_.shared_by_fd && options_.placement == RingPlacement::kDevice) {
    return absl::InvalidArgumentError("a ring shared by file descriptor is host memory");
  }
  if (options_.placement == RingPlacement::kDaemonDevice) {
    PF_ASSIGN_OR_RETURN(ExportedDeviceMemory memory,
                        ExportedDeviceMemory::Create(options_.cuda_device, length));
    exported_ring_.emplace(std::move(memory));
    ring_base_ = exported_ring_->data();
    memory_kind_ = MemoryKind::kCuda;
  } else if (options_.placement == RingPlacement::kDevice) {
    PF_ASSIGN_OR_RETURN(CudaDeviceBuffer buffer,
                        CudaDeviceBuffer::Allocate(options_.cuda_device, length));
    device_ring_.emplace(std::move(buffer));
    PF_ASSIGN_OR_RETURN(
        MemoryRegion region,
        MemoryRegion::Register(context_.get(), device_ring_->data(), length, UCS_MEMORY_TYPE_CUDA));
    ring_.emplace(std::move(region));
    ring_base_ = static_cast<uint8_t*>(ring_->address());
    memory_kind_ = MemoryKind::kCuda;
  } else {
    if (options_.shared_by_fd) {
      PF_ASSIGN_OR_RETURN(SharedRing shared, SharedRing::Create(length));
      shared_ring_.emplace(std::move(shared));
      ring_base_ = shared_ring_->data();
    } else {
      PF_ASSIGN_OR_RETURN(MemoryRegion region, MemoryRegion::Allocate(context_.get(), length));
      ring_.emplace(std::move(region));
      ring_base_ = static_cast<uint8_t*>(ring_->address());
    }
    // Touch every page now, so no write pays for page faults later.
    std::memset(ring_base_, 0, length);
    if (devices > 0) {
      absl::StatusOr<CudaHostRegistration> registration =
          CudaHostRegistration::Register(ring_base_, length);
      if (registration.ok()) {
        host_registration_.emplace(std::move(*registration));
      } else {
        Logger().warn("host ring not page-locked, device copies will be synchronous: {}",
                      std::string(registration.status().message()));
      }
    }
    if (options_.placement == RingPlacement::kStagedDevice) {
      PF_ASSIGN_OR_RETURN(
          copier_,
          CudaSlotCopier::Create(
              options_.cuda_device, options_.slots, options_.slot_bytes, options_.cuda_copy_stream,
              [](void* self) { static_cast<Receiver*>(self)->Wake(); }, this));
      absl::MutexLock lock(&mutex_);
      device_busy_.assign(options_.slots, false);
    }
  }
  {
    absl::MutexLock lock(&mutex_);
    occupied_.assign(options_.slots, false);
  }
  std::string key;  // none for a shared ring: its descriptor travels apart
  if (ring_.has_value()) {
    PF_ASSIGN_OR_RETURN(key, ring_->PackRemoteKey());
  }
  ring_descriptor_ =
      EncodeRingDescriptor({options_.slots, options_.slot_bytes,
                            reinterpret_cast<uint64_t>(ring_base_), memory_kind_, std::move(key)});
  return absl::OkStatus();
}

int Receiver::ring_fd() const {
  if (exported_ring_.has_value()) return exported_ring_->fd();
  return shared_ring_.has_value() ? shared_ring_->fd() : -1;
}

RingOffer Receiver::ring_offer() const {
  if (exported_ring_.has_value()) return {exported_ring_->size(), exported_ring_->gpu_uuid()};
  return {ring_bytes(), ""};
}

absl::Status Receiver::Connect(absl::string_view sender_address, uint64_t connection_id,
                               const ConnectionKey& key) {
  absl::StatusOr<std::string> decoded = DecodeWorkerAddress(sender_address);
  if (!decoded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sender worker address: ", decoded.status().message()));
  }
  std::string address = *std::move(decoded);
  return RunOnProgressThread(
      [this, &address, connection_id, &key] { return Reconnect(address, connection_id, key); });
}

absl::Status Receiver::RunOnProgressThread(std::function<absl::Status()> task) {
  absl::Status result;
  bool done = false;
  {
    absl::MutexLock lock(&mutex_);
    tasks_.push_back([&] {
      absl::Status status = task();
      absl::MutexLock inner(&mutex_);
      result = std::move(status);
      done = true;
    });
  }
  Wake();
  absl::MutexLock lock(&mutex_);
  mutex_.Await(absl::Condition(&done));
  return result;
}

void Receiver::ProgressLoop() {
  absl::Time last_activity = absl::Now();
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mutex_);
      if (stop_) break;
      tasks.swap(tasks_);
    }
    for (std::function<void()>& task : tasks) task();
    // Every step runs each round: no short-circuit.
    const bool staged = StageArrived();
    bool draining = false;
    const bool drained = DrainReleased(draining);
    const bool sent_credit = SendCredit();
    const bool progressed = worker_.Progress();
    const bool busy = !tasks.empty() || staged || drained || sent_credit || progressed;
    CloseFailedEndpoint();
    const absl::Time now = absl::Now();
    if (busy) {
      last_activity = now;
    } else if (now - last_activity >= options_.spin) {
      // Released slots waiting for their readers' streams are polled often:
      // the daemon gets them back soon after the trainer's kernels pass.
      worker_.ProgressOrWait(draining ? std::min(options_.idle_wakeup, kDrainPoll)
                                      : options_.idle_wakeup);
      last_activity = absl::Now();
    }
  }
  CloseEndpoint();  // force-closes on the worker's own thread
}

absl::Status Receiver::Reconnect(const std::string& sender_address, uint64_t connection_id,
                                 const ConnectionKey& key) {
  CloseEndpoint();
  {
    absl::MutexLock lock(&mutex_);
    connected_ = false;
    connection_id_ = connection_id;
    key_ = key;
    failure_ = absl::OkStatus();
    // What the old sender announced and the trainer never took is dropped;
    // what the trainer holds stays occupied until released.
    if (copier_ == nullptr) {
      for (const ReceivedSlot& slot : ready_) occupied_[slot.slot] = false;
    }
    ResetStaging();
    ready_.clear();
    received_ = handed_out_ = released_ = 0;
  }
  PF_ASSIGN_OR_RETURN(UcpEndpoint endpoint, UcpEndpoint::Connect(worker_, sender_address,
                                                                 &Receiver::OnEndpointError, this));
  endpoint_.emplace(std::move(endpoint));
  Logger().debug("connection {} accepted; lanes: {}", connection_id, endpoint_->TransportSummary());
  {
    absl::MutexLock lock(&mutex_);
    connected_ = true;
  }
  // The first credit tells the sender the ring is ready: it holds no credit
  // before, so it cannot notify a receiver that would drop the notification
  // as being of an unknown connection.
  credit_sent_.reset();
  SendCredit();
  absl::MutexLock lock(&mutex_);
  return failure_;
}

bool Receiver::SendCredit() {
  // One credit message in flight at a time; it is never waited for here, so
  // a sender that is slow to progress (TCP wire-up) blocks nobody.
  if (credit_request_ != nullptr) {
    const ucs_status_t status = ucp_request_check_status(credit_request_);
    if (status == UCS_INPROGRESS) return false;
    ucp_request_free(std::exchange(credit_request_, nullptr));
    if (status != UCS_OK) {
      absl::MutexLock lock(&mutex_);
      FailConnection(absl::UnavailableError(absl::StrCat(
          "connection ", connection_id_, ": sender failed (", ucs_status_string(status), ")")));
      return false;
    }
  }
  Credit credit;
  {
    absl::MutexLock lock(&mutex_);
    if (!connected_ || !failure_.ok()) return false;
    credit = CreditNow();
  }
  if (credit == credit_sent_) return false;
  const uint64_t connection_id = credit.connection_id;
  credit_message_ = EncodeMessage(credit);
  ucs_status_ptr_t request = endpoint_->SendEager(kActiveMessageId, credit_message_);
  credit_sent_ = std::move(credit);
  if (UCS_PTR_IS_ERR(request)) {
    absl::MutexLock lock(&mutex_);
    FailConnection(absl::UnavailableError(
        absl::StrCat("connection ", connection_id,
                     ": sending a credit: ", ucs_status_string(UCS_PTR_STATUS(request)))));
  } else if (request != nullptr) {
    credit_request_ = request;
  }
  return true;
}

Credit Receiver::CreditNow() const {
  Credit credit{connection_id_, received_, handed_out_, released_, {}, key_};
  credit.free_slots.assign((options_.slots + 63) / 64, 0);
  for (uint32_t slot = 0; slot < options_.slots; ++slot) {
    if (!occupied_[slot]) credit.set_free(slot);
  }
  return credit;
}

void Receiver::DropCreditRequest() {
  if (credit_request_ == nullptr) return;
  // Closing the endpoint has completed it (with an error): just free it.
  while (ucp_request_check_status(credit_request_) == UCS_INPROGRESS) {
    ucp_worker_progress(worker_.get());
  }
  ucp_request_free(std::exchange(credit_request_, nullptr));
}

void Receiver::CloseFailedEndpoint() {
  {
    absl::MutexLock lock(&mutex_);
    if (failure_.ok()) return;
  }
  CloseEndpoint();
}

void Receiver::CloseEndpoint() {
  endpoint_.reset();
  DropCreditRequest();
}

void Receiver::FailConnection(absl::Status cause) {
  if (!failure_.ok()) return;
  failure_ = std::move(cause);
  Logger().warn("{}", std::string(failure_.message()));
}

absl::StatusOr<ReceivedSlot> Receiver::Next(absl::Duration timeout) {
  absl::StatusOr<ReceivedSlot> next;
  {
    absl::MutexLock lock(&mutex_);
    auto news = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return !ready_.empty() || !failure_.ok() || !connected_;
    };
    mutex_.AwaitWithTimeout(absl::Condition(&news), timeout);
    if (ready_.empty()) {
      if (!connected_) return absl::FailedPreconditionError("not connected to a sender");
      if (!failure_.ok()) return failure_;
      return absl::DeadlineExceededError(
          absl::StrCat("no slot within ", absl::FormatDuration(timeout)));
    }
    next = std::move(ready_.front());
    ready_.pop_front();
    ++handed_out_;
    next->lease = next_lease_++;
    held_[next->lease] = Held{copier_ != nullptr ? next->device_slot : next->slot, connection_id_};
  }
  // No wake-up: the progress thread sends the new count with the next
  // release, or at its idle wake-up (`idle_wakeup`) at the latest; the ledger
  // can wait that long, Next's latency should not pay for it.
  return next;
}

bool Receiver::DrainReleased(bool& pending) {
  if (!exported_ring_.has_value()) return false;
  absl::MutexLock lock(&mutex_);
  bool freed = false;
  for (auto it = draining_.begin(); it != draining_.end();) {
    absl::StatusOr<bool> passed = it->second.Passed();
    if (!passed.ok()) {
      FailConnection(absl::InternalError(
          absl::StrCat("slot ", it->first, ": its readers' streams: ", passed.status().message())));
      return true;
    }
    if (!*passed) {
      ++it;
      continue;
    }
    occupied_[it->first] = false;
    it = draining_.erase(it);
    freed = true;
  }
  pending = !draining_.empty();
  return freed;
}

bool Receiver::StageArrived() {
  if (copier_ == nullptr) return false;
  bool progressed = false;
  absl::MutexLock lock(&mutex_);
  while (!copying_.empty()) {
    const auto [device_slot, host_slot] = copying_.front();
    absl::StatusOr<bool> done = copier_->Copied(device_slot);
    if (!done.ok()) {
      FailConnection(absl::InternalError(absl::StrCat(
          "connection ", connection_id_, ": copy to the device: ", done.status().message())));
      return true;
    }
    if (!*done) break;
    copying_.pop_front();
    occupied_[host_slot] = false;  // the host slot is free once copied
    ++copied_;
    progressed = true;
  }
  while (!arrived_.empty() && failure_.ok()) {
    const auto free_buffer = std::find(device_busy_.begin(), device_busy_.end(), false);
    if (free_buffer == device_busy_.end()) break;
    const auto device_slot = static_cast<uint32_t>(free_buffer - device_busy_.begin());
    ReceivedSlot& slot = arrived_.front();
    const uint8_t* host = ring_base_ + slot.slot * options_.slot_bytes;
    uint64_t extent = 0;
    for (const FieldView& field : slot.fields) {
      extent = std::max(extent, field.descriptor.offset + field.descriptor.bytes);
    }
    absl::Status copying = copier_->Copy(device_slot, host, extent);
    if (!copying.ok()) {
      FailConnection(absl::InternalError(absl::StrCat(
          "connection ", connection_id_, ": copy to the device: ", copying.message())));
      return true;
    }
    for (FieldView& field : slot.fields) {
      if (field.descriptor.bytes <= kHostCopyBytes) {
        field.host_copy.assign(reinterpret_cast<const char*>(field.data), field.descriptor.bytes);
      }
      field.data = copier_->slot(device_slot) + field.descriptor.offset;
    }
    slot.device_slot = device_slot;
    slot.ready_event = copier_->copied_event(device_slot);
    device_busy_[device_slot] = true;
    copying_.emplace_back(device_slot, slot.slot);
    ready_.push_back(std::move(slot));
    arrived_.pop_front();
    progressed = true;
  }
  return progressed;
}

void Receiver::ResetStaging() {
  if (copier_ == nullptr) return;
  // The new sender starts with every host slot free: the copies still
  // reading them must finish first.
  for (const auto& [device_slot, host_slot] : copying_) {
    absl::StatusOr<bool> done;
    while ((done = copier_->Copied(device_slot)).ok() && !*done)
      absl::SleepFor(absl::Microseconds(20));
  }
  copying_.clear();
  copied_ = 0;
  arrived_.clear();
  occupied_.assign(options_.slots, false);
  // Device buffers copied into and never handed out are free; those the
  // trainer holds stay its own until released.
  for (const ReceivedSlot& slot : ready_) device_busy_[slot.device_slot] = false;
}

absl::Status Receiver::StreamWaitsFor(const ReceivedSlot& slot, void* cuda_stream) const {
  if (copier_ == nullptr) return absl::OkStatus();
  return copier_->WaitCopied(slot.device_slot, cuda_stream);
}

absl::Status Receiver::Release(uint64_t lease, absl::Span<void* const> cuda_streams) {
  {
    absl::MutexLock lock(&mutex_);
    auto it = held_.find(lease);
    if (it == held_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("release of lease ", lease, ": not held (released before?)"));
    }
    const Held held = it->second;
    held_.erase(it);
    if (held.connection_id == connection_id_) ++released_;
    if (copier_ != nullptr) {
      device_busy_[held.slot] = false;
      PF_RETURN_IF_ERROR(copier_->Consumed(held.slot, cuda_streams));
    } else if (exported_ring_.has_value()) {
      absl::StatusOr<CudaStreamMarks> marks =
          CudaStreamMarks::Record(options_.cuda_device, cuda_streams);
      if (!marks.ok()) {
        // Not knowing when the streams are done, the slot stays taken:
        // the daemon must not overwrite what a kernel may still read.
        FailConnection(absl::InternalError(
            absl::StrCat("releasing slot ", held.slot, ": ", marks.status().message())));
        return marks.status();
      }
      draining_.emplace_back(held.slot, *std::move(marks));
    } else {
      occupied_[held.slot] = false;
    }
  }
  Wake();
  return absl::OkStatus();
}

ReceiverStats Receiver::stats() const {
  absl::MutexLock lock(&mutex_);
  return ReceiverStats{received_, released_, static_cast<uint32_t>(held_.size()), stale_, copied_};
}

void Receiver::OnEndpointError(void* arg, ucp_ep_h endpoint, ucs_status_t status) {
  auto* receiver = static_cast<Receiver*>(arg);
  if (!receiver->endpoint_.has_value() || receiver->endpoint_->get() != endpoint) return;
  absl::MutexLock lock(&receiver->mutex_);
  receiver->FailConnection(
      absl::UnavailableError(absl::StrCat("connection ", receiver->connection_id_,
                                          ": sender failed (", ucs_status_string(status), ")")));
}

ucs_status_t Receiver::OnActiveMessage(void* arg, const void*, size_t, void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* receiver = static_cast<Receiver*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    absl::MutexLock lock(&receiver->mutex_);
    receiver->FailConnection(absl::DataLossError(
        "a notification arrived as rendezvous; packfeed senders always send eagerly"));
    return UCS_OK;
  }
  receiver->OnMessage(absl::string_view(static_cast<const char*>(data), length), std::nullopt);
  return UCS_OK;
}

ucs_status_t Receiver::OnSlotDataMessage(void* arg, const void* header, size_t header_length,
                                         void* data, size_t length,
                                         const ucp_am_recv_param_t* param) {
  auto* receiver = static_cast<Receiver*>(arg);
  const absl::string_view bytes(static_cast<const char*>(data), length);
  uint64_t notification_length = 0;
  if (header_length == sizeof(notification_length)) {
    std::memcpy(&notification_length, header, sizeof(notification_length));
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ||
      header_length != sizeof(notification_length) || notification_length > bytes.size()) {
    absl::MutexLock lock(&receiver->mutex_);
    receiver->FailConnection(absl::DataLossError(absl::StrCat(
        "connection ", receiver->connection_id_, ": malformed slot message (", header_length,
        "-byte header announcing ", notification_length, " bytes of notification in ", length,
        " bytes",
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? ", sent as rendezvous)" : ")")));
    return UCS_OK;
  }
  receiver->OnMessage(bytes.substr(0, notification_length), bytes.substr(notification_length));
  return UCS_OK;
}

void Receiver::OnMessage(absl::string_view bytes, std::optional<absl::string_view> payload) {
  absl::StatusOr<Message> message = DecodeMessage(bytes);
  absl::MutexLock lock(&mutex_);
  if (!message.ok()) {
    if (!connected_) return;
    const absl::Status& cause = message.status();
    FailConnection(
        cause.code() == absl::StatusCode::kFailedPrecondition
            ? cause
            : absl::DataLossError(absl::StrCat("connection ", connection_id_,
                                               ": malformed notification: ", cause.message())));
    return;
  }
  if (const auto* goodbye = std::get_if<Goodbye>(&*message)) {
    if (!connected_ || goodbye->connection_id != connection_id_) {
      ++stale_;
      return;
    }
    if (!goodbye->reason.empty()) {
      // The sender cannot serve this receiver any further: not a fault of
      // the connection, and not one that re-attaching would mend.
      failure_ = absl::FailedPreconditionError(absl::StrCat(
          "connection ", connection_id_, ": the sender stopped serving it: ", goodbye->reason));
      Logger().warn("{}", std::string(failure_.message()));
      return;
    }
    // A goodbye is the normal end of a stream: no warning.
    failure_ = absl::UnavailableError(
        absl::StrCat("connection ", connection_id_, ": the sender closed it"));
    Logger().debug("{}", std::string(failure_.message()));
    return;
  }
  const auto* ready = std::get_if<SlotReady>(&*message);
  if (ready == nullptr || !connected_ || ready->connection_id != connection_id_) {
    ++stale_;
    return;
  }
  if (!failure_.ok()) return;
  absl::Status valid = ValidateSlotReady(*ready, options_.slots, options_.slot_bytes, received_);
  if (valid.ok() && occupied_[ready->slot]) {
    valid = absl::DataLossError(absl::StrCat("slot-ready for message ", ready->seq, " names slot ",
                                             ready->slot, ", which is not free"));
  }
  if (!valid.ok()) {
    FailConnection(
        absl::DataLossError(absl::StrCat("connection ", connection_id_, ": ", valid.message())));
    return;
  }
  uint8_t* base = ring_base_ + ready->slot * options_.slot_bytes;
  if (payload.has_value()) {
    absl::Status copied = CopyPayload(*ready, *payload, base);
    if (!copied.ok()) {
      FailConnection(std::move(copied));
      return;
    }
  }
  ReceivedSlot slot;
  slot.seq = ready->seq;
  slot.slot = ready->slot;
  slot.step = ready->step;
  slot.microbatch = ready->microbatch;
  slot.inline_metadata = ready->inline_metadata;
  for (const FieldDescriptor& field : ready->fields) {
    slot.fields.push_back(FieldView{field, base + field.offset, {}});
  }
  occupied_[ready->slot] = true;
  (copier_ != nullptr ? arrived_ : ready_).push_back(std::move(slot));
  ++received_;
}

absl::Status Receiver::CopyPayload(const SlotReady& ready, absl::string_view payload,
                                   uint8_t* slot) const {
  uint64_t expected = 0;
  for (const FieldDescriptor& field : ready.fields) expected += field.bytes;
  if (memory_kind_ != MemoryKind::kHost || payload.size() != expected) {
    return absl::DataLossError(absl::StrCat(
        "connection ", connection_id_, ": slot message ", ready.seq, " carries ", payload.size(),
        " bytes for fields of ", expected, " bytes",
        memory_kind_ != MemoryKind::kHost ? " into a device ring (never sent so)" : ""));
  }
  for (const FieldDescriptor& field : ready.fields) {
    std::memcpy(slot + field.offset, payload.data(), field.bytes);
    payload.remove_prefix(field.bytes);
  }
  return absl::OkStatus();
}

}  // namespace packfeed::transport
