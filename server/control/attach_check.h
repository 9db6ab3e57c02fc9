#ifndef PACKFEED_SERVER_CONTROL_ATTACH_CHECK_H_
#define PACKFEED_SERVER_CONTROL_ATTACH_CHECK_H_

// What an attach request can get wrong against its job, checked before any
// runner or transport is touched: token, rank, fingerprint (or its data part
// for an elastic resume), ring descriptor and size, start position. Pure;
// the control service's gate and a fuzz target's subject.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/v1/service.pb.h"
#include "server/pipeline/job.h"

namespace packfeed::server {

// OK, or the refusal with a message naming what is wrong: PermissionDenied
// (token), OutOfRange / FailedPrecondition (rank outside the world / not on
// this node), FailedPrecondition (fingerprint), InvalidArgument (ring,
// start position).
absl::Status CheckAttachRequest(const Job& job, const v1::AttachRequest& request);

// The step an attach starts at: the request's start_step, or the step of a
// pretraining job that begins at its start_sample (Megatron's consumed
// samples). InvalidArgument naming the job's consumed_samples and global
// batch when start_sample is set for another kind, lies before the job's
// first sample or between two steps.
absl::StatusOr<int64_t> AttachStartStep(const Job& job, const v1::AttachRequest& request);

// The one rule for every secret the daemon checks (a job's auth_token on
// attach, detach and drain; admin_tcp_token on the TCP listener): OK when
// `required` is empty (none configured) or `presented` equals it, compared
// in time independent of where they differ; else PermissionDenied naming
// `what` ("wrong auth token for job demo").
absl::Status CheckToken(const std::string& presented, const std::string& required,
                        absl::string_view what);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_ATTACH_CHECK_H_
