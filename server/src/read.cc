#include "server/internal/read.h"

#include <set>

#include "packfeed/common/status_macros.h"

namespace packfeed::server {
namespace {

// The token run of one sample; adds the bytes it needed to `bytes`.
absl::StatusOr<std::vector<int64_t>> ReadRun(const Job& job, const scheduler::SampleRef& sample,
                                             uint64_t& bytes) {
  const dataset::IndexedDataset& data = job.dataset(sample.dataset);
  const dataset::IndexView& index = data.index();
  const int64_t first = index.document_index(sample.index);
  const int64_t last = index.document_index(sample.index + 1);
  const int64_t stored = dataset::DocumentTokens(index, sample.index);
  const dataset::SampleShape shape = dataset::ShapeOfSample(stored, job.rules());
  std::vector<int64_t> read(static_cast<size_t>(shape.read_tokens));
  if (shape.read_tokens == stored) {
    PF_RETURN_IF_ERROR(data.ReadSequences(first, last - first, absl::MakeSpan(read)));
  } else {
    // Truncated: only the kept prefix is read.
    int64_t filled = 0;
    for (int64_t i = first; i < last && filled < shape.read_tokens; ++i) {
      const int64_t take = std::min<int64_t>(index.length(i), shape.read_tokens - filled);
      PF_RETURN_IF_ERROR(data.Read(i, absl::MakeSpan(read).subspan(filled, take)));
      filled += take;
    }
  }
  bytes += shape.read_tokens * dataset::DTypeSize(data.dtype());
  return dataset::MakeTokenRun(read, shape, job.rules());
}

}  // namespace

absl::StatusOr<StepData> ReadStep(const Job& job, StepPlan plan,
                                  absl::Span<const int> global_ranks) {
  std::set<int> dp_cp_ranks;
  for (int rank : global_ranks) dp_cp_ranks.insert(job.layout().Coords(rank).dp_cp_rank);
  StepData data;
  std::vector<uint64_t> before;
  for (int i = 0; i < job.num_datasets(); ++i) before.push_back(job.dataset(i).bytes_read());
  for (const scheduler::PlannedMicrobatch& microbatch : plan.plan.microbatches) {
    for (const scheduler::CpGroup& group : microbatch.groups) {
      auto hosted = dp_cp_ranks.lower_bound(group.first_rank);
      if (hosted == dp_cp_ranks.end() || *hosted >= group.first_rank + group.size) continue;
      for (const scheduler::PlannedSequence& sequence : group.sequences) {
        if (data.runs.count(sequence.sample) != 0) continue;
        PF_ASSIGN_OR_RETURN(
            std::vector<int64_t> run,
            ReadRun(job, plan.samples[static_cast<size_t>(sequence.sample)], data.unique_bytes));
        data.runs.emplace(sequence.sample, std::move(run));
      }
    }
  }
  for (int i = 0; i < job.num_datasets(); ++i) {
    data.bytes_read += job.dataset(i).bytes_read() - before[static_cast<size_t>(i)];
  }
  data.plan = std::move(plan);
  return data;
}

}  // namespace packfeed::server
