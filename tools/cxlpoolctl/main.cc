// cxlpoolctl: the admin CLI. main() only wires the command table to CLI11
// and owns the global options (--socket, --json, --version), which go
// before or after the command word, as with systemctl and kubectl.
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "commands.h"
#include "cxlpool/common/version.h"
#include "daemon_client.h"

namespace cxlpool::ctl {

std::vector<Command> AllCommands() {
  return {
#define CXLPOOLCTL_COMMAND(Name) Make##Name##Command(),
#include "commands.def"
#undef CXLPOOLCTL_COMMAND
  };
}

namespace {

// A parse that stopped with words left over and no command chosen: the first
// word names a command that does not exist (even with --help after it, which
// CLI11 would otherwise answer with the top-level help and exit 0).
std::optional<std::string> UnknownCommandWord(const CLI::App& app) {
  if (!app.get_subcommands().empty()) return std::nullopt;
  for (const std::string& word : app.remaining()) {
    if (!word.empty() && word[0] != '-') return word;
  }
  return std::nullopt;
}

// Handles a parse that did not reach a command; returns the exit code.
int ParseFailed(CLI::App& app, const CLI::ParseError& e) {
  if (auto word = UnknownCommandWord(app)) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    std::cerr << "cxlpoolctl: unknown command '" << *word << "' (commands: " << names
              << "; see cxlpoolctl --help)\n";
    return kExitUsage;
  }
  const bool help = e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success);
  if (help && !app.remaining(/*recurse=*/true).empty()) {
    // `cxlpoolctl pools NOSUCH --help`: the stray words are an error, not help.
    return app.exit(CLI::ExtrasError(app.remaining(true))) == 0 ? kExitOk : kExitUsage;
  }
  int rc = app.exit(e);  // prints help, the version or the parse error
  return rc == 0 ? kExitOk : kExitUsage;
}

}  // namespace
}  // namespace cxlpool::ctl

int main(int argc, char** argv) {
  using namespace cxlpool::ctl;
  CLI::App app{"cxlpoolctl: inspect and administer the cxlpool memory pool daemon"};
  app.require_subcommand(1);
  app.set_version_flag("--version", cxlpool::VersionLine("cxlpoolctl"),
                       "Print the version and exit");
  ConnOptions global;
  AddGlobalOptions(&app, &global);
  // Subcommands (created below, so they inherit it) hand the options they
  // do not know to this app: the global options work after the command too.
  app.fallthrough();
  app.footer(
      "Global options, before or after the command: --socket PATH, --json, --version, "
      "--help.\nExit status (every command): 0 done (topology may still list discovery warnings); "
      "1 the command failed, or doctor found a warning or an error; 2 bad command line; "
      "3 the daemon could not be reached (not running, wrong socket, no permission on "
      "it).\nEnvironment: CXLPOOL_SOCKET (socket when --socket is not given), CXLPOOL_FSROOT "
      "(sysfs root of topology and doctor), CXLPOOL_NVML_LIBRARY. See cxlpoolctl(8).");
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (const Command& c : AllCommands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions.emplace_back(sub, c.setup(sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ParseFailed(app, e);
  }
  ApplyGlobalOptions(global);
  try {
    for (auto& [sub, run] : actions)
      if (sub->parsed()) return run();
  } catch (const std::exception& e) {
    std::cerr << "cxlpoolctl: internal error: " << e.what() << "\n";
    return kExitFailure;
  }
  return kExitUsage;
}
