#ifndef PACKFEED_SERVER_CTL_PRETRAINING_COMMAND_H_
#define PACKFEED_SERVER_CTL_PRETRAINING_COMMAND_H_

#include "CLI/CLI.hpp"

namespace packfeed::server::ctl {

// Adds `pretraining-samples`: a pretraining job's split as Megatron-Core
// numbers it (counts, epochs, and optionally the tokens of a range of
// samples and every index array as .npy), for a side-by-side check against
// Megatron's own GPTDataset and BlendedDataset. Stores its exit code in
// `*exit_code` when it runs.
void AddPretrainingCommand(CLI::App& app, int* exit_code);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_PRETRAINING_COMMAND_H_
