// libFuzzer target for the data plane's wire format, as the client's receiver
// meets it: any bytes a peer sends as a notification, ring descriptor or
// worker address must be rejected with a status or decode to what encodes
// back to the same bytes and validates against a ring without reading out of
// bounds. The same for the offer a client sends with its ring's descriptor
// (SOCKET.rings, from another uid).

#include <cstddef>
#include <cstdint>
#include <string>

#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace packfeed::transport;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Message> message = DecodeMessage(bytes);
  if (message.ok()) {
    if (EncodeMessage(*message) != bytes) __builtin_trap();
    if (const auto* ready = std::get_if<SlotReady>(&*message)) {
      ValidateSlotReady(*ready, 4, 1 << 20, ready->seq).IgnoreError();
    }
  }
  absl::StatusOr<RingDescriptor> ring = DecodeRingDescriptor(bytes);
  if (ring.ok() && EncodeRingDescriptor(*ring) != bytes) __builtin_trap();
  absl::StatusOr<std::string> address = DecodeWorkerAddress(bytes);
  if (address.ok() && EncodeWorkerAddress(*address) != bytes) __builtin_trap();
  // What another uid's client sends the daemon with its ring's descriptor.
  absl::StatusOr<RingOffer> offer = ParseRingOffer(bytes);
  if (offer.ok() && (FormatRingOffer(*offer) != bytes || offer->bytes == 0)) __builtin_trap();
  return 0;
}
