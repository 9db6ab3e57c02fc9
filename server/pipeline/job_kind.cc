#include "server/pipeline/job_kind.h"

#include "absl/strings/str_cat.h"
#include "server/pipeline/job_kinds.h"

namespace packfeed::server {

const JobKind& KindOf(const Job& job) {
  if (job.ingest() != nullptr) return IngestKind();
  if (job.hybrid_context_parallel()) return HybridCpKind();
  if (job.pretraining() != nullptr) return PretrainingKind();
  return DocumentsKind();
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

absl::Status Schedule(const Job& job, const std::vector<int64_t>& lengths, bool serving,
                      StepPlan& out) {
  absl::StatusOr<scheduler::GlobalPlan> plan = scheduler::PlanGlobalBatch(
      lengths, job.PlannerOptionsFor(out.step, serving, &out.cost_model_version));
  if (!plan.ok()) return InStep(job, out.step, plan.status());
  out.plan = *std::move(plan);
  return absl::OkStatus();
}

absl::Status FailedRead(const Job& job, const scheduler::SampleRef& ref, absl::string_view noun,
                        const absl::Status& read) {
  return absl::Status(read.code(), absl::StrCat(job.dataset(ref.dataset).prefix(), " ", noun, " ",
                                                job.PieceOf(ref).document, ": ", read.message()));
}

}  // namespace packfeed::server
