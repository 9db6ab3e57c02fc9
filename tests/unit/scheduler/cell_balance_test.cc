#include "packfeed/scheduler/cell_balance.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace packfeed::scheduler {
namespace {

TEST(CellBalanceTest, APermutationWithEveryCellFull) {
  std::vector<double> costs;
  for (int i = 0; i < 24; ++i) costs.push_back((i * 7919) % 23 + (i % 5 == 0 ? 100 : 1));
  const std::vector<int64_t> order = BalanceCells(costs, 6, 4);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(order, BalanceCells(costs, 6, 4));  // deterministic
  std::vector<int64_t> identity(24);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_LT(BarrierStepCost(costs, order, 2, 4), BarrierStepCost(costs, identity, 2, 4));
}

TEST(CellBalanceTest, SpreadsTheHeavySamples) {
  // Megatron's order puts both heavy samples on DP rank 0.
  const std::vector<double> costs = {9, 9, 1, 1, 1, 1, 1, 1};
  std::vector<int64_t> identity(8);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(BarrierStepCost(costs, identity, 2, 2), 18 + 2);
  const std::vector<int64_t> order = BalanceCells(costs, 4, 2);
  EXPECT_EQ(BarrierStepCost(costs, order, 2, 2), 10 + 2);
}

TEST(CellBalanceTest, DocumentMaskedCostSumsThePieces) {
  CostModel model;
  model.alpha = 1;
  model.beta = 2;
  EXPECT_EQ(DocumentMaskedCost({3, 4}, model), 9 + 6 + 16 + 8);
}

}  // namespace
}  // namespace packfeed::scheduler
