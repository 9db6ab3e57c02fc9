// A job made from its configuration as the daemon makes it: resolved by
// the config layer (JobSpecOf), then created.
#ifndef PACKFEED_TESTS_UNIT_SERVER_PIPELINE_JOB_OF_CONFIG_H_
#define PACKFEED_TESTS_UNIT_SERVER_PIPELINE_JOB_OF_CONFIG_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/job_spec.h"
#include "server/pipeline/job.h"

namespace packfeed::server {

inline absl::StatusOr<std::unique_ptr<Job>> JobOfConfig(
    const v1::JobConfig& config, const DatasetOpener& open = OpenDatasetAlone,
    IngestStream* ingest = nullptr) {
  PF_ASSIGN_OR_RETURN(JobSpec spec, JobSpecOf(config));
  return Job::Create(std::move(spec), open, ingest);
}

}  // namespace packfeed::server

#endif  // PACKFEED_TESTS_UNIT_SERVER_PIPELINE_JOB_OF_CONFIG_H_
