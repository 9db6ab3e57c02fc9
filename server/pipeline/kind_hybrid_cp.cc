// A pretraining job under Megatron's hybrid CP: Megatron's samples as its
// HybridCPMegatronPretrainingSampler hands them out, each cut at its
// documents into sub-samples (pieces) that the dynamic-CP planner places;
// each sample read once for all its pieces, and each piece served as one
// THD sequence with its gid as sample_id and the Megatron group its
// microbatch runs in.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "server/pipeline/document_mask.h"
#include "server/pipeline/job_kinds.h"

namespace packfeed::server {
namespace {

// Megatron's hybrid-CP batch: HybridCPMegatronPretrainingSampler hands DP
// rank d its samples of the whole global batch (microbatch i's are
// i·mbs·DP + d·mbs on), and HybridCPDataLoaderWrapper numbers their
// non-empty cu_seqlens spans DP rank by DP rank, sample by sample: gid i
// is planned sequence i here. The dynamic-CP planner places them.
absl::Status HybridCpBatch(const Job& job, StepPlan& out, std::vector<int64_t>& lengths) {
  const PretrainingSpec& pretraining = *job.spec().pretraining;
  const int64_t mbs = pretraining.micro_batch_size;
  const int64_t seq = job.spec().seq_length;
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
        const SampleBounds bounds = PieceBounds(runs, seq, !pretraining.no_extra_token);
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

// The last planned sample that is a piece of the same Megatron sample as
// `sample` (a sample's pieces are neighbours).
int64_t LastPieceOf(const StepPlan& plan, int64_t sample) {
  const int64_t index = plan.samples[static_cast<size_t>(sample)].index;
  int64_t last = sample;
  while (last + 1 < static_cast<int64_t>(plan.samples.size()) &&
         plan.samples[static_cast<size_t>(last + 1)].index == index) {
    ++last;
  }
  return last;
}

class HybridCp final : public JobKind {
 public:
  absl::string_view name() const override { return "hybrid_cp"; }

  absl::StatusOr<StepPlan> PlanStep(const Job& job, int64_t step, bool serving) const override {
    auto batch = [&](StepPlan& plan, std::vector<int64_t>& lengths) {
      return HybridCpBatch(job, plan, lengths);
    };
    PF_ASSIGN_OR_RETURN(StepPlan out, PlanBatch(job, step, serving, batch));
    out.hybrid_groups = scheduler::HybridGroupsOf(out.plan);
    return out;
  }

  void AddNeeds(const Job& job, const StepPlan& plan, int64_t sample,
                StepNeeds& out) const override {
    const scheduler::SampleRef& ref = plan.samples[static_cast<size_t>(sample)];
    // A sample's pieces are neighbours and share one read of it.
    if (!out.samples.empty() &&
        plan.samples[static_cast<size_t>(out.samples.back())].index == ref.index) {
      return;
    }
    out.samples.push_back(sample);
    PretrainingNeeds(job, ref, out);
  }

  void AddRuns(const Job& job, const StepPlan& plan, int64_t sample, const absl::Status& read,
               std::vector<int64_t> tokens, StepData& data) const override {
    // Every piece of the sample gets the whole sample's run (one copy;
    // TokensOf cuts the piece).
    const int64_t last_piece = LastPieceOf(plan, sample);
    if (!read.ok()) {
      const absl::Status failed =
          FailedRead(job, plan.samples[static_cast<size_t>(sample)], "sample", read);
      for (int64_t piece = sample; piece <= last_piece; ++piece) data.failed.emplace(piece, failed);
      return;
    }
    const TokenRun& whole = data.runs.emplace(sample, TokenRun(std::move(tokens))).first->second;
    for (int64_t piece = sample + 1; piece <= last_piece; ++piece) {
      data.runs.emplace(piece, TokenRun(whole.tokens()));
    }
  }

  absl::StatusOr<absl::Span<const int64_t>> TokensOf(const StepPlan& plan, int64_t sample,
                                                     absl::Span<const int64_t> run) const override {
    // The piece's inputs and the label of its last: the next token.
    const scheduler::TokenRange piece = plan.pieces[static_cast<size_t>(sample)];
    const auto available = static_cast<int64_t>(run.size());
    if (piece.begin >= available) {
      return absl::InternalError(absl::StrCat("sample ", sample, "'s piece starts at ", piece.begin,
                                              " of a run of ", available));
    }
    return run.subspan(static_cast<size_t>(piece.begin),
                       static_cast<size_t>(std::min(piece.end + 1, available) - piece.begin));
  }

  absl::Status ShapeSource(const Job&, const StepData& data, int microbatch,
                           MicrobatchSource& source) const override {
    // Each sequence is one sub-sample, split on its own.
    source.sample_ids.emplace();
    for (const scheduler::PlannedSequence& sequence : source.group->sequences) {
      source.sample_ids->push_back(sequence.sample);
    }
    source.hybrid_group = data.plan.hybrid_groups[static_cast<size_t>(microbatch)];
    return absl::OkStatus();
  }

  absl::Status Open(Job& job, const DatasetOpener& open,
                    std::string& datasets_part) const override {
    return BuildPretrainingIndices(job, open, datasets_part);
  }

  absl::Status CheckServable(const Job& job) const override {
    // A sub-sample is at most a whole sample.
    const int64_t seq_length = job.spec().seq_length;
    if (absl::Status fits = scheduler::CheckSequenceFits(seq_length, job.planner_options());
        !fits.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job.name(), ": a sub-sample of seq_length ", seq_length,
                       " tokens cannot be served: ", fits.message(),
                       "; raise scheduler.max_tokens_per_rank or max_cp"));
    }
    return absl::OkStatus();
  }

  SlotBounds BoundsOf(const Job& job) const override {
    SlotBounds bounds = PretrainingBounds(job, JobKind::BoundsOf(job));
    bounds.sample_ids = true;  // and hybrid_group
    return bounds;
  }
};

}  // namespace

const JobKind& HybridCpKind() {
  static const HybridCp kind;
  return kind;
}

}  // namespace packfeed::server
