#ifndef PACKFEED_SCHEDULER_SLOT_BALANCE_H_
#define PACKFEED_SCHEDULER_SLOT_BALANCE_H_

// Balancing a fixed-layout global batch (Megatron pretraining: every
// microbatch of every DP rank holds micro_batch_size samples of the same
// length) by the samples' costs. Under document-masked attention a sample's
// cost is Σ over its documents, not seq², so Megatron's order leaves some
// ranks with most of the attention work. The batch's samples stay the same,
// so the gradient does too; only which slot computes which sample changes.
// Pure and deterministic.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "packfeed/scheduler/cost_model.h"

namespace packfeed::scheduler {

// A global batch of slots × per_slot samples (slot = microbatch · DP + DP
// rank) reordered by LPT: samples by falling cost (index on ties), each to
// the least loaded slot with room (lowest slot on ties); within a slot in
// ascending index. order[slot · per_slot + b] = the sample placed there.
// REQUIRES: costs.size() == slots · per_slot.
std::vector<int64_t> BalanceSlots(absl::Span<const double> costs, int slots, int per_slot);

// A sample's cost when each of its documents attends only to itself: the
// model's cost of each document piece, summed.
double DocumentMaskedCost(absl::Span<const int64_t> document_lengths, const CostModel& model);

// The modelled step time of `order` (as BalanceSlots returns it; identity
// = Megatron's order): Σ over microbatches of the slowest DP rank's cost,
// the ranks meeting after every microbatch.
double BarrierStepCost(absl::Span<const double> costs, absl::Span<const int64_t> order, int dp,
                       int per_slot);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SLOT_BALANCE_H_
