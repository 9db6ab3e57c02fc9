#include "server/pipeline/job_kind.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fetch_needs.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/dataset_generator.h"
#include "server/config/daemon_config.h"
#include "server/ingest/ingest_stream.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {
namespace {

constexpr int kRanks = 4;  // DP 4

class JobKindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = temp_.Prefix("gpt");
    // Documents of 5 to 101 tokens: a 128-token pretraining sample spans
    // several, so a hybrid-CP sample is cut into several pieces.
    std::vector<int64_t> lengths;
    for (int i = 0; i < 300; ++i) lengths.push_back(5 + (i * 53) % 97);
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix_, lengths, {}).ok());
  }

  // A job over the dataset of `kind` (DATASET_KIND_...) with `body`.
  std::unique_ptr<Job> MakeJob(const std::string& kind, const std::string& body,
                               const std::string& extra = "", IngestStream* stream = nullptr) {
    const std::string datasets = stream != nullptr ? ""
                                                   : absl::StrCat("datasets { prefix: \"", prefix_,
                                                                  "\" kind: ", kind, " } ");
    absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
        absl::StrCat("jobs { name: \"j\" ", datasets, "topology { dp: ", kRanks,
                     "} global_batch: 8 seq_length: 128 eod_id: 0 ", body, " }", extra),
        "test");
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<Job>> job =
        JobOfConfig(config->jobs(0), OpenDatasetAlone, stream);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : nullptr;
  }

  static constexpr const char* kPretraining =
      "pretraining { split: \"1,0,0\" train_samples: 32 micro_batch_size: 1 ";
  static constexpr const char* kHybridCp =
      "scheduler { kind: \"dynamic_cp\" max_tokens_per_rank: 64 } "
      "pretraining { split: \"1,0,0\" train_samples: 32 micro_batch_size: 1 "
      "inter_document_masking: true hybrid_context_parallel: true }";

  static std::vector<int> AllRanks() { return {0, 1, 2, 3}; }

  packfeed::testing::ScopedTempDir temp_;
  std::string prefix_;
};

TEST_F(JobKindTest, EachConfigurationChoosesItsKind) {
  auto kind_of = [](const std::unique_ptr<Job>& job) {
    return job == nullptr ? std::string("no job") : std::string(job->kind().name());
  };
  constexpr const char* kScheduler = "scheduler { max_tokens_per_rank: 256 } ";
  EXPECT_EQ(kind_of(MakeJob("DATASET_KIND_VARLEN", kScheduler)), "documents");
  EXPECT_EQ(kind_of(MakeJob("DATASET_KIND_PRETRAINING", absl::StrCat(kPretraining, "}"))),
            "pretraining");
  EXPECT_EQ(kind_of(MakeJob("DATASET_KIND_PRETRAINING",
                            absl::StrCat(kPretraining, "inter_document_masking: true }"))),
            "pretraining");
  EXPECT_EQ(kind_of(MakeJob("DATASET_KIND_PRETRAINING", kHybridCp)), "hybrid_cp");
  IngestStream stream("rollouts", "", std::vector<SideFieldInfo>{}, 0);
  EXPECT_EQ(kind_of(MakeJob("", absl::StrCat(kScheduler, "ingest_stream: \"rollouts\""),
                            " ingest_streams { name: \"rollouts\" }", &stream)),
            "ingest");
}

// What the runner asks a kind: only an ingest job's samples are in memory
// once its step exists; it joins its stream's consumers when its runner
// starts (Connect), and tells the stream what its ranks consumed.
TEST_F(JobKindTest, OnlyAnIngestJobJoinsItsStreamAndReportsConsumption) {
  constexpr const char* kScheduler = "scheduler { max_tokens_per_rank: 256 } ";
  std::unique_ptr<Job> documents = MakeJob("DATASET_KIND_VARLEN", kScheduler);
  std::unique_ptr<Job> hybrid = MakeJob("DATASET_KIND_PRETRAINING", kHybridCp);
  IngestStream stream("rollouts", "", std::vector<SideFieldInfo>{}, 0);
  std::unique_ptr<Job> ingest = MakeJob("", absl::StrCat(kScheduler, "ingest_stream: \"rollouts\""),
                                        " ingest_streams { name: \"rollouts\" }", &stream);
  ASSERT_NE(documents, nullptr);
  ASSERT_NE(hybrid, nullptr);
  ASSERT_NE(ingest, nullptr);
  EXPECT_FALSE(documents->kind().SamplesInMemory());
  EXPECT_FALSE(hybrid->kind().SamplesInMemory());
  EXPECT_TRUE(ingest->kind().SamplesInMemory());

  EXPECT_TRUE(stream.Stats().consumers.empty());
  int woken = 0;
  ingest->kind().Connect(*ingest, [&woken] { ++woken; });
  ASSERT_EQ(stream.Stats().consumers.size(), 1u);
  EXPECT_EQ(stream.Stats().consumers[0].job, "j");
  ingest->kind().Consumed(*ingest, 3);
  EXPECT_EQ(stream.Stats().consumers[0].consumed_before, 3);
  // The other kinds have no stream to join or tell.
  documents->kind().Connect(*documents, [&woken] { ++woken; });
  documents->kind().Consumed(*documents, 3);
  EXPECT_EQ(stream.Stats().consumers.size(), 1u);
}

// Each kind bounds its slots: the batch's sequences, or one per token when
// documents cut a pretraining row; groups under dynamic CP; hybrid CP's
// sample ids.
TEST_F(JobKindTest, EachKindBoundsItsSlots) {
  const std::unique_ptr<Job> documents =
      MakeJob("DATASET_KIND_VARLEN", "scheduler { max_tokens_per_rank: 256 }");
  const std::unique_ptr<Job> rows =
      MakeJob("DATASET_KIND_PRETRAINING", absl::StrCat(kPretraining, "}"));
  const std::unique_ptr<Job> masked = MakeJob(
      "DATASET_KIND_PRETRAINING", absl::StrCat(kPretraining, "inter_document_masking: true }"));
  const std::unique_ptr<Job> hybrid = MakeJob("DATASET_KIND_PRETRAINING", kHybridCp);
  ASSERT_TRUE(documents && rows && masked && hybrid);

  const SlotBounds plain = documents->kind().BoundsOf(*documents);
  EXPECT_EQ(plain.max_tokens, 256);
  EXPECT_EQ(plain.max_sequences, 8);  // global_batch
  EXPECT_EQ(plain.group_ranks, 0);
  EXPECT_FALSE(plain.sample_ids);
  EXPECT_EQ(rows->kind().BoundsOf(*rows).max_sequences, 8);
  const SlotBounds cut = masked->kind().BoundsOf(*masked);
  EXPECT_EQ(cut.max_sequences, cut.max_tokens);  // one sequence per token
  EXPECT_GT(cut.max_sequences, 8);
  const SlotBounds pieces = hybrid->kind().BoundsOf(*hybrid);
  EXPECT_EQ(pieces.max_tokens, 64);
  EXPECT_EQ(pieces.max_sequences, 64);
  EXPECT_EQ(pieces.group_ranks, kRanks);  // dynamic CP over DP 4
  EXPECT_TRUE(pieces.sample_ids);
}

// A Megatron sample cut into pieces is read once, every piece gets the
// sample's run, and each is served its own span of it: its inputs and the
// label of its last (the next token).
TEST_F(JobKindTest, AHybridCpSampleIsReadOnceAndEachPieceServedItsSpan) {
  const std::unique_ptr<Job> job = MakeJob("DATASET_KIND_PRETRAINING", kHybridCp);
  ASSERT_NE(job, nullptr);
  const JobKind& kind = job->kind();
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->samples.size(), 8u) << "the 8 samples were cut into pieces";

  const StepNeeds needs = NeedsOfStep(*job, *plan, AllRanks());
  std::set<int64_t> read;
  for (int64_t sample : needs.samples) {
    EXPECT_TRUE(read.insert(plan->samples[static_cast<size_t>(sample)].index).second)
        << "Megatron sample " << plan->samples[static_cast<size_t>(sample)].index << " read twice";
  }
  EXPECT_EQ(read.size(), 8u);

  const StepData data = AssembleStep(*job, *plan, needs.samples, needs.counts, FetchNeeds(needs));
  EXPECT_TRUE(data.failed.empty());
  ASSERT_EQ(data.runs.size(), plan->samples.size());
  for (size_t s = 0; s < plan->samples.size(); ++s) {
    const absl::Span<const int64_t> run = data.runs.at(static_cast<int64_t>(s)).tokens();
    EXPECT_EQ(static_cast<int64_t>(run.size()), job->spec().seq_length + 1)
        << "piece " << s << " has its whole sample's run";
    absl::StatusOr<absl::Span<const int64_t>> tokens =
        kind.TokensOf(data.plan, static_cast<int64_t>(s), run);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    const scheduler::TokenRange piece = plan->pieces[s];
    EXPECT_EQ(tokens->data(), run.data() + piece.begin);
    EXPECT_EQ(static_cast<int64_t>(tokens->size()), piece.end + 1 - piece.begin);
  }
}

// A failed read fails every piece it would have served, naming the sample.
TEST_F(JobKindTest, AFailedHybridCpReadFailsEveryPieceOfItsSample) {
  const std::unique_ptr<Job> job = MakeJob("DATASET_KIND_PRETRAINING", kHybridCp);
  ASSERT_NE(job, nullptr);
  absl::StatusOr<StepPlan> plan = PlanStep(*job, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const StepNeeds needs = NeedsOfStep(*job, *plan, AllRanks());
  std::vector<FetchedSample> fetched = FetchNeeds(needs);
  for (FetchedSample& one : fetched) one.status = absl::DataLossError("gpt.bin: truncated");
  const StepData data = AssembleStep(*job, *plan, needs.samples, needs.counts, fetched);
  EXPECT_TRUE(data.runs.empty());
  ASSERT_EQ(data.failed.size(), plan->samples.size());
  for (const auto& [piece, status] : data.failed) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(status.message(),
              absl::StrCat(prefix_, " sample ", plan->samples[static_cast<size_t>(piece)].index,
                           ": gpt.bin: truncated"));
  }
}

}  // namespace
}  // namespace packfeed::server
