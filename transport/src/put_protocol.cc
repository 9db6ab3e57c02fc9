#include "packfeed/transport/put_protocol.h"

#include "absl/strings/match.h"

namespace packfeed::transport {

PutPath ClassifyPut(absl::string_view description) {
  // Looked at first: a rendezvous may move its fragments zero-copy and still
  // need the receiver's software for every one of them. UCX 1.13 with
  // protocols v2 calls a put over TCP "software emulation".
  if (absl::StrContains(description, "rndv") || absl::StrContains(description, "copy-out") ||
      absl::StrContains(description, "fragmented") || absl::StrContains(description, "emulation")) {
    return PutPath::kEmulated;
  }
  if (absl::StrContains(description, "zero-copy")) return PutPath::kTransportWrite;
  return PutPath::kUnknown;
}

absl::string_view PutPathName(PutPath path) {
  switch (path) {
    case PutPath::kTransportWrite:
      return "a transport write";
    case PutPath::kEmulated:
      return "emulated";
    case PutPath::kUnknown:
      break;
  }
  return "not known to be zero-copy";
}

}  // namespace packfeed::transport
