#include "scheduler/src/row_packer.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/scheduler/padding.h"

namespace packfeed::scheduler {

double Inflation(const PackerItem& item, int cp_size, const PackerConfig& config) {
  if (cp_size <= item.cp_size) return 0;
  return static_cast<double>(ShapeAt(item.length, cp_size, config).padded) *
         (static_cast<double>(cp_size) / item.cp_size - 1.0);
}

SequenceShape ShapeAt(int64_t length, int cp_size, const PackerConfig& config) {
  SequenceShape shape;
  shape.padded = PadTo(length, PaddingDivisor(cp_size, config.tp, config.sequence_parallel));
  shape.tokens_per_rank = shape.padded / cp_size;
  shape.cost_per_rank = config.cost_model.Cost(shape.padded, cp_size);
  return shape;
}

namespace {

// A group may join a row only if, filled to the token cap, it could reach
// this fraction of the row's heaviest group; lighter sequences wait for a
// lighter row.
constexpr double kQualifyFraction = 0.9;

// Groups examined in deficit order for each sequence before settling for
// the roomiest one.
constexpr int kFillScan = 32;

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
  Packer(const PackerBatch& batch, int rows, const PackerConfig& config);

  absl::StatusOr<GlobalPlan> Run();

 private:
  absl::Status SetQuotas();
  int ClassOf(int width) const;
  absl::Status AnchorRow(int row, int64_t budget);
  // Opens a group in `row` for the heaviest sequence that fits a free
  // block of its own size or, with `upgrade`, a larger one (at the
  // smallest that is free); false if none.
  bool PlaceLightest(int row, bool within_quota, bool upgrade);
  // Heaviest unplaced item of class `c`, or -1.
  int ClassHead(int class_index);
  // Lowest aligned free block of `width` ranks in `row`, or -1.
  int FindFreeBlock(int row, int width);
  bool BlockIsFree(int row, int first, int width) const;
  void OpenGroup(int row, int first, int size, int item);
  void AddMember(int group, int item);
  void Resize(int group, int first, int size);
  bool DoubleIntoBuddy(int group);
  // Whether doubling `group` stays within the CP inflation budget.
  bool CanDouble(int group) const;
  bool SpreadIntoSmallestFreeBlock(int row);
  int HeaviestGroup(int row) const;
  // Inflation() of `group`'s sequences at `size`.
  double UpgradedTokens(int group, int size) const;
  // lift_heavy_anchors: doubles `group` while it costs more than share_.
  void LiftHeavyAnchor(int group);
  // Keeps heaviest_ current after `group`'s cost rose.
  void NoteCost(int group);
  absl::Status Fill();
  GlobalPlan Build() const;

  const std::vector<PackerItem>& items_;
  const int rows_;
  const PackerConfig& config_;
  const int n_;
  const std::vector<int>& widths_;  // group sizes items may start at, ascending
  const std::vector<double>& own_cost_;
  const std::vector<int>& order_;                  // items by own cost, heaviest first
  const std::vector<std::vector<int>>& by_class_;  // per widths_ entry, in order_
  std::vector<size_t> class_head_;
  // Rank-units (group width × groups, over all rows) each size may anchor:
  // its token demand, so that short sequences keep groups of their own
  // size instead of all riding, inflated, in the heavy ones' spare room.
  std::vector<int64_t> quota_;
  std::vector<int64_t> used_width_;
  std::vector<char> placed_;
  int64_t unplaced_ = 0;
  std::vector<Group> groups_;
  std::vector<std::vector<int>> owner_;  // [row][rank] → group, −1 = free
  std::vector<int> free_ranks_;
  std::vector<std::vector<int>> rows_groups_;
  std::vector<int> heaviest_;  // per row, during anchoring
  // CP inflation spent (Inflation() summed) and how much may be.
  double upgraded_tokens_ = 0;
  double upgrade_limit_ = 0;
  double share_ = 0;                             // Σ own work / (N · rows)
  const int64_t tokens_;                         // padded, every sequence at its own size
  std::vector<std::map<int, int>> search_from_;  // [row][width] → rank
};

Packer::Packer(const PackerBatch& batch, int rows, const PackerConfig& config)
    : items_(batch.items),
      rows_(rows),
      config_(config),
      n_(config.num_ranks),
      widths_(batch.widths),
      own_cost_(batch.own_cost),
      order_(batch.order),
      by_class_(batch.by_class),
      tokens_(batch.own_padded) {
  class_head_.assign(widths_.size(), 0);
  placed_.assign(items_.size(), 0);
  unplaced_ = static_cast<int64_t>(items_.size());
  owner_.assign(static_cast<size_t>(rows_), std::vector<int>(n_, -1));
  free_ranks_.assign(static_cast<size_t>(rows_), n_);
  rows_groups_.resize(static_cast<size_t>(rows_));
  heaviest_.assign(static_cast<size_t>(rows_), -1);
  search_from_.resize(static_cast<size_t>(rows_));
  upgrade_limit_ = config_.cp_upgrade_budget * static_cast<double>(tokens_);
  for (size_t i = 0; i < items_.size(); ++i) share_ += own_cost_[i] * items_[i].cp_size;
  share_ /= static_cast<double>(n_) * rows_;
}

double Packer::UpgradedTokens(int group, int size) const {
  double tokens = 0;
  for (int item : groups_[group].members) {
    tokens += Inflation(items_[item], size, config_);
  }
  return tokens;
}

int Packer::ClassOf(int width) const {
  const auto it = std::lower_bound(widths_.begin(), widths_.end(), width);
  return it != widths_.end() && *it == width ? static_cast<int>(it - widths_.begin()) : -1;
}

absl::Status Packer::SetQuotas() {
  const int64_t cap = config_.max_tokens_per_rank;
  const int64_t total = int64_t{rows_} * n_;
  quota_.assign(widths_.size(), total);
  used_width_.assign(widths_.size(), 0);
  if (widths_.size() < 2) return absl::OkStatus();
  // A sequence over half a group's tokens needs a group to itself; shorter
  // ones share, so they need their tokens' worth of ranks.
  int64_t demand = 0;
  int64_t alone_ranks = 0;
  int64_t shared_total = 0;
  for (size_t k = 0; k < widths_.size(); ++k) {
    int64_t alone = 0;
    int64_t shared_tokens = 0;
    for (int item : by_class_[k]) {
      const SequenceShape shape = ShapeAt(items_[item].length, widths_[k], config_);
      if (2 * shape.tokens_per_rank > cap) {
        alone += widths_[k];
      } else {
        shared_tokens += shape.tokens_per_rank * widths_[k];
      }
    }
    quota_[k] = alone + (shared_tokens + cap - 1) / cap;
    demand += quota_[k];
    alone_ranks += alone;
    shared_total += shared_tokens;
  }
  // Too little room: the smallest sizes give way first (their sequences fit
  // the spare room of the next size up, at twice their CP). Room to spare:
  // the smallest size takes it.
  int64_t excess = demand - total;
  // Shared tokens beyond the ranks that sequences alone leave free must run
  // in the spare room of larger groups, at twice their CP size or more:
  // that much inflation at the least.
  const int64_t forced = shared_total - (total - alone_ranks) * cap;
  if (static_cast<double>(forced) > upgrade_limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(rows_, " microbatches would spend more than ",
                                                     config_.cp_upgrade_budget,
                                                     " of CP inflation"));
  }
  for (size_t k = 0; k + 1 < widths_.size() && excess > 0; ++k) {
    const int64_t cut = std::min(excess, quota_[k]);
    quota_[k] -= cut;
    excess -= cut;
  }
  if (excess < 0) quota_[0] -= excess;
  return absl::OkStatus();
}

absl::StatusOr<GlobalPlan> Packer::Run() {
  if (absl::Status status = SetQuotas(); !status.ok()) return status;
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
  const std::vector<int>& members = by_class_[class_index];
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
  // Ranks only get taken while anchoring, so a block found busy stays busy:
  // start where the last search for this width stopped.
  int& first = search_from_[row][width];
  for (; first + width <= n_; first += width) {
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
  const int k = ClassOf(size);
  if (k >= 0) used_width_[k] += size;
  AddMember(g, item);
}

void Packer::AddMember(int group, int item) {
  Group& g = groups_[group];
  const SequenceShape shape = ShapeAt(items_[item].length, g.size, config_);
  g.tokens += shape.tokens_per_rank;
  g.cost += shape.cost_per_rank;
  upgraded_tokens_ += Inflation(items_[item], g.size, config_);
  g.members.push_back(item);
  placed_[item] = 1;
  --unplaced_;
  NoteCost(group);
}

void Packer::Resize(int group, int first, int size) {
  upgraded_tokens_ += UpgradedTokens(group, size) - UpgradedTokens(group, groups_[group].size);
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

void Packer::NoteCost(int group) {
  const Group& g = groups_[group];
  int& heaviest = heaviest_[g.row];
  if (heaviest < 0 || g.cost > groups_[heaviest].cost) heaviest = group;
}

bool Packer::CanDouble(int group) const {
  return upgraded_tokens_ + UpgradedTokens(group, 2 * groups_[group].size) -
             UpgradedTokens(group, groups_[group].size) <=
         upgrade_limit_;
}

void Packer::LiftHeavyAnchor(int group) {
  while (groups_[group].cost > share_ && CanDouble(group) && DoubleIntoBuddy(group)) {
  }
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
  std::fill(owner_[g.row].begin() + other, owner_[g.row].begin() + other + g.size, group);
  free_ranks_[g.row] -= g.size;
  Resize(group, first, size);
  heaviest_[g.row] = HeaviestGroup(g.row);  // its cost fell
  return true;
}

// When the smallest free block's buddy is split among smaller groups (so no
// single group can double into it), doubles every group of the buddy and
// lays them out, largest first, over both blocks.
bool Packer::SpreadIntoSmallestFreeBlock(int row) {
  for (int width = 1; width <= n_ / 2; width *= 2) {
    for (int first = 0; first + width <= n_; first += width) {
      const int buddy = first ^ width;
      if (buddy + width > n_ || !BlockIsFree(row, first, width) || BlockIsFree(row, buddy, width)) {
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
      std::stable_sort(inside.begin(), inside.end(),
                       [&](int a, int b) { return groups_[a].size > groups_[b].size; });
      int next = std::min(first, buddy);
      for (int g : inside) {
        const int size = 2 * groups_[g].size;
        std::fill(owner_[row].begin() + next, owner_[row].begin() + next + size, g);
        Resize(g, next, size);
        next += size;
      }
      free_ranks_[row] -= width;
      heaviest_[row] = HeaviestGroup(row);
      return true;
    }
  }
  return false;
}

bool Packer::PlaceLightest(int row, bool within_quota, bool upgrade) {
  int best = -1;
  int best_first = -1;
  int best_width = 0;
  for (int k = 0; k < static_cast<int>(widths_.size()); ++k) {
    const int item = ClassHead(k);
    if (item < 0 || (best >= 0 && own_cost_[item] <= own_cost_[best])) {
      continue;
    }
    if (within_quota && used_width_[k] + widths_[k] > quota_[k]) continue;
    const int widest = upgrade ? config_.max_cp : widths_[k];
    for (int width = widths_[k]; width <= widest; width *= 2) {
      const int first = FindFreeBlock(row, width);
      if (first >= 0) {
        best = item;
        best_first = first;
        best_width = width;
        break;
      }
    }
  }
  if (best < 0) return false;
  OpenGroup(row, best_first, best_width, best);
  return true;
}

absl::Status Packer::AnchorRow(int row, int64_t budget) {
  const int64_t cap = config_.max_tokens_per_rank;
  int64_t taken = 0;
  while (free_ranks_[row] > 0) {
    const int heaviest = heaviest_[row];
    const double target = heaviest < 0 ? 0.0 : groups_[heaviest].cost;
    // 1. The heaviest sequence whose group could reach the row's target.
    int best = -1;
    int best_first = -1;
    for (int k = 0; taken < budget && k < static_cast<int>(widths_.size()); ++k) {
      const int item = ClassHead(k);
      if (item < 0) continue;
      const int width = widths_[k];
      if (used_width_[k] + width > quota_[k]) continue;
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
      if (config_.lift_heavy_anchors) LiftHeavyAnchor(static_cast<int>(groups_.size()) - 1);
      continue;
    }
    // 2. Dynamic CP: halve the heaviest group's cost by doubling it.
    if (heaviest >= 0 && CanDouble(heaviest) && DoubleIntoBuddy(heaviest)) continue;
    // 3. A lighter sequence rather than an idle rank: the heaviest with a
    //    free block of its own size (quota first), and only then one in a
    //    larger block.
    if (taken < budget && (PlaceLightest(row, true, false) || PlaceLightest(row, false, false) ||
                           PlaceLightest(row, true, true) || PlaceLightest(row, false, true))) {
      ++taken;
      continue;
    }
    // 4. Grow groups over what is left.
    bool grown = false;
    for (int g : rows_groups_[row]) {
      if (DoubleIntoBuddy(g)) {
        grown = true;
        break;
      }
    }
    if (grown || SpreadIntoSmallestFreeBlock(row)) continue;
    // 5. A sequence meant for a later microbatch; that one may then grow
    //    its groups instead.
    if (PlaceLightest(row, false, true)) {
      ++taken;
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot give every one of the ", n_, " ranks a sequence in each of ", rows_,
                     " microbatches: the batch holds ", items_.size(), " sequences (",
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
  // Per group size, groups still open: by cost below the row's target
  // (most deficit first) and by token room (most first).
  struct Open {
    std::set<std::pair<double, int>> by_deficit;
    std::set<std::pair<int64_t, int>> by_room;  // (−room, group)
  };
  std::map<int, Open> open;
  const auto key = [&](int g) {
    return std::make_pair(groups_[g].cost - target[groups_[g].row], g);
  };
  const auto room_key = [&](int g) { return std::make_pair(groups_[g].tokens - cap, g); };
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    open[groups_[g].size].by_deficit.insert(key(g));
    open[groups_[g].size].by_room.insert(room_key(g));
  }
  // Shortest sequence still to place from each position on: groups with
  // less room than that are closed.
  std::vector<int64_t> shortest_after(order_.size() + 1, INT64_MAX);
  for (size_t p = order_.size(); p-- > 0;) {
    shortest_after[p] = std::min(shortest_after[p + 1], items_[order_[p]].length);
  }
  for (size_t p = 0; p < order_.size(); ++p) {
    const int item = order_[p];
    if (placed_[item]) continue;
    const int own = items_[item].cp_size;
    int chosen = -1;
    double chosen_after = 0;
    for (auto& [size, groups] : open) {
      if (size < own) continue;
      const SequenceShape shape = ShapeAt(items_[item].length, size, config_);
      // Larger than its own size only within the upgrade budget.
      if (size > own &&
          upgraded_tokens_ + Inflation(items_[item], size, config_) > upgrade_limit_) {
        continue;
      }
      // The most deficit among the first few groups that have room; past
      // them, the roomiest group, if anything fits at all. Bounded work per
      // sequence keeps 1 024 ranks within milliseconds.
      int found = -1;
      int scanned = 0;
      std::vector<int> closed;
      for (const auto& [deficit, g] : groups.by_deficit) {
        const int64_t room = cap - groups_[g].tokens;
        if (room >= shape.tokens_per_rank) {
          found = g;
          break;
        }
        if (room * size < shortest_after[p]) closed.push_back(g);
        if (++scanned == kFillScan) break;
      }
      if (found < 0 && !groups.by_room.empty()) {
        const int roomiest = groups.by_room.begin()->second;
        if (cap - groups_[roomiest].tokens >= shape.tokens_per_rank) {
          found = roomiest;
        }
      }
      for (int g : closed) {
        groups.by_deficit.erase(key(g));
        groups.by_room.erase(room_key(g));
      }
      if (found < 0) continue;
      // The smallest size whose group stays within its row's target;
      // failing that, the least overshoot.
      const double after = key(found).first + shape.cost_per_rank;
      if (chosen < 0 || (chosen_after > 0 && after < chosen_after)) {
        chosen = found;
        chosen_after = after;
      }
    }
    if (chosen < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sample ", items_[item].sample, " does not fit in ", rows_, " microbatches"));
    }
    Open& groups = open[groups_[chosen].size];
    groups.by_deficit.erase(key(chosen));
    groups.by_room.erase(room_key(chosen));
    AddMember(chosen, item);
    groups.by_deficit.insert(key(chosen));
    groups.by_room.insert(room_key(chosen));
  }
  return absl::OkStatus();
}

GlobalPlan Packer::Build() const {
  GlobalPlan plan;
  plan.dp_cp_size = n_;
  plan.microbatches.resize(static_cast<size_t>(rows_));
  for (int row = 0; row < rows_; ++row) {
    std::vector<int> groups = rows_groups_[row];
    std::sort(groups.begin(), groups.end(),
              [&](int a, int b) { return groups_[a].first < groups_[b].first; });
    for (int g : groups) {
      const Group& group = groups_[g];
      CpGroup out;
      out.first_rank = group.first;
      out.size = group.size;
      for (int item : group.members) {
        out.sequences.push_back({items_[item].sample, items_[item].length,
                                 ShapeAt(items_[item].length, group.size, config_).padded});
      }
      plan.microbatches[row].groups.push_back(std::move(out));
    }
  }
  plan.flops = ComputeFlopsInputs(plan);
  return plan;
}

}  // namespace

PackerBatch MakePackerBatch(std::vector<PackerItem> items, const PackerConfig& config) {
  PackerBatch batch;
  batch.own_cost.reserve(items.size());
  for (const PackerItem& item : items) {
    batch.own_cost.push_back(ShapeAt(item.length, item.cp_size, config).cost_per_rank);
  }
  batch.order.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) batch.order[i] = static_cast<int>(i);
  std::sort(batch.order.begin(), batch.order.end(), [&](int a, int b) {
    if (batch.own_cost[a] != batch.own_cost[b]) return batch.own_cost[a] > batch.own_cost[b];
    return items[a].sample < items[b].sample;
  });
  for (const PackerItem& item : items) {
    // A handful of distinct sizes: a linear search beats a sort of them all.
    if (std::find(batch.widths.begin(), batch.widths.end(), item.cp_size) == batch.widths.end()) {
      batch.widths.push_back(item.cp_size);
    }
    batch.own_padded += ShapeAt(item.length, item.cp_size, config).padded;
  }
  std::sort(batch.widths.begin(), batch.widths.end());
  batch.by_class.resize(batch.widths.size());
  for (int i : batch.order) {
    const auto k = std::lower_bound(batch.widths.begin(), batch.widths.end(), items[i].cp_size) -
                   batch.widths.begin();
    batch.by_class[static_cast<size_t>(k)].push_back(i);
  }
  batch.items = std::move(items);
  return batch;
}

absl::StatusOr<GlobalPlan> PackRows(const PackerBatch& batch, int rows,
                                    const PackerConfig& config) {
  return Packer(batch, rows, config).Run();
}

}  // namespace packfeed::scheduler
