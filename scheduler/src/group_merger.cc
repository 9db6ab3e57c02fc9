#include "scheduler/src/group_merger.h"

#include <algorithm>
#include <optional>
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

struct Merge {
  size_t heaviest = 0;
  size_t partner = 0;
  double gain = 0;   // fall of the microbatch's maximum
  double spend = 0;  // CP inflation it adds (Inflation's unit)
};

// The best merge for one microbatch: its heaviest group with the partner of
// the same size that gives the lowest maximum.
std::optional<Merge> BestMerge(const PlannedMicrobatch& microbatch,
                               const std::vector<PackerItem>& items, const PackerConfig& config,
                               bool also_upgraded) {
  const std::vector<CpGroup>& groups = microbatch.groups;
  std::vector<double> cost(groups.size());
  size_t heaviest = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    cost[i] = LoadAt({&groups[i]}, groups[i].size, config).cost;
    if (cost[i] > cost[heaviest]) heaviest = i;
  }
  const CpGroup& top = groups[heaviest];
  if (2 * top.size > config.max_cp || (!also_upgraded && !AtOwnSize(top, items))) {
    return std::nullopt;
  }
  // The largest cost outside the merged pair: the second largest overall,
  // or the third when the partner is the second.
  size_t second = groups.size(), third = groups.size();
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i == heaviest) continue;
    if (second == groups.size() || cost[i] > cost[second]) {
      third = second;
      second = i;
    } else if (third == groups.size() || cost[i] > cost[third]) {
      third = i;
    }
  }
  const auto others_max = [&](size_t partner) {
    const size_t k = partner == second ? third : second;
    return k < groups.size() ? cost[k] : 0.0;
  };
  std::optional<Merge> best;
  double best_max = cost[heaviest];
  for (size_t j = 0; j < groups.size(); ++j) {
    if (j == heaviest || groups[j].size != top.size ||
        (!also_upgraded && !AtOwnSize(groups[j], items))) {
      continue;
    }
    const Load merged = LoadAt({&top, &groups[j]}, 2 * top.size, config);
    if (merged.tokens > config.max_tokens_per_rank) continue;
    const double new_max = std::max(merged.cost, others_max(j));
    if (new_max < best_max) {
      best_max = new_max;
      best = Merge{heaviest, j, cost[heaviest] - new_max,
                   SpendToDouble(top, items, config) + SpendToDouble(groups[j], items, config)};
    }
  }
  return best;
}

// Replaces the two groups by one of twice the size and lays the
// microbatch's groups out again, largest first: consecutive blocks sorted by
// decreasing power-of-two size are always aligned.
void Apply(PlannedMicrobatch& microbatch, const Merge& merge, const PackerConfig& config) {
  std::vector<CpGroup>& groups = microbatch.groups;
  CpGroup merged;
  merged.size = 2 * groups[merge.heaviest].size;
  for (size_t index : {merge.heaviest, merge.partner}) {
    for (const PlannedSequence& s : groups[index].sequences) {
      merged.sequences.push_back(
          {s.sample, s.length, ShapeAt(s.length, merged.size, config).padded});
    }
  }
  std::vector<CpGroup> rest;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i != merge.heaviest && i != merge.partner) {
      rest.push_back(std::move(groups[i]));
    }
  }
  rest.push_back(std::move(merged));
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
    best[m] = BestMerge(plan.microbatches[m], items, config, also_upgraded);
  }
  while (true) {
    // The most gain per unit of inflation spent, within the budget.
    std::optional<size_t> chosen;
    for (size_t m = 0; m < best.size(); ++m) {
      if (!best[m] || best[m]->spend > budget) continue;
      if (!chosen || best[m]->gain * best[*chosen]->spend > best[*chosen]->gain * best[m]->spend) {
        chosen = m;
      }
    }
    if (!chosen) break;
    budget -= best[*chosen]->spend;
    Apply(plan.microbatches[*chosen], *best[*chosen], config);
    best[*chosen] = BestMerge(plan.microbatches[*chosen], items, config, also_upgraded);
  }
  plan.flops = ComputeFlopsInputs(plan);
}

}  // namespace packfeed::scheduler
