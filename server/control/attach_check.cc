#include "server/control/attach_check.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "packfeed/common/constant_time.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/wire.h"
#include "server/config/fingerprint.h"

namespace packfeed::server {

absl::Status CheckAttachRequest(const Job& job, const v1::AttachRequest& request) {
  PF_RETURN_IF_ERROR(CheckToken(request.auth_token(), job.spec().auth_token,
                                absl::StrCat("auth token for job ", job.name())));
  const int world = job.layout().world_size();
  if (request.global_rank() >= static_cast<uint32_t>(world)) {
    return absl::OutOfRangeError(absl::StrCat("rank ", request.global_rank(), " is outside job ",
                                              job.name(), "'s world of ", world, " ranks"));
  }
  if (!job.IsLocal(static_cast<int>(request.global_rank()))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.name(), " rank ", request.global_rank(), " is not hosted by this daemon (",
        job.local_ranks().size(), " local ranks, from ", job.local_ranks().front(), " to ",
        job.local_ranks().back(), ")"));
  }
  if (request.elastic() && request.fingerprint().empty()) {
    return absl::InvalidArgumentError(
        "an elastic resume needs the fingerprint the checkpoint was taken under");
  }
  if (!request.fingerprint().empty()) {
    absl::Status match =
        CompareFingerprints(request.fingerprint(), job.fingerprint(), request.elastic());
    if (!match.ok()) return match;
  }
  absl::StatusOr<transport::RingDescriptor> ring =
      transport::DecodeRingDescriptor(request.ring().ring_descriptor());
  if (!ring.ok()) {
    return absl::Status(ring.status().code(),
                        absl::StrCat("ring descriptor: ", ring.status().message()));
  }
  if (ring->slot_bytes < job.required_slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("ring slots of ", ring->slot_bytes,
                                                   " bytes are smaller than job ", job.name(),
                                                   "'s largest microbatch: slots of at least ",
                                                   job.required_slot_bytes(), " bytes are needed"));
  }
  if (request.start_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("start step ", request.start_step(), " < 0"));
  }
  if (request.elastic() && request.start_microbatch() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an elastic resume starts at a step boundary, not at microbatch ",
                     request.start_microbatch(), " of step ", request.start_step(),
                     " (another layout plans that step's microbatches differently)"));
  }
  return AttachStartStep(job, request).status();
}

absl::StatusOr<int64_t> AttachStartStep(const Job& job, const v1::AttachRequest& request) {
  if (!request.has_start_sample()) return request.start_step();
  if (job.pretraining() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("start_sample is for pretraining jobs; job ",
                                                   job.name(),
                                                   " counts in steps: attach with start_step"));
  }
  const int64_t sample = request.start_sample();
  const std::optional<int64_t> step = job.batch_schedule().StepStartingAt(sample);
  if (!step) {
    const int64_t first = job.spec().pretraining->consumed_samples;
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", job.name(), " serves its steps from sample ", first, " (consumed_samples) in ",
        job.batch_schedule().constant()
            ? absl::StrCat("global batches of ", job.spec().global_batch)
            : std::string("the global batches of its batch_schedule"),
        "; sample ", sample, sample < first ? " lies before its first step" : " lies inside a step",
        ": restart the daemon with consumed_samples set to the trainer's count"));
  }
  return *step;
}

absl::Status CheckToken(const std::string& presented, const std::string& required,
                        absl::string_view what) {
  if (required.empty() || ConstantTimeEquals(presented, required)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("wrong ", what));
}

}  // namespace packfeed::server
