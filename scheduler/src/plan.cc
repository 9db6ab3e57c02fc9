#include "packfeed/scheduler/plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace packfeed::scheduler {

FlopsInputs ComputeFlopsInputs(const GlobalPlan& plan) {
  FlopsInputs flops;
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    for (const CpGroup& group : microbatch.groups) {
      for (const PlannedSequence& s : group.sequences) {
        flops.padded_sum += s.padded_length;
        flops.padded_squared_sum += s.padded_length * s.padded_length;
        flops.real_sum += s.length;
        flops.real_squared_sum += s.length * s.length;
      }
    }
  }
  return flops;
}

const CpGroup& GroupOfRank(const PlannedMicrobatch& microbatch, int rank) {
  // Groups are ordered by first_rank: the last one starting at or before
  // `rank` holds it.
  auto it = std::upper_bound(microbatch.groups.begin(), microbatch.groups.end(), rank,
                             [](int r, const CpGroup& group) { return r < group.first_rank; });
  return *(it - 1);
}

std::vector<int> HybridGroupsOf(const GlobalPlan& plan) {
  // Small: a plan has a handful of distinct partitions of its ranks.
  std::vector<std::vector<std::pair<int, int>>> partitions;
  std::vector<int> out;
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    std::vector<std::pair<int, int>> partition;
    for (const CpGroup& group : microbatch.groups)
      partition.emplace_back(group.first_rank, group.size);
    auto it = std::find(partitions.begin(), partitions.end(), partition);
    if (it == partitions.end()) it = partitions.insert(partitions.end(), std::move(partition));
    out.push_back(static_cast<int>(it - partitions.begin()));
  }
  return out;
}

absl::Status ValidatePlan(const GlobalPlan& plan, int64_t num_samples) {
  std::vector<int> seen(static_cast<size_t>(num_samples), 0);
  for (int m = 0; m < plan.num_microbatches(); ++m) {
    int next_rank = 0;
    for (const CpGroup& group : plan.microbatches[m].groups) {
      const auto where = [&] {
        return absl::StrCat("microbatch ", m, " group at rank ", group.first_rank, " size ",
                            group.size, ": ");
      };
      if (group.first_rank != next_rank) {
        return absl::InternalError(absl::StrCat(where(), "expected to start at rank ", next_rank));
      }
      if (group.size < 1 || group.first_rank % group.size != 0) {
        return absl::InternalError(absl::StrCat(where(), "not an aligned block"));
      }
      next_rank += group.size;
      for (const PlannedSequence& s : group.sequences) {
        if (s.sample < 0 || s.sample >= num_samples) {
          return absl::InternalError(absl::StrCat(where(), "sample ", s.sample, " out of range"));
        }
        if (s.padded_length < s.length) {
          return absl::InternalError(
              absl::StrCat(where(), "sample ", s.sample, " padded below its length"));
        }
        ++seen[static_cast<size_t>(s.sample)];
      }
    }
    if (next_rank != plan.dp_cp_size) {
      return absl::InternalError(
          absl::StrCat("microbatch ", m, " covers ", next_rank, " of ", plan.dp_cp_size, " ranks"));
    }
  }
  for (int64_t i = 0; i < num_samples; ++i) {
    if (seen[static_cast<size_t>(i)] != 1) {
      return absl::InternalError(
          absl::StrCat("sample ", i, " placed ", seen[static_cast<size_t>(i)], " times"));
    }
  }
  return absl::OkStatus();
}

}  // namespace packfeed::scheduler
