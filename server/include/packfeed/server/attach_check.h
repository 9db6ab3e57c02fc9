#ifndef PACKFEED_SERVER_ATTACH_CHECK_H_
#define PACKFEED_SERVER_ATTACH_CHECK_H_

// What an attach request can get wrong against its job, checked before any
// runner or transport is touched: token, rank, fingerprint (or its data part
// for an elastic resume), ring descriptor and size, start position. Pure;
// the control service's gate and a fuzz target's subject.

#include <string>

#include "absl/status/status.h"
#include "packfeed/server/job.h"
#include "packfeed/v1/service.pb.h"

namespace packfeed {

// OK, or the refusal with a message naming what is wrong: PermissionDenied
// (token), OutOfRange / FailedPrecondition (rank outside the world / not on
// this node), FailedPrecondition (fingerprint), InvalidArgument (ring,
// start position).
absl::Status CheckAttachRequest(const Job& job, const v1::AttachRequest& request);

// Compares secrets in time independent of where they differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace packfeed

#endif  // PACKFEED_SERVER_ATTACH_CHECK_H_
