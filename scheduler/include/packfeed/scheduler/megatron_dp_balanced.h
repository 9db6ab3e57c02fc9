#ifndef PACKFEED_SCHEDULER_MEGATRON_DP_BALANCED_H_
#define PACKFEED_SCHEDULER_MEGATRON_DP_BALANCED_H_

// Megatron-LM's `dp_balanced` sequence-packing scheduler, reproduced exactly
// (dev d48bd6be0a), for users who must match Megatron's batches before
// switching to packfeed's planners. It balances tokens only, never work.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

struct MegatronDpBalancedOptions {
  int dp = 1;
  int cp = 1;
  // Megatron's max_seqlen_per_dp_cp_rank: a DP rank's pack holds at most
  // this × CP padded tokens. Required (> 0).
  int64_t max_seqlen_per_dp_cp_rank = 0;
  // thd_max_packed_sequences: at most this many sequences per pack. 0 = no
  // cap.
  int max_num_seqs = 0;
  // microbatch_group_size_per_vp_stage when VPP is on; 0 = VPP off.
  int vpp_group_size = 0;
};

// Next-fit in sample order into packs of ≤ max_seqlen_per_dp_cp_rank × CP
// padded tokens; then, walking back from the last pack, moves the last
// sequence of a pack into a new pack at the end until that pack holds one,
// and so on backwards, until the pack count is a multiple of DP (× the VPP
// group size); microbatch k of DP rank d is pack k·DP + d, shared by the CP
// ranks of d.
// `lengths` are real lengths (for the FLOPs inputs), `padded_lengths` what
// Megatron schedules. Errors (InvalidArgument): bad options or sizes;
// Megatron's "Not enough samples to move"; and — where Megatron would emit
// an empty pack that crashes it later (a first sequence longer than a pack)
// — an error saying so.
absl::StatusOr<GlobalPlan> PlanMegatronDpBalanced(absl::Span<const int64_t> lengths,
                                                  absl::Span<const int64_t> padded_lengths,
                                                  const MegatronDpBalancedOptions& options);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_MEGATRON_DP_BALANCED_H_
