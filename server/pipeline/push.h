#ifndef PACKFEED_SERVER_PIPELINE_PUSH_H_
#define PACKFEED_SERVER_PIPELINE_PUSH_H_

// Phase 4 of a step: puts one packed microbatch into a rank's ring slot
// with the step's metadata (docs/PROTOCOLS.md: put → flush → notify, by the
// transport's Sender). Runs on the thread that owns the Sender.

#include <cstdint>

#include "absl/status/status.h"
#include "packfeed/transport/slot_sender.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/plan.h"

namespace packfeed::server {

// Pushes `packed`, microbatch `microbatch` of `plan`, to connection `connection_id`.
// ResourceExhausted when the rank has no free slot; any other error is the
// connection's.
absl::Status PushMicrobatch(transport::SlotSender& sender, uint64_t connection_id,
                            const StepPlan& plan, int microbatch, const PackedMicrobatch& packed);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_PUSH_H_
