#ifndef PACKFEED_CLIENT_SRC_GRPC_STATUS_H_
#define PACKFEED_CLIENT_SRC_GRPC_STATUS_H_

// A call to the daemon as the client library reports it.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/proto/grpc_status.h"

namespace packfeed::client {

// `call` names what was asked; a daemon that does not answer, or lacks the
// call, is named by its `socket` (or address).
inline absl::Status DaemonCallStatus(const grpc::Status& status, absl::string_view call,
                                     absl::string_view socket) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return proto::FromGrpc(status, absl::StrCat(call, ": no packfeedd answers on ", socket));
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    // A daemon's TCP address takes ranks only under ranks_over_tcp.
    return proto::FromGrpc(
        status, absl::StrCat(call, ": the daemon at ", socket,
                             " does not take this call there (over TCP: is ranks_over_tcp set? "
                             "or it is an older packfeedd)"));
  }
  return proto::FromGrpc(status, call);
}

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_SRC_GRPC_STATUS_H_
