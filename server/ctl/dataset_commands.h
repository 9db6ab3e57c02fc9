#ifndef PACKFEED_SERVER_CTL_DATASET_COMMANDS_H_
#define PACKFEED_SERVER_CTL_DATASET_COMMANDS_H_

#include "CLI/CLI.hpp"

namespace packfeed::server::ctl {

// Adds `make-dataset` and `dataset-info` to `app`. Each subcommand stores its
// exit code in `*exit_code` when it runs.
void AddDatasetCommands(CLI::App& app, int* exit_code);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_DATASET_COMMANDS_H_
