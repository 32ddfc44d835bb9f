// What cxlpoold starts with, read before any thread or fork: the command
// line, the configuration and what follows from them (the server limits for
// this process's fd table, the socket's path and group). The components are
// built from a DaemonSettings by Daemon (daemon.h).
//
// Thread safety: LoadDaemonSettings sets process-wide state (the log level,
// RLIMIT_NOFILE); call it once, before the daemon's threads start.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
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

struct DaemonSettings {
  DaemonFlags flags;  // the paths in it made absolute
  DaemonConfig config;
  ServerLimits limits;
  uint64_t nofile = 0;  // RLIMIT_NOFILE, raised to its hard limit
  std::optional<gid_t> socket_group;
  std::string socket_path;  // where to listen unless systemd passes a socket
  bool under_systemd = false;
};

// Reads the configuration `flags` name (the embedded default when none), sets
// the log level and raises RLIMIT_NOFILE. Nullopt with the process exit code
// in `*exit_code` when the daemon must not start: 2 for a bad configuration
// (logged), 0 after --check-config printed "config OK".
std::optional<DaemonSettings> LoadDaemonSettings(const DaemonFlags& flags, int* exit_code);

// The server limits for a daemon whose RLIMIT_NOFILE is `nofile`: the
// [limits] values set, the rest derived (ServerLimits::ForFdLimit; a
// whole-daemon limit set alone brings its per-uid share and reserve along).
// INVALID_ARGUMENT naming the `limits.` key when they do not fit together.
Result<ServerLimits> ResolveLimits(const LimitsConfig& config, uint64_t nofile);

// A duration as config reads one ("30" = 30s, "500ms", "2m");
// nullopt when garbled or over an hour.
std::optional<std::chrono::milliseconds> ParseGracePeriod(const std::string& text);

}  // namespace cxlpool
