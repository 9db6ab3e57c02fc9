#include "server/ctl/pretraining_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/dataset/npy_file.h"
#include "packfeed/dataset/pretraining_indices.h"
#include "packfeed/scheduler/cell_balance.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/batch_schedule.h"
#include "server/config/daemon_config.h"
#include "server/config/job_config.h"
#include "server/ctl/exit_code.h"

namespace packfeed::server::ctl {
namespace {

// Megatron's pad id when the tokenizer has none: the tokens of a partial
// sample are filled with it.
constexpr int64_t kMegatronPad = -1;

struct PretrainingArgs {
  std::string config;
  std::string job;
  int64_t first = 0;
  int64_t count = 0;
  std::string tokens_out;
  std::string indices_dir;
  int64_t model_steps = 0;
};

absl::StatusOr<v1::JobConfig> FindJob(const PretrainingArgs& args) {
  PF_ASSIGN_OR_RETURN(const v1::DaemonConfig config, LoadDaemonConfig(args.config));
  for (const v1::JobConfig& job : config.jobs()) {
    if (!args.job.empty() && job.name() != args.job) continue;
    if (!IsPretrainingJob(job)) continue;
    return job;
  }
  return absl::NotFoundError(absl::StrCat(args.config, ": no pretraining job",
                                          args.job.empty() ? "" : " named ", args.job));
}

absl::Status WriteIndices(const dataset::PretrainingIndices& built, const std::string& dir) {
  for (int d = 0; d < built.num_datasets(); ++d) {
    const dataset::GptIndices& g = built.gpt_indices(d);
    std::vector<int64_t> documents(g.document_index.begin(), g.document_index.end());
    std::vector<int64_t> samples;
    for (const dataset::SampleStart& s : g.sample_index) {
      samples.push_back(s.document_position);
      samples.push_back(s.offset);
    }
    const auto n = static_cast<int64_t>(g.sample_index.size());
    const std::string at = absl::StrCat(dir, "/", d, "-");
    PF_RETURN_IF_ERROR(
        dataset::WriteNpy(at + "document_index.npy",
                          dataset::Int64Npy(documents, {static_cast<int64_t>(documents.size())})));
    PF_RETURN_IF_ERROR(
        dataset::WriteNpy(at + "sample_index.npy", dataset::Int64Npy(samples, {n, 2})));
    PF_RETURN_IF_ERROR(dataset::WriteNpy(at + "shuffle_index.npy",
                                         dataset::Int64Npy(g.shuffle_index, {g.num_samples()})));
  }
  if (built.blend().has_value()) {
    const dataset::BlendIndices& b = *built.blend();
    std::vector<int64_t> datasets(b.dataset_index.begin(), b.dataset_index.end());
    const auto n = static_cast<int64_t>(datasets.size());
    PF_RETURN_IF_ERROR(
        dataset::WriteNpy(dir + "/blend-dataset_index.npy", dataset::Int64Npy(datasets, {n})));
    PF_RETURN_IF_ERROR(dataset::WriteNpy(dir + "/blend-dataset_sample_index.npy",
                                         dataset::Int64Npy(b.dataset_sample_index, {n})));
  }
  return absl::OkStatus();
}

absl::Status WriteTokens(const dataset::PretrainingIndices& built,
                         const std::vector<dataset::IndexedDataset>& datasets,
                         const PretrainingArgs& args) {
  if (args.first < 0 || args.count < 0 || args.first + args.count > built.num_samples()) {
    return absl::InvalidArgumentError(absl::StrCat("samples [", args.first, ", ",
                                                   args.first + args.count, ") are outside the ",
                                                   built.num_samples(), " of the split"));
  }
  const int64_t width = built.sample_tokens();
  std::vector<int64_t> tokens(static_cast<size_t>(args.count * width), kMegatronPad);
  for (int64_t i = 0; i < args.count; ++i) {
    const dataset::PretrainingIndices::Sample sample = built.Locate(args.first + i);
    int64_t at = i * width;
    for (const dataset::SampleRun& run : sample.runs) {
      PF_RETURN_IF_ERROR(datasets[static_cast<size_t>(sample.dataset)].Read(
          static_cast<uint64_t>(run.sequence),
          absl::MakeSpan(tokens).subspan(static_cast<size_t>(at), static_cast<size_t>(run.length)),
          static_cast<uint64_t>(run.offset)));
      at += run.length;
    }
  }
  return dataset::WriteNpy(args.tokens_out, dataset::Int64Npy(tokens, {args.count, width}));
}

// The modelled step time of `steps` steps under document-masked attention
// (the job's cost model per document piece, ranks meeting after every
// microbatch), in Megatron's order and balanced (balance_document_attention).
absl::Status ModelSteps(const v1::JobConfig& job, const dataset::PretrainingIndices& built,
                        int64_t steps) {
  PF_ASSIGN_OR_RETURN(const scheduler::CostModel model,
                      CostModelOf(job.scheduler(), job.topology()));
  const BatchSchedule schedule = BatchSchedule::Of(job);
  const int per_cell = static_cast<int>(job.pretraining().micro_batch_size());
  const int dp = static_cast<int>(job.topology().dp());
  if (schedule.At(steps).first_sample > built.num_samples()) {
    return absl::InvalidArgumentError(
        absl::StrCat(steps, " steps need more than the split's ", built.num_samples(), " samples"));
  }
  double megatron = 0, balanced = 0, ideal = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const auto [first, global_batch] = schedule.At(step);
    std::vector<double> costs;
    for (int64_t k = 0; k < global_batch; ++k) {
      std::vector<int64_t> pieces;
      for (const dataset::SampleRun& run : built.Locate(first + k).runs) {
        pieces.push_back(run.length);
      }
      costs.push_back(scheduler::DocumentMaskedCost(pieces, model));
      ideal += costs.back() / dp;
    }
    std::vector<int64_t> identity(costs.size());
    for (size_t k = 0; k < identity.size(); ++k) identity[k] = static_cast<int64_t>(k);
    megatron += scheduler::BarrierStepCost(costs, identity, dp, per_cell);
    const int cells = static_cast<int>(global_batch / per_cell);
    balanced += scheduler::BarrierStepCost(costs, scheduler::BalanceCells(costs, cells, per_cell),
                                           dp, per_cell);
  }
  std::printf(
      "document-masked attention, %lld steps, DP %d, micro_batch_size %d: modelled step time "
      "over perfect balance %.4f in Megatron's order, %.4f balanced (%.1f %% faster)\n",
      static_cast<long long>(steps), dp, per_cell, megatron / ideal, balanced / ideal,
      100.0 * (megatron / balanced - 1.0));
  return absl::OkStatus();
}

absl::Status PretrainingSamples(const PretrainingArgs& args) {
  PF_ASSIGN_OR_RETURN(const v1::JobConfig job, FindJob(args));
  std::vector<dataset::IndexedDataset> datasets;
  std::vector<std::vector<int32_t>> lengths;
  for (const v1::DatasetSpec& spec : job.datasets()) {
    PF_ASSIGN_OR_RETURN(dataset::IndexedDataset opened,
                        dataset::IndexedDataset::Open(spec.prefix()));
    std::vector<int32_t>& l = lengths.emplace_back(opened.num_sequences());
    for (uint64_t s = 0; s < opened.num_sequences(); ++s) l[s] = opened.sequence_length(s);
    datasets.push_back(std::move(opened));
  }
  std::vector<absl::Span<const int32_t>> spans(lengths.begin(), lengths.end());
  const dataset::MegatronSplit split = ServedSplitOf(job);
  const auto start = std::chrono::steady_clock::now();
  PF_ASSIGN_OR_RETURN(const dataset::PretrainingIndices built,
                      dataset::PretrainingIndices::Build(
                          spans, PretrainingOptionsOf(job), split,
                          static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("job %s, %s split: %lld samples of %lld tokens (indices built in %.3f s)\n",
              job.name().c_str(), std::string(dataset::MegatronSplitName(split)).c_str(),
              static_cast<long long>(built.num_samples()),
              static_cast<long long>(built.sample_tokens()), seconds);
  for (int d = 0; d < built.num_datasets(); ++d) {
    const dataset::GptIndices& g = built.gpt_indices(d);
    std::printf("  dataset %d %s: sequences [%lld, %lld), %d epoch(s)%s, %lld samples%s\n", d,
                job.datasets(d).prefix().c_str(), static_cast<long long>(built.sequences(d).first),
                static_cast<long long>(built.sequences(d).second), g.num_epochs,
                g.separate_final_epoch ? " (final one shuffled apart)" : "",
                static_cast<long long>(g.num_samples()),
                built.from_cache(d) ? " (read from Megatron's cache)" : "");
  }
  if (!args.indices_dir.empty()) PF_RETURN_IF_ERROR(WriteIndices(built, args.indices_dir));
  if (args.model_steps > 0) PF_RETURN_IF_ERROR(ModelSteps(job, built, args.model_steps));
  if (!args.tokens_out.empty()) PF_RETURN_IF_ERROR(WriteTokens(built, datasets, args));
  return absl::OkStatus();
}

}  // namespace

void AddPretrainingCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PretrainingArgs>();
  CLI::App* sub = app.add_subcommand(
      "pretraining-samples",
      "a pretraining job's split as Megatron-Core numbers it: counts, tokens, indices");
  sub->add_option("--config", args->config, "the daemon's configuration file")->required();
  sub->add_option("--job", args->job, "the job (default: the first pretraining job)");
  sub->add_option("--first", args->first, "first sample written to --tokens");
  sub->add_option("--count", args->count, "samples written to --tokens");
  sub->add_option("--tokens", args->tokens_out,
                  "write the samples' tokens here, int64 [count, seq_length + 1], as .npy");
  sub->add_option("--indices-dir", args->indices_dir,
                  "write every index array here as .npy (D-document_index, D-sample_index, "
                  "D-shuffle_index, blend-dataset_index, blend-dataset_sample_index)");
  sub->add_option("--model-steps", args->model_steps,
                  "print the modelled step time of this many steps under document-masked "
                  "attention, Megatron's order against balance_document_attention");
  sub->callback([args, exit_code] { *exit_code = ExitCode(PretrainingSamples(*args)); });
}

}  // namespace packfeed::server::ctl
