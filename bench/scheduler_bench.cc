// Replays the bench traces through every planner on every configuration of
// docs/SCHEDULER.md and prints packfeed's figures beside the ones measured by
// running Megatron-LM's own schedulers on the same traces.
//   scheduler_bench [--traces DIR]
// Megatron's figures are quoted (they come from running
// its code, not from this program); ours are measured in this run,
// single-threaded.

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/scheduler/padding.h"
#include "server/ctl/plan_replay.h"

namespace {

using packfeed::scheduler::Objective;
using packfeed::scheduler::PlannerOptions;
using packfeed::scheduler::SchedulerKind;
using packfeed::server::ctl::ReplayOptions;
using packfeed::server::ctl::ReplaySummary;

struct MegatronFigures {
  const char* scheduler;
  double microbatches, lower_bound, step_over_ideal, padding_pct, ms;
};

struct Config {
  const char* name;
  const char* trace;  // in --traces (made at build time), or with own_trace in bench/traces
  int dp, cp;
  int64_t cap, global_batch;
  std::vector<MegatronFigures> megatron;
  bool own_trace = false;
};

// Megatron-LM's own schedulers on these traces, as measured by running its
// development branch elsewhere (it is not packaged, so it cannot run here):
// quotations, printed apart from what this bench measures
// (docs/SCHEDULER.md). bench/megatron_core_peer.py runs Megatron-Core's
// packaged scheduler beside ours under one evaluator.
constexpr char kQuotedSource[] = "Megatron-LM dev d48bd6be0a, docs/SCHEDULER.md";
const std::vector<Config>& Configs() {
  static const std::vector<Config> configs = {
      {"SFT, 8 ranks (DP8), 8192, 256",
       "trace_sft_lognormal_1024_8192",
       8,
       1,
       8192,
       256,
       {{"dp_balanced", 16.5, 13.1, 2.04, 0, 0.05}, {"dynamic CP", 13.4, 13.2, 1.035, 0.15, 13.6}}},
      {"SFT, DP4xCP2, 4096, 256",
       "trace_sft_lognormal_1024_8192",
       4,
       2,
       4096,
       256,
       {{"dp_balanced", 32.5, 25.7, 1.84, 0.03, 0.07},
        {"dynamic CP", 26.2, 25.7, 1.022, 0.15, 22}}},
      {"SFT, DP4xCP2, 8192, 256",
       "trace_sft_lognormal_1024_8192",
       4,
       2,
       8192,
       256,
       {{"dp_balanced", 15.3, 13.1, 1.40, 0.03, 0.05}}},
      {"long-tail, DP2xCP16 (32 ranks), 3072, 256",
       "trace_dcp_lognormal_512_49152",
       2,
       16,
       3072,
       256,
       {{"dp_balanced", 17.8, 15.3, 1.51, 0.25, 0.11},
        {"dynamic CP", 15.4, 15.3, 1.061, 0.52, 29}}},
      {"long-tail, DP64xCP16 (1024 ranks), 3072, 8192",
       "trace_dcp_lognormal_512_49152",
       64,
       16,
       3072,
       8192,
       {{"dp_balanced", 18, 15, 3.55, 0.25, 3.6}, {"dynamic CP", 18, 18, 1.10, 18.6, 89000}}},
      {"example, DP16xCP4 (64 ranks), 2048, 128",
       "trace_dcpex_lognormal_128_8192",
       16,
       4,
       2048,
       128,
       {{"dynamic CP", 1.2, 1.2, 2.87, 5.6, 13}}},
      // The families bench/traces/make_traces.py made from real files. No
      // Megatron-LM figures: bench/megatron_core_peer.py runs Megatron-Core's
      // own scheduler on them.
      {"code files, 32 ranks, 8192, 512", "trace_code_files", 32, 1, 8192, 512, {}, true},
      {"code files, 8 ranks, 16384, 128", "trace_code_files", 8, 1, 16384, 128, {}, true},
      {"chat + long docs, 512 ranks, 4096, 8192",
       "trace_chat_longdoc",
       512,
       1,
       4096,
       8192,
       {},
       true},
      {"chat + long docs, 16 ranks, 4096, 256", "trace_chat_longdoc", 16, 1, 4096, 256, {}, true},
      // Heavier-tailed than code files: a few sequences of 10-32 ranks'
      // tokens at 4 096 a rank, most below a tenth of one.
      {"heavy tail, 32 ranks, 4096, 512", "trace_heavy_tail", 32, 1, 4096, 512, {}},
      {"heavy tail, 8 ranks, 16384, 128", "trace_heavy_tail", 8, 1, 16384, 128, {}},
      {"doc paragraphs, 64 ranks, 4096, 16384",
       "trace_doc_paragraphs",
       64,
       1,
       4096,
       16384,
       {},
       true},
  };
  return configs;
}

struct Variant {
  const char* label;
  SchedulerKind kind;
  double cp_upgrade_budget;
  bool calibrated;  // plans under the calibrated llama8b model, not s²/c
  Objective objective = Objective::kBarrier;
};

const Variant kVariants[] = {
    {"megatron_dp_balanced (ours)", SchedulerKind::kMegatronDpBalanced, 0, false},
    {"balanced", SchedulerKind::kBalanced, 0, false},
    {"dynamic_cp (default: inflation 0.05)", SchedulerKind::kDynamicCp, 0.05, false},
    {"dynamic_cp, inflation budget 0.10", SchedulerKind::kDynamicCp, 0.10, false},
    {"dynamic_cp, no cap", SchedulerKind::kDynamicCp, 1e9, false},
    // Under a model in seconds the plan chooses its inflation by cost; the
    // budget is a cap, none by default (planner.h).
    {"dynamic_cp, llama8b, capped at 0.05", SchedulerKind::kDynamicCp, 0.05, true},
    {"dynamic_cp, llama8b (default: no cap)", SchedulerKind::kDynamicCp, 1e9, true},
    {"balanced, graph objective", SchedulerKind::kBalanced, 0, false, Objective::kGraph},
    {"dynamic_cp, graph objective", SchedulerKind::kDynamicCp, 0.05, false, Objective::kGraph},
    {"dynamic_cp, graph, llama8b", SchedulerKind::kDynamicCp, 1e9, true, Objective::kGraph},
};

struct Row {
  std::string s2, calib = "-", s2_graph = "-", calib_graph = "-", bound = "-", gap_s2 = "-",
                  gap_calib = "-", inflation = "-", ms;
};

void PrintRow(const char* scheduler, double m, double lower, double padding, const Row& row) {
  std::printf("  %-36s %6.2f (%5.2f) %8s %8s %8s %8s %7s %7s %7s %7s %7.3f %14s\n", scheduler, m,
              lower, row.s2.c_str(), row.calib.c_str(), row.s2_graph.c_str(),
              row.calib_graph.c_str(), row.bound.c_str(), row.gap_s2.c_str(), row.gap_calib.c_str(),
              row.inflation.c_str(), padding, row.ms.c_str());
}

// Megatron's dynamic CP pads every sequence to a multiple of 2·DP·CP, so
// its step/ideal is over an ideal that holds the padding's work too. The
// same step over the ideal of the unpadded sequences (ours pad ≤ 0.05 %):
// its figure × Σ padded² / Σ length² over the trace, with the padding (in %).
std::pair<double, double> MegatronPaddingFactor(const std::vector<int64_t>& lengths, int ranks) {
  const int64_t multiple = 2 * int64_t{ranks};
  double padded_work = 0, work = 0, padded = 0, tokens = 0;
  for (const int64_t length : lengths) {
    const double p = static_cast<double>(packfeed::scheduler::PadTo(length, multiple));
    const double s = static_cast<double>(length);
    padded_work += p * p;
    work += s * s;
    padded += p;
    tokens += s;
  }
  return {padded_work / work, 100.0 * (padded / tokens - 1)};
}

// "-" for NaN (no bound for Megatron's padding).
std::string Fixed(double value, int digits) {
  if (value != value) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Scheduler figures beside Megatron-LM's");
  std::string traces = PF_MADE_TRACES;  // made at build time
  std::string own_traces = std::string(PF_SOURCE_DIR) + "/bench/traces";
  app.add_option("--traces", traces, "Folder of the made trace_*.txt length files")
      ->capture_default_str();
  app.add_option("--own-traces", own_traces, "Folder of make_traces.py's length files")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf(
      "s2: step/ideal under s²/c; calib: modelled step time over the ideal under the "
      "calibrated llama8b model (H100 rates);\ns2 g, calib g: the same when ranks meet only in "
      "their CP groups and at the gradient reduction (GraphStepTime);\nbound: the lower bound "
      "on Σ_m max_r W over Σ W / N under s²/c (scheduler/lower_bound.h); gap s2, gap cal: the "
      "plan's step time over the bound, minus 1,\nunder s²/c and the calibrated model; infl: CP "
      "inflation; ms: median (max) per global batch, one core\n");
  for (const Config& config : Configs()) {
    const std::string path = (config.own_trace ? own_traces : traces) + "/" + config.trace + ".txt";
    absl::StatusOr<std::vector<int64_t>> lengths = packfeed::dataset::ReadLengthsFile(path);
    if (!lengths.ok()) {
      std::printf("\n%s: skipped (%s)\n", config.name, lengths.status().ToString().c_str());
      continue;
    }
    // Each batch four times over: the same means, steadier timings.
    std::vector<int64_t> replayed;
    for (int r = 0; r < 4; ++r) {
      replayed.insert(replayed.end(), lengths->begin(), lengths->end());
    }
    std::printf("\n%s  [%s]\n", config.name, config.trace);
    std::printf("  %-36s %14s %8s %8s %8s %8s %7s %7s %7s %7s %7s %14s\n", "scheduler",
                "M (lower b.)", "s2", "calib", "s2 g", "calib g", "bound", "gap s2", "gap cal",
                "infl", "pad %", "ms");
    for (const Variant& variant : kVariants) {
      ReplayOptions options;
      options.calibrated_model = *packfeed::scheduler::CostModelFromName("llama8b");
      options.planner.kind = variant.kind;
      options.planner.dp = config.dp;
      options.planner.cp = config.cp;
      options.planner.max_tokens_per_rank = config.cap;
      options.planner.cp_upgrade_budget = variant.cp_upgrade_budget;
      if (variant.calibrated) options.planner.cost_model = options.calibrated_model;
      options.planner.objective = variant.objective;
      options.global_batch = config.global_batch;
      absl::StatusOr<ReplaySummary> s = packfeed::server::ctl::ReplayTrace(replayed, options);
      if (!s.ok()) {
        std::printf("  %-36s %s\n", variant.label, s.status().ToString().c_str());
        continue;
      }
      Row row;
      row.s2 = Fixed(s->step_over_ideal, 4);
      row.calib = Fixed(s->step_time_over_ideal_calibrated, 4);
      row.s2_graph = Fixed(s->graph_step_over_ideal, 4);
      row.calib_graph = Fixed(s->graph_step_time_over_ideal_calibrated, 4);
      row.bound = Fixed(s->lower_bound_over_ideal, 3);
      row.gap_s2 = Fixed(s->gap_to_bound_s2, 3);
      row.gap_calib = Fixed(s->gap_to_bound_calibrated, 3);
      row.inflation = Fixed(s->cp_inflation, 3);
      row.ms = Fixed(s->schedule_ms_median, 2) + " (" + Fixed(s->schedule_ms_max, 1) + ")";
      PrintRow(variant.label, s->microbatches_mean, s->microbatches_lower_bound_mean,
               s->padding_pct, row);
    }
    if (!config.megatron.empty()) {
      std::printf(
          "  quoted, not run here: %s, under Megatron-LM's own evaluator and ideal (not "
          "comparable with the rows above)\n",
          kQuotedSource);
    }
    for (const MegatronFigures& m : config.megatron) {
      Row row;
      row.s2 = Fixed(m.step_over_ideal, 4);
      row.ms = Fixed(m.ms, 2);
      PrintRow((std::string("  Megatron-LM ") + m.scheduler).c_str(), m.microbatches, m.lower_bound,
               m.padding_pct, row);
      if (m.padding_pct > 0 && std::string(m.scheduler) == "dynamic CP") {
        const auto [factor, padding] = MegatronPaddingFactor(*lengths, config.dp * config.cp);
        row.s2 = Fixed(m.step_over_ideal * factor, 4);
        PrintRow("    the same, over the unpadded ideal", m.microbatches, m.lower_bound, padding,
                 row);
      }
    }
  }
  return 0;
}
