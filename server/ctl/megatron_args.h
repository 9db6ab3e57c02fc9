#ifndef PACKFEED_SERVER_CTL_MEGATRON_ARGS_H_
#define PACKFEED_SERVER_CTL_MEGATRON_ARGS_H_

// The packfeedd job that serves what a Megatron-LM pretrain_gpt.py command
// line reads (docs/PRETRAINING.md): the blend, split, seed, sample counts as
// Megatron computes them, the topology and the batch's options.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed::server::ctl {

// What Megatron learns elsewhere than its command line.
struct MegatronContext {
  std::string job = "gpt";
  int64_t world_size = 0;  // WORLD_SIZE of the run; required
  // The tokenizer's EOD and pad ids (Megatron asks its tokenizer).
  int64_t eod_id = 0;
  std::optional<int64_t> pad_id;
  // From the checkpoint the run resumes (Megatron's consumed_*_samples).
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  // How a document-masked row splits over CP ranks (Pretraining.cp_split);
  // Megatron's command line does not say (pretrain_gpt's choice is per
  // sequence).
  v1::Pretraining::CpSplit cp_split = v1::Pretraining::CP_SPLIT_PER_SEQUENCE;
  // The Megatron-Core release the run uses ("0.16.1"; empty = not said):
  // --rampup-batch-size needs it (0.18 on ignores the flag).
  std::string megatron_core;
};

// The job for `argv` (pretrain_gpt.py's arguments, no program name).
// InvalidArgument naming the flag for what packfeed cannot serve as Megatron
// would (another dataloader type, mock or FIM data, SFT, data-args files,
// full or multiple validation, phase transitions) or a topology that does
// not divide the world. Flags that do not change the data are ignored.
absl::StatusOr<v1::JobConfig> JobFromMegatronArgs(const std::vector<std::string>& argv,
                                                  const MegatronContext& context);

// Adds `megatron-config`: prints that job as a configuration file
// (textproto). Stores its exit code in `*exit_code` when it runs.
void AddMegatronConfigCommand(CLI::App& app, int* exit_code);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_MEGATRON_ARGS_H_
