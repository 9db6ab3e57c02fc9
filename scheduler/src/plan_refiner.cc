#include "scheduler/src/plan_refiner.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace packfeed::scheduler {
namespace {

// Gains below this fraction of the group's cost are noise, not progress.
constexpr double kMinGain = 1e-9;
// A few milliseconds of search on one core.
constexpr int64_t kWorkBudget = 2'000'000;
// No plan of these groups beats the mean per rank of each microbatch; once
// within this fraction of that floor, the search stops (a 1 024-sequence
// batch over 8 ranks got there at once and then spent its whole budget,
// 3 ms between an ingest step's seal and its first microbatch, gaining
// less than this).
constexpr double kCloseEnough = 1e-3;

struct GroupRef {
  int row = 0;
  CpGroup* group = nullptr;
  int64_t tokens = 0;         // per rank
  double cost = 0;            // per rank
  double min_cost = 0;        // the lightest sequence's
  std::vector<double> costs;  // per sequence, per rank
  // Per sequence, per rank, beside the costs: the swap search reads both.
  std::vector<int64_t> sequence_tokens;
};

class Refiner {
 public:
  Refiner(GlobalPlan& plan, const CostModel& model, int64_t cap)
      : model_(model), cap_(cap), ranks_(plan.dp_cp_size) {
    rows_.resize(plan.microbatches.size());
    row_max_.assign(plan.microbatches.size(), 0.0);
    for (size_t m = 0; m < plan.microbatches.size(); ++m) {
      for (CpGroup& group : plan.microbatches[m].groups) {
        GroupRef ref{static_cast<int>(m), &group, 0, 0.0, 0.0, {}, {}};
        for (const PlannedSequence& s : group.sequences) {
          ref.sequence_tokens.push_back(Tokens(s, group.size));
          ref.tokens += ref.sequence_tokens.back();
          ref.costs.push_back(Cost(s, group.size));
          ref.cost += ref.costs.back();
        }
        UpdateMinCost(ref);
        work_per_rank_ += ref.cost * group.size / ranks_;
        const int id = static_cast<int>(groups_.size());
        groups_.push_back(ref);
        rows_[m].push_back(id);
        by_size_[group.size].push_back(id);
      }
      UpdateRowMax(static_cast<int>(m));
    }
  }

  void Run(int max_passes) {
    for (int pass = 0; pass < max_passes && work_ < kWorkBudget; ++pass) {
      bool improved = false;
      for (int m = 0; m < static_cast<int>(rows_.size()); ++m) {
        if (CloseEnough()) return;
        // Each success lowers this row's maximum; bound the attempts.
        for (size_t tries = 0; tries < 4 * rows_[m].size() && work_ < kWorkBudget; ++tries) {
          if (!ImproveRow(m)) break;
          improved = true;
        }
      }
      if (!improved) return;
    }
  }

 private:
  static int64_t Tokens(const PlannedSequence& s, int size) { return s.padded_length / size; }
  double Cost(const PlannedSequence& s, int size) const {
    return model_.Cost(s.padded_length, size);
  }

  bool CloseEnough() const {
    double step = 0;
    for (double max : row_max_) step += max;
    return step <= (1 + kCloseEnough) * work_per_rank_;
  }

  static void UpdateMinCost(GroupRef& group) {
    group.min_cost =
        group.costs.empty() ? 0.0 : *std::min_element(group.costs.begin(), group.costs.end());
  }

  void UpdateRowMax(int m) {
    double max = 0;
    for (int g : rows_[m]) max = std::max(max, groups_[g].cost);
    row_max_[m] = max;
  }

  // One move or swap that lowers row m's maximum without raising any other
  // row's; false when none exists. It takes the first candidate, in the
  // order x, destination, move before swaps, y, with the largest gain, and
  // charges the work of examining them all, but skips what cannot beat the
  // best found: no candidate for x gains more than moving x out of the row.
  bool ImproveRow(int m) {
    int heaviest = -1;
    double second = 0;
    for (int g : rows_[m]) {
      if (heaviest < 0 || groups_[g].cost > groups_[heaviest].cost) {
        if (heaviest >= 0) second = std::max(second, groups_[heaviest].cost);
        heaviest = g;
      } else {
        second = std::max(second, groups_[g].cost);
      }
    }
    GroupRef& from = groups_[heaviest];
    const double top = from.cost;
    if (top - second <= kMinGain * top) return false;
    const int size = from.group->size;
    const std::vector<PlannedSequence>& out = from.group->sequences;
    const std::vector<int>& peers = by_size_[size];

    // What examining every candidate costs, the same for each x.
    int64_t work_per_x = 0;
    for (int to : peers) {
      if (to == heaviest) continue;
      const GroupRef& dest = groups_[to];
      work_per_x +=
          1 + (dest.cost >= LimitFor(dest, m, top) ? 0 : static_cast<int64_t>(dest.costs.size()));
    }
    work_ += work_per_x * static_cast<int64_t>(out.size());

    double best_gain = kMinGain * top;
    int best_x = -1, best_to = -1, best_y = -1;
    for (size_t x = 0; x < out.size(); ++x) {
      const double wx = from.costs[x];
      const int64_t tx = from.sequence_tokens[x];
      // The most any candidate for x gains: swaps and moves within row m
      // leave at least this much behind.
      const double x_bound = top - std::max(second, top - wx);
      if (x_bound <= best_gain) continue;
      for (int to : peers) {
        if (to == heaviest) continue;
        const GroupRef& dest = groups_[to];
        // The destination's row may not get heavier (its own row m: it may
        // not become the new maximum).
        const double limit = LimitFor(dest, m, top);
        // Move x (the group must keep a sequence).
        if (out.size() >= 2 && dest.tokens + tx <= cap_ && dest.cost + wx <= limit) {
          double after = std::max(second, top - wx);
          if (dest.row == m) after = std::max(after, dest.cost + wx);
          if (top - after > best_gain) {
            best_gain = top - after;
            best_x = static_cast<int>(x);
            best_to = to;
            best_y = -1;
            if (best_gain >= x_bound) break;
          }
        }
        // Swap x for a lighter y; the lightest in dest bounds the gain.
        if (dest.cost >= limit || dest.min_cost >= wx ||
            top - std::max(second, top - wx + dest.min_cost) <= best_gain) {
          continue;
        }
        for (size_t y = 0; y < dest.costs.size(); ++y) {
          const double wy = dest.costs[y];
          if (wy >= wx || dest.cost - wy + wx > limit) continue;
          double after = std::max(second, top - wx + wy);
          if (dest.row == m) after = std::max(after, dest.cost - wy + wx);
          if (top - after <= best_gain) continue;
          const int64_t ty = dest.sequence_tokens[y];
          if (from.tokens - tx + ty > cap_ || dest.tokens - ty + tx > cap_) continue;
          best_gain = top - after;
          best_x = static_cast<int>(x);
          best_to = to;
          best_y = static_cast<int>(y);
        }
        if (best_gain >= x_bound) break;
      }
    }
    if (best_x < 0) return false;
    Apply(heaviest, best_x, best_to, best_y);
    return true;
  }

  // How heavy `dest` may become: its row's maximum, or in row m (whose
  // heaviest group gives) no heavier than that group was.
  double LimitFor(const GroupRef& dest, int m, double top) const {
    return dest.row == m ? top : row_max_[dest.row];
  }

  void Apply(int from_id, int x, int to_id, int y) {
    GroupRef& from = groups_[from_id];
    GroupRef& to = groups_[to_id];
    const int size = from.group->size;
    const auto take = [size](GroupRef& group, int index) {
      const PlannedSequence s = group.group->sequences[index];
      const double cost = group.costs[index];
      group.group->sequences.erase(group.group->sequences.begin() + index);
      group.costs.erase(group.costs.begin() + index);
      group.sequence_tokens.erase(group.sequence_tokens.begin() + index);
      group.tokens -= Tokens(s, size);
      group.cost -= cost;
      return std::make_pair(s, cost);
    };
    const auto put = [size](GroupRef& group, const std::pair<PlannedSequence, double>& entry) {
      group.group->sequences.push_back(entry.first);
      group.costs.push_back(entry.second);
      group.sequence_tokens.push_back(Tokens(entry.first, size));
      group.tokens += group.sequence_tokens.back();
      group.cost += entry.second;
    };
    const auto moved = take(from, x);
    if (y >= 0) put(from, take(to, y));
    put(to, moved);
    UpdateMinCost(from);
    UpdateMinCost(to);
    UpdateRowMax(from.row);
    UpdateRowMax(to.row);
  }

  const CostModel& model_;
  const int64_t cap_;
  const int ranks_;
  double work_per_rank_ = 0;  // Σ over groups of cost × size, over the ranks
  std::vector<GroupRef> groups_;
  std::vector<std::vector<int>> rows_;
  std::vector<double> row_max_;
  std::map<int, std::vector<int>> by_size_;
  // Candidate pairs examined. A budget in work, not time, keeps the plan
  // identical on every machine.
  int64_t work_ = 0;
};

}  // namespace

void RefinePlan(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank,
                int max_passes) {
  Refiner(plan, model, max_tokens_per_rank).Run(max_passes);
}

}  // namespace packfeed::scheduler
