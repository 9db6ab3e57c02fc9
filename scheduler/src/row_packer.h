#ifndef PACKFEED_SCHEDULER_SRC_ROW_PACKER_H_
#define PACKFEED_SCHEDULER_SRC_ROW_PACKER_H_

// The engine behind the balanced and dynamic_cp planners.
//
// Only balance *within* a microbatch matters: ranks meet at the end of every
// microbatch, so the step costs Σ_m max_r W[m][r]. Microbatches may differ
// from one another as much as they like. The packer therefore builds M rows
// (microbatches) of N ranks in two passes:
//   1. Anchors. Sequences, heaviest first, open CP groups row after row, so
//      each row's groups start from sequences of similar cost. A row's
//      target is its heaviest group. A sequence whose group could never
//      reach the target even when full waits for a lighter row; when nothing
//      qualifies, dynamic CP doubles the heaviest group into a free buddy
//      block (halving its per-rank cost) rather than leave a rank idle.
//   2. Fill. The remaining sequences, heaviest first, go to the group with
//      the largest deficit below its row's target that still has token room
//      (longest-processing-time first, per row); once targets are met the
//      excess spreads evenly. Dynamic CP may run a sequence in a larger
//      group than it needs when its own size has no room; the cost model's
//      CP overhead makes that a last resort.
// Everything is ordered by (cost, sample): deterministic, no hashing.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

struct PackerConfig {
  int num_ranks = 1;  // N = DP × CP
  int64_t max_tokens_per_rank = 1;
  int tp = 1;
  bool sequence_parallel = false;
  CostModel cost_model;
  // Group sizes allowed. Static CP: min = max = CP (any positive size).
  // Dynamic CP: powers of two.
  int min_cp = 1;
  int max_cp = 1;
  // Dynamic CP: the CP inflation (see Inflation) the plan may spend, as a
  // fraction of the batch's padded tokens, to use fewer microbatches.
  double cp_upgrade_budget = 0.05;
  // Dynamic CP: a sequence that anchors a group and costs more per rank
  // than a microbatch's share of the work (Σ work / (N · rows)) doubles its
  // group at once, while the budget lasts, before the row fills around it:
  // otherwise it sets its microbatch's time whatever else that holds.
  bool lift_heavy_anchors = false;
};

struct PackerItem {
  int64_t sample = 0;
  int64_t length = 0;
  int cp_size = 1;  // the smallest group size it fits in
};

// The padded length, per-rank tokens and per-rank cost of a sequence of
// `length` tokens run in a group of `cp_size` ranks.
struct SequenceShape {
  int64_t padded = 0;
  int64_t tokens_per_rank = 0;
  double cost_per_rank = 0;
};
SequenceShape ShapeAt(int64_t length, int cp_size, const PackerConfig& config);

// What running `item` at `cp_size` adds to the batch's CP inflation, in
// padded tokens: padded · (cp_size / its own size − 1). Summed over a batch
// and divided by its tokens, this is the plan's CP inflation − 1 (weighted
// by padded rather than real tokens).
double Inflation(const PackerItem& item, int cp_size, const PackerConfig& config);

// A batch's items and what every PackRows call for it shares: each item's
// per-rank cost at its own size, the items by that cost, heaviest first
// (ties by sample), and by own size. Sorting once matters at 100 000
// sequences. Static CP's one size need not be a power of two.
struct PackerBatch {
  std::vector<PackerItem> items;
  std::vector<double> own_cost;
  std::vector<int> order;
  std::vector<int> widths;                 // the items' own sizes, ascending, once each
  std::vector<std::vector<int>> by_class;  // per widths entry, items in `order`
  int64_t own_padded = 0;                  // Σ padded, every item at its own size
};
PackerBatch MakePackerBatch(std::vector<PackerItem> items, const PackerConfig& config);

// Packs the batch into exactly `rows` microbatches.
// ResourceExhausted when the sequences do not fit in `rows` (the caller
// tries more); InvalidArgument when no row count can work (too few
// sequences to give every rank one).
absl::StatusOr<GlobalPlan> PackRows(const PackerBatch& batch, int rows, const PackerConfig& config);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_SRC_ROW_PACKER_H_
