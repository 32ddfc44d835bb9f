// cxlpoold's body as a library: flags -> config -> topology (discovered on
// a worker) -> pools -> lease manager (+ lease journal and restart recovery)
// -> handler -> server, plus signals, systemd notification and the memlock
// limit. daemon/main.cc only parses the command line and calls RunDaemon.
// See docs/daemon.md.
//
// Thread safety: RunDaemon runs the daemon's event loop on the calling
// thread until SIGINT/SIGTERM; call it once per process.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "config/config.h"
#include "cxlpool/common/status.h"
#include "server/limits.h"

namespace cxlpool {

struct DaemonFlags {
  std::string config;
  std::string socket;
  std::string sysfs_root;
  std::string log_level;
  std::string state_dir;     // overrides daemon.state_dir
  std::string grace_period;  // overrides daemon.grace_period: "30", "30s", "500ms"
  bool foreground = false;
  bool print_default_config = false;
  bool check_config = false;
};

// The process exit code (cxlpoold(8), EXIT STATUS): 0 after a clean
// shutdown; 1 when the daemon could not start (socket, pools, state
// directory, background fork); 2 for a bad command line or configuration,
// including a metrics.http_listen address that cannot be bound. The unit
// does not restart on 2 (RestartPreventExitStatus=2).
int RunDaemon(const DaemonFlags& flags);

// The server limits for a daemon whose RLIMIT_NOFILE is `nofile`: the
// [limits] values set, the rest derived (ServerLimits::ForFdLimit; a
// whole-daemon limit set alone brings its per-uid share and reserve along).
// INVALID_ARGUMENT naming the `limits.` key when they do not fit together.
Result<ServerLimits> ResolveLimits(const LimitsConfig& config, uint64_t nofile);

// "30" / "30s" (seconds) or "500ms"; nullopt when garbled or over an hour.
std::optional<std::chrono::milliseconds> ParseGracePeriod(const std::string& text);

}  // namespace cxlpool
