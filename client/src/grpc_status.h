#ifndef PACKFEED_CLIENT_SRC_GRPC_STATUS_H_
#define PACKFEED_CLIENT_SRC_GRPC_STATUS_H_

// A gRPC call's status as the client library reports it.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"

namespace packfeed::client {

// `call` names what was asked; a daemon that does not answer is named by
// its `socket`.
inline absl::Status FromGrpc(const grpc::Status& status, absl::string_view call,
                             absl::string_view socket) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(
        absl::StrCat(call, ": no packfeedd answers on ", socket, ": ", status.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(call, ": ", status.error_message()));
}

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_SRC_GRPC_STATUS_H_
