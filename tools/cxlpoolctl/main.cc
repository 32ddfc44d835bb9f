// cxlpoolctl: the admin CLI. main() only wires the command table to CLI11.
#include <exception>
#include <iostream>
#include <utility>

#include "commands.h"

namespace cxlpool::ctl {

std::vector<Command> AllCommands() {
  return {
#define CXLPOOLCTL_COMMAND(Name) Make##Name##Command(),
#include "commands.def"
#undef CXLPOOLCTL_COMMAND
  };
}

}  // namespace cxlpool::ctl

int main(int argc, char** argv) {
  using namespace cxlpool::ctl;
  CLI::App app{"cxlpoolctl: inspect and administer the cxlpool memory pool daemon"};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 ok (warnings may be listed), 1 failure, 2 bad command line, "
      "3 daemon unreachable.");
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (const Command& c : AllCommands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions.emplace_back(sub, c.setup(sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help or the parse error
    return rc == 0 ? kExitOk : kExitUsage;
  }
  try {
    for (auto& [sub, run] : actions)
      if (sub->parsed()) return run();
  } catch (const std::exception& e) {
    std::cerr << "cxlpoolctl: internal error: " << e.what() << "\n";
    return kExitFailure;
  }
  return kExitUsage;
}
