#ifndef PACKFEED_TRANSPORT_SENDER_H_
#define PACKFEED_TRANSPORT_SENDER_H_

// The daemon's side of the data plane: pushes slots into receivers' rings.
//
// Per connection the receiver's ring has K slots. Push() puts every field
// into a slot the receiver said is free (one-sided), flushes so the bytes are
// visible, and only then sends the SlotReady notification (eager active
// message); a host ring it cannot map gets the bytes inside the notification
// instead (kSlotDataMessageId). The receiver's credits say which slots are
// free: the trainer frees a slot when no tensor of its microbatch lives, in
// any order. A slow receiver therefore stops its own stream after K slots and
// nobody else's; the sender's memory never grows with it.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "packfeed/transport/slot_sender.h"
#include "packfeed/transport/ucx_context.h"
#include "packfeed/transport/wire.h"

namespace packfeed::transport {

struct SenderOptions {
  UcxOptions ucx;
  // A push or goodbye that does not complete within this time fails its
  // connection as Unavailable (the receiver is alive but not progressing:
  // over TCP a put needs the receiver's progress thread). Default 30 s.
  absl::Duration operation_timeout = absl::Seconds(30);
  // ProgressOrWait polls this long before it sleeps on the worker's event fd:
  // a credit that comes back within it costs no wake-up. Default 50 µs.
  absl::Duration spin = absl::Microseconds(50);
};

// Thread-compatible: one thread owns a Sender and its UCP worker (the daemon
// runs one per sending thread).
class Sender : public SlotSender {
 public:
  static absl::StatusOr<std::unique_ptr<Sender>> Create(const SenderOptions& options);
  // Says goodbye on every open connection, all at once: one goodbye's wait
  // (2 s, or operation_timeout if shorter) bounds it however many stopped.
  ~Sender() override;

  // The worker address to give receivers (EncodeWorkerAddress).
  std::string worker_address() const override { return EncodeWorkerAddress(worker_.address()); }

  // Connects to a receiver, given its worker address and encoded ring
  // descriptor, and returns the connection's id. Connection ids name connections in
  // every call and message; they are never reused, even by a restarted sender
  // (their high 32 bits are random per Sender), so a message of an old
  // connection is never taken for one of a new connection. FailedPrecondition
  // for a receiver of another protocol version, or for a ring in device
  // memory that UCX would not write with a transport (it would emulate the
  // puts: see put_protocol.h); InvalidArgument for a malformed descriptor.
  absl::StatusOr<uint64_t> Connect(absl::string_view receiver_address,
                                   absl::string_view ring_descriptor) override;
  // The same for a ring shared by file descriptor (a descriptor without a
  // key), which `ring` maps here: slots are written with memcpy.
  absl::StatusOr<uint64_t> ConnectShared(absl::string_view receiver_address,
                                         absl::string_view ring_descriptor,
                                         std::shared_ptr<SharedRing> ring) override;
  // Tells the receiver no slot follows those already pushed, closes the
  // connection and forgets it (a failed one too). NotFound for an unknown connection id.
  // A non-empty `reason` tells the receiver why it is no longer served (its
  // Next then fails with FailedPrecondition carrying it).
  absl::Status Disconnect(uint64_t connection_id, absl::string_view reason = "") override;
  // Closes and forgets the connection without a goodbye (whose flush would
  // wait, up to operation_timeout, on a receiver that has stopped: over
  // TCP UCX completes it only when the peer answers). NotFound for an
  // unknown connection id.
  absl::Status Abandon(uint64_t connection_id) override;

  // Free slots of the connection now: 0 until the receiver has accepted the
  // connection (Receiver::Connect sends its first credit). Unavailable once
  // the connection has failed.
  absl::StatusOr<ConnectionKey> Key(uint64_t connection_id) const override;
  absl::StatusOr<uint32_t> Credits(uint64_t connection_id) const override;

  // Puts the fields into the connection's next slot (laid out by
  // LayoutFields), flushes, then notifies the receiver. Returns once the
  // notification is sent; the field buffers may be reused at once.
  // ResourceExhausted when no slot is free (call ProgressOrWait and retry);
  // InvalidArgument when the fields do not fit a slot (the connection stays
  // usable); Unavailable when the receiver failed (the connection is closed
  // and its resources freed; other connections are untouched).
  absl::Status Push(uint64_t connection_id, const SlotContent& content) override;

  // The zero-extra-copy path: the receiver's next slot mapped into this
  // process (same-node shared memory only; FailedPrecondition otherwise or
  // when no slot is free). Write each field at the offset LayoutFields gives
  // for `content`'s specs, then CommitMapped with the same specs (the
  // fields' data pointers are ignored).
  absl::StatusOr<MappedSlot> MapNextSlot(uint64_t connection_id) override;
  absl::Status CommitMapped(uint64_t connection_id, const SlotContent& content) override;

  // Runs UCX until something happens, polling for `spin` and then sleeping
  // until an event or `timeout`. Credits
  // arrive and failed receivers are found here (within about a second of
  // their death, through UCX keepalive).
  void ProgressOrWait(absl::Duration timeout) override;
  // Wakes a thread blocked in ProgressOrWait. The one method that is safe to
  // call from any thread.
  void Wake() override { worker_.Signal(); }

  // Counters only: cheap enough to read after every push.
  absl::StatusOr<ConnectionStats> Stats(uint64_t connection_id) const override;
  // The lanes UCX chose, as ucp_ep_print_info says (formats text: for logs
  // and checks, not for a serving loop).
  absl::StatusOr<std::string> Transports(uint64_t connection_id) const;

 private:
  struct Connection;
  Sender(SenderOptions options, UcpContext context, UcpWorker worker);
  absl::StatusOr<uint64_t> Open(absl::string_view receiver_address,
                                absl::string_view ring_descriptor,
                                std::shared_ptr<SharedRing> shared);

  absl::StatusOr<Connection*> Usable(uint64_t connection_id) const;
  // FailedPrecondition, logged, unless UCX writes the connection's ring in
  // device memory with a transport (put_protocol.h): a put it emulated moved
  // 0.8 GiB/s on an H100, where a copy from page-locked memory moves 42-50.
  absl::Status CheckDeviceRingPuts(Connection& connection);
  // A device ring's slot, packed in the connection's staging: one copy of
  // the bytes `layout` covers, complete when this returns (so before the
  // slot is announced).
  absl::Status CopyStagedSlot(Connection& connection, uint32_t slot,
                              const std::vector<FieldDescriptor>& layout);
  absl::Status Notify(Connection& connection, uint32_t slot,
                      const std::vector<FieldDescriptor>& layout, const SlotContent& content,
                      absl::Time deadline);
  // InvalidArgument for a credit no correct receiver sends.
  static absl::Status CheckCredit(const Connection& connection, const Credit& credit);
  absl::Status Wait(Connection& connection, ucs_status_ptr_t request, absl::string_view call,
                    absl::Time deadline);
  // A goodbye on its way: the send and the flush behind it, both started.
  struct Farewell {
    Connection* connection;
    ucs_status_ptr_t sent;
    ucs_status_ptr_t flushed;
  };
  absl::Time GoodbyeDeadline() const;
  Farewell SayGoodbye(Connection& connection, absl::string_view reason);
  // Both requests complete, or the deadline closes the endpoint; the first
  // failure.
  absl::Status AwaitGoodbye(Farewell& farewell, absl::Time deadline);
  absl::Status Fail(Connection& connection, absl::Status cause);
  void CloseFailedConnections();
  void OnMessage(absl::string_view bytes);
  static void OnEndpointError(void* arg, ucp_ep_h endpoint, ucs_status_t status);
  static ucs_status_t OnActiveMessage(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);

  SenderOptions options_;
  UcpContext context_;
  UcpWorker worker_;
  // Ordered by connection_id; holds failed connections until Disconnect so that calls
  // naming them keep returning their failure.
  std::map<uint64_t, std::unique_ptr<Connection>> connections_;
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_SENDER_H_
