#ifndef PACKFEED_SERVER_PIPELINE_JOB_FIGURES_H_
#define PACKFEED_SERVER_PIPELINE_JOB_FIGURES_H_

// What a job's runner reports, in plain structs: control/ makes the admin
// API's RankTimes, RankStats and JobStats from them field for field
// (server/control/stats_proto.h), so the pipeline does not know the proto.

#include <cstdint>
#include <string>
#include <vector>

#include "packfeed/scheduler/cost_fit.h"

namespace packfeed::server {

// Where a rank's trainer spends its time, as its client reports it.
struct TrainerTimes {
  double wait_seconds = 0;  // blocked in NextStep/Next, waiting for data
  double busy_seconds = 0;  // between calls: the trainer's own work
  uint64_t calls = 0;       // NextStep and Next calls measured
  uint64_t copied_out = 0;  // microbatches handed out as private copies
  friend bool operator==(const TrainerTimes&, const TrainerTimes&) = default;
};

struct RankFigures {
  int global_rank = 0;
  bool attached = false;
  int64_t next_step = 0;  // step of the next slot to push
  uint64_t slots_pushed = 0;
  uint64_t slots_released = 0;
  uint64_t bytes_sent = 0;
  uint32_t slots_in_flight = 0;
  // The ledger's position: the step and microbatch after the last consumed.
  int64_t consumed_step = 0;
  int consumed_microbatch = 0;
  TrainerTimes times;      // over every connection of the rank so far
  double input_bound = 0;  // wait / (wait + busy)
  std::string ring;        // "device", "memfd", "shm" or "ucx"
  // Why a device ring the daemon writes was asked for and not used.
  std::string device_ring_fallback;
};

// One microbatch's compute as a rank's client measured it
// (ReportRequest.computed).
struct MeasuredMicrobatch {
  int64_t step = 0;
  int microbatch = 0;
  double seconds = 0;
};

// The job's cost model fitted from its ranks' measured compute
// (cost_learner.h), beside its prior.
struct CostFitFigures {
  std::string prior_name;
  scheduler::CostModel prior;
  scheduler::FittedCost fit;
  struct Step {
    int64_t step = 0;
    double measured = 0;  // the slowest local rank's summed microbatch times
    double prior = 0;     // the same ranks and microbatches, modelled
    double fitted = 0;
  };
  std::vector<Step> recent_steps;  // ascending
  // The learned model's latest version held here, the step it plans from,
  // and the versions offered too late (CostModelVersions); 0 unless the job
  // learns.
  uint32_t model_version = 0;
  int64_t model_from_step = 0;
  int64_t model_versions_missed = 0;
};

struct JobFigures {
  std::string name;
  int64_t steps_planned = 0;
  int64_t steps_served = 0;  // steps every local rank has been sent
  uint64_t bytes_read = 0;
  uint64_t unique_bytes_needed = 0;
  double io_amplification = 0;
  std::vector<RankFigures> ranks;  // the local ranks, ascending
  double mean_step_over_ideal = 0;
  int slowest_rank = 0;
  int64_t slowest_rank_steps_behind = 0;
  uint64_t cached_bytes = 0;
  uint64_t side_rows_bytes = 0;  // side rows held now (read or being read)
  uint64_t peak_side_rows_bytes = 0;
  double plan_seconds = 0;
  double read_seconds = 0;
  int64_t documents_split = 0;
  int64_t samples_truncated = 0;
  int64_t tokens_truncated = 0;
  int most_waiting_rank = 0;
  double input_bound = 0;
  double wait_seconds = 0;  // summed over the local ranks
  CostFitFigures cost_fit;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_JOB_FIGURES_H_
