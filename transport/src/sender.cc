#include "packfeed/transport/sender.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/put_protocol.h"
#include "packfeed/transport/transport_logger.h"
#include "packfeed/transport/ucx_endpoint.h"

namespace packfeed::transport {

struct Sender::Connection {
  // Closes while every member is alive: closing may run the error callback,
  // which writes `failure`.
  ~Connection() {
    remote_key.Reset();
    if (endpoint.has_value()) endpoint->Close(/*force=*/true).IgnoreError();
  }

  uint64_t connection_id = 0;
  ConnectionKey key{};  // what every credit of its receiver carries
  bool stray_credit_logged = false;
  RingDescriptor ring;
  std::optional<UcpEndpoint> endpoint;
  RemoteKey remote_key;                // destroyed before the endpoint closes
  uint8_t* mapped = nullptr;           // the ring in this process, when shared memory
  std::shared_ptr<SharedRing> shared;  // a ring passed by file descriptor: no key
  // A device ring passed by descriptor: slots are packed into this
  // page-locked staging buffer (MapNextSlot) or gathered there (Push), then
  // copied into the ring by the copy engine before they are announced.
  ImportedDeviceMemory* device = nullptr;
  uint8_t* staging = nullptr;
  // A host ring this process cannot map: slots travel inside their
  // notifications (see kSlotDataMessageId) instead of as puts.
  bool slots_as_messages = false;
  uint64_t pushed = 0;
  uint64_t bytes = 0;
  bool accepted = false;  // the receiver's first credit has arrived
  Credit credit;          // the receiver's latest
  // Per slot: 1 + the message last pushed into it, 0 when none was.
  std::vector<uint64_t> filled;
  std::optional<uint32_t> mapped_slot;  // MapNextSlot's, until CommitMapped
  absl::Status failure;                 // set once; the connection is then closed
  std::string notification;             // alive until its send completes (UCX 1.13)
  uint64_t notification_length = 0;     // the header of a kSlotDataMessageId
  std::vector<ucp_dt_iov_t> pieces;     // its data; alive like `notification`

  // Free per the latest credit, and not filled since the receiver took it.
  bool free(uint32_t slot) const { return credit.is_free(slot) && filled[slot] <= credit.seen; }
  uint32_t credits() const {
    if (!failure.ok() || !accepted) return 0;
    uint32_t count = 0;
    for (uint32_t slot = 0; slot < ring.slots; ++slot) count += free(slot) ? 1 : 0;
    return count;
  }
  // The slot the next push fills: MapNextSlot's, else the lowest free one.
  std::optional<uint32_t> next_slot() const {
    if (mapped_slot.has_value()) return mapped_slot;
    if (!failure.ok() || !accepted) return std::nullopt;
    for (uint32_t slot = 0; slot < ring.slots; ++slot) {
      if (free(slot)) return slot;
    }
    return std::nullopt;
  }
  uint64_t slot_address(uint32_t slot) const { return ring.base_address + slot * ring.slot_bytes; }
};

namespace {

// How long a goodbye may take to leave (Disconnect); a receiver alive and
// progressing takes microseconds.
constexpr absl::Duration kGoodbyeWait = absl::Seconds(2);

std::vector<FieldSpec> Specs(const SlotContent& content) {
  std::vector<FieldSpec> specs;
  specs.reserve(content.fields.size());
  for (const FieldBuffer& field : content.fields) specs.push_back(field.spec);
  return specs;
}

absl::Status CheckInline(const SlotContent& content) {
  if (content.inline_metadata.size() <= kMaxInlineBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      content.inline_metadata.size(), " bytes of inline metadata (at most ", kMaxInlineBytes, ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Sender>> Sender::Create(const SenderOptions& options) {
  PF_ASSIGN_OR_RETURN(UcpContext context, UcpContext::Create(options.ucx));
  PF_ASSIGN_OR_RETURN(UcpWorker worker, UcpWorker::Create(context));
  std::unique_ptr<Sender> sender(new Sender(options, std::move(context), std::move(worker)));
  PF_RETURN_IF_ERROR(
      sender->worker_.SetMessageHandler(kActiveMessageId, &Sender::OnActiveMessage, sender.get()));
  return sender;
}

Sender::Sender(SenderOptions options, UcpContext context, UcpWorker worker)
    : options_(std::move(options)), context_(std::move(context)), worker_(std::move(worker)) {}

Sender::~Sender() {
  // Every goodbye at once, under one deadline: a drain with several stopped
  // ranks waits one goodbye's wait, not one per rank.
  const absl::Time deadline = GoodbyeDeadline();
  std::vector<Farewell> farewells;
  for (auto& [connection_id, connection] : connections_) {
    if (connection->failure.ok()) farewells.push_back(SayGoodbye(*connection, ""));
  }
  for (Farewell& farewell : farewells) AwaitGoodbye(farewell, deadline).IgnoreError();
  while (!connections_.empty()) Abandon(connections_.begin()->first).IgnoreError();
}

absl::StatusOr<uint64_t> Sender::Connect(absl::string_view receiver_address,
                                         absl::string_view ring_descriptor) {
  return Open(receiver_address, ring_descriptor, nullptr);
}

absl::StatusOr<uint64_t> Sender::ConnectShared(absl::string_view receiver_address,
                                               absl::string_view ring_descriptor,
                                               std::shared_ptr<SharedRing> shared) {
  if (shared == nullptr) return absl::InvalidArgumentError("ConnectShared without a ring");
  return Open(receiver_address, ring_descriptor, std::move(shared));
}

absl::StatusOr<uint64_t> Sender::Open(absl::string_view receiver_address,
                                      absl::string_view ring_descriptor,
                                      std::shared_ptr<SharedRing> shared) {
  PF_ASSIGN_OR_RETURN(RingDescriptor ring, DecodeRingDescriptor(ring_descriptor));
  if (ring.shared_by_fd() != (shared != nullptr)) {
    return absl::InvalidArgumentError(
        ring.shared_by_fd() ? "a ring shared by file descriptor, and none was given (ConnectShared)"
                            : "a ring with a UCX key given a file descriptor too");
  }
  // A device allocation is rounded up to the GPU's granularity.
  if (shared != nullptr &&
      (shared->device() != nullptr ? shared->bytes() < ring.slots * ring.slot_bytes
                                   : shared->bytes() != ring.slots * ring.slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a shared ring of ", shared->bytes(),
                                                   " bytes for ", ring.slots, " slots of ",
                                                   ring.slot_bytes));
  }
  if (shared != nullptr &&
      (shared->device() != nullptr) != (ring.memory_kind == MemoryKind::kCuda)) {
    return absl::InvalidArgumentError(
        shared->device() != nullptr
            ? "a device ring shared by descriptor for a ring descriptor of host memory"
            : "a host ring shared by descriptor for a ring descriptor of device memory");
  }
  absl::StatusOr<std::string> address = DecodeWorkerAddress(receiver_address);
  if (!address.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("receiver worker address: ", address.status().message()));
  }
  auto connection = std::make_unique<Connection>();
  // Random, not counted: no id tells another's (the key is what proves one).
  std::random_device random;
  do {
    connection->connection_id = static_cast<uint64_t>(random()) << 32 | random();
  } while (connection->connection_id == 0 || connections_.count(connection->connection_id) > 0);
  connection->key = NewConnectionKey();
  connection->ring = std::move(ring);
  connection->filled.assign(connection->ring.slots, 0);
  PF_ASSIGN_OR_RETURN(
      UcpEndpoint endpoint,
      UcpEndpoint::Connect(worker_, *address, &Sender::OnEndpointError, connection.get()));
  connection->endpoint.emplace(std::move(endpoint));
  if (shared != nullptr && shared->device() != nullptr) {
    connection->device = shared->device();
    PF_ASSIGN_OR_RETURN(connection->staging,
                        connection->device->Staging(connection->ring.slot_bytes));
    connection->shared = std::move(shared);
  } else if (shared != nullptr) {
    connection->mapped = shared->data();
    connection->shared = std::move(shared);
  } else {
    PF_ASSIGN_OR_RETURN(connection->remote_key,
                        RemoteKey::Unpack(*connection->endpoint, connection->ring.remote_key));
  }
  if (connection->shared == nullptr && connection->ring.memory_kind == MemoryKind::kHost) {
    absl::StatusOr<void*> mapped =
        connection->remote_key.LocalPointer(connection->ring.base_address);
    if (mapped.ok()) {
      connection->mapped = static_cast<uint8_t*>(*mapped);
    } else {
      connection->slots_as_messages = true;
    }
  }
  if (connection->ring.memory_kind == MemoryKind::kCuda && connection->device == nullptr) {
    PF_RETURN_IF_ERROR(CheckDeviceRingPuts(*connection));
  }
  const uint64_t connection_id = connection->connection_id;
  Logger().debug("connection {}: {} slots of {} B, {}; lanes: {}", connection_id,
                 connection->ring.slots, connection->ring.slot_bytes,
                 connection->device != nullptr   ? "device memory shared by file descriptor"
                 : connection->shared != nullptr ? "shared by file descriptor"
                 : connection->mapped != nullptr ? "mapped"
                 : connection->slots_as_messages ? "slots as messages"
                                                 : "puts",
                 connection->endpoint->TransportSummary());
  connections_.emplace(connection_id, std::move(connection));
  return connection_id;
}

absl::Status Sender::CheckDeviceRingPuts(Connection& connection) {
  // One put of the size of a large field into the first slot, to ask UCX
  // how it carries such puts. A ring outlives its connections: a receiver
  // attaching again may still hold slot 0's microbatch, so the put writes
  // back the bytes a get has just read there.
  std::vector<uint8_t> bytes(std::min<uint64_t>(connection.ring.slot_bytes, 4ull << 20));
  const absl::Time deadline = absl::Now() + options_.operation_timeout;
  PF_RETURN_IF_ERROR(
      Wait(connection,
           connection.endpoint->Get(bytes.data(), bytes.size(), connection.slot_address(0),
                                    connection.remote_key.get()),
           "ucp_get_nbx(from the device ring)", deadline));
  UcpEndpoint::DescribedPut put = connection.endpoint->PutDescribed(
      bytes.data(), bytes.size(), connection.slot_address(0), connection.remote_key.get());
  const PutPath path = ClassifyPut(put.description);
  absl::Status status =
      Wait(connection, put.request, "ucp_put_nbx(into the device ring)", deadline);
  // Waited for before a refusal closes the endpoint: an emulated put is
  // acknowledged by the receiver, and UCX 1.13 aborts the receiver's process
  // when that acknowledgement finds the endpoint already closed.
  status.Update(Wait(connection, connection.endpoint->Flush(), "ucp_ep_flush_nbx", deadline));
  if (path == PutPath::kTransportWrite) return status;
  status = absl::FailedPreconditionError(absl::StrCat(
      "a ring in device memory is refused: UCX ", UcpContext::LibraryVersion(),
      " would not write it with a transport (the put is ", PutPathName(path), ": \"",
      put.description,
      "\"); ask for the staged device ring, which copies each slot with the copy engine"));
  Logger().warn("connection {}: {}", connection.connection_id, std::string(status.message()));
  return status;
}

absl::Status Sender::Disconnect(uint64_t connection_id, absl::string_view reason) {
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrCat("no connection with id ", connection_id));
  }
  Connection& connection = *it->second;
  absl::Status status = connection.failure;
  if (status.ok()) {
    const absl::Time deadline = GoodbyeDeadline();
    Farewell farewell = SayGoodbye(connection, reason);
    status = AwaitGoodbye(farewell, deadline);
  }
  Abandon(connection_id).IgnoreError();
  return status;
}

absl::Time Sender::GoodbyeDeadline() const {
  // Not longer than kGoodbyeWait: a receiver that stopped answering would
  // hold the sending thread, and every other connection of it, that long.
  return absl::Now() + std::min(options_.operation_timeout, kGoodbyeWait);
}

Sender::Farewell Sender::SayGoodbye(Connection& connection, absl::string_view reason) {
  // The flush, started at once (UCX completes it after the goodbye), makes
  // the goodbye leave before the endpoint closes.
  connection.notification = EncodeMessage(Goodbye{connection.connection_id, std::string(reason)});
  const ucs_status_ptr_t sent =
      connection.endpoint->SendEager(kActiveMessageId, connection.notification);
  return {&connection, sent, connection.endpoint->Flush()};
}

absl::Status Sender::AwaitGoodbye(Farewell& farewell, absl::Time deadline) {
  absl::Status sent =
      Wait(*farewell.connection, farewell.sent, "ucp_am_send_nbx(goodbye)", deadline);
  absl::Status flushed = Wait(*farewell.connection, farewell.flushed, "ucp_ep_flush_nbx", deadline);
  return sent.ok() ? flushed : sent;
}

absl::Status Sender::Abandon(uint64_t connection_id) {
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrCat("no connection with id ", connection_id));
  }
  it->second->remote_key.Reset();
  if (it->second->endpoint.has_value()) it->second->endpoint->Close(/*force=*/true).IgnoreError();
  connections_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<Sender::Connection*> Sender::Usable(uint64_t connection_id) const {
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrCat("no connection with id ", connection_id));
  }
  if (!it->second->failure.ok()) return it->second->failure;
  return it->second.get();
}

absl::StatusOr<ConnectionKey> Sender::Key(uint64_t connection_id) const {
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrCat("no connection with id ", connection_id));
  }
  return it->second->key;
}

absl::StatusOr<uint32_t> Sender::Credits(uint64_t connection_id) const {
  PF_ASSIGN_OR_RETURN(Connection * connection, Usable(connection_id));
  return connection->credits();
}

absl::Status Sender::Push(uint64_t connection_id, const SlotContent& content) {
  PF_ASSIGN_OR_RETURN(Connection * connection, Usable(connection_id));
  PF_RETURN_IF_ERROR(CheckInline(content));
  PF_ASSIGN_OR_RETURN(std::vector<FieldDescriptor> layout,
                      LayoutFields(Specs(content), connection->ring.slot_bytes));
  const std::optional<uint32_t> slot = connection->next_slot();
  if (!slot.has_value()) {
    return absl::ResourceExhaustedError(
        connection->accepted
            ? absl::StrCat("connection ", connection_id, ": all ", connection->ring.slots,
                           " slots are held by the receiver")
            : absl::StrCat("connection ", connection_id, ": the receiver has not accepted it yet"));
  }
  const absl::Time deadline = absl::Now() + options_.operation_timeout;
  absl::Status status;
  if (connection->device != nullptr) {
    // Gathered into page-locked staging, then one copy-engine transfer.
    for (size_t i = 0; i < layout.size(); ++i) {
      std::memcpy(connection->staging + layout[i].offset, content.fields[i].data, layout[i].bytes);
    }
    status = CopyStagedSlot(*connection, *slot, layout);
  } else if (connection->shared != nullptr) {
    // A ring shared by file descriptor: plain copies, made visible before
    // the notification can be seen.
    uint8_t* base = connection->mapped + *slot * connection->ring.slot_bytes;
    for (size_t i = 0; i < layout.size(); ++i) {
      std::memcpy(base + layout[i].offset, content.fields[i].data, layout[i].bytes);
    }
    std::atomic_thread_fence(std::memory_order_release);
  } else if (!connection->slots_as_messages) {
    // All puts in flight at once, then one flush: remote completion of every
    // put before the notification leaves (flush, not fence: UCX 1.13's fence
    // does not order across lanes).
    const uint64_t address = connection->slot_address(*slot);
    std::vector<ucs_status_ptr_t> requests;
    ucp_request_param_t put = {};
    for (size_t i = 0; i < layout.size(); ++i) {
      if (layout[i].bytes == 0) continue;
      requests.push_back(ucp_put_nbx(connection->endpoint->get(), content.fields[i].data,
                                     layout[i].bytes, address + layout[i].offset,
                                     connection->remote_key.get(), &put));
    }
    requests.push_back(connection->endpoint->Flush());
    for (ucs_status_ptr_t request : requests) {
      // Wait on every request even after a failure: each must be freed.
      status.Update(Wait(*connection, request, "ucp_put_nbx/ucp_ep_flush_nbx", deadline));
    }
  }
  if (status.ok()) status = Notify(*connection, *slot, layout, content, deadline);
  if (!status.ok()) return Fail(*connection, std::move(status));
  return absl::OkStatus();
}

absl::StatusOr<MappedSlot> Sender::MapNextSlot(uint64_t connection_id) {
  PF_ASSIGN_OR_RETURN(Connection * connection, Usable(connection_id));
  if (connection->mapped == nullptr && connection->device == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("connection ", connection_id,
                     ": the receiver's ring is not mapped into this process "
                     "(not same-node shared memory); use Push"));
  }
  const std::optional<uint32_t> slot = connection->next_slot();
  if (!slot.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("connection ", connection_id, ": no free slot"));
  }
  // Kept until CommitMapped: a credit arriving in between may free a lower slot.
  connection->mapped_slot = slot;
  // A device ring's slot is packed in staging and copied at CommitMapped.
  uint8_t* data = connection->device != nullptr
                      ? connection->staging
                      : connection->mapped + *slot * connection->ring.slot_bytes;
  return MappedSlot{data, connection->ring.slot_bytes, connection->pushed};
}

absl::Status Sender::CommitMapped(uint64_t connection_id, const SlotContent& content) {
  PF_ASSIGN_OR_RETURN(Connection * connection, Usable(connection_id));
  PF_RETURN_IF_ERROR(CheckInline(content));
  if (!connection->mapped_slot.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("connection ", connection_id, ": CommitMapped without a mapped slot"));
  }
  PF_ASSIGN_OR_RETURN(std::vector<FieldDescriptor> layout,
                      LayoutFields(Specs(content), connection->ring.slot_bytes));
  // The slot was written with plain stores: make them visible before the
  // notification can be seen.
  std::atomic_thread_fence(std::memory_order_release);
  const uint32_t slot = *std::exchange(connection->mapped_slot, std::nullopt);
  absl::Status status;
  if (connection->device != nullptr) status = CopyStagedSlot(*connection, slot, layout);
  if (status.ok()) {
    status = Notify(*connection, slot, layout, content, absl::Now() + options_.operation_timeout);
  }
  if (!status.ok()) return Fail(*connection, std::move(status));
  return absl::OkStatus();
}

absl::Status Sender::CopyStagedSlot(Connection& connection, uint32_t slot,
                                    const std::vector<FieldDescriptor>& layout) {
  uint64_t extent = 0;
  for (const FieldDescriptor& field : layout) extent = std::max(extent, field.offset + field.bytes);
  return connection.device->CopyIn(slot * connection.ring.slot_bytes, connection.staging, extent);
}

absl::Status Sender::Notify(Connection& connection, uint32_t slot,
                            const std::vector<FieldDescriptor>& layout, const SlotContent& content,
                            absl::Time deadline) {
  SlotReady ready;
  ready.connection_id = connection.connection_id;
  ready.seq = connection.pushed;
  ready.slot = slot;
  ready.step = content.step;
  ready.microbatch = content.microbatch;
  ready.fields = layout;
  ready.inline_metadata = content.inline_metadata;
  connection.notification = EncodeMessage(ready);
  ucs_status_ptr_t request;
  if (connection.slots_as_messages) {
    // Little-endian like the rest of the wire (wire.cc asserts the host is).
    connection.notification_length = connection.notification.size();
    connection.pieces.assign(
        1, ucp_dt_iov_t{connection.notification.data(), connection.notification.size()});
    for (size_t i = 0; i < layout.size(); ++i) {
      if (layout[i].bytes == 0) continue;
      connection.pieces.push_back(
          ucp_dt_iov_t{const_cast<void*>(content.fields[i].data), layout[i].bytes});
    }
    request = connection.endpoint->SendEager(
        kSlotDataMessageId,
        absl::string_view(reinterpret_cast<const char*>(&connection.notification_length),
                          sizeof(connection.notification_length)),
        connection.pieces);
  } else {
    request = connection.endpoint->SendEager(kActiveMessageId, connection.notification);
  }
  // Pushed once posted, not once the send completes: while Wait progresses
  // the worker, the receiver's credit for this very slot can arrive first
  // (seen over TCP on a loaded machine), and it must not read as a credit
  // for a slot never pushed. A send that fails fails the connection.
  connection.filled[slot] = ++connection.pushed;
  for (const FieldDescriptor& field : layout) connection.bytes += field.bytes;
  return Wait(connection, request, "ucp_am_send_nbx(slot-ready)", deadline);
}

absl::Status Sender::Wait(Connection& connection, ucs_status_ptr_t request, absl::string_view call,
                          absl::Time deadline) {
  return worker_.Wait(request, call, deadline, [&] {
    // Alive but not progressing: closing the endpoint completes the request.
    // (No clock read on the way in: Push waits here for every slot.)
    Logger().warn("connection {}: {} did not complete in time (operation_timeout {}, a goodbye {})",
                  connection.connection_id, std::string(call),
                  absl::FormatDuration(options_.operation_timeout),
                  absl::FormatDuration(kGoodbyeWait));
    connection.remote_key.Reset();
    connection.endpoint->Close(/*force=*/true).IgnoreError();
  });
}

absl::Status Sender::Fail(Connection& connection, absl::Status cause) {
  if (connection.failure.ok()) {
    connection.failure = absl::UnavailableError(absl::StrCat(
        "connection ", connection.connection_id, " to its receiver failed: ", cause.message()));
    Logger().warn("{}", std::string(connection.failure.message()));
  }
  connection.remote_key.Reset();
  if (connection.endpoint.has_value()) connection.endpoint->Close(/*force=*/true).IgnoreError();
  connection.mapped = nullptr;
  return connection.failure;
}

void Sender::CloseFailedConnections() {
  for (auto& [connection_id, connection] : connections_) {
    if (!connection->failure.ok() && connection->endpoint.has_value() &&
        connection->endpoint->open()) {
      Fail(*connection, connection->failure).IgnoreError();
    }
  }
}

void Sender::ProgressOrWait(absl::Duration timeout) {
  const absl::Time spin_until = absl::Now() + options_.spin;
  bool progressed = false;
  while (!(progressed = worker_.Progress()) && absl::Now() < spin_until) {
  }
  if (!progressed) worker_.ProgressOrWait(timeout);
  CloseFailedConnections();
}

absl::StatusOr<ConnectionStats> Sender::Stats(uint64_t connection_id) const {
  PF_ASSIGN_OR_RETURN(Connection * connection, Usable(connection_id));
  ConnectionStats stats;
  stats.pushed = connection->pushed;
  stats.taken = connection->credit.taken;
  stats.released = connection->credit.released;
  stats.bytes = connection->bytes;
  stats.credits = connection->credits();
  stats.mapped = connection->mapped != nullptr || connection->device != nullptr;
  stats.shared = connection->shared != nullptr;
  stats.device = connection->device != nullptr;
  return stats;
}

absl::StatusOr<std::string> Sender::Transports(uint64_t connection_id) const {
  PF_ASSIGN_OR_RETURN(Connection * connection, Usable(connection_id));
  return connection->endpoint->TransportSummary();
}

void Sender::OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  // Inside progress: only record it; the endpoint closes outside callbacks.
  auto* connection = static_cast<Connection*>(arg);
  if (connection->failure.ok()) {
    connection->failure =
        absl::UnavailableError(absl::StrCat("connection ", connection->connection_id,
                                            ": receiver failed (", ucs_status_string(status), ")"));
    Logger().warn("{}", std::string(connection->failure.message()));
  }
}

ucs_status_t Sender::OnActiveMessage(void* arg, const void*, size_t, void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    Logger().warn("dropped a rendezvous message: credits are always eager");
    return UCS_OK;
  }
  static_cast<Sender*>(arg)->OnMessage(absl::string_view(static_cast<const char*>(data), length));
  return UCS_OK;
}

void Sender::OnMessage(absl::string_view bytes) {
  absl::StatusOr<Message> message = DecodeMessage(bytes);
  if (!message.ok()) {
    Logger().warn("dropped a message from a receiver: {}", std::string(message.status().message()));
    return;
  }
  const Credit* credit = std::get_if<Credit>(&*message);
  if (credit == nullptr) {
    Logger().warn("dropped a message from a receiver: not a credit");
    return;
  }
  auto it = connections_.find(credit->connection_id);
  if (it == connections_.end() || !it->second->failure.ok()) {
    Logger().debug("credit for closed connection {} ignored", credit->connection_id);
    return;
  }
  Connection& connection = *it->second;
  if (!SameKey(credit->key, connection.key)) {
    // Not its receiver's: dropped, and the connection goes on.
    if (!std::exchange(connection.stray_credit_logged, true)) {
      Logger().warn("connection {}: dropped a credit without its key (a stray or forged one)",
                    connection.connection_id);
    }
    return;
  }
  if (absl::Status valid = CheckCredit(connection, *credit); !valid.ok()) {
    connection.failure = absl::UnavailableError(absl::StrCat(
        "connection ", connection.connection_id, ": a malformed credit: ", valid.message()));
    Logger().warn("{}", std::string(connection.failure.message()));
    return;
  }
  connection.accepted = true;
  connection.credit = *credit;
}

absl::Status Sender::CheckCredit(const Connection& connection, const Credit& credit) {
  if (credit.seen > connection.pushed) {
    return absl::InvalidArgumentError(
        absl::StrCat("it has seen ", credit.seen, " of ", connection.pushed, " slots pushed"));
  }
  // One credit is in flight at a time and UCX keeps an endpoint's messages
  // in order: a snapshot older than the last is a receiver's fault.
  if (connection.accepted &&
      (credit.seen < connection.credit.seen || credit.taken < connection.credit.taken ||
       credit.released < connection.credit.released)) {
    return absl::InvalidArgumentError("it is older than the credit before it");
  }
  const uint32_t slots = connection.ring.slots;
  for (size_t word = 0; word < credit.free_slots.size(); ++word) {
    const uint64_t beyond = word * 64 + 64 <= slots ? 0
                            : word * 64 >= slots    ? ~uint64_t{0}
                                                    : ~uint64_t{0} << (slots - word * 64);
    if ((credit.free_slots[word] & beyond) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("it frees a slot beyond the ring's ", slots));
    }
  }
  return absl::OkStatus();
}

}  // namespace packfeed::transport
