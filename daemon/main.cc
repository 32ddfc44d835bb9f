// cxlpoold: the node daemon. This file only parses the command line; the
// daemon itself (wiring of every component) is daemon/app. See
// docs/daemon.md and cxlpoold(8).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "app.h"
#include "config/config.h"
#include "cxlpool/common/version.h"

int main(int argc, char** argv) {
  cxlpool::DaemonFlags f;
  CLI::App app{"cxlpoold: pools host DRAM and CXL memory and leases it to GPU processes"};
  app.set_version_flag("--version", cxlpool::VersionLine("cxlpoold"), "Print the version and exit");
  app.add_option("--config", f.config, "TOML configuration file (default: the embedded one)")
      ->type_name("FILE");
  app.add_option("--socket", f.socket, "Listening socket path (overrides the config)")
      ->type_name("PATH");
  app.add_option("--sysfs-root", f.sysfs_root,
                 "Read sysfs from this captured tree (no binding to real nodes)")
      ->type_name("DIR");
  app.add_flag("--foreground", f.foreground,
               "Do not fork into the background (never forks under systemd)");
  app.add_option("--log-level", f.log_level, "debug, info, warning or error")->type_name("LEVEL");
  app.add_option("--state-dir", f.state_dir,
                 "Directory of the lease journal (overrides daemon.state_dir); leases survive "
                 "a restart of the daemon")
      ->type_name("DIR");
  app.add_option("--grace-period", f.grace_period,
                 "After a restart, how long grants wait for clients' reclaim: 30, 30s, 500ms "
                 "(overrides daemon.grace_period)")
      ->type_name("TIME");
  app.add_flag("--print-default-config", f.print_default_config,
               "Print the embedded default configuration and exit");
  app.add_flag("--check-config", f.check_config, "Parse the configuration and exit");
  app.footer(
      "Exit status: 0 stopped cleanly (or --help, --version, --check-config succeeded); "
      "1 could not start (socket, pools, state directory); 2 bad command line or "
      "configuration, including a metrics.http_listen that cannot be bound.\n"
      "Environment: CXLPOOL_LOG_LEVEL, CXLPOOL_FSROOT, CXLPOOL_NVML_LIBRARY; under systemd "
      "NOTIFY_SOCKET, LISTEN_FDS, STATE_DIRECTORY, JOURNAL_STREAM (see cxlpoold(8)).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (f.print_default_config) {
    std::fwrite(cxlpool::DefaultConfigText().data(), 1, cxlpool::DefaultConfigText().size(),
                stdout);
    return 0;
  }
  return cxlpool::RunDaemon(f);
}
