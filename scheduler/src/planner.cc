#include "packfeed/scheduler/planner.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/scheduler/megatron_dp_balanced.h"
#include "packfeed/scheduler/padding.h"
#include "packfeed/scheduler/plan_stats.h"
#include "scheduler/src/graph_refiner.h"
#include "scheduler/src/group_merger.h"
#include "scheduler/src/plan_refiner.h"
#include "scheduler/src/row_packer.h"

namespace packfeed::scheduler {
namespace {

constexpr double kUnlimited = 1e300;

// Each candidate plan costs a full pack. Past this many sequences × ranks a
// batch is packed once, at the configured budget, so that 8 192 sequences
// over 1 024 ranks plan within 20 ms (docs/SCHEDULER.md, "Scale").
constexpr int64_t kExploreWork = int64_t{1} << 22;

// The graph objective refines this many of its best candidates.
constexpr size_t kGraphRefined = 3;

bool IsPowerOfTwo(int x) { return x > 0 && (x & (x - 1)) == 0; }

int LargestPowerOfTwoAtMost(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

absl::Status ValidateCommon(absl::Span<const int64_t> lengths, const PlannerOptions& options) {
  if (options.dp < 1 || options.cp < 1 || options.tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("DP ", options.dp, ", CP ", options.cp,
                                                   " and TP ", options.tp, " must all be >= 1"));
  }
  if (options.max_tokens_per_rank < 1) {
    return absl::InvalidArgumentError(
        "max_tokens_per_rank must be >= 1 (padded tokens a rank may hold per "
        "microbatch)");
  }
  if (options.vpp_group_size < 0) {
    return absl::InvalidArgumentError("vpp_group_size must be >= 0");
  }
  const int ranks = options.dp * options.cp;
  if (options.execution.expert_parallel < 1 || ranks % options.execution.expert_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("expert parallel size ",
                                                   options.execution.expert_parallel,
                                                   " must be >= 1 and divide DP·CP = ", ranks));
  }
  if (lengths.empty()) {
    return absl::InvalidArgumentError("the global batch holds no sequences");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", i, " has length ", lengths[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GlobalPlan> PlanMegatron(absl::Span<const int64_t> lengths,
                                        const PlannerOptions& options) {
  // Megatron numbers the batch DP-rank-major: DP rank d reads positions
  // k·DP + d, and its k-th sample is gid d·(G/DP) + k. It pads every sequence
  // for the static CP, whatever it is scheduled with.
  const int64_t size = static_cast<int64_t>(lengths.size());
  if (size % options.dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("megatron_dp_balanced: a batch of ", size,
                                                   " is not a multiple of DP ", options.dp));
  }
  const int64_t per_dp = size / options.dp;
  const int64_t divisor = PaddingDivisor(options.cp, options.tp, options.sequence_parallel);
  std::vector<int64_t> real(lengths.size()), padded(lengths.size()), position(lengths.size());
  for (int64_t p = 0; p < size; ++p) {
    const int64_t gid =
        options.lengths_in_megatron_order ? p : (p % options.dp) * per_dp + p / options.dp;
    padded[gid] = PadTo(lengths[p], divisor);
    real[gid] = options.megatron_padding_is_real ? padded[gid] : lengths[p];
    position[gid] = p;
  }
  MegatronDpBalancedOptions megatron;
  megatron.dp = options.dp;
  megatron.cp = options.cp;
  megatron.max_seqlen_per_dp_cp_rank = options.max_tokens_per_rank;
  megatron.max_num_seqs = options.max_sequences_per_pack;
  megatron.vpp_group_size = options.vpp_group_size;
  absl::StatusOr<GlobalPlan> plan = PlanMegatronDpBalanced(real, padded, megatron);
  if (!plan.ok()) return plan.status();
  // Name each sequence by its position in the batch given, as every planner does.
  for (PlannedMicrobatch& microbatch : plan->microbatches) {
    for (CpGroup& group : microbatch.groups) {
      for (PlannedSequence& sequence : group.sequences) {
        sequence.sample = position[static_cast<size_t>(sequence.sample)];
      }
    }
  }
  return plan;
}

// Each sequence's smallest group: CP under static CP; under dynamic CP the
// smallest allowed power of two whose per-rank share fits the cap.
absl::StatusOr<std::vector<PackerItem>> MakeItems(absl::Span<const int64_t> lengths,
                                                  const PackerConfig& config) {
  std::vector<PackerItem> items;
  items.reserve(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int c =
        SmallestFittingCp(lengths[i], config.min_cp, config.max_cp, config.max_tokens_per_rank,
                          config.tp, config.sequence_parallel);
    if (c == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", i, " of length ", lengths[i], " does not fit in ", config.max_tokens_per_rank,
          " tokens per rank even at CP size ", config.max_cp, " (the largest allowed)"));
    }
    items.push_back({static_cast<int64_t>(i), lengths[i], c});
  }
  return items;
}

// After packing: under dynamic CP, merges that spend what is left of the
// upgrade budget on the heaviest groups (group_merger.h); then local search.
void Polish(GlobalPlan& plan, const std::vector<PackerItem>& items, const PackerConfig& config,
            SchedulerKind kind, double budget, bool merge_upgraded) {
  if (kind == SchedulerKind::kDynamicCp) {
    double total = 0;
    double upgraded = 0;
    for (const PlannedMicrobatch& microbatch : plan.microbatches) {
      for (const CpGroup& group : microbatch.groups) {
        for (const PlannedSequence& s : group.sequences) {
          total += static_cast<double>(s.padded_length);
          upgraded += Inflation(items[s.sample], group.size, config);
        }
      }
    }
    const double left = budget * total - upgraded;
    if (left >= 1) {
      MergeHeaviestGroups(plan, items, config, left, merge_upgraded);
    }
  }
  RefinePlan(plan, config.cost_model, config.max_tokens_per_rank);
}

}  // namespace

absl::StatusOr<Objective> ObjectiveFromName(absl::string_view name) {
  if (name.empty() || name == "barrier") return Objective::kBarrier;
  if (name == "graph") return Objective::kGraph;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown objective '", name, "'; expected barrier or graph"));
}

absl::StatusOr<SchedulerKind> SchedulerKindFromName(absl::string_view name) {
  if (name == "balanced") return SchedulerKind::kBalanced;
  if (name == "dynamic_cp") return SchedulerKind::kDynamicCp;
  if (name == "megatron_dp_balanced") return SchedulerKind::kMegatronDpBalanced;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown scheduler '", name, "'; expected balanced, dynamic_cp or megatron_dp_balanced"));
}

absl::string_view SchedulerKindName(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kBalanced:
      return "balanced";
    case SchedulerKind::kDynamicCp:
      return "dynamic_cp";
    case SchedulerKind::kMegatronDpBalanced:
      return "megatron_dp_balanced";
  }
  return "unknown";
}

absl::StatusOr<CpRange> ResolveCpRange(const PlannerOptions& options) {
  const int n = options.dp * options.cp;
  CpRange range;
  range.min = options.min_cp > 0 ? options.min_cp : 1;
  range.max = options.max_cp > 0 ? options.max_cp : LargestPowerOfTwoAtMost(n);
  if (!IsPowerOfTwo(range.min) || !IsPowerOfTwo(range.max) || range.min > range.max ||
      range.max > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("dynamic CP sizes [", range.min, ", ", range.max,
                     "] must be powers of two with min <= max <= DP×CP = ", n));
  }
  if (n % range.min != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DP×CP = ", n, " ranks cannot be split into groups of at least ", range.min,
                     " (the minimum CP size)"));
  }
  return range;
}

namespace {

// The packer's view of `options` (not megatron_dp_balanced).
absl::StatusOr<PackerConfig> PackerConfigOf(const PlannerOptions& options) {
  PackerConfig config;
  config.num_ranks = options.dp * options.cp;
  config.max_tokens_per_rank = options.max_tokens_per_rank;
  config.tp = options.tp;
  config.sequence_parallel = options.sequence_parallel;
  config.cost_model = options.cost_model;
  if (options.kind == SchedulerKind::kDynamicCp) {
    absl::StatusOr<CpRange> range = ResolveCpRange(options);
    if (!range.ok()) return range.status();
    config.min_cp = range->min;
    config.max_cp = range->max;
    config.cp_upgrade_budget = options.cp_upgrade_budget;
  } else {
    config.min_cp = config.max_cp = options.cp;
  }
  return config;
}

// What one budget gives: the plan at the fewest microbatches from `*rows`
// on (a multiple of `step`) that fit within it and, with `one_more`, at
// `step` more, polished (each also polished again with `full_budget`, if
// any, as another candidate). `*rows` becomes the count that fitted. If the
// budget pushes the count past what the batch can fill, giving every rank
// work matters more: plan without it.
absl::StatusOr<std::vector<GlobalPlan>> PlanWithBudget(const PackerBatch& batch,
                                                       PackerConfig config, SchedulerKind kind,
                                                       double budget, int64_t* rows, int step,
                                                       bool one_more, double full_budget) {
  const int64_t most = static_cast<int64_t>(batch.items.size());
  absl::Status last = absl::InvalidArgumentError(absl::StrCat(
      "cannot give every one of the ", config.num_ranks, " ranks a sequence in each of ", *rows,
      " microbatches (a multiple of ", step, "): the batch holds ", most, " sequences"));
  for (const double tried : {budget, kUnlimited}) {
    config.cp_upgrade_budget = tried;
    for (int64_t count = *rows; count <= most; count += step) {
      absl::StatusOr<GlobalPlan> plan = PackRows(batch, static_cast<int>(count), config);
      if (plan.ok()) {
        std::vector<GlobalPlan> plans;
        plans.push_back(*std::move(plan));
        if (one_more && count + step <= most) {
          plan = PackRows(batch, static_cast<int>(count + step), config);
          if (plan.ok()) plans.push_back(*std::move(plan));
        }
        // Each polished within what it was packed with and, as another
        // candidate, with merges that may spend the whole budget and take
        // groups already above their own size.
        const size_t packed = plans.size();
        if (kind == SchedulerKind::kDynamicCp && full_budget > 0 && tried <= full_budget) {
          for (size_t i = 0; i < packed; ++i) plans.push_back(plans[i]);
        }
        for (size_t i = 0; i < plans.size(); ++i) {
          const bool again = i >= packed;
          Polish(plans[i], batch.items, config, kind, again ? full_budget : tried, again);
        }
        if (tried < kUnlimited) *rows = count;
        return plans;
      }
      last = plan.status();
      if (!absl::IsResourceExhausted(last)) break;  // more cannot help
    }
    if (tried >= kUnlimited) break;
  }
  return absl::InvalidArgumentError(last.message());
}

}  // namespace

absl::Status CheckSequenceFits(int64_t length, const PlannerOptions& options) {
  if (options.kind == SchedulerKind::kMegatronDpBalanced) return absl::OkStatus();
  absl::StatusOr<PackerConfig> config = PackerConfigOf(options);
  if (!config.ok()) return config.status();
  const int64_t lengths[] = {length};
  return MakeItems(lengths, *config).status();
}

absl::StatusOr<GlobalPlan> PlanGlobalBatch(absl::Span<const int64_t> lengths,
                                           const PlannerOptions& options) {
  if (absl::Status status = ValidateCommon(lengths, options); !status.ok()) {
    return status;
  }
  if (options.kind == SchedulerKind::kMegatronDpBalanced) {
    return PlanMegatron(lengths, options);
  }
  absl::StatusOr<PackerConfig> packer = PackerConfigOf(options);
  if (!packer.ok()) return packer.status();
  PackerConfig& config = *packer;
  absl::StatusOr<std::vector<PackerItem>> items = MakeItems(lengths, config);
  if (!items.ok()) return items.status();
  const PackerBatch batch = MakePackerBatch(*std::move(items), config);

  // Start at the token lower bound (each sequence at its smallest group)
  // and add microbatches until everything fits.
  const int64_t tokens = batch.own_padded;
  const int64_t capacity = int64_t{config.num_ranks} * config.max_tokens_per_rank;
  const int step = options.vpp_group_size > 0 ? options.vpp_group_size : 1;
  int64_t rows = ((tokens + capacity - 1) / capacity + step - 1) / step * step;

  // The budget caps CP inflation; within it the cost model judges. More CP
  // or one more microbatch is not always faster (packing differs, and a
  // calibrated model prices the ring and each microbatch), so a batch small
  // enough plans with all, half and none of the budget, at the fewest
  // microbatches that fit and, where the model prices microbatches, at one
  // more (under s²/c one more always looks free); it keeps the plan with the
  // lowest modelled step time (the first on a tie). A smaller budget never
  // fits in fewer microbatches, so each search starts where the last
  // stopped.
  const bool explore = static_cast<int64_t>(batch.items.size()) * config.num_ranks <= kExploreWork;
  const bool one_more =
      explore && (config.cost_model.microbatch > 0 || config.cost_model.bubble > 0);
  std::vector<double> budgets = {options.cp_upgrade_budget};
  // The extra candidates (polished again, lifted anchors) only where
  // candidates are explored and the budget is at most 100 %: above that it
  // asks for the fewest microbatches whatever the inflation, and merges
  // spending it on a plan packed without it, at more microbatches, would
  // run sequences at many times their CP size.
  const bool bounded = explore && options.cp_upgrade_budget <= 1.0;
  const double polish_budget = bounded ? options.cp_upgrade_budget : 0.0;
  if (explore && options.kind == SchedulerKind::kDynamicCp && options.cp_upgrade_budget > 0) {
    budgets = {options.cp_upgrade_budget, options.cp_upgrade_budget / 2, 0.0};
  }
  // The candidates are the same whatever the objective (the last one below
  // depends on the barrier's choice); the objective picks among them.
  const bool graph = options.objective == Objective::kGraph;
  std::optional<GlobalPlan> best;  // by StepTime
  double best_time = 0;
  // The graph objective: the candidates with the lowest graph times, best
  // first, ties in the order planned.
  std::vector<std::pair<double, GlobalPlan>> best_graph;
  const auto consider = [&](std::vector<GlobalPlan>& plans) {
    for (GlobalPlan& plan : plans) {
      if (graph) {
        const double time = GraphStepTime(plan, config.cost_model, options.execution);
        const auto at = std::upper_bound(
            best_graph.begin(), best_graph.end(), time,
            [](double t, const std::pair<double, GlobalPlan>& entry) { return t < entry.first; });
        if (static_cast<size_t>(at - best_graph.begin()) < kGraphRefined) {
          best_graph.insert(at, {time, plan});
          if (best_graph.size() > kGraphRefined) best_graph.pop_back();
        }
      }
      const double time = StepTime(plan, config.cost_model);
      if (!best || time < best_time) {
        best = std::move(plan);
        best_time = time;
      }
    }
  };
  const int64_t lower_bound = rows;
  for (const double budget : budgets) {
    absl::StatusOr<std::vector<GlobalPlan>> plans =
        PlanWithBudget(batch, config, options.kind, budget, &rows, step, one_more, polish_budget);
    if (!plans.ok()) return plans.status();
    consider(*plans);
  }
  // Giving every rank work can force a plan past the budget (a group
  // doubles rather than leave ranks idle), at many microbatches. Once the
  // budget is spent anyway, the fewest microbatches without it may be
  // faster: one more candidate.
  if (budgets.size() > 1 &&
      ComputePlanStats(*best, config.cost_model, config.max_tokens_per_rank, config.min_cp)
                  .cp_inflation -
              1 >
          options.cp_upgrade_budget) {
    int64_t from = lower_bound;
    absl::StatusOr<std::vector<GlobalPlan>> plans = PlanWithBudget(
        batch, config, options.kind, kUnlimited, &from, step, one_more, polish_budget);
    if (plans.ok()) consider(*plans);
  }
  // Heavy anchors lifted as the rows are laid out (row_packer.h).
  if (budgets.size() > 1 && bounded) {
    PackerConfig lifting = config;
    lifting.lift_heavy_anchors = true;
    int64_t from = lower_bound;
    absl::StatusOr<std::vector<GlobalPlan>> plans =
        PlanWithBudget(batch, lifting, options.kind, options.cp_upgrade_budget, &from, step,
                       one_more, polish_budget);
    if (plans.ok()) consider(*plans);
  }
  if (graph) {
    // How much the local search gains depends on the plan it starts from,
    // so the best few are refined and the fastest after it kept.
    size_t kept = 0;
    double kept_time = 0;
    for (size_t i = 0; i < best_graph.size(); ++i) {
      GlobalPlan& plan = best_graph[i].second;
      RefineForGraph(plan, config.cost_model, config.max_tokens_per_rank, options.execution);
      const double time = GraphStepTime(plan, config.cost_model, options.execution);
      if (i == 0 || time < kept_time) {
        kept = i;
        kept_time = time;
      }
    }
    return std::move(best_graph[kept].second);
  }
  return *std::move(best);
}

}  // namespace packfeed::scheduler
