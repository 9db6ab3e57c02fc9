#ifndef PACKFEED_SCHEDULER_SRC_PLAN_REFINER_H_
#define PACKFEED_SCHEDULER_SRC_PLAN_REFINER_H_

// Local search after packing. The step costs Σ_m max_r W[m][r]; the refiner
// repeatedly takes a microbatch's heaviest group and moves one of its
// sequences — or swaps it for a lighter one — into a group of the same size
// (in any microbatch) whose own microbatch maximum does not rise and whose
// token cap holds. Every accepted change strictly lowers the step cost, so
// it terminates; `max_passes` bounds the time. Group sizes and padded
// lengths never change, so every invariant of the packed plan survives.

#include <cstdint>

#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

void RefinePlan(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank,
                int max_passes = 4);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SRC_PLAN_REFINER_H_
