#ifndef PACKFEED_SERVER_PIPELINE_JOB_KINDS_H_
#define PACKFEED_SERVER_PIPELINE_JOB_KINDS_H_

// The kinds' implementations (kind_*.cc), for KindFor, and what more than
// one of them uses. Private to server/pipeline.

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "packfeed/dataset/pretraining_indices.h"
#include "server/pipeline/job_kind.h"

namespace packfeed::server {

const JobKind& DocumentsKind();
const JobKind& PretrainingKind();
const JobKind& HybridCpKind();
const JobKind& IngestKind();

// JobKind::BoundsOf's `bounds` for a Megatron pretraining job (hybrid CP
// too): a row cut at documents holds up to one sequence per token.
SlotBounds PretrainingBounds(const Job& job, SlotBounds bounds);

// `status` with the job and step in front of its message.
absl::Status InStep(const Job& job, int64_t step, const absl::Status& status);

// Step `step` planned: `batch` puts its samples into the plan and appends
// their lengths, in order; the job's scheduler then plans them. Errors
// name the job and step.
absl::StatusOr<StepPlan> PlanBatch(
    const Job& job, int64_t step, bool serving,
    absl::FunctionRef<absl::Status(StepPlan& out, std::vector<int64_t>& lengths)> batch);

// `read`, the failure of a sample's read, naming its file and, as `noun`
// ("document", "sample"), its number there.
absl::Status FailedRead(const Job& job, const scheduler::SampleRef& ref, absl::string_view noun,
                        const absl::Status& read);

// Megatron's samples (kind_pretraining.cc). The samples of `step` (its
// sampler's order, the batch in force when the step starts), checked to lie
// in the split.
absl::StatusOr<BatchSchedule::Step> SamplesOfStep(const Job& job, int64_t step);
// A sample's runs (its document pieces, as the sample index cuts them),
// each document's index entries checked before its bytes are read.
absl::StatusOr<std::vector<int64_t>> CheckedRuns(const Job& job,
                                                 const dataset::PretrainingIndices::Sample& sample);
// Appends the reads of a sample's runs, each the bytes of one sequence's
// tokens, as needs of the documents holding them.
void PretrainingNeeds(const Job& job, const scheduler::SampleRef& ref, StepNeeds& out);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_KINDS_H_
