#include "packfeed/scheduler/cost_fit.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace packfeed::scheduler {
namespace {

// A group of `size` ranks running 1–4 sequences of 256–16 384 tokens.
CpGroup RandomGroup(std::mt19937_64& random, int size) {
  CpGroup group;
  group.size = size;
  const int count = 1 + static_cast<int>(random() % 4);
  for (int i = 0; i < count; ++i) {
    const int64_t length = 256 + static_cast<int64_t>(random() % 16128);
    group.sequences.push_back({i, length, length});
  }
  return group;
}

CostModel Llama8b() { return *CostModelFromName("llama8b"); }

TEST(CostFitTest, TermsAreTheCostModelsRegressors) {
  CpGroup group;
  group.size = 4;
  group.sequences = {{0, 4000, 4096}, {1, 1000, 1024}};
  const CostTerms terms = TermsOfGroup(group);
  const CostModel model = Llama8b();
  const double direct = model.Cost(4096, 4) + model.Cost(1024, 4) + model.microbatch;
  EXPECT_NEAR(ModelledWork(model, terms), direct, 1e-12 * direct);
}

TEST(CostFitTest, RecoversTheTrueRatesThroughNoiseAndStragglers) {
  const CostModel truth = Llama8b();
  CostModel prior = truth;  // a prior off by 2x and 0.5x
  prior.alpha *= 2;
  prior.beta *= 0.5;
  prior.kappa *= 2;
  prior.microbatch *= 0.5;
  CostFit fit(prior);
  std::mt19937_64 random(11);
  std::normal_distribution<double> noise(0.0, 0.05);  // (test data only)
  for (int i = 0; i < 3000; ++i) {
    const CostTerms terms = TermsOfGroup(RandomGroup(random, 1 << (random() % 4)));
    double seconds = ModelledWork(truth, terms) * (1 + noise(random));
    if (random() % 50 == 0) seconds *= 3;  // a straggler
    fit.Add(terms, seconds);
  }
  const FittedCost fitted = fit.Fit();
  EXPECT_NEAR(fitted.model.alpha, truth.alpha, 0.05 * truth.alpha);
  EXPECT_NEAR(fitted.model.beta, truth.beta, 0.05 * truth.beta);
  EXPECT_NEAR(fitted.model.kappa, truth.kappa, 0.25 * truth.kappa);
  EXPECT_NEAR(fitted.model.microbatch, truth.microbatch, 0.25 * truth.microbatch);
  for (int j : {0, 1, 4}) EXPECT_GT(fitted.determined[j], 0.9) << CostTermName(j);
  EXPECT_LT(fitted.stddev[0], 0.05 * truth.alpha);
  EXPECT_EQ(fitted.rows, 3000);
}

TEST(CostFitTest, WhatTheDataCannotTellApartStaysWithThePrior) {
  // Every microbatch alike: α, β and μ are one number to the data.
  const CostModel truth = Llama8b();
  CostFit fit(truth);
  CpGroup group;
  group.sequences = {{0, 4096, 4096}};
  for (int i = 0; i < 500; ++i)
    fit.Add(TermsOfGroup(group), ModelledWork(truth, TermsOfGroup(group)));
  const FittedCost fitted = fit.Fit();
  EXPECT_LT(fitted.determined[0], 0.9);
  EXPECT_EQ(fitted.determined[2], 0);  // no CP ran: no row has a κ term
  EXPECT_EQ(fitted.model.kappa, truth.kappa);
  EXPECT_NEAR(ModelledWork(fitted.model, TermsOfGroup(group)),
              ModelledWork(truth, TermsOfGroup(group)),
              0.01 * ModelledWork(truth, TermsOfGroup(group)));
}

TEST(CostFitTest, NoRateComesOutNegativeAndBadRowsAreIgnored) {
  CostModel truth = Llama8b();
  truth.kappa = 0;
  truth.lambda = 0;
  CostModel zero;
  zero.alpha = 0;
  CostFit fit(zero);
  EXPECT_EQ(fit.Fit().model, zero);  // no rows: the prior
  std::mt19937_64 random(5);
  std::normal_distribution<double> noise(0.0, 0.1);
  for (int i = 0; i < 800; ++i) {
    const CostTerms terms = TermsOfGroup(RandomGroup(random, 1 << (random() % 3)));
    fit.Add(terms, ModelledWork(truth, terms) * (1 + noise(random)));
  }
  fit.Add(TermsOfGroup(RandomGroup(random, 2)), std::numeric_limits<double>::quiet_NaN());
  fit.Add(TermsOfGroup(RandomGroup(random, 2)), -1);
  EXPECT_EQ(fit.rows_seen(), 800);
  const FittedCost fitted = fit.Fit();
  EXPECT_GE(fitted.model.kappa, 0);
  EXPECT_GE(fitted.model.lambda, 0);
  EXPECT_NEAR(fitted.model.alpha, truth.alpha, 0.1 * truth.alpha);
}

TEST(CostFitTest, AFitIsAdoptedOnceDeterminedWhereThePlansSpendTheirWork) {
  const CostModel truth = Llama8b();
  CostModel none;  // what the learner starts from under s²/c
  none.alpha = 0;
  CostFit fit(none);
  std::mt19937_64 random(5);
  std::vector<CostTerms> recent;
  auto add = [&](int rows) {
    for (int i = 0; i < rows; ++i) {
      const CostTerms terms = TermsOfGroup(RandomGroup(random, 1 << (random() % 3)));
      fit.Add(terms, ModelledWork(truth, terms));
      recent.push_back(terms);
    }
  };
  add(10);
  EXPECT_FALSE(WorthAdopting(fit.Fit(), CostModel::Megatron(), false, recent));  // too few rows
  add(400);
  const FittedCost fitted = fit.Fit();
  EXPECT_TRUE(WorthAdopting(fitted, CostModel::Megatron(), false, recent));
  // In force already, or within 2 % of it: nothing new to announce.
  EXPECT_FALSE(WorthAdopting(fitted, fitted.model, true, recent));
  CostModel near = fitted.model;
  near.alpha *= 1.01;
  near.beta *= 1.01;
  EXPECT_FALSE(WorthAdopting(fitted, near, true, recent));
  CostModel far = fitted.model;
  far.alpha *= 1.5;
  EXPECT_TRUE(WorthAdopting(fitted, far, true, recent));
  // A fit the data has not narrowed (a strong prior) is not adopted.
  CostFit stubborn(truth, {.prior_spread = 1e-6});
  for (const CostTerms& terms : recent) stubborn.Add(terms, 2 * ModelledWork(truth, terms));
  EXPECT_FALSE(WorthAdopting(stubborn.Fit(), far, true, recent));
}

}  // namespace
}  // namespace packfeed::scheduler
