#ifndef PACKFEED_SCHEDULER_COST_FIT_H_
#define PACKFEED_SCHEDULER_COST_FIT_H_

// The cost model's coefficients fitted from measured compute (docs/
// SCHEDULER.md, "A cost model learned from the cluster"). The model is
// linear in them: one rank's work in one microbatch is
//   W = α·Σ s²/c + β·Σ s/c + κ·Σ s(c−1)/c + λ·Σ (c−1) + μ
// over the sequences its CP group runs (cost_model.h), so each measured
// microbatch is one row of a linear regression. The fit is Bayesian with
// the job's configured model as the prior mean, robust (Huber weights,
// iterated, the noise scale from the residuals' median absolute deviation)
// and non-negative, and says per coefficient how far the data narrowed the
// prior. Pure: no clock, no I/O, no threads.

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/plan.h"

namespace packfeed::scheduler {

inline constexpr int kCostTerms = 5;  // α, β, κ, λ, μ
// "alpha", "beta", "kappa", "lambda", "mu".
const char* CostTermName(int term);

// The regressors of one rank's work in one microbatch, in the order of
// kCostTerms: Σ s²/c, Σ s/c, Σ s(c−1)/c, Σ (c−1) over the group's padded
// sequences, and 1.
using CostTerms = std::array<double, kCostTerms>;
CostTerms TermsOfGroup(const CpGroup& group);

// The model's work for `terms` (μ included).
double ModelledWork(const CostModel& model, const CostTerms& terms);

struct CostFitOptions {
  // Rows kept, newest first dropped last.
  int window = 4096;
  // Prior standard deviation of each term's typical contribution, relative
  // to the mean measured time: 1 = weak (a term may be worth as much as a
  // whole microbatch either way).
  double prior_spread = 1.0;
  int robust_passes = 5;
};

struct FittedCost {
  CostModel model;  // bubble kept from the prior
  // Per term: the posterior standard deviation, in the coefficient's unit,
  // and the share of the prior's variance the data removed (0 = the data
  // says nothing about it, 1 = the data alone decides it).
  std::array<double, kCostTerms> stddev{};
  std::array<double, kCostTerms> determined{};
  int64_t rows = 0;
  double residual_rms = 0;  // seconds, over the rows kept (weighted)
  double mean_seconds = 0;  // the rows' mean measured time
};

class CostFit {
 public:
  CostFit(const CostModel& prior, CostFitOptions options = {});

  // One measured microbatch: what the rank's group ran, and the seconds the
  // rank spent on it. Rows with a non-finite or negative time are ignored.
  void Add(const CostTerms& terms, double seconds);
  int64_t rows_seen() const { return rows_seen_; }

  // The fit over the rows kept; the prior itself while there are fewer
  // rows than terms.
  FittedCost Fit() const;

 private:
  struct Row {
    CostTerms terms;
    double seconds;
  };
  CostModel prior_;
  CostFitOptions options_;
  std::deque<Row> rows_;
  int64_t rows_seen_ = 0;
};

// When a fit is worth planning by in place of the model in force
// (docs/SCHEDULER.md, "One learned model on every node").
struct AdoptionRule {
  int64_t min_rows = 64;
  // The data's share of what is known of the terms, each weighted by its
  // share of the fitted work of the recent rows: terms the plans never
  // exercise do not hold a fit back, and keep their prior.
  double min_determined = 0.9;
  // The mean change of the recent rows' modelled work, relative to the
  // fit's, below which a new version is not worth announcing.
  double min_change = 0.02;
};
// `current` is the model in force; `current_in_seconds` false for
// Megatron's unitless s²/c, which any adoptable fit replaces. `recent`:
// the regressors of recent measured microbatches.
bool WorthAdopting(const FittedCost& fit, const CostModel& current, bool current_in_seconds,
                   const std::vector<CostTerms>& recent, const AdoptionRule& rule = {});

// "α=… (±…, 97 % data) β=…", for logs and `packfeedctl cost-model`.
std::string DescribeFit(const FittedCost& fit);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_COST_FIT_H_
