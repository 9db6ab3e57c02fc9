#include "scheduler/src/group_merger.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

namespace packfeed::scheduler {
namespace {

// Per-rank cost and tokens of `groups`' sequences run together at `size`.
struct Load {
  double cost = 0;
  int64_t tokens = 0;
  int64_t padded = 0;
};
Load LoadAt(const std::vector<const CpGroup*>& groups, int size, const PackerConfig& config) {
  Load load;
  for (const CpGroup* group : groups) {
    for (const PlannedSequence& s : group->sequences) {
      const SequenceShape shape = ShapeAt(s.length, size, config);
      load.cost += shape.cost_per_rank;
      load.tokens += shape.tokens_per_rank;
      load.padded += shape.padded;
    }
  }
  return load;
}

bool AtOwnSize(const CpGroup& group, const std::vector<PackerItem>& items) {
  return std::all_of(group.sequences.begin(), group.sequences.end(), [&](const PlannedSequence& s) {
    return items[s.sample].cp_size == group.size;
  });
}

// What running a group's sequences at twice its size adds to the CP
// inflation (Inflation's unit).
double SpendToDouble(const CpGroup& group, const std::vector<PackerItem>& items,
                     const PackerConfig& config) {
  double spend = 0;
  for (const PlannedSequence& s : group.sequences) {
    spend += Inflation(items[s.sample], 2 * group.size, config) -
             Inflation(items[s.sample], group.size, config);
  }
  return spend;
}

// Merges within one microbatch: each heavy group with its partner.
struct Merge {
  std::vector<std::pair<size_t, size_t>> pairs;  // (heavy, partner)
  double gain = 0;                               // fall of the microbatch's maximum
  double spend = 0;                              // CP inflation it adds (Inflation's unit)
};

// At most this many heavy groups merge at once: several groups may share
// the maximum (sequences of one length), and only merging them all lowers it.
constexpr size_t kMostAtOnce = 64;

// The best merges for one microbatch: its k heaviest groups (k = 1, 2, …),
// each with the lightest unused partner of its size whose merged group
// holds the cap; of the k that lower the maximum within `budget`, the one
// with the most gain per inflation spent.
std::optional<Merge> BestMerge(const PlannedMicrobatch& microbatch,
                               const std::vector<PackerItem>& items, const PackerConfig& config,
                               bool also_upgraded, double budget) {
  const std::vector<CpGroup>& groups = microbatch.groups;
  // Per group: its load now and at twice its size (a merged group's load is
  // the sum of its two halves' at that size).
  std::vector<double> cost(groups.size());
  std::vector<Load> doubled(groups.size());
  std::vector<size_t> order(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    cost[i] = LoadAt({&groups[i]}, groups[i].size, config).cost;
    order[i] = i;
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return cost[a] != cost[b] ? cost[a] > cost[b] : a < b; });
  std::vector<char> mergeable(groups.size(), 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    mergeable[i] =
        2 * groups[i].size <= config.max_cp && (also_upgraded || AtOwnSize(groups[i], items));
    if (mergeable[i]) doubled[i] = LoadAt({&groups[i]}, 2 * groups[i].size, config);
  }
  const double top = order.empty() ? 0.0 : cost[order[0]];
  std::vector<char> used(groups.size(), 0);
  std::vector<std::pair<size_t, size_t>> pairs;
  double spend = 0;
  double merged_max = 0;
  std::optional<Merge> best;
  for (size_t k = 0; k < order.size() && k < kMostAtOnce; ++k) {
    const size_t heavy = order[k];
    if (used[heavy] || !mergeable[heavy]) break;
    // Partners come from the light end of `order`.
    std::optional<size_t> partner;
    for (size_t r = order.size(); r-- > k + 1;) {
      const size_t j = order[r];
      if (used[j] || !mergeable[j] || groups[j].size != groups[heavy].size ||
          doubled[heavy].tokens + doubled[j].tokens > config.max_tokens_per_rank) {
        continue;
      }
      partner = j;
      break;
    }
    if (!partner) break;
    merged_max = std::max(merged_max, doubled[heavy].cost + doubled[*partner].cost);
    if (merged_max >= top) break;  // no more merges can lower the maximum
    spend += SpendToDouble(groups[heavy], items, config) +
             SpendToDouble(groups[*partner], items, config);
    if (spend > budget) break;
    used[heavy] = used[*partner] = 1;
    pairs.emplace_back(heavy, *partner);
    // The heaviest group left out of every pair.
    double rest_max = 0;
    for (size_t r = k + 1; r < order.size(); ++r) {
      if (!used[order[r]]) {
        rest_max = cost[order[r]];
        break;
      }
    }
    const double gain = top - std::max(merged_max, rest_max);
    if (gain > 0 && (!best || gain * best->spend > best->gain * spend)) {
      best = Merge{pairs, gain, spend};
    }
  }
  return best;
}

// Replaces each pair by one group of twice the size and lays the
// microbatch's groups out again, largest first: consecutive blocks sorted by
// decreasing power-of-two size are always aligned.
void Apply(PlannedMicrobatch& microbatch, const Merge& merge, const PackerConfig& config) {
  std::vector<CpGroup>& groups = microbatch.groups;
  std::vector<char> merged_away(groups.size(), 0);
  for (const auto& [heavy, partner] : merge.pairs) merged_away[heavy] = merged_away[partner] = 1;
  // The groups that stay, in their order, then the merged ones.
  std::vector<CpGroup> rest;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (!merged_away[i]) rest.push_back(std::move(groups[i]));
  }
  for (const auto& [heavy, partner] : merge.pairs) {
    CpGroup merged;
    merged.size = 2 * groups[heavy].size;
    for (size_t index : {heavy, partner}) {
      for (const PlannedSequence& s : groups[index].sequences) {
        merged.sequences.push_back(
            {s.sample, s.length, ShapeAt(s.length, merged.size, config).padded});
      }
    }
    rest.push_back(std::move(merged));
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const CpGroup& a, const CpGroup& b) { return a.size > b.size; });
  int first = 0;
  for (CpGroup& group : rest) {
    group.first_rank = first;
    first += group.size;
  }
  groups = std::move(rest);
}

}  // namespace

void MergeHeaviestGroups(GlobalPlan& plan, const std::vector<PackerItem>& items,
                         const PackerConfig& config, double budget, bool also_upgraded) {
  std::vector<std::optional<Merge>> best(plan.microbatches.size());
  for (size_t m = 0; m < plan.microbatches.size(); ++m) {
    best[m] = BestMerge(plan.microbatches[m], items, config, also_upgraded, budget);
  }
  while (true) {
    // The most gain per unit of inflation spent, within the budget.
    std::optional<size_t> chosen;
    for (size_t m = 0; m < best.size(); ++m) {
      if (best[m] && best[m]->spend > budget) {  // found before the budget fell
        best[m] = BestMerge(plan.microbatches[m], items, config, also_upgraded, budget);
      }
      if (!best[m]) continue;
      if (!chosen || best[m]->gain * best[*chosen]->spend > best[*chosen]->gain * best[m]->spend) {
        chosen = m;
      }
    }
    if (!chosen) break;
    budget -= best[*chosen]->spend;
    Apply(plan.microbatches[*chosen], *best[*chosen], config);
    best[*chosen] = BestMerge(plan.microbatches[*chosen], items, config, also_upgraded, budget);
  }
  plan.flops = ComputeFlopsInputs(plan);
}

}  // namespace packfeed::scheduler
