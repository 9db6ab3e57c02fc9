#include "server/ctl/plan_command.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "nlohmann/json.hpp"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/planner.h"
#include "packfeed/scheduler/sampler.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/daemon_config.h"
#include "server/config/job_config.h"
#include "server/ctl/exit_code.h"
#include "server/ctl/plan_replay.h"

namespace packfeed::server::ctl {
namespace {

struct PlanArgs {
  std::string config;  // a packfeedd configuration: plan its job `job`
  std::string job;
  std::string lengths_file;
  std::string dataset;
  int64_t seed = -1;  // < 0: the file's or dataset's own order
  int64_t global_batch = 256;
  int dp = 1;
  int cp = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int vpp = 0;
  int64_t max_tokens_per_rank = 0;
  std::string scheduler = "balanced";
  int min_cp = 0;
  int max_cp = 0;
  double cp_upgrade_budget = -1;  // the job's default for the cost model
  std::string objective = "barrier";
  int ep = 1;
  std::string cost_model = "megatron";
  std::string model_shape;  // text format of v1::ModelShape
  std::string hardware;     // text format of v1::HardwareRates
  int pp = 1;
  int virtual_stages = 1;
  int64_t steps = 0;  // 0: every whole global batch of the file
  std::string dump_plan;
  std::string plot;  // PNG or SVG of step plot_step's plan
  int64_t plot_step = 0;
  bool json = false;
};

// A configured job's sample: the sampler's reference and where it lies.
struct PlacedSample {
  scheduler::SampleRef ref;
  dataset::SampleTable::Piece piece;
};

// With `samples` (a configured job's batch), each sequence also names its
// stored sample as the daemon's plan-step does.
nlohmann::json PlanToJson(const scheduler::GlobalPlan& plan,
                          const std::vector<PlacedSample>* samples) {
  nlohmann::json microbatches = nlohmann::json::array();
  for (const scheduler::PlannedMicrobatch& microbatch : plan.microbatches) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < plan.dp_cp_size; ++r) {
      const scheduler::CpGroup& group = scheduler::GroupOfRank(microbatch, r);
      nlohmann::json sequences = nlohmann::json::array();
      for (const scheduler::PlannedSequence& s : group.sequences) {
        nlohmann::json sequence = {{"sample", s.sample},
                                   {"length", s.length},
                                   {"padded_length", s.padded_length},
                                   {"cp_size", group.size},
                                   {"cp_group", group.first_rank / group.size}};
        if (samples != nullptr) {
          const PlacedSample& placed = (*samples)[static_cast<size_t>(s.sample)];
          sequence["dataset"] = placed.ref.dataset;
          sequence["document"] = placed.piece.document;
          if (placed.piece.first_token > 0) sequence["first_token"] = placed.piece.first_token;
          sequence["epoch"] = placed.ref.epoch;
        }
        sequences.push_back(std::move(sequence));
      }
      ranks.push_back(sequences);
    }
    microbatches.push_back(ranks);
  }
  return microbatches;
}

// The lengths to replay, batch after batch: the file's or dataset's own
// order, or with --seed the order packfeed's sampler draws (shuffled per
// epoch), as a job would see it.
absl::StatusOr<std::vector<int64_t>> LoadLengths(const PlanArgs& args) {
  if (args.dataset.empty() == args.lengths_file.empty()) {
    return absl::InvalidArgumentError("give exactly one of --lengths and --dataset");
  }
  std::vector<int64_t> stored;
  if (!args.dataset.empty()) {
    PF_ASSIGN_OR_RETURN(dataset::IndexedDataset dataset,
                        dataset::IndexedDataset::Open(args.dataset));
    stored.reserve(dataset.num_sequences());
    for (uint64_t i = 0; i < dataset.num_sequences(); ++i) {
      stored.push_back(dataset.sequence_length(i));
    }
  } else {
    PF_ASSIGN_OR_RETURN(stored, dataset::ReadLengthsFile(args.lengths_file));
  }
  if (args.seed < 0) return stored;
  PF_ASSIGN_OR_RETURN(scheduler::Sampler sampler,
                      scheduler::Sampler::Create({{{static_cast<int64_t>(stored.size()), 1.0}},
                                                  args.global_batch,
                                                  static_cast<uint64_t>(args.seed),
                                                  /*shuffle=*/true}));
  std::vector<int64_t> drawn;
  const int64_t steps = static_cast<int64_t>(stored.size()) / args.global_batch;
  for (int64_t step = 0; step < steps; ++step) {
    for (const scheduler::SampleRef& ref : sampler.GlobalBatch(step)) {
      drawn.push_back(stored[static_cast<size_t>(ref.index)]);
    }
  }
  return drawn;
}

// The planner's model when it is calibrated, else the llama8b preset on the
// same topology and hardware: what every plan is judged by beside s²/c.
absl::StatusOr<scheduler::CostModel> CalibratedJudge(const scheduler::CostModel& planner,
                                                     v1::SchedulerConfig scheduler,
                                                     const v1::Topology& topology) {
  if (planner.ModelsOverheads()) return planner;
  scheduler.set_cost_model("llama8b");
  scheduler.clear_model_shape();
  return CostModelOf(scheduler, topology);
}

// A configured job's first `steps` global batches (0 = 1), drawn and
// measured exactly as packfeedd plans them: the same sampler, sample rules
// and planner options (server/config/job_config.h).
struct ConfiguredBatches {
  ReplayOptions options;
  std::vector<int64_t> lengths;
  std::vector<std::vector<PlacedSample>> samples;  // by step
};

absl::StatusOr<ConfiguredBatches> LoadConfiguredBatches(const PlanArgs& args) {
  PF_ASSIGN_OR_RETURN(v1::DaemonConfig config, LoadDaemonConfig(args.config));
  const v1::JobConfig* job = nullptr;
  for (const v1::JobConfig& candidate : config.jobs()) {
    if (candidate.name() == args.job || (args.job.empty() && config.jobs_size() == 1)) {
      job = &candidate;
    }
  }
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat(args.config, ": no job '", args.job,
                                            "' (--job is required with several jobs)"));
  }
  if (IsPretrainingJob(*job)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", job->name(),
        " serves Megatron pretraining batches, whose layout is Megatron's and not planned; "
        "`packfeedctl pretraining-samples` shows its samples, `plan-step` a running "
        "daemon's steps"));
  }
  ConfiguredBatches out;
  PF_ASSIGN_OR_RETURN(out.options.planner, PlannerOptionsOf(*job));
  PF_ASSIGN_OR_RETURN(
      out.options.calibrated_model,
      CalibratedJudge(out.options.planner.cost_model, job->scheduler(), job->topology()));
  out.options.global_batch = job->global_batch();
  out.options.steps = std::max<int64_t>(args.steps, 1);
  const dataset::SampleRules rules = SampleRulesOf(*job);
  std::vector<dataset::IndexedDataset> datasets;
  std::vector<dataset::SampleTable> tables;
  std::vector<int64_t> num_samples;
  for (const v1::DatasetSpec& spec : job->datasets()) {
    PF_ASSIGN_OR_RETURN(dataset::IndexedDataset opened,
                        dataset::IndexedDataset::Open(spec.prefix()));
    PF_ASSIGN_OR_RETURN(dataset::SampleTable table,
                        dataset::SampleTable::Build(opened.index(), rules, spec.prefix() + ".idx"));
    tables.push_back(std::move(table));
    num_samples.push_back(tables.back().num_samples());
    datasets.push_back(std::move(opened));
  }
  PF_ASSIGN_OR_RETURN(scheduler::Sampler sampler,
                      scheduler::Sampler::Create(SamplerOptionsOf(*job, num_samples)));
  for (int64_t step = 0; step < out.options.steps; ++step) {
    std::vector<PlacedSample>& placed = out.samples.emplace_back();
    for (const scheduler::SampleRef& ref : sampler.GlobalBatch(step)) {
      const auto d = static_cast<size_t>(ref.dataset);
      placed.push_back({ref, tables[d].Locate(ref.index)});
      out.lengths.push_back(
          dataset::PlannedLength(datasets[d].index(), placed.back().piece, rules));
    }
  }
  return out;
}

absl::StatusOr<ReplayOptions> OptionsFromFlags(const PlanArgs& args) {
  ReplayOptions options;
  PF_ASSIGN_OR_RETURN(options.planner.kind, scheduler::SchedulerKindFromName(args.scheduler));
  v1::SchedulerConfig scheduler;
  scheduler.set_cost_model(args.cost_model);
  const auto parse = [](const char* flag, const std::string& text,
                        google::protobuf::Message* message) -> absl::Status {
    if (google::protobuf::TextFormat::ParseFromString(text, message)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", text, "' is not valid"));
  };
  if (!args.model_shape.empty()) {
    PF_RETURN_IF_ERROR(parse("--model-shape", args.model_shape, scheduler.mutable_model_shape()));
  }
  if (!args.hardware.empty()) {
    PF_RETURN_IF_ERROR(parse("--hardware", args.hardware, scheduler.mutable_hardware()));
  }
  v1::Topology topology;
  topology.set_tp(static_cast<uint32_t>(args.tp));
  topology.set_pp(static_cast<uint32_t>(args.pp));
  topology.set_vpp(static_cast<uint32_t>(args.virtual_stages));
  PF_ASSIGN_OR_RETURN(options.planner.cost_model, CostModelOf(scheduler, topology));
  PF_ASSIGN_OR_RETURN(options.calibrated_model,
                      CalibratedJudge(options.planner.cost_model, scheduler, topology));
  options.planner.dp = args.dp;
  options.planner.cp = args.cp;
  options.planner.tp = args.tp;
  options.planner.sequence_parallel = args.sequence_parallel;
  options.planner.vpp_group_size = args.vpp;
  options.planner.max_tokens_per_rank = args.max_tokens_per_rank;
  options.planner.min_cp = args.min_cp;
  options.planner.max_cp = args.max_cp;
  options.planner.cp_upgrade_budget = args.cp_upgrade_budget >= 0
                                          ? args.cp_upgrade_budget
                                          : DefaultCpUpgradeBudget(args.cost_model, false);
  PF_ASSIGN_OR_RETURN(options.planner.objective, scheduler::ObjectiveFromName(args.objective));
  options.planner.execution.expert_parallel = args.ep;
  // A trace or a dataset replayed in stored order is Megatron's global
  // batches, gid by gid; batches drawn with --seed are sampler positions.
  options.planner.lengths_in_megatron_order = args.seed < 0;
  options.global_batch = args.global_batch;
  options.steps = args.steps;
  return options;
}

nlohmann::ordered_json CoefficientsJson(const scheduler::CostModel& model) {
  return {{"alpha", model.alpha},           {"beta", model.beta},
          {"kappa", model.kappa},           {"lambda", model.lambda},
          {"microbatch", model.microbatch}, {"bubble", model.bubble}};
}

// plot_plan.py's input: per microbatch, each rank's work under `model` and
// the CP groups as [first rank, size].
nlohmann::ordered_json PlotJson(const scheduler::GlobalPlan& plan,
                                const scheduler::CostModel& model, const std::string& title) {
  nlohmann::ordered_json work = nlohmann::ordered_json::array();
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const scheduler::PlannedMicrobatch& microbatch : plan.microbatches) {
    std::vector<double> row(static_cast<size_t>(plan.dp_cp_size), 0.0);
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    for (const scheduler::CpGroup& group : microbatch.groups) {
      double cost = 0;
      for (const scheduler::PlannedSequence& s : group.sequences) {
        cost += model.Cost(s.padded_length, group.size);
      }
      for (int r = group.first_rank; r < group.first_rank + group.size; ++r) {
        row[static_cast<size_t>(r)] = cost;
      }
      blocks.push_back({group.first_rank, group.size});
    }
    work.push_back(row);
    groups.push_back(std::move(blocks));
  }
  return {{"title", title},
          {"unit", model.ModelsOverheads() ? "s" : "s²/c"},
          {"work", std::move(work)},
          {"groups", std::move(groups)}};
}

// plot_plan.py beside an installed packfeedctl (../share/packfeed), else in
// the source tree this binary was built from.
std::string PlotScript() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path installed =
        self.parent_path().parent_path() / PF_PLOT_SCRIPT_INSTALLED;
    if (std::filesystem::exists(installed)) return installed.string();
  }
  return PF_PLOT_SCRIPT_SOURCE;
}

// Draws `plan` (plot_plan.py's input) into `output` through matplotlib.
absl::Status PlotPlan(const nlohmann::ordered_json& plan, const std::string& output) {
  char scratch[] = "/tmp/packfeed-plot-XXXXXX";
  const int fd = mkstemp(scratch);
  if (fd < 0) return absl::InternalError("cannot create a scratch file for --plot");
  close(fd);
  {
    std::ofstream file(scratch);
    file << plan.dump() << "\n";
  }
  const std::string script = PlotScript();
  std::vector<std::string> argv_strings = {PF_PYTHON, script, scratch, output};
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int status = 0;
  const int spawned = posix_spawnp(&pid, PF_PYTHON, nullptr, nullptr, argv.data(), environ);
  if (spawned == 0) waitpid(pid, &status, 0);
  std::remove(scratch);
  if (spawned != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--plot: python3 ", script,
                     " failed; it needs matplotlib (apt install python3-matplotlib)"));
  }
  return absl::OkStatus();
}

absl::Status Plan(const PlanArgs& args) {
  ReplayOptions options;
  std::vector<int64_t> lengths;
  std::vector<std::vector<PlacedSample>> samples;
  std::string source = args.dataset.empty() ? args.lengths_file : args.dataset;
  std::string scheduler_name = args.scheduler;
  std::string cost_model = args.cost_model;
  if (!args.config.empty()) {
    PF_ASSIGN_OR_RETURN(ConfiguredBatches batches, LoadConfiguredBatches(args));
    options = std::move(batches.options);
    lengths = std::move(batches.lengths);
    samples = std::move(batches.samples);
    source = args.config;
    scheduler_name = std::string(scheduler::SchedulerKindName(options.planner.kind));
    cost_model = "(from the job)";
  } else {
    PF_ASSIGN_OR_RETURN(options, OptionsFromFlags(args));
    PF_ASSIGN_OR_RETURN(lengths, LoadLengths(args));
  }
  options.keep_plans = !args.dump_plan.empty() || !args.plot.empty();
  if (!args.plot.empty() && !absl::EndsWith(args.plot, ".png") &&
      !absl::EndsWith(args.plot, ".svg")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plot ", args.plot, ": give a .png or .svg file"));
  }
  absl::StatusOr<ReplaySummary> summary = ReplayTrace(lengths, options);
  if (!summary.ok()) {
    return absl::Status(summary.status().code(),
                        absl::StrCat(source, ": ", summary.status().message()));
  }

  nlohmann::ordered_json out;
  out["scheduler"] = scheduler_name;
  out["cost_model"] = cost_model;
  out["cost_model_coefficients"] = CoefficientsJson(options.planner.cost_model);
  out["calibrated_model_coefficients"] = CoefficientsJson(options.calibrated_model);
  out["steps"] = summary->steps;
  out["dp"] = options.planner.dp;
  out["cp"] = options.planner.cp;
  out["max_tokens_per_rank"] = options.planner.max_tokens_per_rank;
  out["global_batch"] = options.global_batch;
  out["step_over_ideal"] = summary->step_over_ideal;
  out["step_over_ideal_full_model"] = summary->step_over_ideal_full_model;
  out["step_time_over_ideal_calibrated"] = summary->step_time_over_ideal_calibrated;
  out["lower_bound"] = summary->lower_bound;
  out["gap_to_bound"] = summary->gap_to_bound;
  out["gap_to_bound_s2"] = summary->gap_to_bound_s2;
  out["gap_to_bound_calibrated"] = summary->gap_to_bound_calibrated;
  out["lower_bound_over_ideal"] = summary->lower_bound_over_ideal;
  out["objective"] = args.config.empty() ? args.objective : "(from the job)";
  out["expert_parallel"] = options.planner.execution.expert_parallel;
  out["graph_step_over_ideal"] = summary->graph_step_over_ideal;
  out["graph_step_time_over_ideal_calibrated"] = summary->graph_step_time_over_ideal_calibrated;
  out["rank_sum_max_over_mean"] = summary->rank_sum_max_over_mean;
  out["microbatches_mean"] = summary->microbatches_mean;
  out["microbatches_lower_bound_mean"] = summary->microbatches_lower_bound_mean;
  out["padding_pct"] = summary->padding_pct;
  out["schedule_ms_median"] = summary->schedule_ms_median;
  out["schedule_ms_max"] = summary->schedule_ms_max;
  nlohmann::ordered_json histogram = nlohmann::ordered_json::object();
  for (auto [c, count] : summary->cp_size_histogram) {
    histogram[std::to_string(c)] = count;
  }
  out["cp_size_histogram"] = histogram;
  out["cp_inflation"] = summary->cp_inflation;
  out["max_tokens_on_a_rank"] = summary->max_tokens_on_a_rank;
  if (!args.dump_plan.empty()) {
    nlohmann::json dump = nlohmann::json::array();
    for (size_t step = 0; step < summary->plans.size(); ++step) {
      dump.push_back({{"step", step},
                      {"lower_bound", summary->lower_bounds[step]},
                      {"hybrid_groups", scheduler::HybridGroupsOf(summary->plans[step])},
                      {"microbatches", PlanToJson(summary->plans[step],
                                                  samples.empty() ? nullptr : &samples[step])}});
    }
    std::ofstream file(args.dump_plan);
    file << dump.dump() << "\n";
    if (!file) {
      return absl::InternalError(absl::StrCat("cannot write ", args.dump_plan));
    }
  }
  if (!args.plot.empty()) {
    if (args.plot_step < 0 || args.plot_step >= static_cast<int64_t>(summary->plans.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--plot-step ", args.plot_step, ": the replay has ", summary->plans.size(), " steps"));
    }
    PF_RETURN_IF_ERROR(PlotPlan(
        PlotJson(summary->plans[static_cast<size_t>(args.plot_step)], options.planner.cost_model,
                 absl::StrCat(scheduler_name, ", step ", args.plot_step)),
        args.plot));
  }
  if (args.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    for (const auto& [key, value] : out.items()) {
      std::printf("%-32s %s\n", key.c_str(), value.dump().c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* plan =
      app.add_subcommand("plan", "Replay global batches of a length file through a scheduler");
  plan->add_option("--config", args->config,
                   "A packfeedd configuration: plan its job's batches exactly as the daemon "
                   "does (every other planning flag is the job's)");
  plan->add_option("--job", args->job, "With --config: the job (needed with several)");
  plan->add_option("--lengths", args->lengths_file, "One sequence length per line");
  plan->add_option("--dataset", args->dataset,
                   "A Megatron indexed dataset prefix: plan its sequences");
  plan->add_option("--seed", args->seed,
                   "Draw batches with packfeed's sampler (shuffled per epoch) "
                   "from this seed instead of in stored order");
  plan->add_option("--global-batch", args->global_batch, "Sequences per step")
      ->capture_default_str();
  plan->add_option("--dp", args->dp, "Data-parallel size")->capture_default_str();
  plan->add_option("--cp", args->cp, "Context-parallel size")->capture_default_str();
  plan->add_option("--tp", args->tp, "Tensor-parallel size")->capture_default_str();
  plan->add_flag("--sequence-parallel", args->sequence_parallel,
                 "Pad for sequence parallelism (×TP)");
  plan->add_option("--vpp", args->vpp, "Microbatch group size per VPP stage (0 = off)")
      ->capture_default_str();
  plan->add_option("--max-tokens-per-rank", args->max_tokens_per_rank,
                   "Padded tokens a rank may hold per microbatch (required without --config)");
  plan->add_option("--scheduler", args->scheduler, "balanced | dynamic_cp | megatron_dp_balanced")
      ->capture_default_str();
  plan->add_option("--min-cp", args->min_cp, "dynamic_cp: smallest CP size (0 = 1)")
      ->capture_default_str();
  plan->add_option("--max-cp", args->max_cp,
                   "dynamic_cp: largest CP size (0 = largest power of two "
                   "<= DP×CP)")
      ->capture_default_str();
  plan->add_option("--cp-upgrade-budget", args->cp_upgrade_budget,
                   "dynamic_cp: CP inflation (c / c_needed − 1, token-weighted) the plan may "
                   "spend to save microbatches and balance. Under megatron (s²/c) the plan "
                   "spends it (default 0.05; 1e9 = fewest microbatches); under a model in "
                   "seconds it chooses the inflation by cost and this caps it (default: no cap)");
  plan->add_option("--objective", args->objective,
                   "What the planner minimises: barrier (ranks meet after every microbatch) | "
                   "graph (only in CP groups, EP blocks and the gradient reduction) | hybrid "
                   "(as Megatron's hybrid-CP loop runs it: a barrier per group of microbatches "
                   "with the same CP groups, each sequence its own forward)")
      ->capture_default_str();
  plan->add_option("--ep", args->ep,
                   "Expert-parallel size over the DP×CP ranks (the graph evaluator's EP blocks)")
      ->capture_default_str();
  plan->add_option(
          "--cost-model", args->cost_model,
          absl::StrCat("What the planner minimises: ", scheduler::kCostModelNames, " | custom"))
      ->capture_default_str();
  plan->add_option("--model-shape", args->model_shape,
                   "With --cost-model custom: the model, as text, e.g. 'layers: 32 hidden: 4096 "
                   "heads: 32 kv_heads: 8 ffn_hidden: 14336 vocab: 128256'");
  plan->add_option("--hardware", args->hardware,
                   "Calibrated models: rates, as text, e.g. 'tflops: 400 cp_link_gbps: 100 "
                   "cp_latency_us: 20 exposed_fraction: 0.5 microbatch_overhead_ms: 1'");
  plan->add_option("--pp", args->pp,
                   "Pipeline stages (calibrated models: layers per stage, "
                   "bubble)")
      ->capture_default_str();
  plan->add_option("--virtual-stages", args->virtual_stages,
                   "Virtual pipeline stages per rank (calibrated models: bubble)")
      ->capture_default_str();
  plan->add_option("--steps", args->steps, "Global batches to replay (0 = all)")
      ->capture_default_str();
  plan->add_option("--dump-plan", args->dump_plan, "Write every step's plan as JSON to this file");
  plan->add_option("--plot", args->plot,
                   "Draw a step's per-microbatch, per-rank work with its CP groups (.png or .svg; "
                   "needs python3-matplotlib)");
  plan->add_option("--plot-step", args->plot_step, "The step --plot draws")->capture_default_str();
  plan->add_flag("--json", args->json, "Print one JSON object");
  plan->callback([args, exit_code] { *exit_code = ExitCode(Plan(*args)); });
}

}  // namespace packfeed::server::ctl
