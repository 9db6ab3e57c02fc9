#ifndef PACKFEED_SCHEDULER_SRC_GROUP_MERGER_H_
#define PACKFEED_SCHEDULER_SRC_GROUP_MERGER_H_

// Dynamic CP's last balancing tool. A microbatch whose heaviest group holds
// sequences with no room left around them cannot be evened out by moving
// sequences; but two groups of the same size can merge into one group of
// twice the size, whose per-rank cost is their average. Groups may sit
// anywhere in a microbatch (any tiling by aligned power-of-two blocks is
// valid), so the heaviest group can merge with the lightest of its size.
// Where several groups share the maximum, only merging them all lowers it:
// a microbatch's k heaviest groups merge at once. Each merge runs its sequences at twice their CP
// size, so merges spend the planner's upgrade budget (a fraction of the batch's tokens) on the
// largest gains first.

#include <cstdint>
#include <vector>

#include "packfeed/scheduler/plan.h"
#include "scheduler/src/row_packer.h"

namespace packfeed::scheduler {

// `items[sample]` gives each sequence's own size. `budget`: CP inflation that
// may still be spent, in padded tokens (see Inflation in row_packer.h); a
// merge spends what running its groups' sequences at twice the size adds.
// Only groups whose sequences all run at their own size merge, unless
// `also_upgraded`.
void MergeHeaviestGroups(GlobalPlan& plan, const std::vector<PackerItem>& items,
                         const PackerConfig& config, double budget, bool also_upgraded);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SRC_GROUP_MERGER_H_
