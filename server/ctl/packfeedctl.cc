// packfeedctl: the operator's command-line tool.

#include <cstdio>

#include "CLI/CLI.hpp"
#include "packfeed/common/version.h"
#include "server/ctl/admin_commands.h"
#include "server/ctl/dataset_commands.h"
#include "server/ctl/megatron_args.h"
#include "server/ctl/plan_command.h"
#include "server/ctl/pretraining_command.h"

int main(int argc, char** argv) {
  CLI::App app{"packfeedctl: datasets, plans and admin queries for packfeed"};
  app.set_version_flag("--version", packfeed::kPackfeedVersion);
  app.require_subcommand(1);
  int exit_code = 0;
  packfeed::server::ctl::AddDatasetCommands(app, &exit_code);
  packfeed::server::ctl::AddPlanCommand(app, &exit_code);
  packfeed::server::ctl::AddPretrainingCommand(app, &exit_code);
  packfeed::server::ctl::AddMegatronConfigCommand(app, &exit_code);
  packfeed::server::ctl::AddAdminCommands(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
