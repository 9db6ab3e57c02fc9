#include "server/pipeline/read.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "server/pipeline/job_kind.h"

namespace packfeed::server {

std::set<int64_t> SamplesOfRanks(const Job& job, const StepPlan& plan,
                                 absl::Span<const int> global_ranks) {
  std::set<int> dp_cp_ranks;
  for (int rank : global_ranks) dp_cp_ranks.insert(job.layout().Coords(rank).dp_cp_rank);
  std::set<int64_t> samples;
  for (const scheduler::PlannedMicrobatch& microbatch : plan.plan.microbatches) {
    for (const scheduler::CpGroup& group : microbatch.groups) {
      auto hosted = dp_cp_ranks.lower_bound(group.first_rank);
      if (hosted == dp_cp_ranks.end() || *hosted >= group.first_rank + group.size) continue;
      for (const scheduler::PlannedSequence& sequence : group.sequences) {
        samples.insert(sequence.sample);
      }
    }
  }
  return samples;
}

StepNeeds NeedsOfStep(const Job& job, const StepPlan& plan, absl::Span<const int> global_ranks) {
  StepNeeds out;
  const JobKind& kind = job.kind();
  for (int64_t sample : SamplesOfRanks(job, plan, global_ranks)) {
    kind.AddNeeds(job, plan, sample, out);
  }
  return out;
}

std::vector<SampleNeed> SideNeedsOf(const Job& job, const StepPlan& plan,
                                    absl::Span<const int64_t> samples) {
  std::vector<SampleNeed> needs;
  for (int64_t sample : samples) {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(sample)];
    const dataset::SampleShape shape = job.ShapeOf(ref);
    const int64_t document = job.PieceOf(ref).document;
    const auto first = static_cast<uint64_t>(shape.first_token);
    const auto read = static_cast<uint64_t>(shape.read_tokens);
    for (size_t f = 0; f < job.side_fields().size(); ++f) {
      const uint64_t row_bytes = job.side_fields()[f].row_bytes();
      needs.push_back({&job.side_dataset(ref.dataset, static_cast<int>(f)), document, ref.epoch,
                       first * row_bytes, read * row_bytes, /*tokens=*/false, /*keep=*/false});
    }
  }
  return needs;
}

SideRows AssembleSideRows(const Job& job, const StepPlan& plan, absl::Span<const int64_t> samples,
                          absl::Span<const FetchedSample> fetched) {
  SideRows out;
  const size_t fields = job.side_fields().size();
  for (size_t i = 0; i < samples.size(); ++i) {
    absl::Span<const FetchedSample> rows = fetched.subspan(i * fields, fields);
    auto failed = std::find_if(rows.begin(), rows.end(),
                               [](const FetchedSample& row) { return !row.status.ok(); });
    if (failed == rows.end()) {
      out.rows.emplace(samples[i], std::vector<FetchedSample>(rows.begin(), rows.end()));
      continue;
    }
    const auto f = static_cast<int>(failed - rows.begin());
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(samples[i])];
    out.failed.emplace(
        samples[i],
        absl::Status(failed->status.code(),
                     absl::StrCat("side field ", job.side_fields()[static_cast<size_t>(f)].name,
                                  ": ", job.side_dataset(ref.dataset, f).prefix(), " document ",
                                  job.PieceOf(ref).document, ": ", failed->status.message())));
  }
  return out;
}

StepData AssembleStep(const Job& job, StepPlan plan, absl::Span<const int64_t> samples,
                      absl::Span<const int> counts, absl::Span<const FetchedSample> fetched) {
  StepData data;
  const JobKind& kind = job.kind();
  size_t at = 0;  // the sample's first need in `fetched`
  for (size_t i = 0; i < samples.size(); at += static_cast<size_t>(counts[i]), ++i) {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(samples[i])];
    const dataset::IndexedDataset& stored = job.dataset(ref.dataset);
    absl::Status status;
    for (int n = 0; n < counts[i] && status.ok(); ++n) status = fetched[at + n].status;
    std::vector<int64_t> tokens;
    for (int n = 0; n < counts[i] && status.ok(); ++n) {
      const FetchedSample& run = fetched[at + n];
      const size_t count = run.size / dataset::DTypeSize(stored.dtype());
      tokens.resize(tokens.size() + count);
      status = dataset::WidenToInt64(stored.dtype(), run.bytes().data(), count,
                                     tokens.data() + tokens.size() - count);
    }
    kind.AddRuns(job, plan, samples[i], status, std::move(tokens), data);
  }
  data.plan = std::move(plan);
  return data;
}

StepData AssembleIngestStep(const Job& job, StepPlan plan, absl::Span<const int> global_ranks) {
  StepData data;
  for (int64_t s : SamplesOfRanks(job, plan, global_ranks)) {
    const IngestedSample& sample = plan.ingested->samples[static_cast<size_t>(s)];
    if (sample.data == nullptr) {  // cannot be: a peer fetches what its ranks are planned
      data.failed.emplace(
          s, absl::InternalError(absl::StrCat(
                 "ingested sample ", s, " of step ", plan.step,
                 " was not fetched to this node, yet one of its ranks is planned it")));
      continue;
    }
    const dataset::SampleShape shape = dataset::ShapeOfSample(sample.num_tokens, job.rules());
    // Served from the stream's memory unless an EOD is to be appended: a
    // copy of every token of the step was most of the time from the seal
    // to the first microbatch.
    data.runs.emplace(s,
                      shape.run_length == sample.num_tokens
                          ? TokenRun(sample.tokens())
                          : TokenRun(dataset::MakeTokenRun(sample.tokens(), shape, job.rules())));
    if (job.side_fields().empty()) continue;
    std::vector<FetchedSample>& side = data.side.rows[s];
    for (size_t f = 0; f < job.side_fields().size(); ++f) {
      const auto in_stream = static_cast<size_t>(job.ingest_field(static_cast<int>(f)));
      side.push_back({sample.data, sample.field_offsets[in_stream],
                      sample.num_tokens * job.side_fields()[f].row_bytes(), absl::OkStatus()});
    }
  }
  data.plan = std::move(plan);
  return data;
}

IngestConsumer IngestConsumerOf(const Job& job) {
  auto local_samples =
      [&job](std::shared_ptr<const SealedStep> step) -> absl::StatusOr<std::vector<int64_t>> {
    PF_ASSIGN_OR_RETURN(StepPlan plan, PlanSealedStep(job, std::move(step)));
    const std::set<int64_t> samples = SamplesOfRanks(job, plan, job.local_ranks());
    return std::vector<int64_t>(samples.begin(), samples.end());
  };
  return {job.name(), job.spec().global_batch, job.rules(), job.planner_options(),
          std::move(local_samples)};
}

}  // namespace packfeed::server
