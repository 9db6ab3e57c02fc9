#include "packfeed/dataset/megatron_blend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "packfeed/dataset/numpy_compat.h"

namespace packfeed::dataset {

absl::string_view MegatronSplitName(MegatronSplit split) {
  switch (split) {
    case MegatronSplit::kTrain:
      return "train";
    case MegatronSplit::kValid:
      return "valid";
    case MegatronSplit::kTest:
      return "test";
  }
  return "?";
}

absl::StatusOr<SplitMatrix> ParseMegatronSplit(absl::string_view split) {
  std::vector<double> parts;
  for (absl::string_view part : absl::StrSplit(split, ',')) {
    part = absl::StripAsciiWhitespace(part);
    double value = 0;
    // Digits and dots only, as Megatron's pattern [.0-9]+ reads them.
    const bool digits = !part.empty() && part.find_first_not_of("0123456789.") == part.npos;
    if (!digits || !absl::SimpleAtod(part, &value) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("split \"", split, "\": \"", part, "\" is not a non-negative number"));
    }
    parts.push_back(value);
  }
  if (parts.size() > kNumMegatronSplits) {
    return absl::InvalidArgumentError(
        absl::StrCat("split \"", split, "\" has ", parts.size(), " parts; at most 3"));
  }
  parts.resize(kNumMegatronSplits, 0.0);
  const double sum = NumpySum(parts);
  if (!(sum > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("split \"", split, "\" sums to 0"));
  }
  // convert_split_vector_to_split_matrix: cumulative bookends, a split of
  // zero width is absent.
  SplitMatrix matrix;
  double begin = 0;
  for (int i = 0; i < kNumMegatronSplits; ++i) {
    const double end = begin + parts[static_cast<size_t>(i)] / sum;
    if (end > begin) matrix[static_cast<size_t>(i)] = std::make_pair(begin, end);
    begin = end;
  }
  return matrix;
}

std::pair<int64_t, int64_t> SplitSequences(const std::pair<double, double>& share,
                                           int64_t num_sequences) {
  const auto n = static_cast<double>(num_sequences);
  return {PythonRound(share.first * n), PythonRound(share.second * n)};
}

absl::StatusOr<std::vector<double>> NormalizeBlendWeights(absl::Span<const double> weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("blend weight ", i, " is ", weights[i], "; weights must be > 0"));
    }
  }
  if (weights.empty()) return absl::InvalidArgumentError("a blend needs at least one dataset");
  const double sum = NumpySum(weights);
  std::vector<double> out;
  out.reserve(weights.size());
  for (double w : weights) out.push_back(w / sum);
  return out;
}

std::vector<int64_t> SamplesPerDataset(absl::Span<const double> normalized_weights, int64_t target,
                                       double surplus) {
  std::vector<int64_t> out;
  out.reserve(normalized_weights.size());
  for (double w : normalized_weights) {
    const double planned = std::ceil(static_cast<double>(target) * w);
    out.push_back(static_cast<int64_t>(std::ceil(planned * (1.0 + surplus))));
  }
  return out;
}

namespace {

// helpers.cpp's rule for sample i: the dataset furthest behind its weight,
// error = weight · max(i, 1) − drawn, the first on ties, among the datasets
// still open (the exhaustive blend closes a dataset once it has given every
// sample). helpers.cpp scans every dataset for every sample: 2.4·10^10
// errors for a blend of 1 000 datasets and 24 M samples, most of a
// corpus-scale start-up. The same choices, from the same double
// expression, come here from two shortcuts, each exact for those doubles:
//
// 1. Datasets of bitwise-equal weight (and, exhaustive, equal size) form a
//    class whose members are drawn in turn, lowest index first. Within a
//    class every error is fl(fl(w·x) − n) with one product, so the member
//    drawn least is furthest behind, and of those the first index: fl(p − n)
//    is monotone in n, and two counts a draw apart cannot round to one
//    double below 2^52. A class stands in for all its members: a recipe's
//    thousand prefixes often have a handful of distinct weights.
//
// 2. From kBlocksFrom classes on, blocks of classes: each block knows its
//    leader (its class furthest behind) and a step before which no other of
//    its classes can take the lead, and only a block whose leader was drawn,
//    or whose step has come, is scanned again. That step must hold for the
//    doubles, not for exact arithmetic: weights a few ulps apart, or
//    products that round to one double, tie where exact arithmetic would
//    not, and the first index wins a tie. So a class is ruled out for good
//    only where rounding cannot help it, and otherwise only while its exact
//    error stays below the leader's by more than both errors' rounding can
//    close (SafeUntil); a pair that stays within that margin is scanned
//    every step, as helpers.cpp scans every pair.
//
// Ties between classes go to the lower dataset index of their next
// members, which is how helpers.cpp breaks them. Timings: docs/PRETRAINING.md,
// "Start-up".

// Datasets of one weight (and size), drawn in turn.
struct WeightClass {
  double weight = 0;
  int64_t size = -1;              // samples each member gives; -1: unbounded
  std::vector<uint32_t> members;  // dataset indices, ascending
  int64_t rounds = 0;             // draws of each member from `next` on
  size_t next = 0;                // the member drawn next

  bool open() const { return size < 0 || rounds < size; }
  uint32_t leader() const { return members[next]; }
  // Draws the next member: its index and its sample number.
  std::pair<size_t, int64_t> Draw() {
    const std::pair<size_t, int64_t> drawn{members[next], rounds};
    if (++next == members.size()) {
      next = 0;
      ++rounds;
    }
    return drawn;
  }
};

// The classes of `weights` (with `sizes`, when not empty), ordered by their
// first member.
std::vector<WeightClass> ClassesOf(absl::Span<const double> weights,
                                   absl::Span<const int64_t> sizes) {
  // By the weight's bits, never a hash map's order.
  std::map<std::pair<uint64_t, int64_t>, size_t> by_key;
  std::vector<WeightClass> classes;
  for (size_t d = 0; d < weights.size(); ++d) {
    const int64_t size = sizes.empty() ? -1 : sizes[d];
    const auto [it, added] =
        by_key.try_emplace({absl::bit_cast<uint64_t>(weights[d]), size}, classes.size());
    if (added) classes.push_back({weights[d], size, {}, 0, 0});
    classes[it->second].members.push_back(static_cast<uint32_t>(d));
  }
  return classes;
}

// Whether class a is ahead of class b in helpers.cpp's order: the larger
// error, then the lower index.
bool Before(double error_a, uint32_t index_a, double error_b, uint32_t index_b) {
  return error_a > error_b || (error_a == error_b && index_a < index_b);
}

// Every open class compared for every sample: below kBlocksFrom classes.
class ScanClasses {
 public:
  explicit ScanClasses(std::vector<WeightClass> classes) : classes_(std::move(classes)) {}

  // The dataset sample `i` comes from and its number there. REQUIRES: some
  // dataset is open.
  std::pair<size_t, int64_t> Next(int64_t i) {
    const double at = std::max(static_cast<double>(i), 1.0);
    WeightClass* best = nullptr;
    double best_error = 0;
    for (WeightClass& c : classes_) {
      if (!c.open()) continue;
      const double error = c.weight * at - static_cast<double>(c.rounds);
      if (best == nullptr || Before(error, c.leader(), best_error, best->leader())) {
        best = &c;
        best_error = error;
      }
    }
    return best->Draw();
  }

 private:
  std::vector<WeightClass> classes_;
};

// Two doubles side by side, the compiler's vector extension (an SSE2
// register on x86-64, a NEON one on ARM), so that a pass over blocks or
// classes takes two errors an instruction and no branch per error (four
// lanes, split in two without AVX, measured slower). Lane arithmetic is
// IEEE arithmetic lane by lane: the same doubles as helpers.cpp's
// expression, as long as no multiply-add is fused (the library is built
// with -ffp-contract=off).
using Lanes = double __attribute__((vector_size(2 * sizeof(double))));
using LaneMask = int64_t __attribute__((vector_size(2 * sizeof(double))));
constexpr size_t kLanes = 2;

Lanes Load(const double* at) {
  Lanes v;
  std::memcpy(&v, at, sizeof v);
  return v;
}
Lanes Splat(double x) { return Lanes{x, x}; }
bool Any(LaneMask m) { return (m[0] | m[1]) != 0; }

// Blocks of classes, each with its leader and the step to scan it again.
// What a scan reads of each class (weight, rounds, next member) is kept in
// arrays side by side, padded with closed classes to whole blocks, and the
// blocks' leaders likewise to whole lanes: a scan is a pass over lanes.
class BlocksOfClasses {
 public:
  explicit BlocksOfClasses(std::vector<WeightClass> classes) : classes_(std::move(classes)) {
    // Blocks of about √(C / 4) classes (at least a lane's width): a scan
    // costs a few times a leader's comparison, so about 2√C blocks balance
    // them.
    block_ = kLanes;
    while (4 * block_ * block_ < classes_.size()) block_ *= 2;
    const size_t blocks = (classes_.size() + block_ - 1) / block_;
    // Padding: a closed class (error −∞) of an index past every dataset's.
    weight_.assign(blocks * block_, 0);
    rounds_.assign(blocks * block_, kClosed);
    index_.assign(blocks * block_, kNoIndex);
    for (size_t c = 0; c < classes_.size(); ++c) {
      weight_[c] = classes_[c].weight;
      rounds_[c] = 0;
      index_[c] = classes_[c].leader();
      any_shared_ = any_shared_ || classes_[c].members.size() > 1;
    }
    const size_t lanes = (blocks + kLanes - 1) / kLanes * kLanes;
    leader_.assign(blocks, kNone);
    lead_weight_.assign(lanes, 0);
    lead_rounds_.assign(lanes, kClosed);
    lead_index_.assign(lanes, kNoIndex);
    until_.assign(blocks, 0);
    errors_.resize(std::max(lanes, block_));
  }

  std::pair<size_t, int64_t> Next(int64_t i) {
    at_ = std::max(static_cast<double>(i), 1.0);
    // The block drawn from last (its leader's error fell) and any block
    // whose step has come; the earliest step spares a pass over the blocks.
    if (drawn_ != kNone) {
      Scan(drawn_, i);
      earliest_ = std::min(earliest_, until_[drawn_]);
    }
    if (earliest_ <= i) {
      earliest_ = kLatest;
      for (size_t b = 0; b < until_.size(); ++b) {
        if (until_[b] <= i) Scan(b, i);
        earliest_ = std::min(earliest_, until_[b]);
      }
    }
    // Position order is index order unless some class has more than one
    // member.
    drawn_ =
        Lead(lead_weight_.data(), lead_rounds_.data(), lead_index_.data(), lead_weight_.size());
    const size_t c = leader_[drawn_];
    const std::pair<size_t, int64_t> drawn = classes_[c].Draw();
    rounds_[c] = classes_[c].open() ? static_cast<double>(classes_[c].rounds) : kClosed;
    index_[c] = classes_[c].leader();
    return drawn;
  }

 private:
  static constexpr size_t kNone = SIZE_MAX;
  // The rounds of a closed class, and a block with no open class: its error
  // is −∞, below every other.
  static constexpr double kClosed = std::numeric_limits<double>::infinity();
  static constexpr double kNoIndex = 0x1p40;  // above every dataset index
  static constexpr int64_t kLatest = std::numeric_limits<int64_t>::max() / 2;
  // The growth per step of the margin a lead must keep over rounding.
  static constexpr double kRoundingSlope = 0x1p-48;

  // The block's leader at step i, and the step at which to scan it again: at
  // or before the first step another of its classes could take the lead (a
  // scan too early costs a scan; one too late would be wrong).
  void Scan(size_t b, int64_t i) {
    const size_t first = b * block_;
    const size_t found = Lead(&weight_[first], &rounds_[first], &index_[first], block_);
    const size_t lead = found == kNone ? kNone : first + found;
    leader_[b] = lead;
    if (lead == kNone) {
      lead_weight_[b] = 0;
      lead_rounds_[b] = kClosed;
      lead_index_[b] = kNoIndex;
      until_[b] = kLatest;
      return;
    }
    lead_weight_[b] = weight_[lead];
    lead_rounds_[b] = rounds_[lead];
    lead_index_[b] = index_[lead];
    until_[b] = SafeUntil(first, lead, i);
  }

  // The furthest behind of n entries (n a multiple of kLanes) by
  // helpers.cpp's expression, weight · at − rounds: the first position at
  // the largest error or, where some class has more than one member, the
  // lowest index there. kNone when every entry is closed.
  size_t Lead(const double* weight, const double* rounds, const double* index, size_t n) {
    Lanes best = Splat(-std::numeric_limits<double>::infinity());
    for (size_t k = 0; k < n; k += kLanes) {
      const Lanes error = Load(weight + k) * at_ - Load(rounds + k);
      std::memcpy(&errors_[k], &error, sizeof error);
      best = error > best ? error : best;
    }
    const double most = std::max(best[0], best[1]);
    if (most == -std::numeric_limits<double>::infinity()) return kNone;
    size_t lead = kNone;
    for (size_t k = 0; k < n; ++k) {
      if (errors_[k] != most) continue;
      if (!any_shared_) return k;
      if (lead == kNone || index[k] < index[lead]) lead = k;
    }
    return lead;
  }

  // The step at which another class of the block from `first` may take the
  // lead from `lead` (or a step before it); kLatest when none can.
  //
  // Never, where rounding cannot help it: fl(w · x) is monotone in w, and
  // fl(p − n) in p and n, so a class no heavier and drawn no less trails
  // or ties at every x; and errors whose counts differ by ≥ 1 cannot round
  // to one double below 2^52.
  //
  // Otherwise the leader is safe at x while its exact lead
  // (w_L − w_c)·x − (n_L − n_c) exceeds kRoundingSlope·(x + 2). Each error
  // rounds twice, by at most 2^-53 of |w·x| ≤ x and of max(w·x, n) ≤ x
  // (n ≤ i, w ≤ 1), so both together move by less than 2^-51·x: the margin
  // is 8 times that, and covers the rounding of this computation too. A
  // heavier class crosses at offset / slope.
  int64_t SafeUntil(size_t first, size_t lead, int64_t i) const {
    const Lanes lead_weight = Splat(weight_[lead]);
    const Lanes lead_rounds = Splat(rounds_[lead]);
    const Lanes lead_index = Splat(index_[lead]);
    const auto next = static_cast<double>(i + 1);
    const Lanes never = Splat(std::numeric_limits<double>::infinity());
    Lanes soonest = never;
    LaneMask too_close{};
    for (size_t k = first; k < first + block_; k += kLanes) {
      const Lanes rounds = Load(&rounds_[k]);
      const Lanes index = Load(&index_[k]);
      const Lanes lighter = lead_weight - Load(&weight_[k]);
      const Lanes behind = lead_rounds - rounds;  // exact: both < 2^53
      const LaneMask trails =
          (lighter >= 0) & ((behind < 0) | ((behind == 0) & (index > lead_index)));
      const LaneMask rival = (rounds != kClosed) & (index != lead_index) & ~trails;
      const Lanes slope = lighter - kRoundingSlope;
      const Lanes offset = behind + 2 * kRoundingSlope;
      too_close |= rival & ~(slope * next > offset);
      // Safe while x < offset / slope (both negative here).
      const Lanes crossing = (rival & (slope < 0)) ? offset / slope : never;
      soonest = crossing < soonest ? crossing : soonest;
    }
    if (Any(too_close)) return i + 1;  // scanned each step
    const double least = std::min(soonest[0], soonest[1]);
    // Shrunk so that the rounding of the divisions cannot carry it past the
    // crossing.
    const double crossing = least * (1 - 0x1p-40);
    if (crossing >= static_cast<double>(kLatest)) return kLatest;
    return std::max(i + 1, static_cast<int64_t>(std::floor(crossing)) - 1);
  }

  std::vector<WeightClass> classes_;
  size_t block_ = kLanes;
  // Per class (padded): its weight, its rounds as the double the error uses
  // (kClosed once closed), and its next member.
  std::vector<double> weight_;
  std::vector<double> rounds_;
  std::vector<double> index_;
  // Per block: its leader class and the step to scan it again; padded to
  // whole lanes, the leader's weight, rounds and next member.
  std::vector<size_t> leader_;
  std::vector<double> lead_weight_;
  std::vector<double> lead_rounds_;
  std::vector<double> lead_index_;
  std::vector<int64_t> until_;
  std::vector<double> errors_;  // scratch for Lead
  bool any_shared_ = false;
  double at_ = 1;
  size_t drawn_ = kNone;  // the block drawn from last
  int64_t earliest_ = 0;  // the earliest step of any block
};

template <typename Rule>
BlendIndices InterleaveBy(Rule rule, int64_t size) {
  BlendIndices out;
  out.dataset_index.reserve(static_cast<size_t>(size));
  out.dataset_sample_index.reserve(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const auto [best, sample] = rule.Next(i);
    out.dataset_index.push_back(static_cast<int16_t>(best));
    out.dataset_sample_index.push_back(sample);
  }
  return out;
}

BlendIndices Interleave(absl::Span<const double> weights, int64_t size,
                        absl::Span<const int64_t> sizes) {
  std::vector<WeightClass> classes = ClassesOf(weights, sizes);
  if (classes.size() < kBlocksFrom) return InterleaveBy(ScanClasses(std::move(classes)), size);
  return InterleaveBy(BlocksOfClasses(std::move(classes)), size);
}

}  // namespace

BlendIndices BuildBlendIndices(absl::Span<const double> normalized_weights, int64_t size) {
  return Interleave(normalized_weights, size, {});
}

BlendIndices BuildExhaustiveBlendIndices(absl::Span<const int64_t> sizes) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::vector<double> weights;
  for (int64_t s : sizes) weights.push_back(static_cast<double>(s) / static_cast<double>(total));
  return Interleave(weights, total, sizes);
}

}  // namespace packfeed::dataset
