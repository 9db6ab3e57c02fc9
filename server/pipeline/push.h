#ifndef PACKFEED_SERVER_PIPELINE_PUSH_H_
#define PACKFEED_SERVER_PIPELINE_PUSH_H_

// Phase 4 of a step: writes one rank's microbatch into its ring slot with
// the step's metadata (docs/PROTOCOLS.md: put → flush → notify, by the
// transport's Sender). A ring mapped into the daemon (same-node shared
// memory) is written in place, one copy per byte from the step's data;
// any other is written into `staging` (reused, so no allocation per push)
// and put from there. Runs on the thread that owns the Sender; `workers`
// (optional) help write a large microbatch (WriteMicrobatch).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "packfeed/transport/slot_sender.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/plan.h"

namespace packfeed::server {

// Pushes `source`, microbatch `microbatch` of `plan`, to connection
// `connection_id`; `mapped`: the connection's Stats said so;
// `inline_small_fields`: its ring is device memory, so the bytes of fields
// of at most kInlineFieldBytes also go in the slot's metadata (the client
// reads max_seqlen without waiting for the device).
// ResourceExhausted when the rank has no free slot; InvalidArgument when
// the microbatch does not fit a slot; any other error is the connection's.
inline constexpr uint64_t kInlineFieldBytes = 64;
absl::Status PushMicrobatch(transport::SlotSender& sender, uint64_t connection_id, bool mapped,
                            bool inline_small_fields, const StepPlan& plan, int microbatch,
                            const MicrobatchSource& source, std::vector<uint8_t>& staging,
                            PackWorkers* workers = nullptr);

// A mapped ring's push in two halves, for a slot whose side rows are read
// straight into it in between (Storage::ReadInto): writes what is in
// memory into the connection's next slot, appends the reads that complete
// it to `reads`, and returns the slot and what CommitMapped announces once
// they are done. Not for a device ring, whose small fields ride in the
// metadata.
struct MappedWrite {
  uint8_t* slot = nullptr;
  transport::SlotContent content;
};
absl::StatusOr<MappedWrite> WriteMappedSlot(transport::SlotSender& sender, uint64_t connection_id,
                                            const StepPlan& plan, int microbatch,
                                            const MicrobatchSource& source, PackWorkers* workers,
                                            std::vector<SlotRead>& reads);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_PUSH_H_
