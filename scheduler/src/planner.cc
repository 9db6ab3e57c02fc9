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
#include "scheduler/src/hybrid_refiner.h"
#include "scheduler/src/plan_refiner.h"
#include "scheduler/src/row_packer.h"

namespace packfeed::scheduler {
namespace {

constexpr double kUnlimited = 1e300;

// Each candidate plan costs a full pack. Past this many sequences × ranks a
// batch is packed once, at the configured budget, so that 8 192 sequences
// over 1 024 ranks plan within 20 ms (docs/SCHEDULER.md, "Scale").
constexpr int64_t kExploreWork = int64_t{1} << 22;

// The graph and hybrid objectives refine this many of each round's best
// candidates.
constexpr size_t kRefined = 3;

// The budgets dynamic_cp tries, up to the cap (ClimbTheBudgets).
// Fixed for a batch's size, so that a larger cap tries every rung a smaller
// one does; kNoInflationCap is the fewest microbatches whatever the
// inflation. Each rung costs a few packs, so batches past kFineRungsWork
// sequences × ranks climb fewer of them, without the lifted candidates (a
// 512-rank batch of 8 192 sequences then plans in about 0.1 s).
constexpr double kFineRungs[] = {0.0, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, kNoInflationCap};
constexpr double kCoarseRungs[] = {0.0, 0.05, 0.2, 1.0, kNoInflationCap};
constexpr int64_t kFineRungsWork = int64_t{1} << 18;

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
  if (name == "hybrid") return Objective::kHybrid;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown objective '", name, "'; expected barrier, graph or hybrid"));
}

absl::StatusOr<SchedulerKind> SchedulerKindFromName(absl::string_view name) {
  if (name == "balanced") return SchedulerKind::kBalanced;
  if (name == "dynamic_cp") return SchedulerKind::kDynamicCp;
  if (name == "megatron_dp_balanced") return SchedulerKind::kMegatronDpBalanced;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown scheduler '", name, "'; expected balanced, dynamic_cp or megatron_dp_balanced"));
}

absl::string_view ObjectiveName(Objective objective) {
  switch (objective) {
    case Objective::kBarrier:
      return "barrier";
    case Objective::kGraph:
      return "graph";
    case Objective::kHybrid:
      return "hybrid";
  }
  return "unknown";
}

double ObjectiveTime(const GlobalPlan& plan, const PlannerOptions& options) {
  switch (options.objective) {
    case Objective::kGraph:
      return GraphStepTime(plan, options.cost_model, options.execution);
    case Objective::kHybrid:
      return HybridStepTime(plan, options.cost_model);
    case Objective::kBarrier:
      break;
  }
  return StepTime(plan, options.cost_model);
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

// What one budget packs, before polishing: the plan at the fewest
// microbatches from `rows` on (a multiple of `step`) that fit within it
// and, with `one_more`, at `step` more. If the budget pushes the count past
// what the batch can fill, giving every rank work matters more: packed
// without it (`budget` is then kUnlimited).
struct Packed {
  std::vector<GlobalPlan> plans;
  double budget = 0;
};
absl::StatusOr<Packed> PackWithBudget(const PackerBatch& batch, PackerConfig config, double budget,
                                      int64_t rows, int step, bool one_more) {
  const int64_t most = static_cast<int64_t>(batch.items.size());
  absl::Status last = absl::InvalidArgumentError(absl::StrCat(
      "cannot give every one of the ", config.num_ranks, " ranks a sequence in each of ", rows,
      " microbatches (a multiple of ", step, "): the batch holds ", most, " sequences"));
  for (const double tried : {budget, kUnlimited}) {
    config.cp_upgrade_budget = tried;
    for (int64_t count = rows; count <= most; count += step) {
      absl::StatusOr<GlobalPlan> plan = PackRows(batch, static_cast<int>(count), config);
      if (plan.ok()) {
        Packed packed;
        packed.budget = tried;
        packed.plans.push_back(*std::move(plan));
        if (one_more && count + step <= most) {
          plan = PackRows(batch, static_cast<int>(count + step), config);
          if (plan.ok()) packed.plans.push_back(*std::move(plan));
        }
        return packed;
      }
      last = plan.status();
      if (!absl::IsResourceExhausted(last)) break;  // more cannot help
    }
    if (tried >= kUnlimited) break;
  }
  return absl::InvalidArgumentError(last.message());
}

// `packed`'s plans, each polished with `budget` (merges taking groups
// already above their own size with `merge_upgraded`).
std::vector<GlobalPlan> Polished(const Packed& packed, const PackerBatch& batch,
                                 const PackerConfig& config, SchedulerKind kind, double budget,
                                 bool merge_upgraded) {
  std::vector<GlobalPlan> plans = packed.plans;
  for (GlobalPlan& plan : plans) Polish(plan, batch.items, config, kind, budget, merge_upgraded);
  return plans;
}

// The plans a batch's candidates gave, judged by the objective: the
// fastest by StepTime (ties: the first planned) or, for the graph and
// hybrid objectives, by GraphStepTime or HybridStepTime after their local
// search. How much a search gains depends on the plan it starts from, so it
// refines a few of each round's fastest candidates (EndRound) and keeps
// the fastest result: a candidate's refinement depends on its round alone,
// which keeps the planner's step time monotone in its cap for these
// objectives too.
class Candidates {
 public:
  explicit Candidates(const PlannerOptions& options) : options_(options) {}

  void Consider(std::vector<GlobalPlan>& plans) {
    for (GlobalPlan& plan : plans) {
      const double time = ObjectiveTime(plan, options_);
      if (options_.objective == Objective::kBarrier) {
        if (!best_ || time < best_time_) {
          best_ = std::move(plan);
          best_time_ = time;
        }
        continue;
      }
      const auto at = std::upper_bound(
          round_.begin(), round_.end(), time,
          [](double t, const std::pair<double, GlobalPlan>& entry) { return t < entry.first; });
      if (static_cast<size_t>(at - round_.begin()) < kRefined) {
        round_.insert(at, {time, std::move(plan)});
        if (round_.size() > kRefined) round_.pop_back();
      }
    }
  }

  // Graph and hybrid objectives: refines this round's few fastest and
  // keeps the fastest refined plan so far.
  void EndRound() {
    for (auto& [unused, plan] : round_) {
      if (options_.objective == Objective::kGraph) {
        RefineForGraph(plan, options_.cost_model, options_.max_tokens_per_rank, options_.execution);
      } else {
        RefineForHybrid(plan, options_.cost_model, options_.max_tokens_per_rank);
      }
      const double time = ObjectiveTime(plan, options_);
      if (!best_ || time < best_time_) {
        best_ = std::move(plan);
        best_time_ = time;
      }
    }
    round_.clear();
  }

  // The plan kept (at least one plan was considered).
  GlobalPlan Take() {
    EndRound();
    return *std::move(best_);
  }

 private:
  const PlannerOptions& options_;
  std::optional<GlobalPlan> best_;  // barrier: the fastest; else the fastest refined
  double best_time_ = 0;
  std::vector<std::pair<double, GlobalPlan>> round_;
};

double InflationOf(const GlobalPlan& plan, const PackerConfig& config) {
  return ComputePlanStats(plan, config.cost_model, config.max_tokens_per_rank, config.min_cp)
             .cp_inflation -
         1;
}

// The candidates whose heavy anchors are lifted as the rows are laid out
// (row_packer.h), packed within `rung`, polished within what they spent
// and again with merges that may spend the rung.
void ConsiderLifted(const PackerBatch& batch, PackerConfig config, SchedulerKind kind, double rung,
                    int64_t lower_bound, int step, bool one_more, Candidates& candidates) {
  config.lift_heavy_anchors = true;
  absl::StatusOr<Packed> packed = PackWithBudget(batch, config, rung, lower_bound, step, one_more);
  if (!packed.ok()) return;
  std::vector<GlobalPlan> plans = Polished(*packed, batch, config, kind, packed->budget, false);
  candidates.Consider(plans);
  if (packed->budget <= rung) {
    plans = Polished(*packed, batch, config, kind, rung, true);
    candidates.Consider(plans);
  }
}

// dynamic_cp's search (docs/SCHEDULER.md, "Plans chosen by cost"). More CP
// or one more microbatch is not always faster (packing differs; a model in
// seconds prices the ring and each microbatch), so the budget caps the
// inflation and the model chooses within it. Each rung of a fixed ladder
// of budgets up to the cap gives candidates that depend on the rung alone,
// so a larger cap considers every plan a smaller one does and the modelled
// step time never rises with the cap. A batch too large to explore is
// packed once: under s²/c at the cap (CP looks free, so the budget stands in
// for its cost), under a model that prices CP without inflation, the same
// plan under every cap.
absl::Status ClimbTheBudgets(const PackerBatch& batch, const PackerConfig& config,
                             const PlannerOptions& options, int64_t lower_bound, int step,
                             int64_t work, bool one_more, Candidates& candidates) {
  const bool explore = work <= kExploreWork;
  if (!explore) {
    const double budget = config.cost_model.ModelsOverheads() ? 0.0 : options.cp_upgrade_budget;
    absl::StatusOr<Packed> packed = PackWithBudget(batch, config, budget, lower_bound, step, false);
    if (!packed.ok()) return packed.status();
    std::vector<GlobalPlan> plans =
        Polished(*packed, batch, config, options.kind, packed->budget, false);
    candidates.Consider(plans);
    return absl::OkStatus();
  }
  const bool fine = work <= kFineRungsWork;
  const absl::Span<const double> rungs =
      fine ? absl::Span<const double>(kFineRungs) : absl::Span<const double>(kCoarseRungs);
  std::vector<Packed> climbed;  // the rungs' packs so far, within their rung
  bool fewest_planned = false;
  for (const double rung : rungs) {
    if (rung > options.cp_upgrade_budget) break;
    absl::StatusOr<Packed> packed =
        PackWithBudget(batch, config, rung, lower_bound, step, one_more);
    if (!packed.ok()) return packed.status();
    std::vector<GlobalPlan> plans =
        Polished(*packed, batch, config, options.kind, packed->budget, false);
    // A plan forced past its rung (a group doubles rather than leave ranks
    // idle) may do better at the fewest microbatches.
    bool exceeded = false;
    for (const GlobalPlan& plan : plans) exceeded |= InflationOf(plan, config) > rung;
    candidates.Consider(plans);
    if (exceeded && !fewest_planned) {
      fewest_planned = true;
      absl::StatusOr<Packed> fewest =
          PackWithBudget(batch, config, kUnlimited, lower_bound, step, one_more);
      if (fewest.ok()) {
        plans = Polished(*fewest, batch, config, options.kind, kUnlimited, false);
        candidates.Consider(plans);
      }
    }
    // Above 100 % a budget asks for the fewest microbatches whatever the
    // inflation; merges spending it on plans packed at more microbatches
    // would run sequences at many times their CP size. Up to it, every pack
    // so far is polished again with merges that may spend this rung and
    // take groups already above their own size, and (fine rungs) heavy
    // anchors are lifted as the rows are laid out (row_packer.h).
    if (rung <= 1.0) {
      if (packed->budget <= rung) climbed.push_back(*std::move(packed));
      if (rung > 0) {
        for (const Packed& below : climbed) {
          plans = Polished(below, batch, config, options.kind, rung, true);
          candidates.Consider(plans);
        }
        if (fine) {
          ConsiderLifted(batch, config, options.kind, rung, lower_bound, step, one_more,
                         candidates);
        }
      }
    }
    candidates.EndRound();
  }
  return absl::OkStatus();
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
  const int64_t lower_bound = ((tokens + capacity - 1) / capacity + step - 1) / step * step;

  // Sequences × ranks: what each candidate's pack costs (kExploreWork).
  const int64_t work = static_cast<int64_t>(batch.items.size()) * config.num_ranks;
  const bool explore = work <= kExploreWork;
  // One more microbatch: where the model prices microbatches, a trade of
  // μ for balance; under the hybrid objective, which prices sub-samples
  // instead, free room in which the refiner evens the ranks' totals.
  const bool one_more =
      explore && (config.cost_model.microbatch > 0 || config.cost_model.bubble > 0 ||
                  options.objective == Objective::kHybrid);
  Candidates candidates(options);
  if (options.kind == SchedulerKind::kDynamicCp) {
    absl::Status status =
        ClimbTheBudgets(batch, config, options, lower_bound, step, work, one_more, candidates);
    if (!status.ok()) return status;
  } else {
    // Static CP has no inflation to spend: one search.
    absl::StatusOr<Packed> packed =
        PackWithBudget(batch, config, options.cp_upgrade_budget, lower_bound, step, one_more);
    if (!packed.ok()) return packed.status();
    std::vector<GlobalPlan> plans =
        Polished(*packed, batch, config, options.kind, packed->budget, false);
    candidates.Consider(plans);
  }
  return candidates.Take();
}

}  // namespace packfeed::scheduler
