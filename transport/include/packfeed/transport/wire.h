#ifndef PACKFEED_TRANSPORT_WIRE_H_
#define PACKFEED_TRANSPORT_WIRE_H_

// The data plane's wire format (docs/PROTOCOLS.md): the ring descriptor a receiver
// hands its sender at attach, and the three active messages of a connection.
//
// Every message starts with the same 24-byte header
//   magic "PFW\0" (u32) · version (u16) · kind (u16) · connection_id (u64) · body size (u64)
// so a peer of another protocol version is refused by name, and a message of
// an old connection (another connection_id) is never taken for a new one. Integers are
// little-endian; decoding checks every length before reading it and never
// trusts a count or an offset from the peer.

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/common/data_types.h"

namespace packfeed::transport {

inline constexpr uint32_t kWireMagic = 0x00574650;  // "PFW\0"
// 2: slots are reused in any order (a credit names the free ones).
inline constexpr uint16_t kWireVersion = 3;
// The UCP active-message id of every packfeed message.
inline constexpr unsigned kActiveMessageId = 0x7066;
// A slot-ready notification that carries the slot's bytes with it: the
// active message's header is the notification's length (8 bytes, little
// endian), its data the encoded notification followed by every field's bytes
// in field order. Senders use it for host rings they cannot map: there UCX
// 1.13 emulates puts with messages the receiver must answer, and a receiver
// answering a sender that just died aborts inside UCX ("unexpected error:
// Endpoint timeout" in ucp_put_handler); a receiver only copies these.
inline constexpr unsigned kSlotDataMessageId = 0x7067;

inline constexpr size_t kMaxFields = 32;
inline constexpr size_t kMaxFieldNameBytes = 31;
inline constexpr size_t kMaxDims = 4;
inline constexpr size_t kMaxInlineBytes = 2048;
// The most slots a ring may have (a credit carries one bit per slot).
inline constexpr uint32_t kMaxSlots = 1024;
// Fields start at multiples of this in a slot, which suits DLPack/torch and
// vectorised device loads alike.
inline constexpr uint64_t kFieldAlignment = 256;

enum class MessageKind : uint16_t { kSlotReady = 1, kCredit = 2, kGoodbye = 3 };

// Shared with the client's public API (packfeed/common/data_types.h).
using ::packfeed::ElementSize;
using ::packfeed::ElementType;
using ::packfeed::ElementTypeName;
using ::packfeed::MemoryKind;

// Where one field lies in a slot, and what it is.
struct FieldDescriptor {
  std::string name;
  ElementType type = ElementType::kUInt8;
  std::vector<int64_t> shape;  // at most kMaxDims; {} is a scalar
  uint64_t offset = 0;         // from the start of the slot
  uint64_t bytes = 0;          // = product(shape) · ElementSize(type)

  bool operator==(const FieldDescriptor&) const = default;
};

// Sender → receiver, after the slot's bytes are visible: slot `slot` (one the
// receiver's last credit named free) holds message number `seq` (0, 1, 2, …
// on this connection).
struct SlotReady {
  uint64_t connection_id = 0;
  uint64_t seq = 0;
  uint32_t slot = 0;
  int64_t step = 0;
  uint32_t microbatch = 0;
  std::vector<FieldDescriptor> fields;
  std::string inline_metadata;  // at most kMaxInlineBytes, opaque here

  bool operator==(const SlotReady&) const = default;
};

// The secret of one connection: 16 bytes from the system's CSPRNG, drawn
// by the sender at Connect and handed to the rank in its attach reply
// alone. Every credit carries it, so only the receiver the connection was
// made for can free its slots (a credit naming another connection's id is
// dropped), and the rank's later control calls prove themselves with it.
using ConnectionKey = std::array<uint8_t, 16>;
ConnectionKey NewConnectionKey();
// Whether two keys are equal, in time that does not depend on where they
// differ.
bool SameKey(const ConnectionKey& a, const ConnectionKey& b);
// The key as bytes (a proto's bytes field) and back; InvalidArgument unless
// `bytes` is 16 long.
std::string KeyBytes(const ConnectionKey& key);
absl::StatusOr<ConnectionKey> KeyFromBytes(absl::string_view bytes);

// Receiver → sender: a snapshot of the ring, taken after the receiver had
// accepted `seen` notifications. A trainer may hold a microbatch for as long
// as a tensor of it lives, so slots come free in any order: `free_slots` has
// bit s%64 of word s/64 set when slot s is free. A slot the sender filled
// with message `seen` or later is not free whatever the bit says (the
// snapshot predates it). Counts are cumulative, so a credit replaces the one
// before and a repeat is harmless.
struct Credit {
  uint64_t connection_id = 0;
  uint64_t seen = 0;
  // Microbatches handed to the trainer (what the ledger calls consumed),
  // and released by it (no tensor of them alive).
  uint64_t taken = 0;
  uint64_t released = 0;
  std::vector<uint64_t> free_slots;
  ConnectionKey key{};  // the connection's (Receiver::Connect)

  bool operator==(const Credit&) const = default;
  bool is_free(uint32_t slot) const {
    return slot / 64 < free_slots.size() && (free_slots[slot / 64] >> (slot % 64) & 1) != 0;
  }
  void set_free(uint32_t slot) {
    if (free_slots.size() <= slot / 64) free_slots.resize(slot / 64 + 1);
    free_slots[slot / 64] |= uint64_t{1} << (slot % 64);
  }
};

// Sender → receiver: the connection ends after the slots already announced.
// An empty reason is the normal end (the daemon drains); otherwise it says
// why the sender cannot go on serving this receiver (a step it cannot plan
// or read), which the receiver hands to its user instead of waiting forever.
struct Goodbye {
  uint64_t connection_id = 0;
  std::string reason;
  bool operator==(const Goodbye&) const = default;
};

using Message = std::variant<SlotReady, Credit, Goodbye>;

std::string EncodeMessage(const Message& message);
// InvalidArgument for a malformed message (naming what is wrong);
// FailedPrecondition for a peer speaking another protocol version.
absl::StatusOr<Message> DecodeMessage(absl::string_view bytes);

// Checks a decoded SlotReady against the receiver's ring and the sequence
// number it expects: slot in range, fields inside the slot and not
// overlapping. (Whether the slot was free is the receiver's to check.)
// DataLoss naming the first violation.
absl::Status ValidateSlotReady(const SlotReady& ready, uint32_t slots, uint64_t slot_bytes,
                               uint64_t expected_seq);

// A receiver's ring, as its sender needs it: geometry, where it lives and the
// packed UCX key to put into it. A host ring without a key is a SharedRing
// (shared_ring.h), whose file descriptor travels on its own.
struct RingDescriptor {
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  uint64_t base_address = 0;
  MemoryKind memory_kind = MemoryKind::kHost;
  std::string remote_key;

  bool operator==(const RingDescriptor&) const = default;
  bool shared_by_fd() const { return remote_key.empty(); }
};

// The remote key travels with an XXH3 checksum: UCX asserts (aborts the
// process) on a malformed packed key, so a corrupt one is refused here.
std::string EncodeRingDescriptor(const RingDescriptor& ring);
absl::StatusOr<RingDescriptor> DecodeRingDescriptor(absl::string_view bytes);

// A UCX worker address as it travels in attach requests and replies: UCX's
// opaque packed bytes behind our header, with their XXH3 checksum. UCX
// asserts (aborts the process) on a malformed address, so a corrupt or
// foreign blob must be refused before it reaches ucp_ep_create. (This guards
// against accidents, not forgeries: a sender only sees addresses from
// clients that presented the job's token.)
std::string EncodeWorkerAddress(absl::string_view ucx_address);
absl::StatusOr<std::string> DecodeWorkerAddress(absl::string_view bytes);

// Lays out fields of the given types and shapes one after another, each at a
// multiple of kFieldAlignment, and returns their descriptors. InvalidArgument
// when the fields need more than `slot_bytes` (naming both sizes), when there
// are too many, or a name or shape is out of range.
struct FieldSpec {
  std::string name;
  ElementType type = ElementType::kUInt8;
  std::vector<int64_t> shape;
};
absl::StatusOr<std::vector<FieldDescriptor>> LayoutFields(const std::vector<FieldSpec>& fields,
                                                          uint64_t slot_bytes);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_WIRE_H_
