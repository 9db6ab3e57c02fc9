#ifndef PACKFEED_SCHEDULER_INTERNAL_GROUP_MERGER_H_
#define PACKFEED_SCHEDULER_INTERNAL_GROUP_MERGER_H_

// Dynamic CP's last balancing tool. A microbatch whose heaviest group holds
// sequences with no room left around them cannot be evened out by moving
// sequences; but two groups of the same size can merge into one group of
// twice the size, whose per-rank cost is their average. Groups may sit
// anywhere in a microbatch (any tiling by aligned power-of-two blocks is
// valid), so the heaviest group can merge with the lightest of its size.
// Each merge runs its sequences at twice their CP size, so merges spend the
// planner's upgrade budget (a fraction of the batch's tokens) on the largest
// gains first, and a sequence is never merged above twice the size it needs.

#include <cstdint>

#include "internal/row_packer.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::internal {

// `budget_tokens`: padded tokens that may still move to a larger CP size.
void MergeHeaviestGroups(GlobalPlan& plan, const PackerConfig& config,
                         int64_t budget_tokens);

}  // namespace packfeed::internal

#endif  // PACKFEED_SCHEDULER_INTERNAL_GROUP_MERGER_H_
