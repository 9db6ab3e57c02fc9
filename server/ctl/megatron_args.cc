#include "server/ctl/megatron_args.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "packfeed/common/status_macros.h"
#include "server/config/daemon_config.h"
#include "server/ctl/exit_code.h"
#include "server/ctl/megatron_batches.h"

namespace packfeed::server::ctl {
namespace {

// Flags that change which samples Megatron reads, or how, in ways packfeed
// does not serve; each with why.
constexpr std::pair<const char*, const char*> kRefused[] = {
    {"--mock-data", "mock data is not read from files"},
    {"--fim-data",
     "GPTFIMDataset draws its permutations from one random stream per process, advanced by "
     "every sample that process read before, so a sample's tokens depend on the data loader's "
     "history (DP rank, workers, restarts), not on the seed and its index; packfeed serves "
     "samples that depend on those alone (docs/PRETRAINING.md)"},
    {"--sft",
     "0.19.2's SFTDataset reads JSON-lines conversations and tokenizes them at load time with "
     "the trainer's tokenizer (tokenize_conversation); packfeedd runs no tokenizer, so it cannot "
     "serve SFTDataset's samples (a DATASET_KIND_SFT job serves pre-tokenized conversations in "
     "packfeed's own layout, docs/PRETRAINING.md)"},
    {"--data-args-path", "give the blend as --data-path"},
    {"--per-split-data-args-path", "give the blends as --train/valid/test-data-path"},
    {"--full-validation",
     "not served yet: MegatronFullValidationSampler walks one epoch of the validation split, one "
     "sample per DP rank and microbatch, and a rank whose share runs out starts it again "
     "(cyclic), so DP ranks read different counts; packfeed serves each split as whole global "
     "batches"},
    {"--multiple-validation-sets",
     "not served yet: Megatron runs it only with --full-validation (NotImplementedError "
     "otherwise), which is not served"},
    {"--phase-transition-iterations", "phase transitions are not served yet"},
    {"--skip-train", "a run without training is not served"},
    {"--num-layers-per-virtual-pipeline-stage",
     "give --virtual-pipeline-model-parallel-size instead"},
};

// argparse's view of the command line: each flag with the values after it.
class Args {
 public:
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv) {
    Args out;
    std::vector<std::string>* values = nullptr;
    for (const std::string& token : argv) {
      if (token.rfind("--", 0) == 0) {
        const size_t equals = token.find('=');
        values = &out.flags_[token.substr(0, equals)];
        values->clear();  // argparse keeps the last
        if (equals != std::string::npos) values->push_back(token.substr(equals + 1));
      } else if (values != nullptr) {
        values->push_back(token);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("'", token,
                         "' comes before any flag (give pretrain_gpt.py's arguments, "
                         "not the program)"));
      }
    }
    return out;
  }

  bool Has(const std::string& flag) const { return flags_.count(flag) > 0; }

  const std::vector<std::string>* List(const std::string& flag) const {
    auto it = flags_.find(flag);
    return it == flags_.end() ? nullptr : &it->second;
  }

  absl::StatusOr<std::optional<std::string>> One(const std::string& flag) const {
    const std::vector<std::string>* values = List(flag);
    if (values == nullptr) return std::nullopt;
    if (values->size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": takes one value, got ", values->size()));
    }
    return values->front();
  }

  absl::StatusOr<std::optional<int64_t>> Int(const std::string& flag) const {
    PF_ASSIGN_OR_RETURN(std::optional<std::string> text, One(flag));
    if (!text) return std::nullopt;
    int64_t value = 0;
    if (!absl::SimpleAtoi(*text, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", *text, "' is no integer"));
    }
    return value;
  }

  absl::StatusOr<int64_t> Int(const std::string& flag, int64_t fallback) const {
    PF_ASSIGN_OR_RETURN(std::optional<int64_t> value, Int(flag));
    return value.value_or(fallback);
  }

 private:
  std::map<std::string, std::vector<std::string>> flags_;
};

// Megatron's get_blend_from_list: "W1 P1 W2 P2 ..." when every other entry
// is a number, else prefixes without weights.
absl::Status AddBlend(const std::vector<std::string>& list, const std::string& flag,
                      google::protobuf::RepeatedPtrField<v1::DatasetSpec>& out) {
  if (list.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": no datasets"));
  std::vector<double> weights;
  if (list.size() % 2 == 0) {
    for (size_t i = 0; i < list.size(); i += 2) {
      double weight = 0;
      if (absl::SimpleAtod(list[i], &weight)) weights.push_back(weight);
    }
    if (!weights.empty() && weights.size() != list.size() / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": some entries are weights and some are not"));
    }
  }
  const bool weighted = !weights.empty();
  for (size_t i = weighted ? 1 : 0; i < list.size(); i += weighted ? 2 : 1) {
    v1::DatasetSpec& dataset = *out.Add();
    dataset.set_prefix(list[i]);
    dataset.set_kind(v1::DATASET_KIND_PRETRAINING);
    if (weighted) dataset.set_weight(weights[i / 2]);
  }
  return absl::OkStatus();
}

// Megatron's parse_and_normalize_split reads the runs of digits and dots,
// whatever lies between them: "969, 30, 1" and "969/30/1" are "969,30,1".
std::string SplitNumbers(absl::string_view text) {
  std::vector<std::string> numbers;
  bool in_number = false;
  for (char c : text) {
    const bool part = (c >= '0' && c <= '9') || c == '.';
    if (part && !in_number) numbers.emplace_back();
    if (part) numbers.back().push_back(c);
    in_number = part;
  }
  return absl::StrJoin(numbers, ",");
}

}  // namespace

namespace {

// TP, PP, CP and VPP from their flags; DP what the world leaves.
absl::Status SetTopology(const Args& args, const MegatronContext& context, v1::JobConfig& job) {
  v1::Topology& topology = *job.mutable_topology();
  PF_ASSIGN_OR_RETURN(const int64_t tp, args.Int("--tensor-model-parallel-size", 1));
  PF_ASSIGN_OR_RETURN(const int64_t pp, args.Int("--pipeline-model-parallel-size", 1));
  PF_ASSIGN_OR_RETURN(const int64_t cp, args.Int("--context-parallel-size", 1));
  PF_ASSIGN_OR_RETURN(const int64_t vpp, args.Int("--virtual-pipeline-model-parallel-size", 1));
  if (tp < 1 || pp < 1 || cp < 1 || context.world_size < 1 ||
      context.world_size % (tp * pp * cp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a world of ", context.world_size,
                                                   " ranks does not divide into TP ", tp, " x PP ",
                                                   pp, " x CP ", cp));
  }
  topology.set_tp(static_cast<uint32_t>(tp));
  topology.set_pp(static_cast<uint32_t>(pp));
  topology.set_cp(static_cast<uint32_t>(cp));
  topology.set_dp(static_cast<uint32_t>(context.world_size / (tp * pp * cp)));
  topology.set_vpp(static_cast<uint32_t>(vpp));

  return absl::OkStatus();
}

// The sequence length, seed and global batch (with its ramp-up or
// schedule), as Megatron's arguments derive them.
absl::StatusOr<MegatronBatches> SetBatches(const Args& args, const MegatronContext& context,
                                           v1::JobConfig& job) {
  PF_ASSIGN_OR_RETURN(const std::optional<int64_t> seq_length, args.Int("--seq-length"));
  PF_ASSIGN_OR_RETURN(const std::optional<int64_t> mbs, args.Int("--micro-batch-size"));
  if (!seq_length || !mbs) {
    return absl::InvalidArgumentError("--seq-length and --micro-batch-size are required");
  }
  MegatronBatchFlags batch_flags;
  batch_flags.micro_batch_size = *mbs;
  batch_flags.dp = job.topology().dp();
  batch_flags.seq_length = *seq_length;
  batch_flags.megatron_core = context.megatron_core;
  PF_ASSIGN_OR_RETURN(batch_flags.global_batch_size, args.Int("--global-batch-size"));
  PF_ASSIGN_OR_RETURN(batch_flags.step_batch_size_schedule, args.One("--step-batch-size-schedule"));
  if (const std::vector<std::string>* rampup = args.List("--rampup-batch-size")) {
    batch_flags.rampup_batch_size = *rampup;
  }
  PF_ASSIGN_OR_RETURN(batch_flags.train_samples, args.Int("--train-samples"));
  PF_ASSIGN_OR_RETURN(batch_flags.train_iters, args.Int("--train-iters"));
  PF_ASSIGN_OR_RETURN(MegatronBatches batches, MegatronBatchesOf(batch_flags));
  PF_ASSIGN_OR_RETURN(const int64_t seed, args.Int("--seed", 1234));
  job.set_seq_length(*seq_length);
  job.set_global_batch(batches.global_batch);
  job.set_seed(static_cast<uint64_t>(seed));
  job.set_eod_id(context.eod_id);

  job.mutable_pretraining()->set_micro_batch_size(static_cast<uint32_t>(*mbs));
  return batches;
}

// --data-path with --split, or a blend per split.
absl::Status SetDatasets(const Args& args, v1::JobConfig& job) {
  v1::Pretraining& p = *job.mutable_pretraining();
  const std::vector<std::string>* data_path = args.List("--data-path");
  const std::vector<std::string>* per_split[] = {args.List("--train-data-path"),
                                                 args.List("--valid-data-path"),
                                                 args.List("--test-data-path")};
  if (data_path != nullptr) {
    PF_RETURN_IF_ERROR(AddBlend(*data_path, "--data-path", *job.mutable_datasets()));
    // Megatron reads the numbers of the split whatever separates them.
    PF_ASSIGN_OR_RETURN(std::optional<std::string> split, args.One("--split"));
    p.set_split(SplitNumbers(split.value_or("969, 30, 1")));  // Megatron's default
  } else if (per_split[0] != nullptr) {
    PF_RETURN_IF_ERROR(AddBlend(*per_split[0], "--train-data-path", *job.mutable_datasets()));
    if (per_split[1] != nullptr) {
      PF_RETURN_IF_ERROR(AddBlend(*per_split[1], "--valid-data-path", *p.mutable_valid_datasets()));
    }
    if (per_split[2] != nullptr) {
      PF_RETURN_IF_ERROR(AddBlend(*per_split[2], "--test-data-path", *p.mutable_test_datasets()));
    }
  } else {
    return absl::InvalidArgumentError("--data-path or --train-data-path is required");
  }

  return absl::OkStatus();
}

// Each split's samples and the evaluation's batch.
absl::Status SetSplitSizes(const Args& args, const MegatronContext& context,
                           const MegatronBatches& batches, v1::Pretraining& p) {
  const int64_t mbs = p.micro_batch_size();
  // Megatron's get_train_valid_test_num_samples (update_train_iters first
  // turns --train-samples into iterations).
  for (const BatchSchedule::Entry& entry : batches.schedule) {
    v1::BatchSizeStep& step = *p.add_batch_schedule();
    step.set_from_sample(entry.from_sample);
    step.set_global_batch(entry.global_batch);
  }
  PF_ASSIGN_OR_RETURN(const int64_t eval_iters, args.Int("--eval-iters", 100));
  PF_ASSIGN_OR_RETURN(const int64_t eval_interval, args.Int("--eval-interval", 1000));
  PF_ASSIGN_OR_RETURN(const std::optional<int64_t> start_eval, args.Int("--start-eval-at-iter"));
  if (eval_interval < 1) return absl::InvalidArgumentError("--eval-interval must be positive");
  int64_t eval_points = batches.train_iters / eval_interval + 1;
  if (start_eval) eval_points = std::max<int64_t>(0, eval_points - *start_eval / eval_interval);
  // Megatron evaluates with its evaluation batch (0.18's flags; unset =
  // its args.global_batch_size).
  PF_ASSIGN_OR_RETURN(const int64_t eval_global_batch,
                      args.Int("--eval-global-batch-size", batches.args_global_batch));
  PF_ASSIGN_OR_RETURN(const int64_t eval_mbs, args.Int("--eval-micro-batch-size", mbs));
  if (eval_global_batch != batches.global_batch) p.set_eval_global_batch(eval_global_batch);
  if (eval_mbs != mbs) p.set_eval_micro_batch_size(static_cast<uint32_t>(eval_mbs));
  p.set_train_samples(batches.train_samples);
  p.set_valid_samples(eval_points * eval_iters * eval_global_batch);
  p.set_test_samples(eval_iters * eval_global_batch);
  // Megatron builds every split; with no evaluation there is none to serve.
  p.set_serve_every_split(p.valid_samples() > 0);
  if (!p.serve_every_split()) {
    p.clear_eval_global_batch();
    p.clear_eval_micro_batch_size();
  }
  p.set_consumed_samples(context.consumed_train_samples);
  p.set_consumed_valid_samples(context.consumed_valid_samples);

  return absl::OkStatus();
}

// Megatron's sample rules: masks, position ids, the cache, CP's split and
// hybrid CP.
absl::Status SetSampleRules(const Args& args, const MegatronContext& context, v1::JobConfig& job) {
  v1::Pretraining& p = *job.mutable_pretraining();
  p.set_eod_mask_loss(args.Has("--eod-mask-loss"));
  p.set_reset_position_ids(args.Has("--reset-position-ids"));
  p.set_inter_document_masking(args.Has("--dataloader-inter-document-masking"));
  // With inter-document masking Megatron drops the [s, s] mask, and with it
  // what --reset-attention-mask would change.
  p.set_reset_attention_mask(args.Has("--reset-attention-mask") && !p.inter_document_masking());
  PF_ASSIGN_OR_RETURN(std::optional<std::string> cache, args.One("--data-cache-path"));
  if (cache) p.set_cache_dir(*cache);
  PF_ASSIGN_OR_RETURN(std::optional<std::string> surplus, args.One("--mid-level-dataset-surplus"));
  if (surplus) {
    double value = 0;
    if (!absl::SimpleAtod(*surplus, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mid-level-dataset-surplus: '", *surplus, "' is no number"));
    }
    p.set_mid_level_dataset_surplus(value);
  }
  if (context.pad_id) p.set_tokenizer_pad_id(*context.pad_id);
  p.set_cp_split(context.cp_split);
  if (args.Has("--hybrid-context-parallel")) {
    // Megatron plans each global batch's sub-samples; the daemon does it
    // with dynamic_cp, each rank holding at most Megatron's cap.
    PF_ASSIGN_OR_RETURN(const std::optional<int64_t> cap, args.Int("--max-seqlen-per-dp-cp-rank"));
    if (!cap || *cap < 1) {
      return absl::InvalidArgumentError(
          "--hybrid-context-parallel: needs --max-seqlen-per-dp-cp-rank (Megatron's cap on a "
          "rank's tokens, packfeed's scheduler.max_tokens_per_rank)");
    }
    p.set_hybrid_context_parallel(true);
    job.mutable_scheduler()->set_kind("dynamic_cp");
    job.mutable_scheduler()->set_max_tokens_per_rank(*cap);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobConfig> JobFromMegatronArgs(const std::vector<std::string>& argv,
                                                  const MegatronContext& context) {
  PF_ASSIGN_OR_RETURN(const Args args, Args::Parse(argv));
  for (const auto& [flag, why] : kRefused) {
    if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", why));
  }
  PF_ASSIGN_OR_RETURN(std::optional<std::string> loader, args.One("--dataloader-type"));
  // 'external' is the drop-in's (packfeed.megatron), which serves the
  // order of 'single'.
  if (loader && *loader != "single" && *loader != "external") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataloader-type ", *loader,
                     ": packfeed serves the order of 'single' (the default), or of 'external' "
                     "with packfeed.megatron's provider"));
  }
  v1::JobConfig job;
  job.set_name(context.job);
  PF_RETURN_IF_ERROR(SetTopology(args, context, job));
  PF_ASSIGN_OR_RETURN(const MegatronBatches batches, SetBatches(args, context, job));
  PF_RETURN_IF_ERROR(SetDatasets(args, job));
  PF_RETURN_IF_ERROR(SetSplitSizes(args, context, batches, *job.mutable_pretraining()));
  PF_RETURN_IF_ERROR(SetSampleRules(args, context, job));
  return job;
}

void AddMegatronConfigCommand(CLI::App& app, int* exit_code) {
  struct Options {
    MegatronContext context;
    int64_t pad_id = -1;
    bool json = false;
    std::string cp_split = "per-sequence";
    std::vector<std::string> argv;
  };
  auto options = std::make_shared<Options>();
  CLI::App* sub =
      app.add_subcommand("megatron-config",
                         "print the packfeedd job that serves a pretrain_gpt.py command line: "
                         "packfeedctl megatron-config --world-size N --eod-id ID -- ARGS...");
  sub->add_option("--job", options->context.job, "the job's name")->capture_default_str();
  sub->add_option("--world-size", options->context.world_size, "the run's WORLD_SIZE")->required();
  sub->add_option("--eod-id", options->context.eod_id, "the tokenizer's EOD id")->required();
  sub->add_option("--pad-id", options->pad_id,
                  "the tokenizer's pad id, when it has one apart from its special tokens");
  sub->add_option("--consumed-train-samples", options->context.consumed_train_samples,
                  "consumed_train_samples of the checkpoint the run resumes");
  sub->add_option("--consumed-valid-samples", options->context.consumed_valid_samples,
                  "consumed_valid_samples of the checkpoint the run resumes");
  sub->add_option("--megatron-core", options->context.megatron_core,
                  "the Megatron-Core release of the run (e.g. 0.16.1); needed with "
                  "--rampup-batch-size, which 0.18 and later ignore");
  sub->add_option("--cp-split", options->cp_split,
                  "per-sequence (pretrain_gpt's, the default) or per-document: how a "
                  "document-masked row splits over CP ranks")
      ->check(CLI::IsMember({"per-sequence", "per-document"}));
  sub->add_flag("--json", options->json, "print the job as JSON instead");
  sub->add_option("args", options->argv, "pretrain_gpt.py's arguments, after --")->required();
  sub->callback([options, exit_code] {
    if (options->pad_id >= 0) options->context.pad_id = options->pad_id;
    options->context.cp_split = options->cp_split == "per-document"
                                    ? v1::Pretraining::CP_SPLIT_PER_DOCUMENT
                                    : v1::Pretraining::CP_SPLIT_PER_SEQUENCE;
    *exit_code = ExitCode([&]() -> absl::Status {
      PF_ASSIGN_OR_RETURN(const v1::JobConfig job,
                          JobFromMegatronArgs(options->argv, options->context));
      v1::DaemonConfig config;
      *config.add_jobs() = job;
      std::string text;
      google::protobuf::TextFormat::PrintToString(config, &text);
      // What the daemon will make of it: refused here, not at its start.
      PF_RETURN_IF_ERROR(ParseDaemonConfig(text, "megatron-config").status());
      if (options->json) {
        text.clear();
        if (!google::protobuf::util::MessageToJsonString(job, &text).ok()) {
          return absl::InternalError("the job does not print as JSON");
        }
        text += "\n";
      }
      std::fputs(text.c_str(), stdout);
      return absl::OkStatus();
    }());
  });
}

}  // namespace packfeed::server::ctl
