#include "server/pipeline/read.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"

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
  for (int64_t sample : SamplesOfRanks(job, plan, global_ranks)) {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(sample)];
    const dataset::IndexedDataset& data = job.dataset(ref.dataset);
    const dataset::SampleShape shape = job.ShapeOf(ref);
    const int64_t document = job.PieceOf(ref).document;
    const auto first = static_cast<uint64_t>(shape.first_token);
    const auto read = static_cast<uint64_t>(shape.read_tokens);
    const uint64_t token_bytes = DTypeSize(data.dtype());
    out.samples.push_back(sample);
    out.needs.push_back({&data, document, ref.epoch, first * token_bytes, read * token_bytes});
    for (size_t f = 0; f < job.side_fields().size(); ++f) {
      const uint64_t row_bytes = job.side_fields()[f].row_bytes();
      out.needs.push_back({&job.side_dataset(ref.dataset, static_cast<int>(f)), document, ref.epoch,
                           first * row_bytes, read * row_bytes});
    }
  }
  return out;
}

StepData AssembleStep(const Job& job, StepPlan plan, absl::Span<const int64_t> samples,
                      absl::Span<const FetchedSample> fetched) {
  StepData data;
  const size_t per_sample = 1 + job.side_fields().size();
  for (size_t i = 0; i < samples.size(); ++i) {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(samples[i])];
    const dataset::IndexedDataset& stored = job.dataset(ref.dataset);
    const FetchedSample& sample = fetched[i * per_sample];
    absl::Status status = sample.status;
    for (size_t f = 1; f < per_sample && status.ok(); ++f) {
      if (!fetched[i * per_sample + f].status.ok()) {
        const absl::Status& side = fetched[i * per_sample + f].status;
        status = absl::Status(
            side.code(),
            absl::StrCat("side field ", job.side_fields()[f - 1].name, ": ", side.message()));
      }
    }
    std::vector<int64_t> tokens(sample.size / dataset::DTypeSize(stored.dtype()));
    if (status.ok()) {
      status = dataset::WidenToInt64(stored.dtype(), sample.bytes().data(), tokens.size(),
                                     tokens.data());
    }
    if (!status.ok()) {
      data.failed.emplace(samples[i],
                          absl::Status(status.code(), absl::StrCat(stored.prefix(), " document ",
                                                                   job.PieceOf(ref).document, ": ",
                                                                   status.message())));
      continue;
    }
    const dataset::SampleShape shape = job.ShapeOf(ref);
    data.runs.emplace(samples[i], dataset::MakeTokenRun(tokens, shape, job.rules()));
    if (per_sample > 1) {
      data.side.emplace(samples[i],
                        std::vector<FetchedSample>(fetched.begin() + i * per_sample + 1,
                                                   fetched.begin() + (i + 1) * per_sample));
    }
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
    data.runs.emplace(s, dataset::MakeTokenRun(sample.tokens(), shape, job.rules()));
    if (job.side_fields().empty()) continue;
    std::vector<FetchedSample>& side = data.side[s];
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
  return {job.name(), job.config().global_batch(), job.rules(), job.planner_options(),
          std::move(local_samples)};
}

}  // namespace packfeed::server
