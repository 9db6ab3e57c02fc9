#ifndef PACKFEED_SCHEDULER_SRC_HYBRID_REFINER_H_
#define PACKFEED_SCHEDULER_SRC_HYBRID_REFINER_H_

// Local search for the hybrid objective (HybridStepTime, plan_stats.h). In
// Megatron's hybrid-CP loop the microbatches of one group (HybridGroupsOf:
// the same CP groups) run back to back on every rank, so inside a group
// only each CP block's total matters, not how it splits over the
// microbatches. The search evens those totals: it takes the group's
// heaviest block and moves one of its sequences, or swaps it for a lighter
// one, into a block of the same size (in any microbatch of the group)
// whose total stays below the heaviest's, where the token cap holds and no
// block of a microbatch is left empty; of the changes it finds it keeps
// the one that evens the two totals most. Every change lowers the sum of
// squares of the totals, so the search ends; a work budget (not a clock)
// bounds it, so plans are identical on every machine. Group sizes and
// padded lengths never change, so every invariant of the packed plan
// survives.

#include <cstdint>

#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

void RefineForHybrid(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SRC_HYBRID_REFINER_H_
