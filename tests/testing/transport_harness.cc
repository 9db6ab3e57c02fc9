#include "transport_harness.h"

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "packfeed/common/status_macros.h"
#include "payload_pattern.h"

namespace packfeed::testing {

using transport::FieldBuffer;
using transport::FieldSpec;
using transport::ReceivedSlot;
using transport::SlotContent;

absl::Status PushTestMessages(transport::Sender& sender, uint64_t connection_id, uint64_t first_seq,
                              uint64_t count, uint64_t max_payload_bytes, PushReport* report,
                              absl::Duration credit_timeout) {
  std::vector<std::vector<uint8_t>> buffers;
  for (uint64_t seq = first_seq; seq < first_seq + count; ++seq) {
    SlotContent content;
    content.step = static_cast<int64_t>(seq);
    content.microbatch = static_cast<uint32_t>(seq % 7);
    content.inline_metadata = absl::StrCat("seq=", seq);
    const std::vector<FieldSpec> specs = TestFields(seq, max_payload_bytes);
    buffers.resize(specs.size());
    for (size_t f = 0; f < specs.size(); ++f) {
      uint64_t bytes = transport::ElementSize(specs[f].type);
      for (int64_t dim : specs[f].shape) bytes *= static_cast<uint64_t>(dim);
      buffers[f].resize(bytes);
      FillPattern(buffers[f].data(), bytes, seq, static_cast<uint32_t>(f));
      content.fields.push_back(FieldBuffer{specs[f], buffers[f].data()});
    }
    const absl::Time deadline = absl::Now() + credit_timeout;
    while (true) {
      PF_ASSIGN_OR_RETURN(uint32_t credits, sender.Credits(connection_id));
      if (credits > 0) break;
      ++report->waits_for_credit;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("no credit for message ", seq));
      }
      sender.ProgressOrWait(absl::Milliseconds(50));
    }
    PF_RETURN_IF_ERROR(sender.Push(connection_id, content));
    PF_ASSIGN_OR_RETURN(transport::ConnectionStats stats, sender.Stats(connection_id));
    report->most_in_flight = std::max<uint32_t>(
        report->most_in_flight, static_cast<uint32_t>(stats.pushed - stats.released));
    ++report->pushed;
    for (const auto& buffer : buffers) report->bytes += buffer.size();
  }
  return absl::OkStatus();
}

absl::Status CheckTestMessage(const ReceivedSlot& slot, uint64_t seq, uint64_t max_payload_bytes) {
  auto wrong = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("message ", seq, ": ", what));
  };
  if (slot.step != static_cast<int64_t>(seq) || slot.microbatch != seq % 7) {
    return wrong(absl::StrCat("step ", slot.step, " microbatch ", slot.microbatch));
  }
  if (slot.inline_metadata != absl::StrCat("seq=", seq)) {
    return wrong("inline metadata " + slot.inline_metadata);
  }
  const std::vector<FieldSpec> specs = TestFields(seq, max_payload_bytes);
  if (slot.fields.size() != specs.size()) {
    return wrong(absl::StrCat(slot.fields.size(), " fields, expected ", specs.size()));
  }
  for (size_t f = 0; f < specs.size(); ++f) {
    const transport::FieldView& field = slot.fields[f];
    if (field.descriptor.name != specs[f].name || field.descriptor.type != specs[f].type ||
        field.descriptor.shape != specs[f].shape) {
      return wrong("field " + field.descriptor.name + " is not " + specs[f].name);
    }
    if (field.descriptor.offset % transport::kFieldAlignment != 0) {
      return wrong(absl::StrCat("field ", f, " at unaligned offset ", field.descriptor.offset));
    }
    std::optional<size_t> bad =
        FindPatternMismatch(field.data, field.descriptor.bytes, seq, static_cast<uint32_t>(f));
    if (bad.has_value()) {
      return wrong(absl::StrCat("field ", field.descriptor.name, " byte ", *bad, " of ",
                                field.descriptor.bytes, " is wrong"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReceiveTestMessages(transport::Receiver& receiver, uint64_t first_seq, uint64_t count,
                                 uint64_t max_payload_bytes, absl::Duration hold, uint64_t* bytes,
                                 absl::Duration timeout) {
  for (uint64_t seq = first_seq; seq < first_seq + count; ++seq) {
    PF_ASSIGN_OR_RETURN(ReceivedSlot slot, receiver.Next(timeout));
    PF_RETURN_IF_ERROR(CheckTestMessage(slot, seq, max_payload_bytes));
    for (const auto& field : slot.fields) *bytes += field.descriptor.bytes;
    if (hold > absl::ZeroDuration()) absl::SleepFor(hold);
    PF_RETURN_IF_ERROR(receiver.Release(slot.lease));
  }
  return absl::OkStatus();
}

std::string StatusLine(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

constexpr absl::string_view kConnectionPrefix = "connection ";

std::string FormatConnection(uint64_t id, const transport::ConnectionKey& key) {
  return absl::StrCat(id, " ", absl::BytesToHexString(transport::KeyBytes(key)));
}

absl::StatusOr<PeerConnection> ParseConnection(absl::string_view text) {
  const std::vector<absl::string_view> words = absl::StrSplit(text, ' ');
  PeerConnection connection;
  absl::StatusOr<transport::ConnectionKey> key =
      words.size() == 2 ? transport::KeyFromBytes(absl::HexStringToBytes(words[1]))
                        : absl::InvalidArgumentError("not two words");
  if (!key.ok() || !absl::SimpleAtoi(words[0], &connection.id)) {
    return absl::InvalidArgumentError(absl::StrCat("not \"ID KEY\": ", text));
  }
  connection.key = *key;
  return connection;
}

std::string ConnectionReply(uint64_t id, const transport::ConnectionKey& key) {
  return absl::StrCat(kConnectionPrefix, FormatConnection(id, key));
}

absl::StatusOr<PeerConnection> ConnectionOf(absl::string_view reply) {
  absl::string_view text = reply;
  absl::StatusOr<PeerConnection> connection =
      absl::ConsumePrefix(&text, kConnectionPrefix)
          ? ParseConnection(text)
          : absl::InvalidArgumentError("no connection prefix");
  if (!connection.ok()) {
    return absl::InternalError(absl::StrCat("peer's reply to connect: ", reply));
  }
  return connection;
}

}  // namespace packfeed::testing
