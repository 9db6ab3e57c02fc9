#ifndef PACKFEED_SERVER_PIPELINE_JOB_KIND_H_
#define PACKFEED_SERVER_PIPELINE_JOB_KIND_H_

// What the kinds of job do differently in a step's phases. plan.cc, read.cc
// and pack.cc ask the job's kind instead of branching on it:
//
//   kind        samples of a step                    read as          served as
//   documents   the sampler's batch, planned         a document       THD, sample rules
//   pretraining Megatron's sampler, its own cells    a sample's runs  BSHD or document rows
//   hybrid CP   Megatron's samples cut at documents, a sample's runs  THD pieces, sample_ids
//               the pieces planned                   (once)
//   ingest      the sealed step, planned             from the stream  THD, sample rules
//
// Job::Create asks it too: what opens the job's samples, what checks they
// can be served, what bounds a slot. A new kind is one implementation
// (kind_*.cc) and one line in KindFor (job_kind.cc). The kinds hold no
// state: each is one static instance.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/pipeline/job.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/plan.h"
#include "server/pipeline/read.h"
#include "server/pipeline/slot_fields.h"

namespace packfeed::server {

class JobKind {
 public:
  virtual ~JobKind() = default;

  // For logs and tests: "documents", "pretraining", "hybrid_cp", "ingest".
  virtual absl::string_view name() const = 0;

  // plan.h's PlanStep for a job of this kind.
  virtual absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving) const = 0;

  // read.h's NeedsOfStep, one planned sample at a time, in ascending order:
  // appends what `sample` needs to `out` (nothing when an earlier sample's
  // reads serve it). REQUIRES: a kind read through the Storage (not ingest).
  virtual void AddNeeds(const Job& job, const StepPlan& plan, int64_t sample,
                        StepNeeds& out) const = 0;

  // read.h's AssembleStep, one sample at a time: the sample's token run (or
  // `read`, its read's failure) into `data`, as runs / failed of `sample`
  // and of any later sample its read serves. `tokens`: what its reads held,
  // widened, in order.
  virtual void AddRuns(const Job& job, const StepPlan& plan, int64_t sample,
                       const absl::Status& read, std::vector<int64_t> tokens,
                       StepData& data) const = 0;

  // pack.h's SourceForRank: the tokens of planned `sample` within its run
  // (the whole run but for a hybrid-CP piece).
  virtual absl::StatusOr<absl::Span<const int64_t>> TokensOf(const StepPlan& plan, int64_t sample,
                                                             absl::Span<const int64_t> run) const;

  // pack.h's SourceForRank: what a microbatch of this kind carries beyond
  // its THD fields (hybrid CP's sample ids, a pretraining job's BSHD rows or
  // document rows). Nothing by default.
  virtual absl::Status ShapeSource(const Job& job, const StepData& data, int microbatch,
                                   MicrobatchSource& source) const;

  // Job::Create: opens what the job's samples come from (its datasets and
  // sampler; Megatron's indices; the ingest stream's fields) through
  // `open`, appending the datasets' part of its fingerprint.
  virtual absl::Status Open(Job& job, const DatasetOpener& open,
                            std::string& datasets_part) const = 0;
  // Job::Create, the job opened: refuses it when one of its samples no
  // plan could hold. Nothing to refuse by default.
  virtual absl::Status CheckServable(const Job& job) const;
  // Job::Create: what bounds any microbatch of the job, for its largest
  // slot: max_tokens_per_rank local tokens, the batch's sequences, groups
  // of up to DP·CP ranks under dynamic CP.
  virtual SlotBounds BoundsOf(const Job& job) const;

  // The runner: whether a step's samples are in memory once the step
  // exists (an ingest stream's sealed step). Such a step is planned on the
  // runner thread, nothing is read for it, and its side-field rows come
  // with its samples. False by default.
  virtual bool SamplesInMemory() const { return false; }
  // JobRunner::Start: connects the runner to where the job's steps come
  // from; `wake` (callable from any thread) makes it look again at what it
  // waits for. Nothing by default; an ingest job joins its stream's
  // consumers, which wake it when a step is sealed.
  virtual void Connect(const Job& job, std::function<void()> wake) const {}
  // The runner: this node's ranks consumed every step before `before`.
  // Nothing by default; an ingest job tells its stream, which frees them.
  virtual void Consumed(const Job& job, int64_t before) const {}

 protected:
  // Job::Create's own steps (Job's, private), for the kinds' Open.
  static absl::Status OpenDatasets(Job& job, const DatasetOpener& open,
                                   std::string& datasets_part) {
    return job.OpenDatasets(open, datasets_part);
  }
  static absl::Status BuildPretrainingIndices(Job& job, const DatasetOpener& open,
                                              std::string& datasets_part) {
    return job.BuildPretrainingIndices(open, datasets_part);
  }
  static absl::Status FindIngestFields(Job& job, std::string& datasets_part) {
    return job.FindIngestFields(datasets_part);
  }
  static absl::Status CheckEverySampleFits(const Job& job) { return job.CheckEverySampleFits(); }
};

// The kind a job of `spec` is (`ingest`: it reads an ingest stream).
const JobKind& KindFor(const JobSpec& spec, bool ingest);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_KIND_H_
