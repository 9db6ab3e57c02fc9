#include "packfeed/scheduler/megatron_dp_balanced.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packfeed::scheduler {
namespace {

absl::Status ValidateOptions(absl::Span<const int64_t> lengths,
                             absl::Span<const int64_t> padded_lengths,
                             const MegatronDpBalancedOptions& options) {
  if (options.dp < 1 || options.cp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_balanced: DP ", options.dp, " and CP ", options.cp, " must be >= 1"));
  }
  if (options.max_seqlen_per_dp_cp_rank < 1) {
    return absl::InvalidArgumentError("dp_balanced: max_seqlen_per_dp_cp_rank must be >= 1");
  }
  if (options.max_num_seqs < 0 || options.vpp_group_size < 0) {
    return absl::InvalidArgumentError("dp_balanced: max_num_seqs and vpp_group_size must be >= 0");
  }
  if (lengths.size() != padded_lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("dp_balanced: ", lengths.size(), " lengths but ",
                                                   padded_lengths.size(), " padded lengths"));
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1 || padded_lengths[i] < lengths[i]) {
      return absl::InvalidArgumentError(absl::StrCat("dp_balanced: sample ", i, " has length ",
                                                     lengths[i], " and padded length ",
                                                     padded_lengths[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GlobalPlan> PlanMegatronDpBalanced(absl::Span<const int64_t> lengths,
                                                  absl::Span<const int64_t> padded_lengths,
                                                  const MegatronDpBalancedOptions& options) {
  if (absl::Status status = ValidateOptions(lengths, padded_lengths, options); !status.ok()) {
    return status;
  }
  const int64_t capacity = options.max_seqlen_per_dp_cp_rank * options.cp;

  // Next-fit in sample order. Like Megatron, a sequence that does not fit
  // closes the open pack even when that pack is empty.
  std::vector<std::vector<int64_t>> packs;
  std::vector<int64_t> open;
  int64_t open_tokens = 0;
  for (size_t i = 0; i < padded_lengths.size(); ++i) {
    const bool fits =
        open_tokens + padded_lengths[i] <= capacity &&
        (options.max_num_seqs == 0 || open.size() < static_cast<size_t>(options.max_num_seqs));
    if (!fits) {
      packs.push_back(std::move(open));
      open.clear();
      open_tokens = 0;
    }
    open.push_back(static_cast<int64_t>(i));
    open_tokens += padded_lengths[i];
  }
  if (!open.empty()) packs.push_back(std::move(open));

  // Make the pack count a multiple of DP (× VPP group): walking back from
  // the last pack, a pack gives its last sequence to a new pack at the end
  // until it holds one; then the walk steps to the previous pack.
  const size_t multiple =
      static_cast<size_t>(options.dp) *
      static_cast<size_t>(options.vpp_group_size > 0 ? options.vpp_group_size : 1);
  int64_t i = static_cast<int64_t>(packs.size()) - 1;
  while (packs.size() % multiple != 0) {
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dp_balanced: Not enough samples to move: ", padded_lengths.size(),
                       " sequences cannot fill a multiple of ", multiple, " packs"));
    }
    if (packs[i].size() >= 2) {
      const int64_t moved = packs[i].back();
      packs[i].pop_back();
      packs.push_back({moved});
    } else {
      --i;
    }
  }
  for (size_t p = 0; p < packs.size(); ++p) {
    if (packs[p].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dp_balanced: Megatron's schedule holds an empty pack (pack ", p,
                       ") because sample ", packs[p + 1].front(), " of padded length ",
                       padded_lengths[packs[p + 1].front()], " exceeds a pack's ", capacity,
                       " tokens; Megatron would crash later; use packfeed's planners or "
                       "raise max_seqlen_per_dp_cp_rank"));
    }
  }

  GlobalPlan plan;
  plan.dp_cp_size = options.dp * options.cp;
  const size_t num_microbatches = packs.size() / options.dp;
  plan.microbatches.resize(num_microbatches);
  for (size_t k = 0; k < num_microbatches; ++k) {
    for (int d = 0; d < options.dp; ++d) {
      CpGroup group;
      group.first_rank = d * options.cp;
      group.size = options.cp;
      for (int64_t sample : packs[k * options.dp + d]) {
        group.sequences.push_back({sample, lengths[sample], padded_lengths[sample]});
      }
      plan.microbatches[k].groups.push_back(std::move(group));
    }
  }
  plan.flops = ComputeFlopsInputs(plan);
  return plan;
}

}  // namespace packfeed::scheduler
