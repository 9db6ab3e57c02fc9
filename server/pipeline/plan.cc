#include "server/pipeline/plan.h"

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cell_balance.h"
#include "server/config/job_config.h"
#include "server/pipeline/document_mask.h"

namespace packfeed::server {

namespace {

absl::Status InStep(const Job& job, int64_t step, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("job ", job.name(), " step ", step, ": ", status.message()));
}

// A sealed step's samples, served whole, in the step's order; epoch = step
// (what the ledger's per-epoch shares count).
void IngestBatch(const Job& job, const SealedStep& sealed, StepPlan& out,
                 std::vector<int64_t>& lengths) {
  for (size_t i = 0; i < sealed.samples.size(); ++i) {
    const auto tokens = static_cast<int64_t>(sealed.samples[i].num_tokens);
    const dataset::SampleShape shape = dataset::ShapeOfSample(tokens, job.rules());
    out.samples.push_back({0, static_cast<int64_t>(i), sealed.step});
    lengths.push_back(dataset::RealLength(shape.run_length, job.rules()));
  }
}

// The sampler's batch, each sample's index entry checked when a step first
// uses it.
absl::Status StoredBatch(const Job& job, StepPlan& out, std::vector<int64_t>& lengths) {
  out.samples = job.sampler().GlobalBatch(out.step);
  lengths.reserve(out.samples.size());
  for (const scheduler::SampleRef& sample : out.samples) {
    const dataset::IndexedDataset& data = job.dataset(sample.dataset);
    const dataset::SampleTable::Piece piece = job.PieceOf(sample);
    PF_RETURN_IF_ERROR(data.CheckDocument(static_cast<uint64_t>(piece.document)));
    const int64_t stored = dataset::DocumentTokens(data.index(), piece.document);
    const dataset::SampleShape shape =
        dataset::ShapeOfSample(stored, job.rules(), piece.first_token);
    // (A piece of a split document leaves the rest to the next pieces.)
    const int64_t dropped =
        job.rules().split_long_documents ? 0 : stored - piece.first_token - shape.read_tokens;
    if (dropped > 0) {
      ++out.samples_truncated;
      out.tokens_truncated += dropped;
    }
    lengths.push_back(dataset::RealLength(shape.run_length, job.rules()));
  }
  return absl::OkStatus();
}

// A Megatron sample's runs (its document pieces, as the sample index cuts
// them), each document's index entries checked before its bytes are read.
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

// The samples of `step` (Megatron's sampler order, the batch in force when
// the step starts) and a check that the split holds them.
absl::StatusOr<BatchSchedule::Step> SamplesOfStep(const Job& job, int64_t step) {
  const BatchSchedule::Step out = job.batch_schedule().At(step);
  const int64_t available = job.pretraining()->num_samples();
  if (out.first_sample + out.global_batch > available) {
    return absl::OutOfRangeError(
        absl::StrCat("the ", dataset::MegatronSplitName(ServedSplitOf(job.config())),
                     " split holds ", available, " samples; this step needs [", out.first_sample,
                     ", ", out.first_sample + out.global_batch, ")"));
  }
  return out;
}

// Megatron's hybrid-CP batch: HybridCPMegatronPretrainingSampler hands DP
// rank d its samples of the whole global batch (microbatch i's are
// i·mbs·DP + d·mbs on), and HybridCPDataLoaderWrapper numbers their
// non-empty cu_seqlens spans DP rank by DP rank, sample by sample: gid i
// is planned sequence i here. The dynamic-CP planner places them.
absl::Status HybridCpBatch(const Job& job, StepPlan& out, std::vector<int64_t>& lengths) {
  const v1::JobConfig& config = job.config();
  const v1::Pretraining& pretraining = config.pretraining();
  const int64_t mbs = pretraining.micro_batch_size();
  const int64_t seq = config.seq_length();
  const int dp = job.layout().dp;
  PF_ASSIGN_OR_RETURN(const BatchSchedule::Step batch, SamplesOfStep(job, out.step));
  const int64_t first = batch.first_sample;
  const int64_t microbatches = batch.global_batch / (mbs * dp);
  for (int d = 0; d < dp; ++d) {
    for (int64_t i = 0; i < microbatches; ++i) {
      for (int64_t b = 0; b < mbs; ++b) {
        const int64_t k = first + (i * dp + d) * mbs + b;
        const dataset::PretrainingIndices::Sample sample = job.pretraining()->Locate(k);
        PF_ASSIGN_OR_RETURN(const std::vector<int64_t> runs, CheckedRuns(job, sample));
        const SampleBounds bounds = PieceBounds(runs, seq, !pretraining.no_extra_token());
        if (bounds.back() != seq) {
          return absl::InternalError(absl::StrCat("sample ", k, "'s document pieces end at ",
                                                  bounds.back(), ", not at seq_length ", seq));
        }
        for (size_t p = 1; p < bounds.size(); ++p) {
          if (bounds[p] == bounds[p - 1]) continue;  // Megatron drops empty spans too
          out.samples.push_back({sample.dataset, k, 0});
          out.pieces.push_back({bounds[p - 1], bounds[p]});
          lengths.push_back(bounds[p] - bounds[p - 1]);
        }
      }
    }
  }
  return absl::OkStatus();
}

// Megatron's pretraining batch (MegatronPretrainingSampler, dataloader
// type "single"): step s takes a global batch of the split's samples from
// where the batch schedule puts it; microbatch m of DP rank d holds the
// micro_batch_size samples from m·mbs·DP + d·mbs, and its CP group slices
// each of them.
absl::Status PretrainingBatch(const Job& job, StepPlan& out) {
  const v1::JobConfig& config = job.config();
  const int64_t mbs = config.pretraining().micro_batch_size();
  const int64_t seq = config.seq_length();
  const JobLayout& layout = job.layout();
  PF_ASSIGN_OR_RETURN(const BatchSchedule::Step batch, SamplesOfStep(job, out.step));
  const int64_t first = batch.first_sample;
  const int64_t global_batch = batch.global_batch;
  const bool balance = config.pretraining().balance_document_attention();
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

absl::Status Schedule(const Job& job, const std::vector<int64_t>& lengths, bool serving,
                      StepPlan& out) {
  absl::StatusOr<scheduler::GlobalPlan> plan = scheduler::PlanGlobalBatch(
      lengths, job.PlannerOptionsFor(out.step, serving, &out.cost_model_version));
  if (!plan.ok()) return InStep(job, out.step, plan.status());
  out.plan = *std::move(plan);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving) {
  if (job.ingest() != nullptr) {
    absl::StatusOr<std::shared_ptr<const SealedStep>> sealed = job.ingest()->Sealed(step);
    if (!sealed.ok()) return InStep(job, step, sealed.status());
    return PlanSealedStep(job, *std::move(sealed), serving);
  }
  StepPlan out;
  out.step = step;
  std::vector<int64_t> lengths;
  if (job.hybrid_context_parallel()) {
    if (absl::Status batch = HybridCpBatch(job, out, lengths); !batch.ok()) {
      return InStep(job, step, batch);
    }
    PF_RETURN_IF_ERROR(Schedule(job, lengths, serving, out));
    out.hybrid_groups = scheduler::HybridGroupsOf(out.plan);
    return out;
  }
  if (job.pretraining() != nullptr) {
    if (absl::Status batch = PretrainingBatch(job, out); !batch.ok()) {
      return InStep(job, step, batch);
    }
    return out;
  }
  if (absl::Status stored = StoredBatch(job, out, lengths); !stored.ok()) {
    return InStep(job, step, stored);
  }
  PF_RETURN_IF_ERROR(Schedule(job, lengths, serving, out));
  return out;
}

absl::StatusOr<StepPlan> PlanSealedStep(const Job& job, std::shared_ptr<const SealedStep> sealed,
                                        bool serving) {
  StepPlan out;
  out.step = sealed->step;
  out.ingested = std::move(sealed);
  std::vector<int64_t> lengths;
  IngestBatch(job, *out.ingested, out, lengths);
  PF_RETURN_IF_ERROR(Schedule(job, lengths, serving, out));
  return out;
}

std::vector<scheduler::SampleRef> MicrobatchSamples(const StepPlan& plan, int microbatch,
                                                    int dp_cp_rank) {
  std::vector<scheduler::SampleRef> samples;
  const scheduler::CpGroup& group =
      scheduler::GroupOfRank(plan.plan.microbatches[static_cast<size_t>(microbatch)], dp_cp_rank);
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    samples.push_back(plan.samples[static_cast<size_t>(sequence.sample)]);
  }
  return samples;
}

}  // namespace packfeed::server
