#ifndef PACKFEED_SERVER_CTL_PLAN_COMMAND_H_
#define PACKFEED_SERVER_CTL_PLAN_COMMAND_H_

#include "CLI/CLI.hpp"

namespace packfeed::server::ctl {

// Adds `plan`: the offline planner over a length file (capacity planning).
void AddPlanCommand(CLI::App& app, int* exit_code);

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_PLAN_COMMAND_H_
