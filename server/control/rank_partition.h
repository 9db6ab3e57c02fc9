#ifndef PACKFEED_SERVER_CONTROL_RANK_PARTITION_H_
#define PACKFEED_SERVER_CONTROL_RANK_PARTITION_H_

// The daemons of a multi-node job must host its ranks between them exactly
// once: a rank hosted twice would be served twice (or refused on one node),
// a rank hosted nowhere waits forever. Checked at start-up with the peers'
// ListJobs answers (daemon.cc).

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace packfeed::server {

struct HostedRanks {
  std::string node;  // "this node", or a peer's address
  std::vector<int> ranks;
};

// OK when every rank of [0, world_size) appears exactly once in `nodes`.
// FailedPrecondition naming the job and, for the first few problems, each
// rank hosted twice (and by which nodes), missing, or outside the world.
absl::Status CheckRankPartition(const std::string& job, int world_size,
                                const std::vector<HostedRanks>& nodes);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_RANK_PARTITION_H_
