#ifndef PACKFEED_SCHEDULER_SRC_MEETING_RUNS_H_
#define PACKFEED_SCHEDULER_SRC_MEETING_RUNS_H_

// The sets of ranks that move together through one microbatch (plan_stats.h,
// GraphStepTime): a CP group, or with expert parallelism the groups whose
// ranks share an aligned EP block. Groups are aligned blocks in rank order,
// so each set is a run of consecutive groups ending on a multiple of EP.

#include <cstddef>
#include <utility>
#include <vector>

#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

// [first, last] group indices of each run, in rank order.
inline std::vector<std::pair<size_t, size_t>> MeetingRuns(const PlannedMicrobatch& microbatch,
                                                          int expert_parallel) {
  const int ep = expert_parallel > 1 ? expert_parallel : 1;
  std::vector<std::pair<size_t, size_t>> runs;
  size_t first = 0;
  while (first < microbatch.groups.size()) {
    size_t last = first;
    while ((microbatch.groups[last].first_rank + microbatch.groups[last].size) % ep != 0 &&
           last + 1 < microbatch.groups.size()) {
      ++last;
    }
    runs.emplace_back(first, last);
    first = last + 1;
  }
  return runs;
}

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SRC_MEETING_RUNS_H_
