#ifndef PACKFEED_SERVER_INTERNAL_READ_H_
#define PACKFEED_SERVER_INTERNAL_READ_H_

// Stage 2 of a step: reads, once each, the stored samples the given ranks
// need for a planned step, and turns each into its token run (sample rules:
// EOD, truncation). Counts what it read against what was needed.

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/internal/job.h"
#include "server/internal/plan.h"

namespace packfeed::server {

// The token runs of the samples some ranks need for one step.
struct StepData {
  StepPlan plan;
  std::map<int64_t, std::vector<int64_t>> runs;  // by planned sample
  uint64_t bytes_read = 0;                       // fetched from .bin for this step
  uint64_t unique_bytes = 0;                     // the distinct samples' bytes needed
};

// Errors are the dataset's (DataLoss, I/O), naming the file.
absl::StatusOr<StepData> ReadStep(const Job& job, StepPlan plan,
                                  absl::Span<const int> global_ranks);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INTERNAL_READ_H_
