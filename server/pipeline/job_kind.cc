#include "server/pipeline/job_kind.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/pipeline/job_kinds.h"

namespace packfeed::server {

const JobKind& KindFor(const JobSpec& spec, bool ingest) {
  if (ingest) return IngestKind();
  if (spec.pretraining) {
    return spec.pretraining->hybrid_context_parallel ? HybridCpKind() : PretrainingKind();
  }
  return DocumentsKind();
}

absl::Status JobKind::CheckServable(const Job&) const { return absl::OkStatus(); }

SlotBounds JobKind::BoundsOf(const Job& job) const {
  SlotBounds bounds;
  bounds.max_tokens = job.planner_options().max_tokens_per_rank;
  bounds.max_sequences = job.spec().global_batch;
  if (job.planner_options().kind == scheduler::SchedulerKind::kDynamicCp) {
    bounds.group_ranks = job.layout().dp_cp_size();
  }
  return bounds;
}

SlotBounds PretrainingBounds(const Job& job, SlotBounds bounds) {
  // Documents split a sample's row: up to one sequence per token.
  const PretrainingSpec& pretraining = *job.spec().pretraining;
  if (pretraining.reset_attention_mask || pretraining.inter_document_masking) {
    bounds.max_sequences = std::max<int64_t>(job.spec().global_batch, bounds.max_tokens);
  }
  return bounds;
}

absl::StatusOr<absl::Span<const int64_t>> JobKind::TokensOf(const StepPlan&, int64_t,
                                                            absl::Span<const int64_t> run) const {
  return run;
}

absl::Status JobKind::ShapeSource(const Job&, const StepData&, int, MicrobatchSource&) const {
  return absl::OkStatus();
}

absl::Status InStep(const Job& job, int64_t step, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("job ", job.name(), " step ", step, ": ", status.message()));
}

absl::StatusOr<StepPlan> PlanBatch(
    const Job& job, int64_t step, bool serving,
    absl::FunctionRef<absl::Status(StepPlan& out, std::vector<int64_t>& lengths)> batch) {
  StepPlan out;
  out.step = step;
  std::vector<int64_t> lengths;
  if (absl::Status gathered = batch(out, lengths); !gathered.ok()) {
    return InStep(job, step, gathered);
  }
  absl::StatusOr<scheduler::GlobalPlan> plan = scheduler::PlanGlobalBatch(
      lengths, job.PlannerOptionsFor(step, serving, &out.cost_model_version));
  if (!plan.ok()) return InStep(job, step, plan.status());
  out.plan = *std::move(plan);
  return out;
}

absl::Status FailedRead(const Job& job, const scheduler::SampleRef& ref, absl::string_view noun,
                        const absl::Status& read) {
  return absl::Status(read.code(), absl::StrCat(job.dataset(ref.dataset).prefix(), " ", noun, " ",
                                                job.PieceOf(ref).document, ": ", read.message()));
}

}  // namespace packfeed::server
