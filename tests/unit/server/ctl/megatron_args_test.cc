#include "server/ctl/megatron_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "server/ctl/megatron_batches.h"

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
  EXPECT_THAT(refused({"--sft"}), HasSubstr("packfeedd runs no tokenizer"));
  EXPECT_THAT(refused({"--full-validation"}), HasSubstr("DP ranks read different counts"));
  EXPECT_THAT(refused({"--multiple-validation-sets"}), HasSubstr("only with --full-validation"));
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

// The batch after `consumed` samples under a job's batch_schedule.
int64_t BatchAfter(const v1::JobConfig& job, int64_t consumed) {
  int64_t batch = job.global_batch();
  for (const v1::BatchSizeStep& entry : job.pretraining().batch_schedule()) {
    if (consumed >= entry.from_sample()) batch = entry.global_batch();
  }
  return batch;
}

std::vector<std::string> Unbatched(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--seq-length",    "1000", "--micro-batch-size", "2",
                                   "--data-path",     "/d",   "--eval-iters",       "5",
                                   "--eval-interval", "10"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(MegatronArgsTest, AStepScheduleInTokensBecomesTheBatchScheduleInSamples) {
  // Thresholds in tokens of seq_length 1000, out of order, commas allowed.
  absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(
      Unbatched({"--step-batch-size-schedule", "64K:32, 0:16 0.2m:64", "--train-samples", "500"}),
      World(8));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Pretraining& p = job->pretraining();
  ASSERT_EQ(p.batch_schedule_size(), 3);
  EXPECT_EQ(p.batch_schedule(1).from_sample(), 64);
  EXPECT_EQ(p.batch_schedule(2).from_sample(), 200);
  EXPECT_EQ(p.batch_schedule(2).global_batch(), 64);
  EXPECT_EQ(job->global_batch(), 64);
  // Megatron's loop: 4 steps of 16, 4 of 32 (64..192), then 64 from 192:
  // 5 more reach 512 >= 500, so 13 iterations and (13 // 10 + 1) x 5
  // evaluations of its default global batch, micro_batch_size x DP = 16.
  EXPECT_EQ(p.train_samples(), 500);
  EXPECT_EQ(p.valid_samples(), 2 * 5 * 16);
  EXPECT_EQ(p.eval_global_batch(), 16);
  EXPECT_EQ(p.eval_micro_batch_size(), 0u);

  auto refused = [](std::vector<std::string> extra, const std::string& release = "") {
    MegatronContext context = World(8);
    context.megatron_core = release;
    absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(Unbatched(extra), context);
    return job.ok() ? std::string("accepted") : std::string(job.status().message());
  };
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0:16", "--global-batch-size", "16",
                       "--train-samples", "100"}),
              HasSubstr("not with --global-batch-size"));
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0:16", "--train-iters", "10"}),
              HasSubstr("needs --train-samples"));
  EXPECT_THAT(refused({"--step-batch-size-schedule", "1K:16", "--train-samples", "100"}),
              HasSubstr("the first threshold must be 0 (it is 1 samples)"));
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0:16 500:32", "--train-samples", "100"}),
              HasSubstr("two thresholds are both 0 samples"));  // 500 tokens are 0 samples
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0:16 x:32", "--train-samples", "100"}),
              HasSubstr("in 'x:32': 'x' is no count"));
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0:16 inf:32", "--train-samples", "100"}),
              HasSubstr("'inf' is no count"));
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0 16", "--train-samples", "100"}),
              HasSubstr("'0' is not THRESHOLD:BATCH_SIZE"));
  EXPECT_THAT(refused({"--step-batch-size-schedule", "0:16", "--train-samples", "100"}, "0.16.1"),
              HasSubstr("has no such flag"));
}

// Megatron-Core 0.16.1's ramp-up, restated: batch start + k x increment
// with k = int(c / (samples / increments)) while c <= samples.
int64_t RampUpBatch(int64_t c, int64_t start, int64_t increment, int64_t samples,
                    int64_t global_batch) {
  if (c > samples) return global_batch;
  const int64_t increments = (global_batch - start) / increment;
  const double per_increment = static_cast<double>(samples) / static_cast<double>(increments);
  return start + static_cast<int64_t>(static_cast<double>(c) / per_increment) * increment;
}

TEST(MegatronArgsTest, ARampUpIsMegatronsBatchAfterEveryConsumedCount) {
  struct Case {
    int64_t start, increment, samples, global_batch, world;
  };
  // Megatron's documented example; one with fewer samples than increments
  // (several increments at once); one whose quotients round.
  for (const Case& c :
       {Case{16, 8, 300000, 1024, 8}, Case{2, 2, 3, 18, 2}, Case{32, 32, 999999, 32 * 97, 16}}) {
    MegatronContext context = World(c.world);
    context.megatron_core = "0.16.1";
    const std::vector<std::string> ramp = {
        "--rampup-batch-size",       std::to_string(c.start),
        std::to_string(c.increment), std::to_string(c.samples),
        "--global-batch-size",       std::to_string(c.global_batch),
        "--train-samples",           "2000000"};
    absl::StatusOr<v1::JobConfig> job = JobFromMegatronArgs(Unbatched(ramp), context);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->global_batch(), c.global_batch);
    for (int64_t consumed = 0; consumed <= c.samples + 2; ++consumed) {
      ASSERT_EQ(BatchAfter(*job, consumed),
                RampUpBatch(consumed, c.start, c.increment, c.samples, c.global_batch))
          << "ramp from " << c.start << " after " << consumed;
    }
    // 0.16.1's update_train_iters: the ramp's steps, then whole batches.
    int64_t consumed = 0, iterations = 0;
    while (consumed <= c.samples && consumed <= 2000000) {
      consumed += RampUpBatch(consumed, c.start, c.increment, c.samples, c.global_batch);
      ++iterations;
    }
    iterations += (2000000 - consumed) / c.global_batch;
    EXPECT_EQ(job->pretraining().valid_samples(), (iterations / 10 + 1) * 5 * c.global_batch);
  }
  MegatronContext later = World(8);
  later.megatron_core = "0.19.2";  // parses the flag and ignores it
  absl::StatusOr<v1::JobConfig> ignored =
      JobFromMegatronArgs(Unbatched({"--rampup-batch-size", "16", "8", "1000",
                                     "--global-batch-size", "64", "--train-iters", "10"}),
                          later);
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_EQ(ignored->pretraining().batch_schedule_size(), 0);
  EXPECT_EQ(ignored->global_batch(), 64);

  MegatronContext early = World(8);
  early.megatron_core = "0.16";
  for (const auto& [values, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"16", "8"}, "takes three integers"},
           {{"16", "0", "100"}, "must be positive"},
           {{"64", "8", "100"}, "in whole increments"},
           {{"16", "10", "100"}, "in whole increments of 10"}}) {
    std::vector<std::string> argv = {"--rampup-batch-size"};
    argv.insert(argv.end(), values.begin(), values.end());
    argv.insert(argv.end(), {"--global-batch-size", "64", "--train-samples", "1000"});
    EXPECT_THAT(std::string(JobFromMegatronArgs(Unbatched(argv), early).status().message()),
                HasSubstr(why));
  }
  EXPECT_THAT(std::string(JobFromMegatronArgs(
                              Unbatched({"--rampup-batch-size", "16", "8", "100",
                                         "--global-batch-size", "64", "--train-iters", "10"}),
                              early)
                              .status()
                              .message()),
              HasSubstr("needs --train-samples"));
  MegatronContext garbled = World(8);
  garbled.megatron_core = "new";
  EXPECT_THAT(
      std::string(
          JobFromMegatronArgs(Unbatched({"--train-iters", "10"}), garbled).status().message()),
      HasSubstr("'new' is no release"));
}

}  // namespace
}  // namespace packfeed::server::ctl
