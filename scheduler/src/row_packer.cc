#include "internal/row_packer.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/scheduler/padding.h"

namespace packfeed::internal {

SequenceShape ShapeAt(int64_t length, int cp_size, const PackerConfig& config) {
  SequenceShape shape;
  shape.padded = PadTo(
      length, PaddingDivisor(cp_size, config.tp, config.sequence_parallel));
  shape.tokens_per_rank = shape.padded / cp_size;
  shape.cost_per_rank = config.cost_model.Cost(shape.padded, cp_size);
  return shape;
}

namespace {

// A group may join a row only if, filled to the token cap, it could reach
// this fraction of the row's heaviest group; lighter sequences wait for a
// lighter row.
constexpr double kQualifyFraction = 0.9;

struct Group {
  int row = 0;
  int first = 0;
  int size = 1;
  int64_t tokens = 0;        // per rank
  double cost = 0;           // per rank
  std::vector<int> members;  // indices into the items, in placement order
};

class Packer {
 public:
  Packer(const std::vector<PackerItem>& items, int rows,
         const PackerConfig& config);

  absl::StatusOr<GlobalPlan> Run();

 private:
  absl::Status AnchorRow(int row, int64_t budget);
  // Heaviest unplaced item of class `c`, or -1.
  int ClassHead(int class_index);
  // Lowest aligned free block of `width` ranks in `row`, or -1.
  int FindFreeBlock(int row, int width);
  bool BlockIsFree(int row, int first, int width) const;
  void OpenGroup(int row, int first, int size, int item);
  void AddMember(int group, int item);
  void Resize(int group, int first, int size);
  bool DoubleIntoBuddy(int group);
  bool SpreadIntoSmallestFreeBlock(int row);
  int HeaviestGroup(int row) const;
  absl::Status Fill();
  GlobalPlan Build() const;

  const std::vector<PackerItem>& items_;
  const int rows_;
  const PackerConfig& config_;
  const int n_;
  std::vector<int> widths_;  // group sizes items may start at, ascending
  std::vector<double> own_cost_;
  std::vector<int> order_;                  // items by own cost, heaviest first
  std::vector<std::vector<int>> by_class_;  // per widths_ entry, in order_
  std::vector<size_t> class_head_;
  std::vector<char> placed_;
  int64_t unplaced_ = 0;
  std::vector<Group> groups_;
  std::vector<std::vector<int>> owner_;  // [row][rank] → group, −1 = free
  std::vector<int> free_ranks_;
  std::vector<std::vector<int>> rows_groups_;
};

Packer::Packer(const std::vector<PackerItem>& items, int rows,
               const PackerConfig& config)
    : items_(items), rows_(rows), config_(config), n_(config.num_ranks) {
  for (const PackerItem& item : items_) widths_.push_back(item.cp_size);
  std::sort(widths_.begin(), widths_.end());
  widths_.erase(std::unique(widths_.begin(), widths_.end()), widths_.end());
  own_cost_.reserve(items_.size());
  for (const PackerItem& item : items_) {
    own_cost_.push_back(
        ShapeAt(item.length, item.cp_size, config_).cost_per_rank);
  }
  order_.resize(items_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int>(i);
  std::sort(order_.begin(), order_.end(), [&](int a, int b) {
    if (own_cost_[a] != own_cost_[b]) return own_cost_[a] > own_cost_[b];
    return items_[a].sample < items_[b].sample;
  });
  by_class_.resize(widths_.size());
  for (int i : order_) {
    const size_t k = static_cast<size_t>(
        std::lower_bound(widths_.begin(), widths_.end(), items_[i].cp_size) -
        widths_.begin());
    by_class_[k].push_back(i);
  }
  class_head_.assign(widths_.size(), 0);
  placed_.assign(items_.size(), 0);
  unplaced_ = static_cast<int64_t>(items_.size());
  owner_.assign(static_cast<size_t>(rows_), std::vector<int>(n_, -1));
  free_ranks_.assign(static_cast<size_t>(rows_), n_);
  rows_groups_.resize(static_cast<size_t>(rows_));
}

absl::StatusOr<GlobalPlan> Packer::Run() {
  // The fewest groups that can tile a row: aligned blocks of the largest
  // allowed size.
  int64_t min_groups = 0;
  for (int first = 0; first < n_; ++min_groups) {
    int width = config_.max_cp;
    while (first % width != 0 || first + width > n_) width /= 2;
    first += width;
  }
  for (int row = 0; row < rows_; ++row) {
    // Leave enough sequences for every later row.
    const int64_t budget = unplaced_ - (rows_ - row - 1) * min_groups;
    if (absl::Status status = AnchorRow(row, budget); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = Fill(); !status.ok()) return status;
  return Build();
}

int Packer::ClassHead(int class_index) {
  std::vector<int>& members = by_class_[class_index];
  size_t& head = class_head_[class_index];
  while (head < members.size() && placed_[members[head]]) ++head;
  return head < members.size() ? members[head] : -1;
}

bool Packer::BlockIsFree(int row, int first, int width) const {
  const std::vector<int>& owner = owner_[row];
  return std::all_of(owner.begin() + first, owner.begin() + first + width,
                     [](int g) { return g < 0; });
}

int Packer::FindFreeBlock(int row, int width) {
  if (free_ranks_[row] < width) return -1;
  for (int first = 0; first + width <= n_; first += width) {
    if (BlockIsFree(row, first, width)) return first;
  }
  return -1;
}

void Packer::OpenGroup(int row, int first, int size, int item) {
  const int g = static_cast<int>(groups_.size());
  groups_.push_back({row, first, size, 0, 0.0, {}});
  std::fill(owner_[row].begin() + first, owner_[row].begin() + first + size, g);
  free_ranks_[row] -= size;
  rows_groups_[row].push_back(g);
  AddMember(g, item);
}

void Packer::AddMember(int group, int item) {
  Group& g = groups_[group];
  const SequenceShape shape = ShapeAt(items_[item].length, g.size, config_);
  g.tokens += shape.tokens_per_rank;
  g.cost += shape.cost_per_rank;
  g.members.push_back(item);
  placed_[item] = 1;
  --unplaced_;
}

void Packer::Resize(int group, int first, int size) {
  Group& g = groups_[group];
  g.first = first;
  g.size = size;
  g.tokens = 0;
  g.cost = 0;
  for (int item : g.members) {
    const SequenceShape shape = ShapeAt(items_[item].length, size, config_);
    g.tokens += shape.tokens_per_rank;
    g.cost += shape.cost_per_rank;
  }
}

int Packer::HeaviestGroup(int row) const {
  int best = -1;
  for (int g : rows_groups_[row]) {
    if (best < 0 || groups_[g].cost > groups_[best].cost) best = g;
  }
  return best;
}

// Doubles `group` into its buddy block when that block is free and the
// larger size is allowed: the group's sequences then run at twice the CP.
bool Packer::DoubleIntoBuddy(int group) {
  const Group& g = groups_[group];
  const int size = 2 * g.size;
  const int first = g.first - g.first % size;
  if (size > config_.max_cp || first + size > n_) return false;
  const int other = first == g.first ? g.first + g.size : first;
  if (!BlockIsFree(g.row, other, g.size)) return false;
  std::fill(owner_[g.row].begin() + other,
            owner_[g.row].begin() + other + g.size, group);
  free_ranks_[g.row] -= g.size;
  Resize(group, first, size);
  return true;
}

// When the smallest free block's buddy is split among smaller groups (so no
// single group can double into it), doubles every group of the buddy and
// lays them out, largest first, over both blocks.
bool Packer::SpreadIntoSmallestFreeBlock(int row) {
  for (int width = 1; width <= n_ / 2; width *= 2) {
    for (int first = 0; first + width <= n_; first += width) {
      const int buddy = first ^ width;
      if (buddy + width > n_ || !BlockIsFree(row, first, width) ||
          BlockIsFree(row, buddy, width)) {
        continue;
      }
      std::vector<int> inside;
      for (int g : rows_groups_[row]) {
        const Group& group = groups_[g];
        if (group.first >= buddy && group.first < buddy + width) {
          if (2 * group.size > config_.max_cp || group.size >= width) {
            inside.clear();
            break;
          }
          inside.push_back(g);
        }
      }
      if (inside.empty()) continue;
      std::stable_sort(inside.begin(), inside.end(), [&](int a, int b) {
        return groups_[a].size > groups_[b].size;
      });
      int next = std::min(first, buddy);
      for (int g : inside) {
        const int size = 2 * groups_[g].size;
        std::fill(owner_[row].begin() + next, owner_[row].begin() + next + size,
                  g);
        Resize(g, next, size);
        next += size;
      }
      free_ranks_[row] -= width;
      return true;
    }
  }
  return false;
}

absl::Status Packer::AnchorRow(int row, int64_t budget) {
  const int64_t cap = config_.max_tokens_per_rank;
  int64_t taken = 0;
  while (free_ranks_[row] > 0) {
    const int heaviest = HeaviestGroup(row);
    const double target = heaviest < 0 ? 0.0 : groups_[heaviest].cost;
    // 1. The heaviest sequence whose group could reach the row's target.
    int best = -1;
    int best_first = -1;
    for (int k = 0; taken < budget && k < static_cast<int>(widths_.size());
         ++k) {
      const int item = ClassHead(k);
      if (item < 0) continue;
      const int width = widths_[k];
      const double capacity = config_.cost_model.Cost(width * cap, width);
      if (capacity < kQualifyFraction * target) continue;
      if (best >= 0 && own_cost_[item] <= own_cost_[best]) continue;
      const int first = FindFreeBlock(row, width);
      if (first < 0) continue;
      best = item;
      best_first = first;
    }
    if (best >= 0) {
      OpenGroup(row, best_first, items_[best].cp_size, best);
      ++taken;
      continue;
    }
    // 2. Dynamic CP: halve the heaviest group's cost by doubling it.
    if (heaviest >= 0 && DoubleIntoBuddy(heaviest)) continue;
    // 3. A lighter sequence rather than an idle rank, at its own size or,
    //    if only larger blocks are free, at the smallest free one.
    for (int k = 0;
         taken < budget && best < 0 && k < static_cast<int>(widths_.size());
         ++k) {
      const int item = ClassHead(k);
      if (item < 0) continue;
      for (int width = widths_[k]; width <= config_.max_cp; width *= 2) {
        const int first = FindFreeBlock(row, width);
        if (first >= 0) {
          OpenGroup(row, first, width, item);
          ++taken;
          best = item;
          break;
        }
        if (config_.max_cp == config_.min_cp) break;  // static CP
      }
    }
    if (best >= 0) continue;
    // 4. Spread groups over what is left.
    bool grown = false;
    for (int g : rows_groups_[row]) {
      if (DoubleIntoBuddy(g)) {
        grown = true;
        break;
      }
    }
    if (grown || SpreadIntoSmallestFreeBlock(row)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot give every one of the ", n_, " ranks a sequence in each of ",
        rows_, " microbatches: the batch holds ", items_.size(), " sequences (",
        free_ranks_[row], " ranks idle in microbatch ", row, ")"));
  }
  return absl::OkStatus();
}

absl::Status Packer::Fill() {
  const int64_t cap = config_.max_tokens_per_rank;
  std::vector<double> target(static_cast<size_t>(rows_), 0.0);
  for (int row = 0; row < rows_; ++row) {
    const int heaviest = HeaviestGroup(row);
    if (heaviest >= 0) target[row] = groups_[heaviest].cost;
  }
  // Per group size: (cost − row target, group), most room first.
  std::map<int, std::set<std::pair<double, int>>> open;
  for (size_t g = 0; g < groups_.size(); ++g) {
    open[groups_[g].size].insert(
        {groups_[g].cost - target[groups_[g].row], static_cast<int>(g)});
  }
  // Shortest sequence still to place from each position on: groups with
  // less room than that can be forgotten.
  std::vector<int64_t> shortest_after(order_.size() + 1, INT64_MAX);
  for (size_t p = order_.size(); p-- > 0;) {
    shortest_after[p] =
        std::min(shortest_after[p + 1], items_[order_[p]].length);
  }
  for (size_t p = 0; p < order_.size(); ++p) {
    const int item = order_[p];
    if (placed_[item]) continue;
    const int own = items_[item].cp_size;
    int chosen = -1;
    double chosen_after = 0;
    bool chosen_exact = false;
    for (auto& [size, candidates] : open) {
      if (size < own) continue;
      const SequenceShape shape = ShapeAt(items_[item].length, size, config_);
      std::vector<std::pair<double, int>> full;
      for (const auto& [key, g] : candidates) {
        const int64_t room = cap - groups_[g].tokens;
        if (room >= shape.tokens_per_rank) {
          const double after = key + shape.cost_per_rank;
          const bool exact = size == own;
          // Own size while it stays within target; else least overshoot.
          const bool better =
              chosen < 0 || (exact && after <= 0) ||
              (!(chosen_exact && chosen_after <= 0) && after < chosen_after);
          if (better) {
            chosen = g;
            chosen_after = after;
            chosen_exact = exact;
          }
          break;
        }
        if (room * size < shortest_after[p]) full.push_back({key, g});
      }
      for (const auto& entry : full) candidates.erase(entry);
    }
    if (chosen < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sample ", items_[item].sample, " does not fit in ",
                       rows_, " microbatches"));
    }
    const Group& g = groups_[chosen];
    std::set<std::pair<double, int>>& candidates = open[g.size];
    candidates.erase({g.cost - target[g.row], chosen});
    AddMember(chosen, item);
    candidates.insert({g.cost - target[g.row], chosen});
  }
  return absl::OkStatus();
}

GlobalPlan Packer::Build() const {
  GlobalPlan plan;
  plan.dp_cp_size = n_;
  plan.microbatches.resize(static_cast<size_t>(rows_));
  for (int row = 0; row < rows_; ++row) {
    std::vector<int> groups = rows_groups_[row];
    std::sort(groups.begin(), groups.end(), [&](int a, int b) {
      return groups_[a].first < groups_[b].first;
    });
    for (int g : groups) {
      const Group& group = groups_[g];
      CpGroup out;
      out.first_rank = group.first;
      out.size = group.size;
      for (int item : group.members) {
        out.sequences.push_back(
            {items_[item].sample, items_[item].length,
             ShapeAt(items_[item].length, group.size, config_).padded});
      }
      plan.microbatches[row].groups.push_back(std::move(out));
    }
  }
  plan.flops = ComputeFlopsInputs(plan);
  return plan;
}

}  // namespace

absl::StatusOr<GlobalPlan> PackRows(const std::vector<PackerItem>& items,
                                    int rows, const PackerConfig& config) {
  return Packer(items, rows, config).Run();
}

}  // namespace packfeed::internal
