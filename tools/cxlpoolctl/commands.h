// cxlpoolctl's command table.
//
// Adding a command is one new file and one line:
//   1. cmd_<name>.cc defines `Command Make<Name>Command()` in cxlpool::ctl;
//   2. commands.def gets `CXLPOOLCTL_COMMAND(<Name>)`.
// tools/CMakeLists.txt compiles every cxlpoolctl/*.cc, so CMake needs no edit
// unless the command links a new library.
//
// Thread safety: the CLI is single-threaded; nothing here is shared.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace cxlpool::ctl {

// Exit codes of every cxlpoolctl command (also printed by --help, and the
// EXIT STATUS table of cxlpoolctl(8)).
enum ExitCode : int {
  kExitOk = 0,           // done (the output may still list discovery warnings)
  kExitFailure = 1,      // the command ran and failed (unreadable root, error reply);
                         // doctor: a finding of severity warning or error
  kExitUsage = 2,        // bad command line
  kExitUnavailable = 3,  // the daemon could not be reached
};

struct Command {
  std::string name;  // subcommand word, e.g. "topology"
  std::string help;  // one line for --help
  // Declares the subcommand's options on `app` and returns the action to run
  // once parsing succeeded (it returns an ExitCode). Keep option storage in
  // something the action owns (e.g. a shared_ptr captured by value).
  std::function<std::function<int()>(CLI::App* app)> setup;
};

// Every command, in the order commands.def lists them.
std::vector<Command> AllCommands();

#define CXLPOOLCTL_COMMAND(Name) Command Make##Name##Command();
#include "commands.def"
#undef CXLPOOLCTL_COMMAND

}  // namespace cxlpool::ctl
