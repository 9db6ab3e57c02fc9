#include "server/pipeline/read.h"

#include <algorithm>
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

namespace {

// A pretraining sample's runs, each the bytes of one sequence's tokens, as
// needs of the documents holding them (the pass over the split tells
// copies of a sequence in different epochs apart).
void PretrainingNeeds(const Job& job, const scheduler::SampleRef& ref, StepNeeds& out) {
  const dataset::IndexedDataset& data = job.dataset(ref.dataset);
  const dataset::IndexView& index = data.index();
  const uint64_t token_bytes = DTypeSize(data.dtype());
  const dataset::PretrainingIndices::Sample sample = job.pretraining()->Locate(ref.index);
  for (const dataset::SampleRun& run : sample.runs) {
    const int64_t document = dataset::DocumentOfSequence(index, run.sequence);
    const auto first_sequence = static_cast<uint64_t>(index.document_index(document));
    const auto into_document = static_cast<uint64_t>(
        index.pointer(static_cast<uint64_t>(run.sequence)) - index.pointer(first_sequence));
    out.needs.push_back({&data, document, run.pass,
                         into_document + static_cast<uint64_t>(run.offset) * token_bytes,
                         static_cast<uint64_t>(run.length) * token_bytes});
  }
  out.counts.push_back(static_cast<int>(sample.runs.size()));
}

}  // namespace

StepNeeds NeedsOfStep(const Job& job, const StepPlan& plan, absl::Span<const int> global_ranks) {
  StepNeeds out;
  int64_t last_read = -1;  // hybrid CP: the Megatron sample read last
  for (int64_t sample : SamplesOfRanks(job, plan, global_ranks)) {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(sample)];
    if (job.pretraining() != nullptr) {
      // A sample's pieces are neighbours and share one read of it.
      if (job.hybrid_context_parallel() && ref.index == last_read) continue;
      last_read = ref.index;
      out.samples.push_back(sample);
      PretrainingNeeds(job, ref, out);
      continue;
    }
    const dataset::IndexedDataset& data = job.dataset(ref.dataset);
    const dataset::SampleShape shape = job.ShapeOf(ref);
    const int64_t document = job.PieceOf(ref).document;
    const auto first = static_cast<uint64_t>(shape.first_token);
    const auto read = static_cast<uint64_t>(shape.read_tokens);
    const uint64_t token_bytes = DTypeSize(data.dtype());
    out.samples.push_back(sample);
    out.needs.push_back({&data, document, ref.epoch, first * token_bytes, read * token_bytes});
    out.counts.push_back(1);
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
    // Under hybrid CP every piece of the sample gets the whole sample's
    // run (one copy; SourceForRank cuts the piece).
    int64_t last_piece = samples[i];
    while (job.hybrid_context_parallel() &&
           last_piece + 1 < static_cast<int64_t>(plan.samples.size()) &&
           plan.samples[static_cast<size_t>(last_piece + 1)].index == ref.index) {
      ++last_piece;
    }
    if (!status.ok()) {
      const absl::Status failed(
          status.code(),
          absl::StrCat(stored.prefix(), " ", job.pretraining() ? "sample " : "document ",
                       job.PieceOf(ref).document, ": ", status.message()));
      for (int64_t piece = samples[i]; piece <= last_piece; ++piece) {
        data.failed.emplace(piece, failed);
      }
      continue;
    }
    if (job.pretraining() != nullptr) {
      const TokenRun& whole =
          data.runs.emplace(samples[i], TokenRun(std::move(tokens))).first->second;
      for (int64_t piece = samples[i] + 1; piece <= last_piece; ++piece) {
        data.runs.emplace(piece, TokenRun(whole.tokens()));
      }
      continue;
    }
    data.runs.emplace(samples[i],
                      TokenRun(dataset::MakeTokenRun(tokens, job.ShapeOf(ref), job.rules())));
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
  return {job.name(), job.config().global_batch(), job.rules(), job.planner_options(),
          std::move(local_samples)};
}

}  // namespace packfeed::server
