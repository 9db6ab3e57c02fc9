#include "plan_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "exit_code.h"
#include "nlohmann/json.hpp"
#include "packfeed/common/status_macros.h"
#include "packfeed/scheduler/cost_model.h"
#include "packfeed/scheduler/megatron_dp_balanced.h"
#include "packfeed/scheduler/padding.h"
#include "packfeed/scheduler/plan_stats.h"
#include "packfeed/server/dataset_generator.h"

namespace packfeed::ctl {
namespace {

struct PlanArgs {
  std::string lengths_file;
  int64_t global_batch = 256;
  int dp = 1;
  int cp = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int vpp = 0;
  int64_t max_tokens_per_rank = 0;
  std::string scheduler = "megatron_dp_balanced";
  int steps = 0;  // 0: every whole global batch of the file
  std::string dump_plan;
  bool json = false;
};

nlohmann::json PlanToJson(const GlobalPlan& plan) {
  nlohmann::json microbatches = nlohmann::json::array();
  for (const PlannedMicrobatch& microbatch : plan.microbatches) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < plan.dp_cp_size; ++r) {
      const CpGroup& group = GroupOfRank(microbatch, r);
      nlohmann::json sequences = nlohmann::json::array();
      for (const PlannedSequence& s : group.sequences) {
        sequences.push_back({{"sample", s.sample},
                             {"length", s.length},
                             {"padded_length", s.padded_length},
                             {"cp_size", group.size},
                             {"cp_group", group.first_rank / group.size}});
      }
      ranks.push_back(sequences);
    }
    microbatches.push_back(ranks);
  }
  return microbatches;
}

absl::Status Plan(const PlanArgs& args) {
  if (args.scheduler != "megatron_dp_balanced") {
    return absl::UnimplementedError(
        absl::StrCat("scheduler '", args.scheduler,
                     "' is not built yet; available: megatron_dp_balanced"));
  }
  if (args.max_tokens_per_rank < 1 || args.global_batch < 1 || args.dp < 1 ||
      args.cp < 1 || args.tp < 1) {
    return absl::InvalidArgumentError(
        "--max-tokens-per-rank, --global-batch, --dp, --cp and --tp must be "
        ">= 1");
  }
  PF_ASSIGN_OR_RETURN(std::vector<int64_t> lengths,
                      ReadLengthsFile(args.lengths_file));
  const int64_t available =
      static_cast<int64_t>(lengths.size()) / args.global_batch;
  const int64_t steps = args.steps > 0 ? args.steps : available;
  if (steps < 1 || steps > available) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.lengths_file, " holds ", available, " global batches of ",
        args.global_batch, "; asked for ", steps));
  }
  // Megatron's padding: every sequence to 2·CP (×TP with SP), whatever it
  // is scheduled with.
  const int64_t divisor =
      PaddingDivisor(args.cp, args.tp, args.sequence_parallel);
  MegatronDpBalancedOptions options;
  options.dp = args.dp;
  options.cp = args.cp;
  options.max_seqlen_per_dp_cp_rank = args.max_tokens_per_rank;
  options.vpp_group_size = args.vpp;

  const CostModel s2 = CostModel::Megatron();
  // A Llama-3-8B-like shape for the full model (hidden 4096, FFN 14336,
  // 8 KV heads of 128).
  const CostModel full = CostModel::FromModel(4096, 14336, 1024);
  double step_ideal = 0, step_ideal_full = 0, rank_sum = 0, m_mean = 0,
         m_lower = 0, inflation = 0;
  int64_t real = 0, padded = 0;
  std::map<int, int64_t> histogram;
  std::vector<double> millis;
  nlohmann::json dump = nlohmann::json::array();
  for (int64_t step = 0; step < steps; ++step) {
    const auto first = lengths.begin() + step * args.global_batch;
    std::vector<int64_t> batch(first, first + args.global_batch);
    std::vector<int64_t> padded_batch;
    for (int64_t length : batch) padded_batch.push_back(PadTo(length, divisor));
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<GlobalPlan> plan =
        PlanMegatronDpBalanced(batch, padded_batch, options);
    millis.push_back(std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - start)
                         .count());
    if (!plan.ok()) {
      return absl::Status(
          plan.status().code(),
          absl::StrCat("step ", step, ": ", plan.status().message()));
    }
    const PlanStats stats =
        ComputePlanStats(*plan, s2, args.max_tokens_per_rank);
    step_ideal += stats.step_over_ideal;
    step_ideal_full +=
        ComputePlanStats(*plan, full, args.max_tokens_per_rank).step_over_ideal;
    rank_sum += stats.rank_sum_max_over_mean;
    m_mean += stats.num_microbatches;
    m_lower += stats.microbatches_lower_bound;
    inflation += stats.cp_inflation;
    real += plan->flops.real_sum;
    padded += plan->flops.padded_sum;
    for (auto [c, count] : stats.cp_size_histogram) histogram[c] += count;
    if (!args.dump_plan.empty()) {
      dump.push_back({{"step", step}, {"microbatches", PlanToJson(*plan)}});
    }
  }
  std::sort(millis.begin(), millis.end());
  const double n = static_cast<double>(steps);
  nlohmann::ordered_json out;
  out["scheduler"] = args.scheduler;
  out["steps"] = steps;
  out["dp"] = args.dp;
  out["cp"] = args.cp;
  out["max_tokens_per_rank"] = args.max_tokens_per_rank;
  out["global_batch"] = args.global_batch;
  out["step_over_ideal"] = step_ideal / n;
  out["step_over_ideal_full_model"] = step_ideal_full / n;
  out["rank_sum_max_over_mean"] = rank_sum / n;
  out["microbatches_mean"] = m_mean / n;
  out["microbatches_lower_bound_mean"] = m_lower / n;
  out["padding_pct"] =
      100.0 * static_cast<double>(padded - real) / static_cast<double>(real);
  out["schedule_ms_median"] = millis[millis.size() / 2];
  nlohmann::ordered_json hist;
  for (auto [c, count] : histogram) hist[std::to_string(c)] = count;
  out["cp_size_histogram"] = hist;
  out["cp_inflation"] = inflation / n;
  if (!args.dump_plan.empty()) {
    std::ofstream file(args.dump_plan);
    file << dump.dump() << "\n";
    if (!file) {
      return absl::InternalError(absl::StrCat("cannot write ", args.dump_plan));
    }
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
  CLI::App* plan = app.add_subcommand(
      "plan", "Replay global batches of a length file through a scheduler");
  plan->add_option("--lengths", args->lengths_file,
                   "One sequence length per line")
      ->required();
  plan->add_option("--global-batch", args->global_batch, "Sequences per step")
      ->capture_default_str();
  plan->add_option("--dp", args->dp, "Data-parallel size")
      ->capture_default_str();
  plan->add_option("--cp", args->cp, "Context-parallel size")
      ->capture_default_str();
  plan->add_option("--tp", args->tp, "Tensor-parallel size")
      ->capture_default_str();
  plan->add_flag("--sequence-parallel", args->sequence_parallel,
                 "Pad for sequence parallelism (×TP)");
  plan->add_option("--vpp", args->vpp,
                   "Microbatch group size per VPP stage (0 = off)")
      ->capture_default_str();
  plan->add_option("--max-tokens-per-rank", args->max_tokens_per_rank,
                   "Padded tokens a rank may hold per microbatch")
      ->required();
  plan->add_option("--scheduler", args->scheduler,
                   "balanced | dynamic_cp | megatron_dp_balanced")
      ->capture_default_str();
  plan->add_option("--steps", args->steps, "Global batches to replay (0 = all)")
      ->capture_default_str();
  plan->add_option("--dump-plan", args->dump_plan,
                   "Write every step's plan as JSON to this file");
  plan->add_flag("--json", args->json, "Print one JSON object");
  plan->callback([args, exit_code] { *exit_code = ExitCode(Plan(*args)); });
}

}  // namespace packfeed::ctl
