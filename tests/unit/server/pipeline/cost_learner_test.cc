#include "server/pipeline/cost_learner.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/scheduler/cost_fit.h"
#include "server/config/daemon_config.h"
#include "server/pipeline/job.h"
#include "server/pipeline/plan.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {
namespace {

// A hidden cluster: what each rank's microbatch really costs, in seconds.
scheduler::CostModel Truth() {
  scheduler::CostModel truth;
  truth.alpha = 2e-7;
  truth.beta = 4e-5;
  truth.kappa = 1e-5;
  truth.lambda = 2e-3;
  truth.microbatch = 5e-3;
  return truth;
}

class CostLearnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = temp_.Prefix("data");
    std::vector<int64_t> lengths;
    for (int i = 0; i < 600; ++i) lengths.push_back(8 + (i * 53) % 250);
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths, {}).ok());
  }

  // TP 2 (and `pp`) over 4 dp-cp ranks, dynamic CP, under `cost_model`.
  std::unique_ptr<Job> MakeJob(const std::string& cost_model = "llama1b", int pp = 1) {
    absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
        absl::StrCat("jobs { name: \"j\" datasets { prefix: \"", prefix_,
                     "\" } global_batch: 32 eod_id: 0 seed: 3 seq_length: 256 "
                     "topology { tp: 2 cp: 2 dp: 2 pp: ",
                     pp,
                     " } scheduler { kind: \"dynamic_cp\" max_tokens_per_rank: 128 cost_model: \"",
                     cost_model, "\" } }"),
        "test");
    EXPECT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<Job>> job = JobOfConfig(config->jobs(0));
    EXPECT_TRUE(job.ok()) << job.status();
    return *std::move(job);
  }

  // Plans `step`, tells `learner`, and reports every rank's microbatch
  // times under Truth() (its group's work), as the clients would. The
  // step's microbatch count.
  static absl::StatusOr<int> PlanAndReport(const Job& job, CostLearner& learner, int64_t step) {
    absl::StatusOr<StepPlan> planned = PlanStep(job, step);
    if (!planned.ok()) return planned.status();
    const scheduler::GlobalPlan& plan = planned->plan;
    learner.Planned(step, plan);
    for (int rank = 0; rank < job.layout().world_size(); ++rank) {
      const RankCoords coords = job.layout().Coords(rank);
      std::vector<MeasuredMicrobatch> rows;
      for (int m = 0; m < plan.num_microbatches(); ++m) {
        const scheduler::CostTerms terms = scheduler::TermsOfGroup(
            scheduler::GroupOfRank(plan.microbatches[static_cast<size_t>(m)], coords.dp_cp_rank));
        rows.push_back({step, m, scheduler::ModelledWork(Truth(), terms)});
      }
      learner.Measured(rank, rows);
    }
    return plan.num_microbatches();
  }

  packfeed::testing::ScopedTempDir temp_;
  std::string prefix_;
};

TEST_F(CostLearnerTest, FitsTheClustersRatesFromWhatTheRanksMeasure) {
  const std::unique_ptr<Job> job = MakeJob();
  CostLearner learner(*job);
  ASSERT_TRUE(learner.measures());
  for (int64_t step = 0; step < 40; ++step) {
    const absl::StatusOr<int> microbatches = PlanAndReport(*job, learner, step);
    ASSERT_TRUE(microbatches.ok()) << microbatches.status();
  }
  const CostFitFigures figures = learner.Figures();
  EXPECT_EQ(figures.prior_name, "llama1b");
  // α and β (every microbatch exercises them) from exact rows; what CP
  // adds only where groups of 2 ran.
  EXPECT_NEAR(figures.fit.model.alpha, Truth().alpha, 0.02 * Truth().alpha);
  EXPECT_NEAR(figures.fit.model.beta, Truth().beta, 0.05 * Truth().beta);
  EXPECT_NEAR(figures.fit.model.microbatch, Truth().microbatch, 0.05 * Truth().microbatch);
  EXPECT_GT(figures.fit.determined[0], 0.99);
  // The steps shown: the newest 8, each measured as modelled by the fit.
  ASSERT_EQ(figures.recent_steps.size(), 8u);
  EXPECT_EQ(figures.recent_steps.back().step, 39);
  for (const CostFitFigures::Step& step : figures.recent_steps) {
    EXPECT_NEAR(step.fitted, step.measured, 0.01 * step.measured) << step.step;
    EXPECT_NE(step.prior, step.measured);
  }
}

TEST_F(CostLearnerTest, CountsOnlyTpRankZeroAfterWarmUpAndNotTheLastMicrobatch) {
  const std::unique_ptr<Job> job = MakeJob();
  CostLearner learner(*job);
  int64_t expected_rows = 0;
  for (int64_t step = 0; step < 5; ++step) {
    const absl::StatusOr<int> microbatches = PlanAndReport(*job, learner, step);
    ASSERT_TRUE(microbatches.ok()) << microbatches.status();
    // Each dp-cp rank's TP rank 0 (one of its TP pair), from its third step
    // on, every microbatch but the step's last.
    if (step >= 2) expected_rows += int64_t{job->layout().dp_cp_size()} * (*microbatches - 1);
    // A step never planned, a microbatch out of range: ignored.
    learner.Measured(0, std::vector<MeasuredMicrobatch>{{step + 100, 0, 1.0}, {step, -1, 1.0}});
  }
  EXPECT_EQ(learner.Figures().fit.rows, expected_rows);
  EXPECT_GT(expected_rows, 0);
}

TEST_F(CostLearnerTest, PipelinedJobsAreNotMeasured) {
  const std::unique_ptr<Job> job = MakeJob("llama1b", 2);
  CostLearner learner(*job);
  EXPECT_FALSE(learner.measures());
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  learner.Planned(0, plan->plan);
  learner.Measured(0, std::vector<MeasuredMicrobatch>{{0, 0, 1.0}});
  EXPECT_EQ(learner.Figures().fit.rows, 0);
}

TEST_F(CostLearnerTest, MegatronsUnitlessModelIsNoPrior) {
  const std::unique_ptr<Job> job = MakeJob("megatron");
  CostLearner learner(*job);
  const CostFitFigures figures = learner.Figures();
  EXPECT_EQ(figures.prior.alpha, 0);
  EXPECT_NE(figures.prior_name.find("no unit"), std::string::npos) << figures.prior_name;
}

}  // namespace
}  // namespace packfeed::server
