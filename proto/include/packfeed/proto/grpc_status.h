#ifndef PACKFEED_PROTO_GRPC_STATUS_H_
#define PACKFEED_PROTO_GRPC_STATUS_H_

// The one conversion between gRPC's and absl's statuses. Both use
// google.rpc.Code, so a status crosses with its code unchanged.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace packfeed::proto {

// What a call returned, its message prefixed by `what` (the call, and where
// it went) when that is not empty.
inline absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      what.empty() ? status.error_message() : absl::StrCat(what, ": ", status.error_message()));
}

// What a service answers.
inline grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace packfeed::proto

#endif  // PACKFEED_PROTO_GRPC_STATUS_H_
