#include "server/control/rank_partition.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace packfeed::server {

absl::Status CheckRankPartition(const std::string& job, int world_size,
                                const std::vector<HostedRanks>& nodes) {
  constexpr size_t kShown = 4;
  std::vector<std::vector<std::string>> hosts(static_cast<size_t>(world_size));
  std::vector<std::string> problems;
  size_t count = 0;
  auto problem = [&](std::string text) {
    if (++count <= kShown) problems.push_back(std::move(text));
  };
  for (const HostedRanks& node : nodes) {
    for (int rank : node.ranks) {
      if (rank < 0 || rank >= world_size) {
        problem(absl::StrCat("rank ", rank, " (", node.node, ") is outside the world"));
      } else {
        hosts[static_cast<size_t>(rank)].push_back(node.node);
      }
    }
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const std::vector<std::string>& by = hosts[static_cast<size_t>(rank)];
    if (by.empty()) problem(absl::StrCat("rank ", rank, " is hosted by no node"));
    if (by.size() > 1) {
      problem(absl::StrCat("rank ", rank, " is hosted ", by.size(), " times: by ",
                           absl::StrJoin(by, " and by ")));
    }
  }
  if (count == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job '", job, "': the nodes' local_ranks do not partition its ", world_size,
                   " ranks: ", absl::StrJoin(problems, "; "),
                   count > kShown ? absl::StrCat("; and ", count - kShown, " more") : ""));
}

}  // namespace packfeed::server
