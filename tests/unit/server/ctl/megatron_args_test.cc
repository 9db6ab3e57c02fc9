#include "server/ctl/megatron_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace packfeed::server::ctl {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Base() {
  return {"--num-layers",        "4",  "--seq-length",  "4096", "--micro-batch-size", "2",
          "--global-batch-size", "64", "--train-iters", "1000"};
}

MegatronContext World(int64_t ranks) {
  MegatronContext context;
  context.world_size = ranks;
  context.eod_id = 7;
  return context;
}

TEST(MegatronArgsTest, ReadsTheBlendTopologyAndCountsAsMegatronDoes) {
  std::vector<std::string> argv = Base();
  for (const char* arg :
       {"--data-path", "30", "/d/web", "70", "/d/code", "--split", "98, 2, 0",
        "--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--eval-interval",
        "300", "--eval-iters", "5", "--dataloader-inter-document-masking", "--reset-attention-mask",
        "--eod-mask-loss", "--seed=42"}) {
    argv.emplace_back(arg);
  }
  absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(argv, World(16));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->topology().dp(), 4u);
  EXPECT_EQ(job->seed(), 42u);
  EXPECT_EQ(job->eod_id(), 7);
  ASSERT_EQ(job->datasets_size(), 2);
  EXPECT_EQ(job->datasets(1).prefix(), "/d/code");
  EXPECT_EQ(job->datasets(1).weight(), 70);
  const v1::Pretraining& p = job->pretraining();
  EXPECT_EQ(p.split(), "98,2,0");
  EXPECT_EQ(p.train_samples(), 64000);
  EXPECT_EQ(p.valid_samples(), (1000 / 300 + 1) * 5 * 64);
  EXPECT_EQ(p.test_samples(), 5 * 64);
  EXPECT_TRUE(p.serve_every_split());
  EXPECT_TRUE(p.inter_document_masking());
  // Megatron drops the dense mask under inter-document masking.
  EXPECT_FALSE(p.reset_attention_mask());
  EXPECT_TRUE(p.eod_mask_loss());
}

TEST(MegatronArgsTest, ReadsBlendsPerSplitAndSampleBasedTraining) {
  absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs({"--seq-length",
                                                           "128",
                                                           "--micro-batch-size",
                                                           "1",
                                                           "--train-samples",
                                                           "1000",
                                                           "--train-data-path",
                                                           "/t1",
                                                           "/t2",
                                                           "--valid-data-path",
                                                           "1",
                                                           "/v",
                                                           "--test-data-path",
                                                           "/x",
                                                           "--eval-interval",
                                                           "100",
                                                           "--eval-iters",
                                                           "2",
                                                           "--start-eval-at-iter",
                                                           "250"},
                                                          World(8));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->global_batch(), 8u);  // micro_batch_size x DP
  EXPECT_EQ(job->datasets_size(), 2);
  EXPECT_EQ(job->datasets(0).weight(), 0);  // prefixes only: no weights
  const v1::Pretraining& p = job->pretraining();
  ASSERT_EQ(p.valid_datasets_size(), 1);
  EXPECT_EQ(p.valid_datasets(0).weight(), 1);
  EXPECT_EQ(p.test_datasets(0).prefix(), "/x");
  // 1000 samples are 125 iterations: 2 eval points, less the 2 before 250.
  EXPECT_EQ(p.train_samples(), 1000);
  EXPECT_EQ(p.valid_samples(), 0);
  EXPECT_FALSE(p.serve_every_split());  // nothing evaluated: the train split alone
}

// packfeed.megatron's drop-in runs pretrain_gpt with --dataloader-type
// external: the same order as 'single'.
TEST(MegatronArgsTest, TheDropInsExternalLoaderServesSinglesOrder) {
  std::vector<std::string> argv = Base();
  argv.insert(argv.end(), {"--data-path", "/d", "--dataloader-type", "external"});
  absl::StatusOr<v1::JobConfig> external = JobFromMegatronArgs(argv, World(8));
  ASSERT_TRUE(external.ok()) << external.status();
  argv.resize(argv.size() - 2);
  absl::StatusOr<v1::JobConfig> single = JobFromMegatronArgs(argv, World(8));
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(external->DebugString(), single->DebugString());
}

// --hybrid-context-parallel: the daemon plans the sub-samples with
// dynamic_cp under Megatron's per-rank cap; the CP split is an option.
TEST(MegatronArgsTest, HybridCpBecomesADynamicCpPlanUnderMegatronsCap) {
  std::vector<std::string> argv = Base();
  argv.insert(argv.end(), {"--data-path", "/d", "--dataloader-inter-document-masking",
                           "--hybrid-context-parallel", "--max-seqlen-per-dp-cp-rank", "1024",
                           "--calculate-per-token-loss"});
  absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(argv, World(8));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->pretraining().hybrid_context_parallel());
  EXPECT_EQ(job->scheduler().kind(), "dynamic_cp");
  EXPECT_EQ(job->scheduler().max_tokens_per_rank(), 1024);
  argv.resize(argv.size() - 3);
  EXPECT_THAT(std::string(JobFromMegatronArgs(argv, World(8)).status().message()),
              HasSubstr("needs --max-seqlen-per-dp-cp-rank"));

  MegatronContext per_document = World(8);
  per_document.cp_split = v1::Pretraining::CP_SPLIT_PER_DOCUMENT;
  argv = Base();
  argv.insert(argv.end(), {"--data-path", "/d", "--dataloader-inter-document-masking"});
  absl::StatusOr<v1::JobConfig> split = JobFromMegatronArgs(argv, per_document);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->pretraining().cp_split(), v1::Pretraining::CP_SPLIT_PER_DOCUMENT);
}

TEST(MegatronArgsTest, EvaluationCountsInTheEvaluationBatch) {
  std::vector<std::string> argv = Base();
  argv.insert(argv.end(), {"--data-path", "/d", "--eval-iters", "5", "--eval-interval", "500",
                           "--eval-global-batch-size", "32", "--eval-micro-batch-size", "4"});
  absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(argv, World(8));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->pretraining().eval_global_batch(), 32);
  EXPECT_EQ(job->pretraining().eval_micro_batch_size(), 4u);
  // (1000 // 500 + 1) evaluations of 5 iterations of 32 samples.
  EXPECT_EQ(job->pretraining().valid_samples(), 3 * 5 * 32);
  EXPECT_EQ(job->pretraining().test_samples(), 5 * 32);
}

TEST(MegatronArgsTest, RefusesWhatItCannotServeNamingTheFlag) {
  auto refused = [](std::vector<std::string> extra, int64_t ranks = 8) {
    std::vector<std::string> argv = Base();
    argv.insert(argv.end(), {"--data-path", "/d"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(argv, World(ranks));
    return job.ok() ? std::string("accepted") : std::string(job.status().message());
  };
  EXPECT_THAT(refused({"--mock-data"}), HasSubstr("--mock-data"));
  EXPECT_THAT(refused({"--fim-data"}), HasSubstr("not on the seed and its index"));
  EXPECT_THAT(refused({"--dataloader-type", "cyclic"}), HasSubstr("--dataloader-type cyclic"));
  EXPECT_THAT(refused({"--rampup-batch-size", "16", "16", "1000"}),
              HasSubstr("--rampup-batch-size"));
  EXPECT_THAT(refused({"--tensor-model-parallel-size", "3"}), HasSubstr("does not divide"));
  EXPECT_THAT(refused({"--seq-length", "x"}), HasSubstr("--seq-length: 'x' is no integer"));
  EXPECT_THAT(refused({"--data-path", "1", "/a", "/b", "2"}),
              HasSubstr("some entries are weights and some are not"));
  EXPECT_EQ(std::string(JobFromMegatronArgs({"pretrain_gpt.py", "--seq-length", "8"}, World(1))
                            .status()
                            .message()),
            "'pretrain_gpt.py' comes before any flag (give pretrain_gpt.py's arguments, not the "
            "program)");
  EXPECT_THAT(std::string(JobFromMegatronArgs({"--seq-length", "8"}, World(1)).status().message()),
              HasSubstr("--micro-batch-size are required"));
}

}  // namespace
}  // namespace packfeed::server::ctl
