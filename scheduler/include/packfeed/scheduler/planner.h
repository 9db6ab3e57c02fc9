#ifndef PACKFEED_SCHEDULER_PLANNER_H_
#define PACKFEED_SCHEDULER_PLANNER_H_

// packfeed's planners (docs/ARCHITECTURE.md): from the real lengths of one global
// batch and the topology, a GlobalPlan whose microbatches are balanced by
// the cost model. Pure and deterministic: equal inputs give equal plans on
// every node (no hashing, no unordered iteration, no wall clock).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"
#include "packfeed/scheduler/plan_stats.h"

namespace packfeed::scheduler {

enum class SchedulerKind {
  kBalanced,            // static CP: every sequence runs on its DP rank's CP
  kDynamicCp,           // per-sequence CP size, aligned power-of-two groups
  kMegatronDpBalanced,  // Megatron-LM's dp_balanced, reproduced exactly
};

// What balanced and dynamic_cp minimise (plan_stats.h): StepTime, ranks
// meeting at the end of every microbatch; GraphStepTime, ranks meeting
// only where the model makes them; or HybridStepTime, as Megatron's
// hybrid-CP loop runs the plan (a barrier per group of microbatches with
// the same CP groups, each sequence its own forward).
enum class Objective { kBarrier, kGraph, kHybrid };
// "barrier" (also ""), "graph", "hybrid".
absl::StatusOr<Objective> ObjectiveFromName(absl::string_view name);
absl::string_view ObjectiveName(Objective objective);

// "balanced", "dynamic_cp", "megatron_dp_balanced".
absl::StatusOr<SchedulerKind> SchedulerKindFromName(absl::string_view name);
absl::string_view SchedulerKindName(SchedulerKind kind);

// cp_upgrade_budget when a job names none: 0.05 under s²/c, no cap under a
// model that prices CP (CostModel::ModelsOverheads).
inline constexpr double kDefaultCpUpgradeBudget = 0.05;
inline constexpr double kNoInflationCap = 1e9;

struct PlannerOptions {
  SchedulerKind kind = SchedulerKind::kBalanced;
  int dp = 1;  // data-parallel size
  int cp = 1;  // context-parallel size; N = DP × CP dp-cp ranks
  int tp = 1;  // tensor-parallel size (padding only, with sequence_parallel)
  bool sequence_parallel = false;
  // microbatch_group_size_per_vp_stage; 0 = VPP off. When on, the number of
  // microbatches is a multiple of it.
  int vpp_group_size = 0;
  // Padded tokens one rank may hold per microbatch, after the CP split.
  // Required (>= 1).
  int64_t max_tokens_per_rank = 0;
  // dynamic_cp only: CP sizes allowed, powers of two; 0 = 1 and the largest
  // power of two <= N.
  int min_cp = 0;
  int max_cp = 0;
  // dynamic_cp only. Power-of-two groups leave a sequence just over half a
  // group's cap with an almost half-empty group; filling that room, or
  // evening out a microbatch by merging groups, runs sequences at a larger
  // CP size than they need. This is the CP inflation (token-weighted
  // c / c_needed, minus 1) the plan may spend to save microbatches and to
  // balance. A batch that cannot otherwise give every rank work may exceed
  // it.
  //   Under s²/c (a model that does not ModelsOverheads) CP looks free, so
  //   the budget stands in for its cost: the plan spends up to it and past
  //   it uses more microbatches; kNoInflationCap = the fewest microbatches
  //   whatever the inflation.
  //   Under a model that prices CP and microbatches the plan chooses the
  //   inflation by modelled time, and the budget only caps it: the step
  //   time never rises with the cap (docs/SCHEDULER.md, "Plans chosen by
  //   cost").
  double cp_upgrade_budget = kDefaultCpUpgradeBudget;
  // The model the objective's step time is taken under. dynamic_cp plans
  // candidates for batches up to 2²² sequences × ranks (budgets, one more
  // microbatch where the model prices microbatches or the objective is
  // kHybrid) and keeps the fastest (docs/SCHEDULER.md).
  CostModel cost_model = CostModel::Megatron();
  // kGraph: candidates are judged by GraphStepTime over `execution`, and
  // the one kept is refined for it (scheduler/src/graph_refiner.h).
  // kHybrid: candidates are judged by HybridStepTime.
  Objective objective = Objective::kBarrier;
  ExecutionGraph execution;
  // megatron_dp_balanced only: Megatron's thd_max_packed_sequences (0 = no
  // cap).
  int max_sequences_per_pack = 0;
  // megatron_dp_balanced only: the batch holds rows of Megatron's SFT
  // dataset, whose padding Megatron counts as real tokens.
  bool megatron_padding_is_real = false;
  // megatron_dp_balanced only: `lengths` are already in Megatron's global
  // order (index = gid), as the bench traces replay Megatron's global
  // batches. False (the daemon): they are the sampler's batch positions,
  // which Megatron's DP ranks read DP-rank-major.
  bool lengths_in_megatron_order = false;
};

// Plans one global batch. `lengths[i]` is the real length of sample i (i is
// the sample's position in the batch, and PlannedSequence::sample names it).
// megatron_dp_balanced numbers the batch as Megatron does, DP-rank-major
// (DP rank d reads positions k·DP + d; see lengths_in_megatron_order), pads
// every sequence to Megatron's divisor and reproduces its plan exactly. Every sample is placed
// exactly once, never split across microbatches; every rank of every microbatch holds at least one
// sequence; per-rank tokens (Σ padded / c over its group) stay within max_tokens_per_rank; the
// number of microbatches is the same on every DP rank and a multiple of the VPP group size. Errors
// (InvalidArgument): bad options; a sequence that does not fit at the largest allowed CP size
// (naming the sample and its length); a batch too small to give every rank a sequence; Megatron's
// own dp_balanced failures.
absl::StatusOr<GlobalPlan> PlanGlobalBatch(absl::Span<const int64_t> lengths,
                                           const PlannerOptions& options);

// What PlanGlobalBatch minimises: the plan's StepTime, GraphStepTime over
// options.execution or HybridStepTime, as options.objective says, under
// options.cost_model.
double ObjectiveTime(const GlobalPlan& plan, const PlannerOptions& options);

// InvalidArgument (as PlanGlobalBatch's, for "sample 0") when a sequence of
// real length `length` does not fit max_tokens_per_rank even at the largest
// CP size `options` allow. Always OK for megatron_dp_balanced.
absl::Status CheckSequenceFits(int64_t length, const PlannerOptions& options);

// The CP sizes a dynamic_cp plan may use, after defaults: [min, max].
struct CpRange {
  int min = 1;
  int max = 1;
};
absl::StatusOr<CpRange> ResolveCpRange(const PlannerOptions& options);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_PLANNER_H_
