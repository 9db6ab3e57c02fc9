#ifndef PACKFEED_SCHEDULER_CELL_BALANCE_H_
#define PACKFEED_SCHEDULER_CELL_BALANCE_H_

// Balancing a fixed-layout global batch (Megatron pretraining: every
// microbatch of every DP rank holds micro_batch_size samples of the same
// length) by the samples' costs. Under document-masked attention a sample's
// cost is Σ over its documents, not seq², so Megatron's order leaves some
// ranks with most of the attention work. The batch's samples stay the same,
// so the gradient does too; only which cell computes which sample changes.
// Pure and deterministic.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "packfeed/scheduler/cost_model.h"

namespace packfeed::scheduler {

// A global batch of cells × per_cell samples (a cell: one microbatch of
// one DP rank, cell = microbatch · DP + DP rank) reordered by LPT: samples by falling cost (index
// on ties), each to the least loaded cell with room (lowest cell on ties); within a cell in
// ascending index. order[cell · per_cell + b] = the sample placed there.
// REQUIRES: costs.size() == cells · per_cell.
std::vector<int64_t> BalanceCells(absl::Span<const double> costs, int cells, int per_cell);

// A sample's cost when each of its documents attends only to itself: the
// model's cost of each document piece, summed.
double DocumentMaskedCost(absl::Span<const int64_t> document_lengths, const CostModel& model);

// The modelled step time of `order` (as BalanceCells returns it; identity
// = Megatron's order): Σ over microbatches of the slowest DP rank's cost,
// the ranks meeting after every microbatch.
double BarrierStepCost(absl::Span<const double> costs, absl::Span<const int64_t> order, int dp,
                       int per_cell);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_CELL_BALANCE_H_
