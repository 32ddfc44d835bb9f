// cxlpoold: the node daemon. This file only parses the command line; the
// daemon itself (wiring of every component) is daemon/app. See
// docs/daemon.md.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "app.h"
#include "config/config.h"

int main(int argc, char** argv) {
  cxlpool::DaemonFlags f;
  CLI::App app{"cxlpoold: pools host DRAM and CXL memory and leases it to GPU processes"};
  app.add_option("--config", f.config, "TOML configuration file (default: the embedded one)");
  app.add_option("--socket", f.socket, "Listening socket path (overrides the config)");
  app.add_option("--sysfs-root", f.sysfs_root,
                 "Read sysfs from this captured tree (no binding to real nodes)");
  app.add_flag("--foreground", f.foreground, "Do not fork into the background");
  app.add_option("--log-level", f.log_level, "debug, info, warning or error");
  app.add_option("--state-dir", f.state_dir,
                 "Directory of the lease journal (overrides daemon.state_dir); leases survive "
                 "a restart of the daemon");
  app.add_option("--grace-period", f.grace_period,
                 "After a restart, how long grants wait for clients' reclaim: 30, 30s, 500ms "
                 "(overrides daemon.grace_period)");
  app.add_flag("--print-default-config", f.print_default_config,
               "Print the embedded default configuration and exit");
  app.add_flag("--check-config", f.check_config, "Parse the configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (f.print_default_config) {
    std::fwrite(cxlpool::DefaultConfigText().data(), 1, cxlpool::DefaultConfigText().size(),
                stdout);
    return 0;
  }
  return cxlpool::RunDaemon(f);
}
