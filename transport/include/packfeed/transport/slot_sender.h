#ifndef PACKFEED_TRANSPORT_SLOT_SENDER_H_
#define PACKFEED_TRANSPORT_SLOT_SENDER_H_

// What a serving loop needs of the data plane's sending side: connections
// to receivers' rings, their credits, and pushing a slot. Sender is the
// implementation over UCX; the daemon's runner holds this interface, so its
// tests drive it step by step in one process with a fake.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/wire.h"

namespace packfeed::transport {

// One field of a slot, with its bytes in host memory, valid during the call.
struct FieldBuffer {
  FieldSpec spec;
  const void* data = nullptr;
};

// What one slot carries.
struct SlotContent {
  int64_t step = 0;
  uint32_t microbatch = 0;
  std::vector<FieldBuffer> fields;
  std::string inline_metadata;  // at most kMaxInlineBytes
};

struct ConnectionStats {
  uint64_t pushed = 0;    // slots notified
  uint64_t taken = 0;     // handed to the trainer (the ledger's "consumed")
  uint64_t released = 0;  // freed by the trainer (no tensor of them alive)
  uint64_t bytes = 0;     // field bytes pushed
  uint32_t credits = 0;   // free slots now
  bool mapped = false;    // MapNextSlot is available (same-node shared memory)
  bool shared = false;    // the ring was shared by file descriptor (memfd or device)
  // A device ring shared by descriptor: slots are packed into page-locked
  // staging (MapNextSlot) and copied into it by the copy engine.
  bool device = false;
};

// A receiver's next slot mapped into this process, to pack it in place.
struct MappedSlot {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint64_t seq = 0;
};

// Thread-compatible: one thread owns it, except Wake (any thread). The
// contract of each call is Sender's (sender.h).
class SlotSender {
 public:
  virtual ~SlotSender() = default;

  // The address receivers connect with (EncodeWorkerAddress).
  virtual std::string worker_address() const = 0;
  // A new connection to the receiver's ring; returns its id.
  virtual absl::StatusOr<uint64_t> Connect(absl::string_view receiver_address,
                                           absl::string_view ring_descriptor) = 0;
  // A connection to a ring shared by file descriptor, mapped by `ring`.
  virtual absl::StatusOr<uint64_t> ConnectShared(absl::string_view receiver_address,
                                                 absl::string_view ring_descriptor,
                                                 std::shared_ptr<SharedRing> ring) {
    return absl::UnimplementedError("this sender does not take shared rings");
  }
  // The connection's key (wire.h), which its receiver and its rank prove
  // themselves with; NotFound for an id it never gave or has closed.
  virtual absl::StatusOr<ConnectionKey> Key(uint64_t connection_id) const = 0;
  // No slot follows those pushed; `reason`, when not empty, tells why.
  virtual absl::Status Disconnect(uint64_t connection_id, absl::string_view reason = "") = 0;
  // The receiver is gone or does not answer: the connection is closed at
  // once, telling it nothing and waiting on nothing.
  virtual absl::Status Abandon(uint64_t connection_id) = 0;
  // Free slots now; Unavailable once the connection failed.
  virtual absl::StatusOr<uint32_t> Credits(uint64_t connection_id) const = 0;
  // The next slot; ResourceExhausted when none is free.
  virtual absl::Status Push(uint64_t connection_id, const SlotContent& content) = 0;
  // Where Stats says `mapped`: the next slot, to be written in place and
  // then announced by CommitMapped (Sender's contract). FailedPrecondition
  // elsewhere.
  virtual absl::StatusOr<MappedSlot> MapNextSlot(uint64_t connection_id) {
    return absl::FailedPreconditionError("this sender maps no slots");
  }
  virtual absl::Status CommitMapped(uint64_t connection_id, const SlotContent& content) {
    return absl::FailedPreconditionError("this sender maps no slots");
  }
  virtual absl::StatusOr<ConnectionStats> Stats(uint64_t connection_id) const = 0;
  // Waits for something to happen (a credit, a failure) up to `timeout`.
  virtual void ProgressOrWait(absl::Duration timeout) = 0;
  // Ends a ProgressOrWait early; safe from any thread.
  virtual void Wake() = 0;
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_SLOT_SENDER_H_
