#include "packfeed/scheduler/lower_bound.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/scheduler/padding.h"

namespace packfeed::scheduler {
namespace {

// The CP sizes a sequence may run with: every size of a dynamic_cp plan's
// range (powers of two), or the one static size.
CpRange SizesFor(const PlannerOptions& options) {
  if (options.kind != SchedulerKind::kDynamicCp) return {options.cp, options.cp};
  absl::StatusOr<CpRange> range = ResolveCpRange(options);
  return range.ok() ? *range : CpRange{options.cp, options.cp};
}

int64_t PaddedAt(int64_t length, int c, const PlannerOptions& options) {
  return PadTo(length, PaddingDivisor(c, options.tp, options.sequence_parallel));
}

// The smallest size in `range` at which the sequence fits the cap; 0 if none.
int OwnCp(int64_t length, const CpRange& range, const PlannerOptions& options) {
  return SmallestFittingCp(length, range.min, range.max, options.max_tokens_per_rank, options.tp,
                           options.sequence_parallel);
}

struct Upgrade {
  double cost_per_rank;  // at the larger size
  double spend;          // padded · (c / own − 1)
};

struct Item {
  double floor = 0;    // per-rank cost at its own size
  double tokens = 0;   // padded at its own size (the fewest)
  double density = 0;  // the most work per token at any size: max c·cost / tokens
  std::vector<Upgrade> upgrades;
};

// Tokens of the sequences whose microbatch must last ≥ tau, after the
// budget lifts what it can below tau (fractional knapsack, most tokens per
// unit spent first).
double Remaining(const std::vector<Item>& items, double tau, double budget) {
  double remaining = 0;
  struct Escape {
    double tokens, spend;
  };
  std::vector<Escape> escapes;
  for (const Item& item : items) {
    if (item.floor < tau) continue;
    remaining += item.tokens;
    double spend = std::numeric_limits<double>::infinity();
    for (const Upgrade& upgrade : item.upgrades) {
      if (upgrade.cost_per_rank < tau) spend = std::min(spend, upgrade.spend);
    }
    if (std::isfinite(spend)) escapes.push_back({item.tokens, spend});
  }
  std::sort(escapes.begin(), escapes.end(), [](const Escape& a, const Escape& b) {
    return a.tokens * b.spend > b.tokens * a.spend;
  });
  for (const Escape& escape : escapes) {
    if (budget <= 0) break;
    const double share = std::min(1.0, budget / escape.spend);
    remaining -= share * escape.tokens;
    budget -= share * escape.spend;
  }
  return remaining;
}

// Every sequence as the bound sees it, with the sums over them.
struct Sequences {
  std::vector<Item> items;
  double work = 0;               // W: Σ the least work of each sequence
  double budget_tokens = 0;      // Σ padded at the largest size, ≥ any plan's Σ padded
  double tokens = 0;             // Σ padded at each one's own size
  std::vector<double> cheapest;  // each sequence's least per-rank cost
};

absl::StatusOr<Sequences> SequencesOf(absl::Span<const int64_t> lengths,
                                      const PlannerOptions& options, const CpRange& range) {
  const CostModel& model = options.cost_model;
  Sequences out;
  out.items.reserve(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int own = OwnCp(lengths[i], range, options);
    if (own == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", i, " of length ", lengths[i], " does not fit at any CP size"));
    }
    Item item;
    double least_work = std::numeric_limits<double>::infinity();
    double most_work = 0;
    double largest_padded = 0;
    out.cheapest.push_back(std::numeric_limits<double>::infinity());
    for (int c = own; c <= range.max; c *= 2) {
      const int64_t padded = PaddedAt(lengths[i], c, options);
      const double cost = model.Cost(padded, c);
      least_work = std::min(least_work, c * cost);
      most_work = std::max(most_work, c * cost);
      largest_padded = static_cast<double>(padded);
      out.cheapest.back() = std::min(out.cheapest.back(), cost);
      if (c == own) {
        item.floor = cost;
        item.tokens = static_cast<double>(padded);
      } else {
        item.upgrades.push_back(
            {cost, static_cast<double>(padded) * (static_cast<double>(c) / own - 1)});
      }
      if (range.min == range.max) break;
    }
    item.density = most_work / item.tokens;
    out.work += least_work;
    out.budget_tokens += largest_padded;
    out.tokens += item.tokens;
    out.items.push_back(std::move(item));
  }
  return out;
}

// g_j for j = 1 … `fewest` (⌈Σ tokens / (N·cap)⌉): the least time of the
// j-th longest microbatch, by bisection over the floors; R(τ) falls as τ
// rises (fewer sequences, cheaper escapes).
std::vector<double> MicrobatchFloors(const std::vector<Item>& items, double capacity, double budget,
                                     int64_t fewest) {
  std::vector<double> floors;
  for (const Item& item : items) floors.push_back(item.floor);
  std::sort(floors.begin(), floors.end());
  floors.erase(std::unique(floors.begin(), floors.end()), floors.end());
  std::vector<double> g;
  for (int64_t j = 1; j <= fewest; ++j) {
    const double needed = static_cast<double>(j - 1) * capacity;
    size_t low = 0;
    size_t high = floors.size();  // the answer is floors[low - 1]; none if low stays 0
    while (low < high) {
      const size_t mid = (low + high) / 2;
      if (Remaining(items, floors[mid], budget) > needed) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    if (low == 0) break;
    g.push_back(floors[low - 1]);
  }
  return g;
}

}  // namespace

absl::StatusOr<StepTimeBound> LowerBoundStepTime(absl::Span<const int64_t> lengths,
                                                 const PlannerOptions& options,
                                                 double upgrade_budget) {
  if (options.kind == SchedulerKind::kMegatronDpBalanced) {
    return absl::InvalidArgumentError(
        "no lower bound for megatron_dp_balanced: it pads as Megatron does");
  }
  if (options.dp < 1 || options.cp < 1 || options.max_tokens_per_rank < 1 || lengths.empty()) {
    return absl::InvalidArgumentError(
        "a lower bound needs dp, cp and max_tokens_per_rank >= 1 and a sequence");
  }
  const CpRange range = SizesFor(options);
  const CostModel& model = options.cost_model;
  const double ranks = static_cast<double>(options.dp) * options.cp;
  const double capacity = ranks * static_cast<double>(options.max_tokens_per_rank);

  absl::StatusOr<Sequences> sequences = SequencesOf(lengths, options, range);
  if (!sequences.ok()) return sequences.status();
  const std::vector<Item>& items = sequences->items;
  const double work = sequences->work;
  const double tokens = sequences->tokens;
  std::vector<double>& cheapest = sequences->cheapest;
  const double budget = std::max(upgrade_budget, 0.0) * sequences->budget_tokens;

  const int64_t fewest = static_cast<int64_t>(std::ceil(tokens / capacity - 1e-9));
  const std::vector<double> g = MicrobatchFloors(items, capacity, budget, fewest);

  // D(X): the most work X tokens can carry.
  std::vector<const Item*> densest;
  for (const Item& item : items) densest.push_back(&item);
  std::sort(densest.begin(), densest.end(),
            [](const Item* a, const Item* b) { return a->density > b->density; });
  const auto most_work_in = [&](double room) {
    double carried = 0;
    for (const Item* item : densest) {
      if (room <= 0) break;
      const double taken = std::min(item->tokens, room);
      carried += taken * item->density;
      room -= taken;
    }
    return carried;
  };

  StepTimeBound bound;
  bound.ideal = work / ranks;
  bound.sum_of_max = bound.ideal;
  double floors_sum = 0;
  for (size_t k = 1; k <= g.size(); ++k) {
    floors_sum += g[k - 1];
    const double rest = std::max(0.0, work - most_work_in(static_cast<double>(k) * capacity));
    bound.sum_of_max = std::max(bound.sum_of_max, floors_sum + rest / ranks);
  }

  // StepTime = (Σ max + μ·M)(1 + bubble / M) for some M between the token
  // bound and the most microbatches that give every group a sequence. Each
  // microbatch holds a sequence, so Σ max is at least the M cheapest.
  const int64_t groups_per_microbatch =
      (options.dp * options.cp + range.max - 1) / static_cast<int64_t>(range.max);
  const int64_t most =
      std::max<int64_t>(fewest, static_cast<int64_t>(lengths.size()) / groups_per_microbatch);
  std::sort(cheapest.begin(), cheapest.end());
  double cheapest_sum = 0;
  bound.step_time = std::numeric_limits<double>::infinity();
  for (int64_t m = 1; m <= most; ++m) {
    cheapest_sum += cheapest[static_cast<size_t>(m - 1)];
    if (m < fewest) continue;
    const double md = static_cast<double>(m);
    const double sum_of_max = std::max(bound.sum_of_max, cheapest_sum);
    bound.step_time =
        std::min(bound.step_time, (sum_of_max + model.microbatch * md) * (1 + model.bubble / md));
  }
  return bound;
}

double UpgradeSpent(const GlobalPlan& plan, const PlannerOptions& options) {
  const CpRange range = SizesFor(options);
  double spent = 0;
  double padded = 0;
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    for (const CpGroup& group : microbatch.groups) {
      for (const PlannedSequence& s : group.sequences) {
        padded += static_cast<double>(s.padded_length);
        const int own = OwnCp(s.length, range, options);
        if (own > 0 && group.size > own) {
          spent +=
              static_cast<double>(s.padded_length) * (static_cast<double>(group.size) / own - 1);
        }
      }
    }
  }
  return padded > 0 ? spent / padded : 0;
}

}  // namespace packfeed::scheduler
