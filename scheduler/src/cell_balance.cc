#include "packfeed/scheduler/cell_balance.h"

#include <algorithm>
#include <numeric>
#include <queue>

namespace packfeed::scheduler {

std::vector<int64_t> BalanceCells(absl::Span<const double> costs, int cells, int per_cell) {
  std::vector<int64_t> by_cost(costs.size());
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  // Least loaded cell first, lowest cell on ties; a full cell leaves.
  using Load = std::pair<double, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<>> open;
  for (int s = 0; s < cells; ++s) open.push({0.0, s});
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(cells));
  for (int64_t sample : by_cost) {
    const auto [load, cell] = open.top();
    open.pop();
    std::vector<int64_t>& samples = held[static_cast<size_t>(cell)];
    samples.push_back(sample);
    if (static_cast<int>(samples.size()) < per_cell) open.push({load + costs[sample], cell});
  }
  std::vector<int64_t> order;
  order.reserve(costs.size());
  for (std::vector<int64_t>& samples : held) {
    std::sort(samples.begin(), samples.end());
    order.insert(order.end(), samples.begin(), samples.end());
  }
  return order;
}

double DocumentMaskedCost(absl::Span<const int64_t> document_lengths, const CostModel& model) {
  double cost = 0;
  for (int64_t length : document_lengths) cost += model.Cost(length, 1);
  return cost;
}

double BarrierStepCost(absl::Span<const double> costs, absl::Span<const int64_t> order, int dp,
                       int per_cell) {
  const auto per_microbatch = static_cast<size_t>(dp * per_cell);
  double step = 0;
  for (size_t first = 0; first < order.size(); first += per_microbatch) {
    double slowest = 0;
    for (int d = 0; d < dp; ++d) {
      double rank = 0;
      for (int b = 0; b < per_cell; ++b) {
        rank += costs[static_cast<size_t>(order[first + static_cast<size_t>(d * per_cell + b)])];
      }
      slowest = std::max(slowest, rank);
    }
    step += slowest;
  }
  return step;
}

}  // namespace packfeed::scheduler
