#ifndef PACKFEED_TRANSPORT_UCX_STATUS_H_
#define PACKFEED_TRANSPORT_UCX_STATUS_H_

// The one place a UCX status becomes an absl::Status.

#include <ucs/type/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace packfeed::transport {

// Returns OK for UCS_OK, otherwise a status whose message is
// "<call>: <UCX's description>". Peer and network failures (connection
// reset, endpoint timeout, unreachable, canceled) are Unavailable, so callers
// may retry by reconnecting; a bad argument is InvalidArgument; exhausted
// memory is ResourceExhausted; an unsupported feature Unimplemented.
absl::Status UcxStatus(ucs_status_t status, absl::string_view call);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_UCX_STATUS_H_
