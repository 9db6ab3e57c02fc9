#ifndef PACKFEED_TESTS_TESTING_TRANSPORT_HARNESS_H_
#define PACKFEED_TESTS_TESTING_TRANSPORT_HARNESS_H_

// Pushing and checking self-describing test messages, shared by the transport
// tests (in either process) and the peer program they spawn.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/sender.h"

namespace packfeed::testing {

struct PushReport {
  uint64_t pushed = 0;
  uint64_t bytes = 0;
  uint32_t most_in_flight = 0;  // slots pushed but not yet released, at most
  uint64_t waits_for_credit = 0;
};

// Pushes test messages first_seq .. first_seq + count - 1 (TestFields, with
// step = seq, microbatch = seq % 7, inline "seq=<seq>"), waiting for credits
// as needed. Stops at the first error, or when no credit comes for
// `credit_timeout`.
absl::Status PushTestMessages(transport::Sender& sender, uint64_t connection_id, uint64_t first_seq,
                              uint64_t count, uint64_t max_payload_bytes, PushReport* report,
                              absl::Duration credit_timeout = absl::Seconds(30));

// Checks that `slot` is test message `seq` (its step; the slot's own seq
// counts from 0 on each connection) byte for byte. DataLoss naming the first
// difference.
absl::Status CheckTestMessage(const transport::ReceivedSlot& slot, uint64_t seq,
                              uint64_t max_payload_bytes);

// Receives `count` slots, checks each is the next test message starting at
// `first_seq`, and releases it after `hold`. Adds the payload bytes to *bytes.
absl::Status ReceiveTestMessages(transport::Receiver& receiver, uint64_t first_seq, uint64_t count,
                                 uint64_t max_payload_bytes, absl::Duration hold, uint64_t* bytes,
                                 absl::Duration timeout = absl::Seconds(20));

// "<CODE>: <message>", the way peers report a status over the control channel.
std::string StatusLine(const absl::Status& status);

// A connection as one test process tells another: "ID KEY" (the id in
// decimal, its key in hex).
struct PeerConnection {
  uint64_t id = 0;
  transport::ConnectionKey key{};
};
std::string FormatConnection(uint64_t id, const transport::ConnectionKey& key);
// InvalidArgument, quoting it, for anything else.
absl::StatusOr<PeerConnection> ParseConnection(absl::string_view text);
// A sender peer's reply to "connect": "connection ID KEY".
std::string ConnectionReply(uint64_t id, const transport::ConnectionKey& key);
// The connection in a ConnectionReply; Internal, quoting the reply, for
// anything else.
absl::StatusOr<PeerConnection> ConnectionOf(absl::string_view reply);

}  // namespace packfeed::testing

#endif  // PACKFEED_TESTS_TESTING_TRANSPORT_HARNESS_H_
