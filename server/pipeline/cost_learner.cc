#include "server/pipeline/cost_learner.h"

#include <algorithm>

namespace packfeed::server {
namespace {

// The configured model when it is in seconds (a calibrated preset or a
// custom shape); s²/c has no unit, so the fit then starts from nothing.
scheduler::CostModel PriorOf(const Job& job, std::string& name) {
  name = job.spec().cost_model;
  if (name.empty() || name == "megatron") {
    name = "none (megatron's s²/c has no unit)";
    scheduler::CostModel none;
    none.alpha = 0;
    return none;
  }
  return job.planner_options().cost_model;
}

}  // namespace

CostLearner::CostLearner(const Job& job)
    : job_(job), measures_(job.layout().pp == 1), prior_(PriorOf(job, prior_name_)), fit_(prior_) {
  const std::string& configured = job.spec().cost_model;
  prior_in_seconds_ = !configured.empty() && configured != "megatron";
  for (int rank : job.local_ranks()) {
    const RankCoords coords = job.layout().Coords(rank);
    if (coords.tp == 0) local_dp_cp_.push_back(coords.dp_cp_rank);
  }
  std::sort(local_dp_cp_.begin(), local_dp_cp_.end());
  local_dp_cp_.erase(std::unique(local_dp_cp_.begin(), local_dp_cp_.end()), local_dp_cp_.end());
}

void CostLearner::Planned(int64_t step, const scheduler::GlobalPlan& plan) {
  if (!measures_ || local_dp_cp_.empty()) return;
  StepWork& work = steps_[step];
  work.terms.clear();
  for (const scheduler::PlannedMicrobatch& microbatch : plan.microbatches) {
    std::vector<scheduler::CostTerms>& row = work.terms.emplace_back();
    for (int rank : local_dp_cp_) {
      row.push_back(scheduler::TermsOfGroup(scheduler::GroupOfRank(microbatch, rank)));
    }
  }
  work.measured.assign(local_dp_cp_.size(), 0);
  work.measured_count.assign(local_dp_cp_.size(), 0);
  while (steps_.size() > kStepsKept) steps_.erase(steps_.begin());
}

void CostLearner::Measured(int global_rank, absl::Span<const MeasuredMicrobatch> computed) {
  const RankCoords coords = job_.layout().Coords(global_rank);
  if (!measures_ || coords.tp != 0) return;
  auto local = std::lower_bound(local_dp_cp_.begin(), local_dp_cp_.end(), coords.dp_cp_rank);
  if (local == local_dp_cp_.end() || *local != coords.dp_cp_rank) return;
  const int index = static_cast<int>(local - local_dp_cp_.begin());
  for (const MeasuredMicrobatch& row : computed) {
    const int64_t first = first_step_.emplace(index, row.step).first->second;
    auto step = steps_.find(row.step);
    if (step == steps_.end()) continue;  // planned too long ago, or never
    const size_t microbatches = step->second.terms.size();
    // The step's last microbatch holds the optimizer step too.
    if (row.microbatch < 0 || static_cast<size_t>(row.microbatch) + 1 >= microbatches) continue;
    const scheduler::CostTerms& terms =
        step->second.terms[static_cast<size_t>(row.microbatch)][static_cast<size_t>(index)];
    step->second.measured[static_cast<size_t>(index)] += row.seconds;
    ++step->second.measured_count[static_cast<size_t>(index)];
    if (row.step < first + kWarmUpSteps) continue;
    fit_.Add(terms, row.seconds);
    absl::MutexLock lock(&rows_mutex_);
    rows_.push_back({terms, row.seconds});
    ++rows_added_;
    if (rows_.size() > kRowsKept) rows_.pop_front();
  }
}

std::vector<CostLearner::Row> CostLearner::RowsAfter(int64_t after, size_t max_rows,
                                                     int64_t& last) const {
  absl::MutexLock lock(&rows_mutex_);
  const int64_t oldest = rows_added_ - static_cast<int64_t>(rows_.size());
  const int64_t first = std::max(after + 1, oldest);
  last = std::max(after, first - 1);
  std::vector<Row> out;
  for (int64_t row = first; row < rows_added_ && out.size() < max_rows; ++row) {
    out.push_back(rows_[static_cast<size_t>(row - oldest)]);
    last = row;
  }
  return out;
}

CostFitFigures CostLearner::Figures() const {
  CostFitFigures out;
  out.prior_name = prior_name_;
  out.prior = prior_;
  out.fit = fit_.Fit();
  for (const auto& [step, work] : steps_) {
    CostFitFigures::Step figures;
    figures.step = step;
    bool whole = false;
    for (size_t i = 0; i < local_dp_cp_.size(); ++i) {
      // Only ranks that reported every microbatch but the last.
      if (work.measured_count[i] + 1 != static_cast<int>(work.terms.size())) continue;
      whole = true;
      double prior = 0, fitted = 0;
      for (size_t m = 0; m + 1 < work.terms.size(); ++m) {
        prior += scheduler::ModelledWork(prior_, work.terms[m][i]);
        fitted += scheduler::ModelledWork(out.fit.model, work.terms[m][i]);
      }
      if (work.measured[i] >= figures.measured) {
        figures.measured = work.measured[i];
        figures.prior = prior;
        figures.fitted = fitted;
      }
    }
    if (whole) out.recent_steps.push_back(figures);
  }
  constexpr size_t kRecentShown = 8;
  if (out.recent_steps.size() > kRecentShown) {
    out.recent_steps.erase(out.recent_steps.begin(),
                           out.recent_steps.end() - static_cast<std::ptrdiff_t>(kRecentShown));
  }
  return out;
}

}  // namespace packfeed::server
