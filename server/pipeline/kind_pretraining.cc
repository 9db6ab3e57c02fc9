// A pretraining job: Megatron's samples of its split (GPTDataset over a
// blend), as its MegatronPretrainingSampler hands them out, in cells of
// micro_batch_size per DP rank (balanced by document-masked cost when
// asked); each sample read as its runs and served whole, as BSHD rows or,
// with document-masked attention, as one THD row of documents.

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cell_balance.h"
#include "server/pipeline/document_mask.h"
#include "server/pipeline/job_kinds.h"

namespace packfeed::server {

absl::StatusOr<std::vector<int64_t>> CheckedRuns(
    const Job& job, const dataset::PretrainingIndices::Sample& sample) {
  const dataset::IndexedDataset& data = job.dataset(sample.dataset);
  const dataset::IndexView& index = data.index();
  std::vector<int64_t> runs;
  for (const dataset::SampleRun& run : sample.runs) {
    const int64_t document = dataset::DocumentOfSequence(index, run.sequence);
    PF_RETURN_IF_ERROR(data.CheckDocument(static_cast<uint64_t>(document)));
    if (run.sequence < index.document_index(static_cast<uint64_t>(document)) ||
        run.sequence >= index.document_index(static_cast<uint64_t>(document) + 1)) {
      return absl::DataLossError(absl::StrCat(data.prefix(), ".idx: sequence ", run.sequence,
                                              " lies in no document (the document index is "
                                              "not ascending)"));
    }
    runs.push_back(run.length);
  }
  return runs;
}

absl::StatusOr<BatchSchedule::Step> SamplesOfStep(const Job& job, int64_t step) {
  const BatchSchedule::Step out = job.batch_schedule().At(step);
  const int64_t available = job.pretraining()->num_samples();
  if (out.first_sample + out.global_batch > available) {
    return absl::OutOfRangeError(
        absl::StrCat("the ", dataset::MegatronSplitName(job.spec().pretraining->split),
                     " split holds ", available, " samples; this step needs [", out.first_sample,
                     ", ", out.first_sample + out.global_batch, ")"));
  }
  return out;
}

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

namespace {

// Megatron's pretraining batch (MegatronPretrainingSampler, dataloader
// type "single"): step s takes a global batch of the split's samples from
// where the batch schedule puts it; microbatch m of DP rank d holds the
// micro_batch_size samples from m·mbs·DP + d·mbs, and its CP group slices
// each of them.
absl::Status PretrainingBatch(const Job& job, StepPlan& out) {
  const PretrainingSpec& pretraining = *job.spec().pretraining;
  const int64_t mbs = pretraining.micro_batch_size;
  const int64_t seq = job.spec().seq_length;
  const JobLayout& layout = job.layout();
  PF_ASSIGN_OR_RETURN(const BatchSchedule::Step batch, SamplesOfStep(job, out.step));
  const int64_t first = batch.first_sample;
  const int64_t global_batch = batch.global_batch;
  const bool balance = pretraining.balance_document_attention;
  std::vector<double> costs;  // with balance: each sample's document-masked cost
  for (int64_t k = 0; k < global_batch; ++k) {
    const dataset::PretrainingIndices::Sample sample = job.pretraining()->Locate(first + k);
    PF_ASSIGN_OR_RETURN(const std::vector<int64_t> pieces, CheckedRuns(job, sample));
    out.samples.push_back({sample.dataset, first + k, 0});
    if (balance) {
      costs.push_back(scheduler::DocumentMaskedCost(pieces, job.planner_options().cost_model));
    }
  }
  out.plan.dp_cp_size = layout.dp_cp_size();
  const int64_t microbatches = global_batch / (mbs * layout.dp);
  if (balance) {
    // The same samples in other cells (documents end with their sequences,
    // so a sample's runs are its document pieces).
    const std::vector<int64_t> order = scheduler::BalanceCells(
        costs, static_cast<int>(microbatches * layout.dp), static_cast<int>(mbs));
    std::vector<scheduler::SampleRef> placed;
    for (int64_t k : order) placed.push_back(out.samples[static_cast<size_t>(k)]);
    out.samples = std::move(placed);
  }
  for (int64_t m = 0; m < microbatches; ++m) {
    scheduler::PlannedMicrobatch& microbatch = out.plan.microbatches.emplace_back();
    for (int d = 0; d < layout.dp; ++d) {
      scheduler::CpGroup& group = microbatch.groups.emplace_back();
      group.first_rank = d * layout.cp;
      group.size = layout.cp;
      for (int64_t b = 0; b < mbs; ++b) {
        group.sequences.push_back({(m * layout.dp + d) * mbs + b, seq, seq});
      }
    }
  }
  out.plan.flops = scheduler::ComputeFlopsInputs(out.plan);
  return absl::OkStatus();
}

// A pretraining microbatch with document-masked attention: its samples as
// one THD row with cu_seqlens at their documents, and the positions of the
// row this rank holds (document_mask.h).
absl::Status ServeDocumentRow(const Job& job, const StepData& data, MicrobatchSource& source) {
  const PretrainingSpec& pretraining = *job.spec().pretraining;
  const int64_t seq_length = job.spec().seq_length;
  std::vector<SampleBounds> samples;
  for (size_t i = 0; i < source.runs.size(); ++i) {
    if (!pretraining.inter_document_masking) {
      samples.push_back(EodBounds(source.runs[i], seq_length, source.rules));
      continue;
    }
    const scheduler::SampleRef& ref =
        data.plan.samples[static_cast<size_t>(source.group->sequences[i].sample)];
    std::vector<int64_t> pieces;
    for (const dataset::SampleRun& run : job.pretraining()->Locate(ref.index).runs) {
      pieces.push_back(run.length);
    }
    samples.push_back(PieceBounds(pieces, seq_length, !pretraining.no_extra_token));
    if (samples.back().back() != seq_length) {
      // The index's runs cover more than the sample: never serve that.
      return absl::InternalError(absl::StrCat("sample ", ref.index, "'s document pieces end at ",
                                              samples.back().back(), ", not at seq_length ",
                                              seq_length));
    }
  }
  const DocumentRow row = RowOf(samples, seq_length);
  const CpSplit split =
      pretraining.cp_split_per_document ? CpSplit::kPerDocument : CpSplit::kPerSequence;
  PF_ASSIGN_OR_RETURN(source.slices,
                      CpRangesOfRow(row, seq_length, source.group->size, source.cp_rank, split));
  source.tokens = 0;
  for (const RankRanges& ranges : source.slices) {
    for (const scheduler::TokenRange& range : ranges) source.tokens += range.end - range.begin;
  }
  source.cu_seqlens = row.cu_seqlens;
  source.cu_seqlens_padded = row.cu_seqlens;
  source.max_seqlen = row.max_seqlen;
  if (pretraining.inter_document_masking) source.document_bounds = std::move(samples);
  return absl::OkStatus();
}

class Pretraining final : public JobKind {
 public:
  absl::string_view name() const override { return "pretraining"; }

  absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool) const override {
    StepPlan out;
    out.step = step;
    if (absl::Status batch = PretrainingBatch(job, out); !batch.ok()) {
      return InStep(job, step, batch);
    }
    return out;
  }

  void AddNeeds(const Job& job, const StepPlan& plan, int64_t sample,
                StepNeeds& out) const override {
    out.samples.push_back(sample);
    PretrainingNeeds(job, plan.samples[static_cast<size_t>(sample)], out);
  }

  void AddRuns(const Job& job, const StepPlan& plan, int64_t sample, const absl::Status& read,
               std::vector<int64_t> tokens, StepData& data) const override {
    if (!read.ok()) {
      data.failed.emplace(
          sample, FailedRead(job, plan.samples[static_cast<size_t>(sample)], "sample", read));
      return;
    }
    data.runs.emplace(sample, TokenRun(std::move(tokens)));
  }

  absl::Status ShapeSource(const Job& job, const StepData& data, int,
                           MicrobatchSource& source) const override {
    const PretrainingSpec& pretraining = *job.spec().pretraining;
    if (pretraining.reset_attention_mask || pretraining.inter_document_masking) {
      return ServeDocumentRow(job, data, source);
    }
    source.bshd_rows = static_cast<int64_t>(source.group->sequences.size());
    return absl::OkStatus();
  }

  absl::Status Open(Job& job, const DatasetOpener& open,
                    std::string& datasets_part) const override {
    return BuildPretrainingIndices(job, open, datasets_part);
  }

  SlotBounds BoundsOf(const Job& job) const override {
    return PretrainingBounds(job, JobKind::BoundsOf(job));
  }
};

}  // namespace

const JobKind& PretrainingKind() {
  static const Pretraining kind;
  return kind;
}

}  // namespace packfeed::server
