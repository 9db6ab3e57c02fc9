#include "server/config/daemon_config.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/job_config.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

constexpr absl::string_view kJob = R"(
jobs {
  name: "pretrain"
  datasets { prefix: "/data/a" }
  topology { tp: 2 cp: 2 dp: 2 }
  global_batch: 16
  seq_length: 256
  eod_id: 7
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 128 }
}
)";

std::string Message(absl::string_view text) {
  return std::string(ParseDaemonConfig(text, "c.textproto").status().message());
}

TEST(DaemonConfigTest, FillsDefaults) {
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(kJob, "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->socket_path(), kDefaultSocketPath);
  EXPECT_EQ(config->prefetch_steps(), 2u);
  EXPECT_EQ(config->peer_timeout_seconds(), 120u);
  EXPECT_EQ(config->ledger_keep_steps(), 1000u);
  EXPECT_EQ(config->ledger_compact_after_lines(), 65536u);
  EXPECT_TRUE(config->admin_tcp_address().empty());
  const v1::JobConfig& job = config->jobs(0);
  EXPECT_EQ(job.topology().pp(), 1u);
  EXPECT_EQ(job.pad_id(), 7);
  EXPECT_EQ(job.datasets(0).weight(), 1.0);
  EXPECT_EQ(job.datasets(0).kind(), v1::DATASET_KIND_VARLEN);
  EXPECT_EQ(job.sampler(), v1::SAMPLER_MODE_SHUFFLE);
  EXPECT_DOUBLE_EQ(job.scheduler().cp_upgrade_budget(), 0.05);
  EXPECT_EQ(job.topology().vpp(), 1u);
  EXPECT_EQ(job.long_documents(), v1::JobConfig::LONG_DOCUMENTS_SPLIT);
}

std::string PretrainingJob(absl::string_view weights, absl::string_view pretraining) {
  return absl::StrCat(R"(jobs { name: "gpt" seq_length: 64 global_batch: 8
    datasets { prefix: "/a" kind: DATASET_KIND_PRETRAINING )",
                      weights, R"( }
    datasets { prefix: "/b" kind: DATASET_KIND_PRETRAINING )",
                      weights, " }\n    pretraining { ", pretraining, " } }");
}

TEST(DaemonConfigTest, PretrainingKeepsNoWeightsAndChecksMegatronsOptions) {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseDaemonConfig(PretrainingJob("", "micro_batch_size: 2"), "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  const v1::JobConfig& job = config->jobs(0);
  EXPECT_TRUE(IsPretrainingJob(job));
  EXPECT_EQ(job.datasets(0).weight(), 0);  // no weights: Megatron blends by size
  EXPECT_EQ(job.pretraining().split(), "969,30,1");
  EXPECT_EQ(job.pretraining().mid_level_dataset_surplus(), 0.005);
  EXPECT_EQ(job.scheduler().max_tokens_per_rank(), 128);
  EXPECT_FALSE(PretrainingOptionsOf(job).weights.has_value());
  absl::StatusOr<v1::DaemonConfig> weighted =
      ParseDaemonConfig(PretrainingJob("weight: 2", "train_samples: 100"), "c.textproto");
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  EXPECT_EQ(PretrainingOptionsOf(weighted->jobs(0)).weights, (std::vector<double>{2, 2}));
  EXPECT_EQ(PretrainingOptionsOf(weighted->jobs(0)).split_samples[0], 100);

  std::string mixed = PretrainingJob("", "");
  mixed.replace(mixed.find(R"("/b" )"), 5, R"("/b" weight: 1 )");
  EXPECT_THAT(Message(mixed), HasSubstr("jobs[0].datasets[1].weight"));
  EXPECT_THAT(Message(PretrainingJob("", R"(split: "9x,1")")), HasSubstr("pretraining.split"));
  EXPECT_THAT(Message(PretrainingJob("", R"(split: "1,0" serve_split: SPLIT_VALID)")),
              HasSubstr("pretraining.serve_split"));
  EXPECT_THAT(Message(PretrainingJob("", "train_samples: -1")),
              HasSubstr("pretraining.train_samples"));
  EXPECT_THAT(Message(PretrainingJob("", "mid_level_dataset_surplus: -0.5")),
              HasSubstr("mid_level_dataset_surplus"));
  std::string cp2 = PretrainingJob("", "reset_attention_mask: true");
  cp2.replace(cp2.find("global_batch"), 0, "topology { cp: 2 } ");
  EXPECT_THAT(Message(cp2), HasSubstr("under CP use inter_document_masking"));
  std::string cp2_pieces = PretrainingJob("", "inter_document_masking: true");
  cp2_pieces.replace(cp2_pieces.find("global_batch"), 0, "topology { cp: 2 } ");
  EXPECT_TRUE(ParseDaemonConfig(cp2_pieces, "c.textproto").ok());
  EXPECT_THAT(
      Message(PretrainingJob("", "reset_attention_mask: true inter_document_masking: true")),
      HasSubstr("both set"));
  EXPECT_THAT(Message(PretrainingJob("", "cp_split: CP_SPLIT_PER_DOCUMENT")),
              HasSubstr("pretraining.cp_split: applies to inter_document_masking only"));
  EXPECT_THAT(Message(PretrainingJob("", "balance_document_attention: true")),
              HasSubstr("needs reset_attention_mask or inter_document_masking"));
  EXPECT_THAT(Message(PretrainingJob("", "micro_batch_size: 3")), HasSubstr("global_batch"));
}

// Megatron evaluates with --eval-micro-batch-size and --eval-global-batch-size.
TEST(DaemonConfigTest, TheEvaluationSplitsTakeTheEvaluationBatch) {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseDaemonConfig(PretrainingJob("",
                                       "serve_every_split: true eval_micro_batch_size: 4 "
                                       "eval_global_batch: 16"),
                        "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->jobs_size(), 3);
  EXPECT_EQ(config->jobs(0).global_batch(), 8);
  EXPECT_EQ(config->jobs(0).pretraining().micro_batch_size(), 1u);
  for (int split : {1, 2}) {
    const v1::JobConfig& job = config->jobs(split);
    EXPECT_EQ(job.global_batch(), 16) << job.name();
    EXPECT_EQ(job.pretraining().micro_batch_size(), 4u) << job.name();
    EXPECT_EQ(job.scheduler().max_tokens_per_rank(), 4 * 64) << job.name();
  }
  EXPECT_THAT(Message(PretrainingJob("", "serve_every_split: true eval_micro_batch_size: 3")),
              HasSubstr("'gpt.valid'"));
  EXPECT_THAT(Message(PretrainingJob("", "eval_global_batch: 16")),
              HasSubstr("apply to the splits serve_every_split serves"));
}

// Learning needs measured microbatches of plans the daemon made by cost.
TEST(DaemonConfigTest, LearningTheCostModelNeedsMeasuredPlansByCost) {
  std::string learned =
      PretrainingJob("", "inter_document_masking: true hybrid_context_parallel: true");
  learned.replace(learned.find("global_batch"), 0, "scheduler { learn_cost_model: true } ");
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(learned, "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->jobs(0).scheduler().learned_model_lead_steps(), 32u);
  std::string megatron_order = PretrainingJob("", "inter_document_masking: true");
  megatron_order.replace(megatron_order.find("global_batch"), 0,
                         "scheduler { learn_cost_model: true } ");
  EXPECT_THAT(Message(megatron_order),
              HasSubstr("scheduler.learn_cost_model: needs a job the daemon plans by cost"));
  std::string far = learned;
  far.replace(far.find("learn_cost_model"), 0, "learned_model_lead_steps: 100001 ");
  EXPECT_THAT(Message(far), HasSubstr("100001 is above 100000"));
}

TEST(DaemonConfigTest, HybridCpIsPlannedBySubSampleAndRefusesWhatMegatronRefuses) {
  absl::StatusOr<v1::DaemonConfig> hybrid = ParseDaemonConfig(
      PretrainingJob("", "inter_document_masking: true hybrid_context_parallel: true"),
      "c.textproto");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  EXPECT_EQ(hybrid->jobs(0).scheduler().kind(), "dynamic_cp");
  EXPECT_DOUBLE_EQ(hybrid->jobs(0).scheduler().cp_upgrade_budget(), 1.0);
  EXPECT_EQ(hybrid->jobs(0).scheduler().objective(), "hybrid");
  std::string barrier =
      PretrainingJob("", "inter_document_masking: true hybrid_context_parallel: true");
  barrier.replace(barrier.find("global_batch"), 0, R"(scheduler { objective: "barrier" } )");
  EXPECT_THAT(Message(barrier), HasSubstr("scheduler.objective: must be hybrid"));
  std::string without = PretrainingJob("", "inter_document_masking: true");
  without.replace(without.find("global_batch"), 0, R"(scheduler { objective: "hybrid" } )");
  EXPECT_THAT(Message(without), HasSubstr("it needs pretraining.hybrid_context_parallel"));
  EXPECT_THAT(Message(PretrainingJob("", "hybrid_context_parallel: true")),
              HasSubstr("pretraining.hybrid_context_parallel: needs inter_document_masking"));
  std::string pipelined =
      PretrainingJob("", "inter_document_masking: true hybrid_context_parallel: true");
  pipelined.replace(pipelined.find("global_batch"), 0, "topology { pp: 2 } ");
  EXPECT_THAT(Message(pipelined), HasSubstr("pipeline parallelism"));
  std::string balanced =
      PretrainingJob("", "inter_document_masking: true hybrid_context_parallel: true");
  balanced.replace(balanced.find("global_batch"), 0, R"(scheduler { kind: "balanced" } )");
  EXPECT_THAT(Message(balanced), HasSubstr("scheduler.kind: must be dynamic_cp"));
  EXPECT_THAT(Message(PretrainingJob("",
                                     "inter_document_masking: true "
                                     "hybrid_context_parallel: true "
                                     "cp_split: CP_SPLIT_PER_DOCUMENT")),
              HasSubstr("cp_split do not apply"));
}

TEST(DaemonConfigTest, ServeEverySplitMakesAJobPerSplit) {
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
      PretrainingJob("",
                     "serve_every_split: true consumed_samples: 16 "
                     "consumed_valid_samples: 8 valid_samples: 24 test_samples: 8"),
      "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->jobs_size(), 3);
  const v1::JobConfig& valid = config->jobs(1);
  EXPECT_EQ(valid.name(), "gpt.valid");
  EXPECT_EQ(valid.pretraining().serve_split(), v1::Pretraining::SPLIT_VALID);
  EXPECT_EQ(valid.pretraining().consumed_samples(), 8);
  EXPECT_EQ(valid.pretraining().split(), "969,30,1");
  EXPECT_EQ(valid.datasets_size(), 2);
  const v1::JobConfig& test = config->jobs(2);
  EXPECT_EQ(test.name(), "gpt.test");
  EXPECT_EQ(test.pretraining().serve_split(), v1::Pretraining::SPLIT_TEST);
  EXPECT_EQ(test.pretraining().consumed_samples(), 0);

  // A split string that gives the test split nothing: no test job.
  absl::StatusOr<v1::DaemonConfig> no_test = ParseDaemonConfig(
      PretrainingJob("", R"(serve_every_split: true split: "99,1,0")"), "c.textproto");
  ASSERT_TRUE(no_test.ok()) << no_test.status();
  ASSERT_EQ(no_test->jobs_size(), 2);
  EXPECT_EQ(no_test->jobs(1).name(), "gpt.valid");

  EXPECT_THAT(Message(PretrainingJob("", "serve_every_split: true serve_split: SPLIT_VALID")),
              HasSubstr("pretraining.serve_split: is the train split"));
  EXPECT_THAT(Message(PretrainingJob("", "consumed_valid_samples: -1")),
              HasSubstr("pretraining.consumed_valid_samples"));
  // A job already named NAME.valid clashes with the one made for it.
  std::string clash = PretrainingJob("", "serve_every_split: true");
  clash += R"( jobs { name: "gpt.valid" seq_length: 64 global_batch: 8
    datasets { prefix: "/a" kind: DATASET_KIND_PRETRAINING } pretraining {} })";
  EXPECT_THAT(Message(clash), HasSubstr("'gpt.valid' names two jobs"));
}

TEST(DaemonConfigTest, BlendPerSplitServesEachSplitFromItsOwnDatasets) {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseDaemonConfig(PretrainingJob("weight: 2", R"(serve_every_split: true
          valid_datasets { prefix: "/v" weight: 3 }
          test_datasets { prefix: "/t1" weight: 1 } test_datasets { prefix: "/t2" weight: 2 })"),
                        "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->jobs_size(), 3);
  EXPECT_EQ(config->jobs(0).pretraining().split(), "1,0,0");
  const v1::JobConfig& valid = config->jobs(1);
  EXPECT_EQ(valid.pretraining().split(), "0,1,0");
  ASSERT_EQ(valid.datasets_size(), 1);
  EXPECT_EQ(valid.datasets(0).prefix(), "/v");
  EXPECT_EQ(valid.datasets(0).kind(), v1::DATASET_KIND_PRETRAINING);
  EXPECT_EQ(valid.datasets(0).weight(), 0);  // one dataset: itself, as Megatron builds it
  const v1::JobConfig& test = config->jobs(2);
  EXPECT_EQ(test.pretraining().split(), "0,0,1");
  EXPECT_EQ(PretrainingOptionsOf(test).weights, (std::vector<double>{1, 2}));
  // No valid datasets: no valid split.
  absl::StatusOr<v1::DaemonConfig> no_valid = ParseDaemonConfig(
      PretrainingJob("", R"(serve_every_split: true test_datasets { prefix: "/t" })"),
      "c.textproto");
  ASSERT_TRUE(no_valid.ok()) << no_valid.status();
  ASSERT_EQ(no_valid->jobs_size(), 2);
  EXPECT_EQ(no_valid->jobs(1).name(), "gpt.test");

  EXPECT_THAT(Message(PretrainingJob("", R"(split: "90,8,2" valid_datasets { prefix: "/v" })")),
              HasSubstr("pretraining.split: is not used with valid_datasets/test_datasets"));
}

TEST(DaemonConfigTest, ModelLayersAndSideFieldsAreCheckedByPath) {
  auto with = [](const std::string& extra) {
    std::string text(kJob);
    text.insert(text.rfind('}'), extra);
    return Message(text);
  };
  const std::string experts =
      " side_fields { name: \"experts\" dtype: \"int16\" inner_shape: [4, 2] layer_axis: true }";
  EXPECT_THAT(with(" model { num_layers: 4 }" + experts + experts), HasSubstr("'experts' twice"));
  EXPECT_THAT(with(experts),
              HasSubstr("jobs[0].side_fields[0].layer_axis: needs model.num_layers"));
  EXPECT_THAT(with(" model { num_layers: 6 }" + experts),
              HasSubstr("the layer axis holds 4 layers; the model has 6"));
  EXPECT_THAT(with(" side_fields { name: \"tokens\" dtype: \"int16\" }"),
              HasSubstr("'tokens' is a THD field"));
  EXPECT_THAT(with(" side_fields { name: \"x\" dtype: \"int16\" pad_value: 1.5 }"),
              HasSubstr("pad_value: 1.5 is not a int16"));
  EXPECT_THAT(with(" side_fields { name: \"x\" dtype: \"float64\" }"),
              HasSubstr("side_fields[0].dtype: 'float64' is not one of"));
  EXPECT_THAT(with(" side_fields { name: \"x\" dtype: \"uint8\" inner_shape: [1, 2, 3] }"),
              HasSubstr("at most two dimensions"));
  std::string vpp(kJob);
  vpp.replace(vpp.find("dp: 2 }"), 7, "dp: 2 vpp: 2 }");
  EXPECT_THAT(Message(vpp), HasSubstr("topology.vpp: needs topology.pp > 1"));
  EXPECT_THAT(with(" datasets { prefix: \"b\" side_field_prefixes { key: \"y\" value: \"z\" } }"),
              HasSubstr("'y' is not a side field of the job"));
}

TEST(DaemonConfigTest, SyntaxErrorsGiveLineAndColumn) {
  EXPECT_THAT(Message("jobs { name: }"), HasSubstr("c.textproto:1:"));
  EXPECT_THAT(Message("jobz {}"), HasSubstr("jobz"));
  EXPECT_THAT(Message(""), HasSubstr("at least one job"));
}

TEST(DaemonConfigTest, InvalidFieldsAreNamedByPath) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text(kJob);
    text.replace(text.find(from), from.size(), to);
    return Message(text);
  };
  EXPECT_THAT(with("name: \"pretrain\"", "name: \"a b\""), HasSubstr("jobs[0].name"));
  EXPECT_THAT(with("datasets { prefix: \"/data/a\" }", ""), HasSubstr("jobs[0].datasets"));
  EXPECT_THAT(with("prefix: \"/data/a\"", "weight: 1"), HasSubstr("datasets[0].prefix"));
  EXPECT_THAT(with("prefix: \"/data/a\"", "prefix: \"a\" weight: -1"),
              HasSubstr("datasets[0].weight"));
  EXPECT_THAT(with("global_batch: 16", "global_batch: 0"), HasSubstr("jobs[0].global_batch"));
  EXPECT_THAT(with("seq_length: 256", ""), HasSubstr("jobs[0].seq_length"));
  EXPECT_THAT(with("\"dynamic_cp\"", "\"fastest\""), HasSubstr("jobs[0].scheduler.kind"));
  EXPECT_THAT(with("max_tokens_per_rank: 128", ""),
              HasSubstr("jobs[0].scheduler.max_tokens_per_rank"));
  EXPECT_THAT(with("max_tokens_per_rank: 128", "max_tokens_per_rank: 128 min_cp: 3"),
              HasSubstr("scheduler.min_cp: 3 is not a power of two"));
  EXPECT_THAT(with("global_batch: 16", "global_batch: 16 local_ranks: [1, 99]"),
              HasSubstr("rank 99 is outside the world of 8"));
  EXPECT_THAT(with("global_batch: 16", "global_batch: 16 local_ranks: [1, 1]"),
              HasSubstr("listed twice"));
  EXPECT_THAT(with("\"dynamic_cp\"", "\"megatron_dp_balanced\""),
              HasSubstr("SAMPLER_MODE_SEQUENTIAL"));
  EXPECT_THAT(with("max_tokens_per_rank: 128", "max_tokens_per_rank: 128 objective: \"fast\""),
              HasSubstr("jobs[0].scheduler.objective: unknown objective 'fast'"));
  EXPECT_THAT(with("dp: 2 }", "dp: 2 ep: 3 }"),
              HasSubstr("jobs[0].topology.ep: 3 does not divide"));
  EXPECT_THAT(Message(std::string(kJob) + std::string(kJob)), HasSubstr("names two jobs"));
}

TEST(DaemonConfigTest, CostModelsAreCalibratedForTheTopology) {
  auto with = [](const std::string& scheduler_extra) {
    std::string text(kJob);
    const std::string from = "max_tokens_per_rank: 128";
    text.replace(text.find(from), from.size(), from + " " + scheduler_extra);
    return text;
  };
  // A preset and a custom shape, with and without rates, on TP 2.
  absl::StatusOr<v1::DaemonConfig> preset =
      ParseDaemonConfig(with("cost_model: \"llama8b\""), "c.textproto");
  ASSERT_TRUE(preset.ok()) << preset.status();
  const absl::StatusOr<scheduler::CostModel> llama =
      CostModelOf(preset->jobs(0).scheduler(), preset->jobs(0).topology());
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->Cost(4096, 2),
            scheduler::Calibrate(*scheduler::ModelPreset("llama8b"), {}, {2, 1, 1}).Cost(4096, 2));
  // A model in seconds chooses the inflation by cost: no cap unless given.
  EXPECT_DOUBLE_EQ(preset->jobs(0).scheduler().cp_upgrade_budget(), scheduler::kNoInflationCap);
  absl::StatusOr<v1::DaemonConfig> capped =
      ParseDaemonConfig(with("cost_model: \"llama8b\" cp_upgrade_budget: 0.2"), "c.textproto");
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_DOUBLE_EQ(capped->jobs(0).scheduler().cp_upgrade_budget(), 0.2);
  absl::StatusOr<v1::DaemonConfig> custom = ParseDaemonConfig(
      with("cost_model: \"custom\" model_shape { layers: 2 hidden: 8 heads: 2 ffn_hidden: 16 "
           "vocab: 10 } hardware { tflops: 1 microbatch_overhead_ms: 0 }"),
      "c.textproto");
  ASSERT_TRUE(custom.ok()) << custom.status();
  scheduler::Hardware rates;
  rates.tflops = 1;
  rates.microbatch_overhead_ms = 0;
  EXPECT_EQ(CostModelOf(custom->jobs(0).scheduler(), custom->jobs(0).topology())->Cost(64, 2),
            scheduler::Calibrate({2, 8, 2, 2, 16, 10, true}, rates, {2, 1, 1}).Cost(64, 2));

  EXPECT_THAT(Message(with("cost_model: \"custom\"")), HasSubstr("needs model_shape"));
  EXPECT_THAT(Message(with("cost_model: \"llama8b\" model_shape { layers: 1 }")),
              HasSubstr("model_shape is only for cost_model \"custom\""));
  EXPECT_THAT(Message(with("hardware { tflops: 100 }")),
              HasSubstr("jobs[0].scheduler.cost_model: hardware has no meaning"));
  EXPECT_THAT(Message(with("cost_model: \"llama8b\" hardware { tflops: 0 }")),
              HasSubstr("hardware.tflops = 0 must be > 0"));
  EXPECT_THAT(Message(with("cost_model: \"llama8b\" hardware { cp_latency_us: -1 }")),
              HasSubstr("hardware.cp_latency_us = -1 must be >= 0"));
  EXPECT_THAT(
      Message(with("cost_model: \"custom\" model_shape { hidden: 8 heads: 2 ffn_hidden: 16 }")),
      HasSubstr("model_shape.layers must be >= 1"));
  EXPECT_THAT(Message(with("cost_model: \"gpt5\"")), HasSubstr("unknown cost model 'gpt5'"));

  // The rates themselves (a fitted model pinned), in seconds.
  absl::StatusOr<v1::DaemonConfig> pinned = ParseDaemonConfig(
      with("cost_model: \"rates\" rates { alpha: 1e-9 beta: 2e-6 kappa: 1e-6 lambda: 0.002 "
           "mu: 0.004 }"),
      "c.textproto");
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  const absl::StatusOr<scheduler::CostModel> given =
      CostModelOf(pinned->jobs(0).scheduler(), pinned->jobs(0).topology());
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->alpha, 1e-9);
  EXPECT_EQ(given->lambda, 0.002);
  EXPECT_EQ(given->microbatch, 0.004);
  EXPECT_DOUBLE_EQ(pinned->jobs(0).scheduler().cp_upgrade_budget(), scheduler::kNoInflationCap);
  EXPECT_THAT(Message(with("cost_model: \"rates\"")),
              HasSubstr("cost_model \"rates\" needs rates"));
  EXPECT_THAT(Message(with("rates { alpha: 1 }")),
              HasSubstr("rates are only for cost_model \"rates\""));
  EXPECT_THAT(Message(with("cost_model: \"rates\" rates { alpha: 1 kappa: -1 }")),
              HasSubstr("rates.kappa = -1 must be a finite number >= 0"));
  EXPECT_THAT(Message(with("cost_model: \"rates\" rates { mu: 1 }")),
              HasSubstr("alpha or beta must be > 0"));
}

TEST(DaemonConfigTest, PackingThreadsAreBounded) {
  EXPECT_THAT(Message(absl::StrCat("packing_threads: 65\n", kJob)),
              HasSubstr("packing_threads: 65 threads per job; at most 64"));
  auto config = ParseDaemonConfig(absl::StrCat("packing_threads: 64\n", kJob), "test");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->packing_threads(), 64u);
}

TEST(DaemonConfigTest, RanksOverTcpNeedTheAddressAndEveryJobsToken) {
  constexpr absl::string_view kTcp =
      "admin_tcp_address: \"10.0.0.1:7070\"\nadmin_tcp_token: \"s\"\nranks_over_tcp: true\n";
  EXPECT_THAT(Message(absl::StrCat("ranks_over_tcp: true\n", kJob)),
              HasSubstr("ranks_over_tcp: ranks attach over admin_tcp_address, which is not set"));
  EXPECT_THAT(Message(absl::StrCat(kTcp, kJob)),
              HasSubstr("ranks_over_tcp: job 'pretrain' has no auth_token"));
  std::string with_token(kJob);
  with_token.replace(with_token.find("eod_id"), 0, "auth_token: \"t\"\n  ");
  // Without TLS, only with the opt-in that names the risk.
  EXPECT_THAT(Message(absl::StrCat(kTcp, with_token)),
              HasSubstr("ranks_over_tcp without admin_tls: every job token and rank connection "
                        "key would cross the network in cleartext; set admin_tls, or "
                        "ranks_over_tcp_without_tls: true"));
  auto config = ParseDaemonConfig(
      absl::StrCat(kTcp, "ranks_over_tcp_without_tls: true\n", with_token), "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->ranks_over_tcp());
}

TEST(DaemonConfigTest, PeersNeedAnAdminTcpAddressWithAToken) {
  EXPECT_THAT(Message(absl::StrCat("peers: \"10.0.0.2:7070\"\n", kJob)),
              HasSubstr("peers: peers check each other, so admin_tcp_address must be set"));
  EXPECT_THAT(Message(absl::StrCat("admin_tcp_address: \"10.0.0.1:7070\"\n", kJob)),
              HasSubstr("admin_tcp_token: required with admin_tcp_address"));
  EXPECT_TRUE(ParseDaemonConfig(absl::StrCat("peers: \"10.0.0.2:7070\"\n"
                                             "admin_tcp_address: \"10.0.0.1:7070\"\n"
                                             "admin_tcp_token: \"s\"\n",
                                             kJob),
                                "c.textproto")
                  .ok());
}

TEST(DaemonConfigTest, IngestPeerTimesHaveDefaultsAndRanges) {
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(kJob, "c.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ingest_peers().room_wait_ms(), 30'000u);
  EXPECT_EQ(config->ingest_peers().forward_timeout_ms(), 60'000u);
  EXPECT_EQ(config->ingest_peers().seal_wait_ms(), 10'000u);
  EXPECT_EQ(config->ingest_peers().sync_interval_ms(), 500u);
  config = ParseDaemonConfig(absl::StrCat("ingest_peers { room_wait_ms: 1000 }\n", kJob), "c");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ingest_peers().forward_timeout_ms(), 31'000u);  // follows the room wait
  for (const auto& [field, message] : std::vector<std::pair<std::string, std::string>>{
           {"room_wait_ms: 3600001", "ingest_peers.room_wait_ms: 3600001 is out of [1, 3600000]"},
           {"room_wait_ms: 5000 forward_timeout_ms: 5000",
            "ingest_peers.forward_timeout_ms: 5000 is out of [5001, 3900000]"},
           {"seal_wait_ms: 4000000", "ingest_peers.seal_wait_ms: 4000000 is out of"},
           {"sync_interval_ms: 10", "ingest_peers.sync_interval_ms: 10 is out of [50, 60000]"}}) {
    EXPECT_THAT(Message(absl::StrCat("ingest_peers { ", field, " }\n", kJob)), HasSubstr(message))
        << field;
  }
}

TEST(DaemonConfigTest, AdminTlsNeedsTheTcpListenerAndAllThreeFiles) {
  EXPECT_THAT(Message(absl::StrCat(
                  "admin_tls { cert_file: \"c\" key_file: \"k\" ca_file: \"a\" }\n", kJob)),
              HasSubstr("admin_tls: secures admin_tcp_address, which is not set"));
  EXPECT_THAT(Message(absl::StrCat("admin_tcp_address: \"10.0.0.1:7070\"\n"
                                   "admin_tcp_token: \"s\"\n"
                                   "admin_tls { cert_file: \"c\" ca_file: \"a\" }\n",
                                   kJob)),
              HasSubstr("admin_tls.key_file: required with admin_tls"));
}

}  // namespace
}  // namespace packfeed::server
