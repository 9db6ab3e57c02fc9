#ifndef PACKFEED_SERVER_PIPELINE_COST_LEARNER_H_
#define PACKFEED_SERVER_PIPELINE_COST_LEARNER_H_

// What a job's local ranks measure of their compute, fitted to the cost
// model (docs/SCHEDULER.md, "A cost model learned from the cluster"). The
// runner tells it each step's plan and hands it the microbatch times the
// ranks' clients report; it pairs each time with the work the plan gave
// that rank's CP group and keeps the fit (scheduler::CostFit), whose
// figures are exported for operators to compare. A job that learns its
// model (scheduler.learn_cost_model) plans by the fit of its leader daemon,
// which takes every node's rows (RowsAfter; cost_model_sync.h).
//
// Which measurements count: pipeline parallelism interleaves stages'
// microbatches, so jobs with PP > 1 are not measured (report_compute is
// off for them); TP ranks > 0 repeat their TP rank 0's time and are
// skipped; each step's last microbatch also holds the optimizer step and
// the gradient reduction, and each rank's first two steps warm up, so
// neither is fitted. Runner thread only, but for RowsAfter.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "packfeed/scheduler/cost_fit.h"
#include "server/pipeline/job.h"
#include "server/pipeline/job_figures.h"

namespace packfeed::server {

class CostLearner {
 public:
  explicit CostLearner(const Job& job);

  // Whether this job's clients are asked for their microbatch times; fixed
  // at construction (read from any thread).
  bool measures() const { return measures_; }
  // What the fit starts from, and whether it is in seconds (a calibrated
  // model) rather than none (under Megatron's unitless s²/c). Fixed at
  // construction (read from any thread).
  const scheduler::CostModel& prior() const { return prior_; }
  bool prior_in_seconds() const { return prior_in_seconds_; }
  // Each planned step's local groups' work, kept for the reports to come.
  void Planned(int64_t step, const scheduler::GlobalPlan& plan);
  void Measured(int global_rank, absl::Span<const MeasuredMicrobatch> computed);
  CostFitFigures Figures() const;

  // The rows fitted here, numbered from 0 in the order they came, after row
  // `after` (-1: from the oldest kept), at most `max_rows`; and the number
  // of the last row returned (`after` when none). Thread-safe.
  struct Row {
    scheduler::CostTerms terms;
    double seconds = 0;
  };
  std::vector<Row> RowsAfter(int64_t after, size_t max_rows, int64_t& last) const;

 private:
  struct StepWork {
    // [microbatch][i]: local dp-cp rank i's group's work.
    std::vector<std::vector<scheduler::CostTerms>> terms;
    // [i]: measured seconds and microbatches of local dp-cp rank i.
    std::vector<double> measured;
    std::vector<int> measured_count;
  };
  static constexpr int kStepsKept = 64;
  static constexpr int kWarmUpSteps = 2;
  static constexpr size_t kRowsKept = 8192;

  const Job& job_;
  const bool measures_;
  std::string prior_name_;
  scheduler::CostModel prior_;
  bool prior_in_seconds_ = false;
  scheduler::CostFit fit_;
  std::vector<int> local_dp_cp_;  // the local dp-cp ranks, ascending
  std::map<int64_t, StepWork> steps_;
  std::map<int, int64_t> first_step_;  // per local dp-cp rank index
  mutable absl::Mutex rows_mutex_;
  std::deque<Row> rows_ ABSL_GUARDED_BY(rows_mutex_);  // the newest kRowsKept
  int64_t rows_added_ ABSL_GUARDED_BY(rows_mutex_) = 0;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_COST_LEARNER_H_
