#ifndef PACKFEED_SERVER_INTERNAL_PUSH_H_
#define PACKFEED_SERVER_INTERNAL_PUSH_H_

// Stage 4 of a step: puts one packed microbatch into a rank's ring slot
// with the step's metadata (DESIGN.md §4: put → flush → notify, by the
// transport's Sender). Runs on the thread that owns the Sender.

#include <cstdint>

#include "absl/status/status.h"
#include "packfeed/transport/sender.h"
#include "server/internal/pack.h"
#include "server/internal/plan.h"

namespace packfeed::server {

// Pushes `packed`, microbatch `microbatch` of `plan`, to connection `epoch`.
// ResourceExhausted when the rank has no free slot; any other error is the
// connection's.
absl::Status PushMicrobatch(transport::Sender& sender, uint64_t epoch, const StepPlan& plan,
                            int microbatch, const PackedMicrobatch& packed);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INTERNAL_PUSH_H_
