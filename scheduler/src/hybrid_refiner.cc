#include "scheduler/src/hybrid_refiner.h"

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace packfeed::scheduler {
namespace {

// Pairs of sequences examined, over the whole plan.
constexpr int64_t kWorkBudget = 2'000'000;

// One CP group of one microbatch: plan.microbatches[microbatch].groups[group].
struct Place {
  size_t microbatch = 0;
  size_t group = 0;
};

// An aligned block of ranks of one hybrid group: its CP group in each of
// the group's microbatches, the tokens each of its ranks holds in each
// (kept as sequences move, for the cap), and the work each rank runs in all.
struct Block {
  int size = 1;
  std::vector<Place> places;
  std::vector<int64_t> tokens;  // by place
  double total = 0;
};

// A change that moves `from` of block `src` into `to` of block `dst`, and
// with a swap `back` of `to` into `from`; delta = the work moved.
struct Change {
  size_t dst = 0;
  size_t from_place = 0;
  size_t from_sequence = 0;
  size_t to_place = 0;
  std::optional<size_t> back;
  double delta = 0;
};

class HybridRefiner {
 public:
  HybridRefiner(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank)
      : plan_(plan), model_(model), cap_(max_tokens_per_rank) {}

  void Run() {
    const std::vector<int> groups = HybridGroupsOf(plan_);
    for (int h = 0; budget_ > 0; ++h) {
      std::vector<size_t> microbatches;
      for (size_t m = 0; m < groups.size(); ++m) {
        if (groups[m] == h) microbatches.push_back(m);
      }
      if (microbatches.empty()) break;
      Even(microbatches);
    }
  }

 private:
  CpGroup& At(const Place& place) {
    return plan_.microbatches[place.microbatch].groups[place.group];
  }
  double Work(const PlannedSequence& s, int size) const {
    return model_.Cost(s.padded_length, size) + model_.microbatch;
  }

  void Even(const std::vector<size_t>& microbatches) {
    std::vector<Block> blocks;
    const std::vector<CpGroup>& partition = plan_.microbatches[microbatches[0]].groups;
    for (size_t g = 0; g < partition.size(); ++g) {
      Block& block = blocks.emplace_back();
      block.size = partition[g].size;
      for (size_t m : microbatches) {
        block.places.push_back({m, g});
        int64_t tokens = 0;
        for (const PlannedSequence& s : At(block.places.back()).sequences) {
          block.total += Work(s, block.size);
          tokens += s.padded_length / block.size;
        }
        block.tokens.push_back(tokens);
      }
    }
    while (budget_ > 0) {
      size_t src = 0;
      for (size_t b = 1; b < blocks.size(); ++b) {
        if (blocks[b].total > blocks[src].total) src = b;
      }
      std::optional<Change> change = BestChange(blocks, src);
      if (!change) return;
      Apply(blocks, src, *change);
    }
  }

  // The change from `src` that evens its total with another block's most.
  std::optional<Change> BestChange(const std::vector<Block>& blocks, size_t src) {
    std::optional<Change> best;
    double best_gain = 0;  // delta · (gap − delta): how much Σ total² falls, halved
    const Block& from = blocks[src];
    for (size_t dst = 0; dst < blocks.size(); ++dst) {
      const Block& to = blocks[dst];
      const double gap = from.total - to.total;
      if (dst == src || to.size != from.size || gap <= 0) continue;
      for (size_t fp = 0; fp < from.places.size(); ++fp) {
        const CpGroup& source = At(from.places[fp]);
        const int64_t source_tokens = from.tokens[fp];
        for (size_t fs = 0; fs < source.sequences.size(); ++fs) {
          const PlannedSequence& moved = source.sequences[fs];
          const int64_t moved_tokens = moved.padded_length / from.size;
          const double work = Work(moved, from.size);
          for (size_t tp = 0; tp < to.places.size(); ++tp) {
            const CpGroup& target = At(to.places[tp]);
            const int64_t target_tokens = to.tokens[tp];
            budget_ -= 1 + static_cast<int64_t>(target.sequences.size());
            auto consider = [&](double delta, std::optional<size_t> back) {
              const double gain = delta * (gap - delta);
              if (delta > 0 && delta < gap && gain > best_gain) {
                best_gain = gain;
                best = Change{dst, fp, fs, tp, back, delta};
              }
            };
            if (source.sequences.size() > 1 && target_tokens + moved_tokens <= cap_) {
              consider(work, std::nullopt);
            }
            for (size_t ts = 0; ts < target.sequences.size(); ++ts) {
              const PlannedSequence& returned = target.sequences[ts];
              const int64_t returned_tokens = returned.padded_length / to.size;
              if (source_tokens - moved_tokens + returned_tokens > cap_ ||
                  target_tokens - returned_tokens + moved_tokens > cap_) {
                continue;
              }
              consider(work - Work(returned, to.size), ts);
            }
          }
        }
      }
    }
    return best;
  }

  void Apply(std::vector<Block>& blocks, size_t src, const Change& change) {
    Block& from = blocks[src];
    Block& to = blocks[change.dst];
    std::vector<PlannedSequence>& source = At(from.places[change.from_place]).sequences;
    std::vector<PlannedSequence>& target = At(to.places[change.to_place]).sequences;
    // Same-size blocks: a sequence holds as many tokens per rank in either.
    const int64_t moved = source[change.from_sequence].padded_length / from.size;
    const int64_t returned = change.back ? target[*change.back].padded_length / to.size : 0;
    from.tokens[change.from_place] += returned - moved;
    to.tokens[change.to_place] += moved - returned;
    if (change.back) {
      std::swap(source[change.from_sequence], target[*change.back]);
    } else {
      target.push_back(source[change.from_sequence]);
      source.erase(source.begin() + static_cast<std::ptrdiff_t>(change.from_sequence));
    }
    from.total -= change.delta;
    to.total += change.delta;
  }

  GlobalPlan& plan_;
  const CostModel& model_;
  const int64_t cap_;
  int64_t budget_ = kWorkBudget;
};

}  // namespace

void RefineForHybrid(GlobalPlan& plan, const CostModel& model, int64_t max_tokens_per_rank) {
  HybridRefiner(plan, model, max_tokens_per_rank).Run();
}

}  // namespace packfeed::scheduler
