#include "scheduler/src/graph_refiner.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "scheduler/src/meeting_runs.h"

namespace packfeed::scheduler {
namespace {

// Relative gains below this are noise, not progress.
constexpr double kMinGain = 1e-9;
// Rank updates of the evaluations: a few milliseconds on one core.
constexpr int64_t kWorkBudget = 2'000'000;

// What the search lowers, in this order.
struct Score {
  double makespan = 0;
  double total = 0;  // Σ_r of each rank's finish, squared
};

struct Group {
  CpGroup* group = nullptr;
  int run = 0;  // the meeting run it belongs to
  int64_t tokens = 0;
  double cost = 0;  // per rank
  std::vector<double> costs;
};

// Ranks [begin, end) that meet in one microbatch, and the groups they run.
struct Meeting {
  int row = 0;
  int begin = 0;
  int end = 0;
  std::vector<int> groups;
  // From the last baseline evaluation.
  double work = 0;
  double finish = 0;
  double slack = 0;   // latest finish − finish
  int previous = -1;  // the run whose rank started this one last (the chain)
};

class GraphRefiner {
 public:
  GraphRefiner(GlobalPlan& plan, const CostModel& model, int64_t cap, ExecutionGraph graph)
      : model_(model), cap_(cap), ranks_(plan.dp_cp_size) {
    for (size_t m = 0; m < plan.microbatches.size(); ++m) {
      PlannedMicrobatch& microbatch = plan.microbatches[m];
      for (const auto& [first, last] : MeetingRuns(microbatch, graph.expert_parallel)) {
        Meeting run;
        run.row = static_cast<int>(m);
        run.begin = microbatch.groups[first].first_rank;
        run.end = microbatch.groups[last].first_rank + microbatch.groups[last].size;
        for (size_t g = first; g <= last; ++g) {
          CpGroup& group = microbatch.groups[g];
          Group ref{&group, static_cast<int>(runs_.size()), 0, 0.0, {}};
          for (const PlannedSequence& s : group.sequences) {
            ref.tokens += s.padded_length / group.size;
            ref.costs.push_back(model_.Cost(s.padded_length, group.size));
            ref.cost += ref.costs.back();
          }
          run.groups.push_back(static_cast<int>(groups_.size()));
          by_size_[group.size].push_back(static_cast<int>(groups_.size()));
          groups_.push_back(std::move(ref));
        }
        runs_.push_back(std::move(run));
      }
    }
  }

  void Search() {
    Score score = Evaluate(/*baseline=*/true);
    while (work_ < kWorkBudget) {
      bool improved = false;
      for (int g : CriticalGroups()) {
        if (TryImprove(g, score)) {
          improved = true;
          break;
        }
        if (work_ >= kWorkBudget) return;
      }
      if (!improved) return;
      score = Evaluate(/*baseline=*/true);
    }
  }

 private:
  // The makespan. With `baseline` (the plan as kept), also each run's work,
  // finish, slack and place in the chain; a tentative change leaves them.
  Score Evaluate(bool baseline) {
    std::vector<double>& free_at = free_at_;
    std::vector<int>& last_run = last_run_;
    free_at.assign(static_cast<size_t>(ranks_), 0.0);
    last_run.assign(static_cast<size_t>(ranks_), -1);
    for (size_t i = 0; i < runs_.size(); ++i) {
      Meeting& run = runs_[i];
      double start = 0.0;
      int previous = -1;
      for (int r = run.begin; r < run.end; ++r) {
        if (free_at[static_cast<size_t>(r)] > start || previous < 0) {
          start = std::max(start, free_at[static_cast<size_t>(r)]);
          previous = last_run[static_cast<size_t>(r)];
        }
      }
      double work = 0.0;
      for (int g : run.groups) work = std::max(work, groups_[static_cast<size_t>(g)].cost);
      const double finish = start + work + model_.microbatch;
      if (baseline) {
        run.work = work;
        run.finish = finish;
        run.previous = previous;
      }
      for (int r = run.begin; r < run.end; ++r) {
        free_at[static_cast<size_t>(r)] = finish;
        last_run[static_cast<size_t>(r)] = static_cast<int>(i);
      }
      work_ += run.end - run.begin;
    }
    double makespan = 0.0;
    double total = 0.0;
    int last = -1;
    for (int r = 0; r < ranks_; ++r) {
      total += free_at[static_cast<size_t>(r)] * free_at[static_cast<size_t>(r)];
      if (free_at[static_cast<size_t>(r)] > makespan) {
        makespan = free_at[static_cast<size_t>(r)];
        last = last_run[static_cast<size_t>(r)];
      }
    }
    if (!baseline) return {makespan, total};
    last_ = last;
    // The latest each rank may be free from here on without delaying the
    // step, walked back from the end.
    std::vector<double> latest(static_cast<size_t>(ranks_), makespan);
    for (size_t i = runs_.size(); i-- > 0;) {
      Meeting& run = runs_[i];
      double latest_finish = makespan;
      for (int r = run.begin; r < run.end; ++r) {
        latest_finish = std::min(latest_finish, latest[static_cast<size_t>(r)]);
      }
      run.slack = latest_finish - run.finish;
      const double latest_start = latest_finish - run.work - model_.microbatch;
      for (int r = run.begin; r < run.end; ++r) latest[static_cast<size_t>(r)] = latest_start;
      work_ += run.end - run.begin;
    }
    return {makespan, total};
  }

  // The heaviest group of each run on the critical chain, heaviest first.
  std::vector<int> CriticalGroups() const {
    std::vector<int> out;
    for (int i = last_; i >= 0; i = runs_[static_cast<size_t>(i)].previous) {
      const Meeting& run = runs_[static_cast<size_t>(i)];
      int heaviest = run.groups.front();
      for (int g : run.groups) {
        if (groups_[static_cast<size_t>(g)].cost > groups_[static_cast<size_t>(heaviest)].cost) {
          heaviest = g;
        }
      }
      out.push_back(heaviest);
    }
    std::stable_sort(out.begin(), out.end(), [&](int a, int b) {
      return groups_[static_cast<size_t>(a)].cost > groups_[static_cast<size_t>(b)].cost;
    });
    return out;
  }

  // How much later run `run` finishes when group `g` of it costs `delta` more.
  double Delay(int g, double delta) const {
    const Group& group = groups_[static_cast<size_t>(g)];
    return std::max(0.0, group.cost + delta - runs_[static_cast<size_t>(group.run)].work);
  }

  // One move or swap out of critical group `from` that lowers the makespan;
  // kept if found.
  bool TryImprove(int from, Score base) {
    Group& source = groups_[static_cast<size_t>(from)];
    const int size = source.group->size;
    // Better: a shorter step, or the same step with the ranks' finishes
    // more even (their sum of squares), which is how the search gets past
    // several chains of equal length: each move shortens one.
    const auto better = [&](Score score) {
      return score.makespan < base.makespan * (1 - kMinGain) ||
             (score.makespan <= base.makespan && score.total < base.total * (1 - kMinGain));
    };
    // Most slack first: the likeliest to take work without delaying anyone.
    std::vector<int> destinations = by_size_.at(size);
    std::stable_sort(destinations.begin(), destinations.end(), [&](int a, int b) {
      return runs_[static_cast<size_t>(groups_[static_cast<size_t>(a)].run)].slack >
             runs_[static_cast<size_t>(groups_[static_cast<size_t>(b)].run)].slack;
    });
    for (size_t x = 0; x < source.group->sequences.size(); ++x) {
      const double wx = source.costs[x];
      const int64_t tx = source.group->sequences[x].padded_length / size;
      for (int to : destinations) {
        const Group& dest = groups_[static_cast<size_t>(to)];
        const double slack = runs_[static_cast<size_t>(dest.run)].slack;
        // A delay is never negative, so no later destination takes work.
        if (slack <= 0) break;
        if (work_ >= kWorkBudget) return false;  // nothing more is tried
        if (to == from) continue;
        if (source.group->sequences.size() >= 2 && dest.tokens + tx <= cap_ &&
            Delay(to, wx) < slack) {
          Apply(from, static_cast<int>(x), to, -1);
          if (better(Evaluate(false))) return true;
          Undo(from, to);
        }
        for (size_t y = 0; y < dest.group->sequences.size() && work_ < kWorkBudget; ++y) {
          const double wy = dest.costs[y];
          const int64_t ty = dest.group->sequences[y].padded_length / size;
          if (wy >= wx || source.tokens - tx + ty > cap_ || dest.tokens - ty + tx > cap_ ||
              Delay(to, wx - wy) >= slack) {
            continue;
          }
          Apply(from, static_cast<int>(x), to, static_cast<int>(y));
          if (better(Evaluate(false))) return true;
          Undo(from, to);
        }
      }
    }
    return false;
  }

  // Moves sequence x of `from` to the end of `to` and, with y >= 0, sequence
  // y of `to` to the end of `from`.
  void Apply(int from, int x, int to, int y) {
    Group& a = groups_[static_cast<size_t>(from)];
    Group& b = groups_[static_cast<size_t>(to)];
    undo_ = {a.group->sequences, a.costs, a.tokens, a.cost,
             b.group->sequences, b.costs, b.tokens, b.cost};
    const int size = a.group->size;
    const auto take = [size](Group& group, int index) {
      const PlannedSequence s = group.group->sequences[static_cast<size_t>(index)];
      const double cost = group.costs[static_cast<size_t>(index)];
      group.group->sequences.erase(group.group->sequences.begin() + index);
      group.costs.erase(group.costs.begin() + index);
      group.tokens -= s.padded_length / size;
      group.cost -= cost;
      return std::make_pair(s, cost);
    };
    const auto put = [size](Group& group, const std::pair<PlannedSequence, double>& entry) {
      group.group->sequences.push_back(entry.first);
      group.costs.push_back(entry.second);
      group.tokens += entry.first.padded_length / size;
      group.cost += entry.second;
    };
    const auto moved = take(a, x);
    if (y >= 0) put(a, take(b, y));
    put(b, moved);
  }

  void Undo(int from, int to) {
    Group& a = groups_[static_cast<size_t>(from)];
    Group& b = groups_[static_cast<size_t>(to)];
    a.group->sequences = undo_.a_sequences;
    a.costs = undo_.a_costs;
    a.tokens = undo_.a_tokens;
    a.cost = undo_.a_cost;
    b.group->sequences = undo_.b_sequences;
    b.costs = undo_.b_costs;
    b.tokens = undo_.b_tokens;
    b.cost = undo_.b_cost;
  }

  const CostModel& model_;
  const int64_t cap_;
  const int ranks_;
  std::vector<Group> groups_;
  std::vector<Meeting> runs_;
  std::map<int, std::vector<int>> by_size_;
  int last_ = -1;  // the run that finishes last (baseline)
  // Evaluate's per-rank state, kept to spare an allocation per candidate.
  std::vector<double> free_at_;
  std::vector<int> last_run_;
  struct {
    std::vector<PlannedSequence> a_sequences;
    std::vector<double> a_costs;
    int64_t a_tokens = 0;
    double a_cost = 0;
    std::vector<PlannedSequence> b_sequences;
    std::vector<double> b_costs;
    int64_t b_tokens = 0;
    double b_cost = 0;
  } undo_;
  // Rank updates of the evaluations: a budget in work, not time, keeps the
  // plan identical on every machine.
  int64_t work_ = 0;
};

}  // namespace

void RefineForGraph(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank,
                    ExecutionGraph graph) {
  GraphRefiner(plan, model, max_tokens_per_rank, graph).Search();
}

}  // namespace packfeed::scheduler
