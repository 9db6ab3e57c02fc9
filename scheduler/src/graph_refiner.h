#ifndef PACKFEED_SCHEDULER_SRC_GRAPH_REFINER_H_
#define PACKFEED_SCHEDULER_SRC_GRAPH_REFINER_H_

// Local search for the graph objective (GraphStepTime, plan_stats.h). Ranks
// meet only in their CP group (and EP block), so the step is set by one
// chain of groups, each starting when the last of its ranks is free; a
// microbatch's other groups may be lighter without cost. The search takes
// the groups of that critical chain and moves one of their sequences, or
// swaps it for a lighter one, into a group of the same size (any
// microbatch) whose slack (how much later it could finish without delaying
// the step) absorbs the extra work and whose token cap holds, most slack
// first; it keeps a change when the makespan falls, or stays and the
// ranks' finishes get more even (their sum of squares falls). Group sizes
// and padded lengths never change, so every invariant of the packed plan
// survives; a work budget (not a clock) bounds the search, so plans are
// identical on every machine.

#include <cstdint>

#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/plan_stats.h"

namespace packfeed::scheduler {

void RefineForGraph(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank,
                    ExecutionGraph graph);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SRC_GRAPH_REFINER_H_
