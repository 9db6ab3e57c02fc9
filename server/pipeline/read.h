#ifndef PACKFEED_SERVER_PIPELINE_READ_H_
#define PACKFEED_SERVER_PIPELINE_READ_H_

// Phase 2 of a step: which stored samples the node's ranks need for a
// planned step (each once, whatever number of ranks share it), fetched
// through the node's Storage, and their token runs once fetched (sample
// rules: EOD, truncation).

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/pipeline/job.h"
#include "server/pipeline/plan.h"
#include "server/storage/storage.h"

namespace packfeed::server {

// The planned samples of the CP groups the given ranks belong to.
std::set<int64_t> SamplesOfRanks(const Job& job, const StepPlan& plan,
                                 absl::Span<const int> global_ranks);

// What the given ranks need of a planned step's tokens, per planned sample.
// (A dataset job's side fields are fetched per microbatch: SideNeedsOf.)
struct StepNeeds {
  std::vector<int64_t> samples;
  // Per sample, in order: its token runs (one, or a pretraining sample's
  // runs across sequences).
  std::vector<SampleNeed> needs;
  std::vector<int> counts;  // needs per sample
};
StepNeeds NeedsOfStep(const Job& job, const StepPlan& plan, absl::Span<const int> global_ranks);

// Some planned samples' rows of the job's side fields, by sample: one per
// side field, in configuration order; or why a sample's could not be read.
struct SideRows {
  std::map<int64_t, std::vector<FetchedSample>> rows;
  std::map<int64_t, absl::Status> failed;
};

// What `samples` of a dataset job's planned step need of its side fields:
// per sample, one need per side field, for the same tokens NeedsOfStep
// reads. Not kept by the storage once released (SampleNeed::keep).
std::vector<SampleNeed> SideNeedsOf(const Job& job, const StepPlan& plan,
                                    absl::Span<const int64_t> samples);
// `fetched`: one per need of SideNeedsOf(job, plan, samples).
SideRows AssembleSideRows(const Job& job, const StepPlan& plan, absl::Span<const int64_t> samples,
                          absl::Span<const FetchedSample> fetched);

// The token runs of the samples some ranks need for one step.
// A sample's token run: its own tokens (read from a file, an EOD appended)
// or a view of an ingested sample's, which the step's plan keeps alive.
// Move-only: the view points into the owned tokens when there are any.
class TokenRun {
 public:
  explicit TokenRun(std::vector<int64_t> owned) : owned_(std::move(owned)), tokens_(owned_) {}
  explicit TokenRun(absl::Span<const int64_t> view) : tokens_(view) {}
  TokenRun(TokenRun&&) = default;  // a vector moved keeps its buffer
  TokenRun& operator=(TokenRun&&) = delete;

  absl::Span<const int64_t> tokens() const { return tokens_; }
  // The bytes this run holds itself (not those of a view).
  uint64_t owned_bytes() const { return owned_.size() * sizeof(int64_t); }

 private:
  std::vector<int64_t> owned_;
  absl::Span<const int64_t> tokens_;
};

struct StepData {
  StepPlan plan;
  std::map<int64_t, TokenRun> runs;  // by planned sample
  // An ingest job's side rows (in the stream's memory); a dataset job's
  // are fetched per microbatch, apart from the step.
  SideRows side;
  // Samples that could not be read (I/O error, a file truncated under the
  // daemon, a float token that is no integer), with why.
  std::map<int64_t, absl::Status> failed;
};

// `fetched`: one per need of NeedsOfStep, whose `samples` and `counts`
// are given.
StepData AssembleStep(const Job& job, StepPlan plan, absl::Span<const int64_t> samples,
                      absl::Span<const int> counts, absl::Span<const FetchedSample> fetched);

// An ingest job's step (plan.ingested): what the given ranks need of its
// samples, straight from the stream (the side fields' bytes shared, not
// copied).
StepData AssembleIngestStep(const Job& job, StepPlan plan, absl::Span<const int> global_ranks);

// An ingest job as its stream's consumer: its batch and rules, and the
// samples of a sealed step this node's ranks are planned (what a peer
// daemon fetches of a forwarded step). REQUIRES: `job` outlives the result.
IngestConsumer IngestConsumerOf(const Job& job);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_READ_H_
