#ifndef PACKFEED_SERVER_CTL_ADMIN_COMMANDS_H_
#define PACKFEED_SERVER_CTL_ADMIN_COMMANDS_H_

#include "CLI/CLI.hpp"

namespace packfeed::server::ctl {

// Adds the commands that talk to a running packfeedd: `jobs`, `stats`,
// `ledger`, `plan-step`, `health`, `drain`, and `dump` (attaches as a rank and prints
// what it receives).
void AddAdminCommands(CLI::App& app, int* exit_code);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_ADMIN_COMMANDS_H_
