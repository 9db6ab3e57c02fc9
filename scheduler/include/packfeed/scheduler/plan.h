#ifndef PACKFEED_SCHEDULER_PLAN_H_
#define PACKFEED_SCHEDULER_PLAN_H_

// The scheduler's output (docs/ARCHITECTURE.md): for each microbatch, the dp-cp
// ranks split into CP groups (aligned blocks of a power-of-two size under
// dynamic CP; DP blocks of CP ranks under static CP), each holding an ordered
// list of sequences that every rank of the group slices with zigzag CP.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace packfeed::scheduler {

// One sequence of the global batch as placed in a plan.
struct PlannedSequence {
  int64_t sample = 0;         // index into the batch (Megatron's gid)
  int64_t length = 0;         // real tokens
  int64_t padded_length = 0;  // a multiple of the group's padding divisor

  friend bool operator==(const PlannedSequence&, const PlannedSequence&) = default;
};

// Ranks [first_rank, first_rank + size) of the dp-cp group (r = cp + CP·dp)
// process `sequences`, in order, as one CP group.
struct CpGroup {
  int first_rank = 0;
  int size = 1;
  std::vector<PlannedSequence> sequences;

  friend bool operator==(const CpGroup&, const CpGroup&) = default;
};

struct PlannedMicrobatch {
  // Disjoint, ordered by first_rank, covering every dp-cp rank.
  std::vector<CpGroup> groups;

  friend bool operator==(const PlannedMicrobatch&, const PlannedMicrobatch&) = default;
};

// What Megatron's FLOPs formula consumes (padded) and what it claims to
// consume (real), summed over the whole global batch; exact integers.
struct FlopsInputs {
  int64_t padded_sum = 0;
  int64_t padded_squared_sum = 0;
  int64_t real_sum = 0;
  int64_t real_squared_sum = 0;

  friend bool operator==(const FlopsInputs&, const FlopsInputs&) = default;
};

struct GlobalPlan {
  int dp_cp_size = 1;  // N = DP × CP
  std::vector<PlannedMicrobatch> microbatches;
  FlopsInputs flops;

  int num_microbatches() const { return static_cast<int>(microbatches.size()); }
  friend bool operator==(const GlobalPlan&, const GlobalPlan&) = default;
};

// Σ and Σ² of the planned sequences' real and padded lengths.
FlopsInputs ComputeFlopsInputs(const GlobalPlan& plan);

// The group of `plan.microbatches[m]` that holds dp-cp rank `rank`.
// REQUIRES: the plan is well formed (see ValidatePlan).
const CpGroup& GroupOfRank(const PlannedMicrobatch& microbatch, int rank);

// Megatron's hybrid-CP loop runs a global batch as groups, with a barrier
// over every dp-cp rank after each, and a rank changes CP partners only at
// a barrier. Microbatches whose CP groups are the same (each group's
// first_rank and size) run as one such group: each rank runs their
// sequences back to back with the same partners, so no rank waits on a
// partner inside it, and the step loses a barrier per merged microbatch
// (the slowest rank's sum never exceeds the sum of each microbatch's
// slowest). Returns each microbatch's group, numbered in order of first
// appearance.
std::vector<int> HybridGroupsOf(const GlobalPlan& plan);

// Checks the structural invariants every planner promises: groups disjoint,
// ordered and covering [0, N); aligned (first_rank % size == 0; static CP
// may use any size, dynamic CP's are powers of two); every sample in [0,
// num_samples) placed exactly once; padded ≥ real. Internal error naming the
// first violation.
absl::Status ValidatePlan(const GlobalPlan& plan, int64_t num_samples);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_PLAN_H_
