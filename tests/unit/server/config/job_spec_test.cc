#include "server/config/job_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/daemon_config.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kBalanced = "scheduler { kind: \"balanced\" max_tokens_per_rank: 256 }";

// The spec of the one job `body` configures (its name, topology and
// scheduler given).
absl::StatusOr<JobSpec> SpecOf(const std::string& body, const std::string& topology = "dp: 4",
                               const std::string& scheduler = kBalanced) {
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
      absl::StrCat("jobs { name: \"j\" topology { ", topology, " } ", scheduler, " ", body, " }"),
      "test");
  if (!config.ok()) return config.status();
  return JobSpecOf(config->jobs(0));
}

constexpr const char* kDocuments =
    "datasets { prefix: \"/d/a\" weight: 2 } datasets { prefix: \"/d/b\" weight: 1 "
    "side_field_prefixes { key: \"experts\" value: \"/e/b\" } } "
    "global_batch: 8 seq_length: 128 eod_id: 0 auth_token: \"t\" "
    "side_fields { name: \"experts\" dtype: \"int16\" inner_shape: [2] pad_value: -1 }";

TEST(JobSpecTest, ADocumentsJobResolvesItsDatasetsSideFieldsAndRanks) {
  absl::StatusOr<JobSpec> spec = SpecOf(kDocuments, "dp: 2 tp: 2");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "j");
  EXPECT_EQ(spec->auth_token, "t");
  EXPECT_EQ(spec->layout.world_size(), 4);
  EXPECT_THAT(spec->local_ranks, ElementsAre(0, 1, 2, 3));  // none configured: every rank
  ASSERT_EQ(spec->datasets.size(), 2u);
  EXPECT_EQ(spec->datasets[0].weight, 2);
  // A side field's copy: named where configured, else beside the tokens.
  EXPECT_THAT(spec->datasets[0].side_prefixes, ElementsAre("/d/a_experts"));
  EXPECT_THAT(spec->datasets[1].side_prefixes, ElementsAre("/e/b"));
  ASSERT_EQ(spec->side_fields.size(), 1u);
  EXPECT_EQ(spec->side_fields[0].stages, SideFieldStages::kInputs);
  ASSERT_EQ(spec->sampler.datasets.size(), 2u);
  EXPECT_EQ(spec->sampler.datasets[0].weight, 2);
  EXPECT_EQ(spec->sampler.global_batch, 8);
  EXPECT_FALSE(spec->pretraining.has_value());
  EXPECT_TRUE(spec->fingerprint.datasets.empty());  // opening the datasets tells it
  EXPECT_FALSE(spec->fingerprint.topology.empty());
}

TEST(JobSpecTest, HostedRanksAreSorted) {
  absl::StatusOr<JobSpec> spec = SpecOf(absl::StrCat(kDocuments, " local_ranks: [3, 1]"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->local_ranks, ElementsAre(1, 3));
}

TEST(JobSpecTest, APretrainingJobCarriesMegatronsSettings) {
  absl::StatusOr<JobSpec> spec = SpecOf(
      "datasets { prefix: \"/d/a\" kind: DATASET_KIND_PRETRAINING } global_batch: 8 "
      "seq_length: 128 eod_id: 0 pretraining { split: \"1,0,0\" train_samples: 32 "
      "micro_batch_size: 2 consumed_samples: 16 inter_document_masking: true "
      "cp_split: CP_SPLIT_PER_DOCUMENT }",
      "dp: 2 cp: 2");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->pretraining.has_value());
  const PretrainingSpec& p = *spec->pretraining;
  EXPECT_EQ(p.micro_batch_size, 2);
  EXPECT_EQ(p.consumed_samples, 16);
  EXPECT_TRUE(p.inter_document_masking);
  EXPECT_TRUE(p.cp_split_per_document);
  EXPECT_FALSE(p.hybrid_context_parallel);
  EXPECT_EQ(p.split, dataset::MegatronSplit::kTrain);
  EXPECT_EQ(p.batch_schedule.At(0).first_sample, 16);  // from consumed_samples on
  EXPECT_EQ(p.batch_schedule.At(1).first_sample, 24);
  EXPECT_THAT(p.canonical, HasSubstr("pretraining:"));
}

TEST(JobSpecTest, TheSchedulersSettingsAreKeptAsConfigured) {
  absl::StatusOr<JobSpec> spec = SpecOf(kDocuments, "dp: 2 cp: 2",
                                        "scheduler { kind: \"dynamic_cp\" max_tokens_per_rank: 256 "
                                        "cp_upgrade_budget: 0.5 learn_cost_model: true }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->scheduler_kind, "dynamic_cp");
  EXPECT_EQ(spec->planner.kind, scheduler::SchedulerKind::kDynamicCp);
  EXPECT_TRUE(spec->cp_upgrade_budget_set);
  EXPECT_EQ(spec->planner.cp_upgrade_budget, 0.5);
  EXPECT_TRUE(spec->learn_cost_model);
}

TEST(JobSpecTest, ALayerSplitThatDoesNotAddUpIsAnErrorNamingTheJob) {
  // Validation refuses it first; resolving refuses it too, should a
  // configuration reach JobSpecOf unvalidated.
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
      absl::StrCat("jobs { name: \"j\" topology { pp: 2 } ", kBalanced, " ", kDocuments, " }"),
      "test");
  ASSERT_TRUE(config.ok()) << config.status();
  config->mutable_jobs(0)->mutable_model()->set_num_layers(3);
  absl::StatusOr<JobSpec> spec = JobSpecOf(config->jobs(0));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("j.model"));
}

}  // namespace
}  // namespace packfeed::server
