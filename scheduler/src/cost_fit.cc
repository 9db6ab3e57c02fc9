#include "packfeed/scheduler/cost_fit.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace packfeed::scheduler {
namespace {

constexpr int kN = kCostTerms;
using Vector = std::array<double, kN>;
using Matrix = std::array<Vector, kN>;

std::array<double, kN> Coefficients(const CostModel& model) {
  return {model.alpha, model.beta, model.kappa, model.lambda, model.microbatch};
}

// Cholesky factor of the symmetric positive definite `a` over the terms in
// `active` (the others are left out); false when it is not positive.
bool Factor(const Matrix& a, const std::array<bool, kN>& active, Matrix& l) {
  l = {};
  for (int i = 0; i < kN; ++i) {
    if (!active[i]) continue;
    for (int j = 0; j <= i; ++j) {
      if (!active[j]) continue;
      double sum = a[i][j];
      for (int k = 0; k < j; ++k) {
        if (active[k]) sum -= l[i][k] * l[j][k];
      }
      if (i == j) {
        if (!(sum > 0)) return false;
        l[i][i] = std::sqrt(sum);
      } else {
        l[i][j] = sum / l[j][j];
      }
    }
  }
  return true;
}

Vector Solve(const Matrix& l, const std::array<bool, kN>& active, const Vector& b) {
  Vector y{}, x{};
  for (int i = 0; i < kN; ++i) {
    if (!active[i]) continue;
    double sum = b[i];
    for (int k = 0; k < i; ++k) {
      if (active[k]) sum -= l[i][k] * y[k];
    }
    y[i] = sum / l[i][i];
  }
  for (int i = kN - 1; i >= 0; --i) {
    if (!active[i]) continue;
    double sum = y[i];
    for (int k = i + 1; k < kN; ++k) {
      if (active[k]) sum -= l[k][i] * x[k];
    }
    x[i] = sum / l[i][i];
  }
  return x;
}

double Median(std::vector<double> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

}  // namespace

const char* CostTermName(int term) {
  static constexpr const char* kNames[kN] = {"alpha", "beta", "kappa", "lambda", "mu"};
  return kNames[term];
}

CostTerms TermsOfGroup(const CpGroup& group) {
  CostTerms terms{0, 0, 0, 0, 1};
  const double c = static_cast<double>(group.size);
  for (const PlannedSequence& sequence : group.sequences) {
    const double s = static_cast<double>(sequence.padded_length);
    terms[0] += s * s / c;
    terms[1] += s / c;
    if (group.size > 1) {
      terms[2] += s * (c - 1) / c;
      terms[3] += c - 1;
    }
  }
  return terms;
}

double ModelledWork(const CostModel& model, const CostTerms& terms) {
  const std::array<double, kN> theta = Coefficients(model);
  double work = 0;
  for (int j = 0; j < kN; ++j) work += theta[j] * terms[j];
  return work;
}

CostFit::CostFit(const CostModel& prior, CostFitOptions options)
    : prior_(prior), options_(options) {}

void CostFit::Add(const CostTerms& terms, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  for (double term : terms) {
    if (!std::isfinite(term) || term < 0) return;
  }
  rows_.push_back({terms, seconds});
  ++rows_seen_;
  while (static_cast<int>(rows_.size()) > std::max(options_.window, kN)) rows_.pop_front();
}

FittedCost CostFit::Fit() const {
  FittedCost out;
  out.model = prior_;
  out.rows = static_cast<int64_t>(rows_.size());
  if (rows_.empty()) return out;
  const double n = static_cast<double>(rows_.size());
  // Each term on the scale of its typical size, so the prior and the
  // solve see comparable numbers (s² is ~10⁷ where 1 is 1).
  Vector scale{};
  for (const Row& row : rows_) {
    out.mean_seconds += row.seconds / n;
    for (int j = 0; j < kN; ++j) scale[j] += row.terms[j] / n;
  }
  const std::array<double, kN> prior = Coefficients(prior_);
  // The prior on each term's contribution to a typical microbatch, in
  // seconds: the configured model's, give or take prior_spread × the mean.
  const double spread = std::max(options_.prior_spread * out.mean_seconds, 1e-12);
  std::array<bool, kN> used{};
  Vector prior_mean{};
  for (int j = 0; j < kN; ++j) {
    used[j] = scale[j] > 0;
    prior_mean[j] = prior[j] * scale[j];
    out.stddev[j] = used[j] ? spread / scale[j] : 0;
  }
  if (rows_.size() < static_cast<size_t>(kN)) return out;

  // Noise is taken as relative (a microbatch twice as long varies twice
  // as much): each row is divided by its modelled time, the measured one
  // in the first pass.
  std::vector<double> weights(rows_.size(), 1.0);
  std::vector<double> typical(rows_.size());
  for (size_t i = 0; i < rows_.size(); ++i) {
    typical[i] = std::max(rows_[i].seconds, 1e-3 * out.mean_seconds + 1e-12);
  }
  double sigma = 1.0;  // of the relative residuals
  std::array<bool, kN> active = used;
  Vector u = prior_mean;
  Matrix a{}, l{};
  for (int pass = 0; pass < std::max(1, options_.robust_passes); ++pass) {
    a = {};
    Vector b{};
    const double inverse_noise = 1.0 / (sigma * sigma);
    for (size_t i = 0; i < rows_.size(); ++i) {
      Vector z{};
      for (int j = 0; j < kN; ++j) z[j] = used[j] ? rows_[i].terms[j] / scale[j] / typical[i] : 0;
      const double y = rows_[i].seconds / typical[i];
      const double w = weights[i] * inverse_noise;
      for (int j = 0; j < kN; ++j) {
        b[j] += w * z[j] * y;
        for (int k = 0; k < kN; ++k) a[j][k] += w * z[j] * z[k];
      }
    }
    for (int j = 0; j < kN; ++j) {
      a[j][j] += 1.0 / (spread * spread);
      b[j] += prior_mean[j] / (spread * spread);
    }
    // Non-negative: a term the solve drives below 0 is fixed at 0.
    active = used;
    for (int round = 0; round < kN; ++round) {
      if (!Factor(a, active, l)) return out;
      u = Solve(l, active, b);
      bool clamped = false;
      for (int j = 0; j < kN; ++j) {
        if (active[j] && u[j] < 0) {
          active[j] = false;
          u[j] = 0;
          clamped = true;
        }
      }
      if (!clamped) break;
    }
    // Huber weights from the relative residuals' robust scale.
    std::vector<double> relative(rows_.size());
    std::vector<double> residuals(rows_.size());
    for (size_t i = 0; i < rows_.size(); ++i) {
      double predicted = 0;
      for (int j = 0; j < kN; ++j) {
        if (used[j]) predicted += u[j] * rows_[i].terms[j] / scale[j];
      }
      residuals[i] = rows_[i].seconds - predicted;
      relative[i] = std::fabs(residuals[i]) / typical[i];
      typical[i] = std::max(predicted, 1e-3 * out.mean_seconds + 1e-12);
    }
    sigma = std::max(1.4826 * Median(relative), 1e-6);
    double weighted = 0, total = 0;
    for (size_t i = 0; i < rows_.size(); ++i) {
      weights[i] = std::min(1.0, 1.345 * sigma / std::max(relative[i], 1e-300));
      weighted += weights[i] * residuals[i] * residuals[i];
      total += weights[i];
    }
    out.residual_rms = std::sqrt(weighted / total);
  }
  // The posterior covariance over every used term (the last pass's A).
  Matrix full{};
  if (!Factor(a, used, full)) return out;
  for (int j = 0; j < kN; ++j) {
    if (!used[j]) continue;
    Vector unit{};
    unit[j] = 1;
    const double variance = Solve(full, used, unit)[j];
    out.stddev[j] = std::sqrt(variance) / scale[j];
    out.determined[j] = std::clamp(1.0 - variance / (spread * spread), 0.0, 1.0);
  }
  std::array<double, kN> theta{};
  for (int j = 0; j < kN; ++j) theta[j] = used[j] ? u[j] / scale[j] : prior[j];
  out.model.alpha = theta[0];
  out.model.beta = theta[1];
  out.model.kappa = theta[2];
  out.model.lambda = theta[3];
  out.model.microbatch = theta[4];
  return out;
}

bool WorthAdopting(const FittedCost& fit, const CostModel& current, bool current_in_seconds,
                   const std::vector<CostTerms>& recent, const AdoptionRule& rule) {
  if (fit.rows < rule.min_rows || recent.empty()) return false;
  const std::array<double, kN> theta = Coefficients(fit.model);
  std::array<double, kN> work{};
  double total = 0, change = 0;
  for (const CostTerms& terms : recent) {
    for (int t = 0; t < kN; ++t) work[t] += theta[t] * terms[t];
    const double fitted = ModelledWork(fit.model, terms);
    total += fitted;
    change += std::abs(fitted - ModelledWork(current, terms));
  }
  if (!(total > 0)) return false;
  double determined = 0;
  for (int t = 0; t < kN; ++t) determined += fit.determined[t] * work[t] / total;
  if (determined < rule.min_determined) return false;
  return !current_in_seconds || change / total >= rule.min_change;
}

std::string DescribeFit(const FittedCost& fit) {
  const std::array<double, kN> theta = Coefficients(fit.model);
  static constexpr const char* kSymbols[kN] = {"α", "β", "κ", "λ", "μ"};
  std::string out;
  for (int j = 0; j < kN; ++j) {
    absl::StrAppend(&out, j ? " " : "",
                    absl::StrFormat("%s=%.4g (±%.2g, %.0f %% data)", kSymbols[j], theta[j],
                                    fit.stddev[j], 100 * fit.determined[j]));
  }
  absl::StrAppend(&out,
                  absl::StrFormat(" over %d rows, residual %.3g s", fit.rows, fit.residual_rms));
  return out;
}

}  // namespace packfeed::scheduler
