#include "settings.h"

#include <grp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/frame.h"
#include "values/value_parser.h"

namespace cxlpool {
namespace {

std::optional<gid_t> ResolveGroup(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (auto n = ParseU64(name)) return static_cast<gid_t>(*n);
  struct group gr, *res = nullptr;
  char buf[4096];
  if (getgrnam_r(name.c_str(), &gr, buf, sizeof buf, &res) != 0 || res == nullptr) {
    return std::nullopt;
  }
  return res->gr_gid;
}

// Paths from the command line, made absolute before the background mode's
// chdir("/") (the config path is read again on SIGHUP).
void MakeAbsolute(std::string* path) {
  if (path->empty() || (*path)[0] == '/') return;
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd) != nullptr) *path = std::string(cwd) + "/" + *path;
}

// Raises RLIMIT_NOFILE's soft limit to the hard one (each lease holds an fd)
// and returns it (1M for "unlimited").
uint64_t RaiseFdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    struct rlimit up = {rl.rlim_max, rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
  }
  return rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : static_cast<uint64_t>(rl.rlim_cur);
}

}  // namespace

Result<ServerLimits> ResolveLimits(const LimitsConfig& c, uint64_t nofile) {
  ServerLimits l = ServerLimits::ForFdLimit(nofile);
  // A whole-daemon limit set alone brings its per-uid share and reserve along.
  if (c.max_connections) {
    l.max_connections = *c.max_connections;
    l.max_connections_per_uid = std::max<uint64_t>(1, l.max_connections / 4);
    l.reserved_connections = l.max_connections / 16;
  }
  if (c.max_requests) {
    l.max_requests = *c.max_requests;
    l.max_requests_per_uid = std::max<uint64_t>(1, l.max_requests / 4);
  }
  if (c.max_queued_bytes) {
    l.max_queued_bytes = *c.max_queued_bytes;
    l.max_queued_bytes_per_uid = l.max_queued_bytes / 4;
  }
  if (c.max_fds) {
    l.max_fds = *c.max_fds;
    l.max_fds_per_uid = l.max_fds / 4;
  }
  auto set = [](const std::optional<uint64_t>& v, uint64_t* out) {
    if (v) *out = *v;
  };
  set(c.max_connections_per_uid, &l.max_connections_per_uid);
  set(c.reserved_connections, &l.reserved_connections);
  set(c.max_requests_per_uid, &l.max_requests_per_uid);
  set(c.max_requests_per_connection, &l.max_requests_per_connection);
  set(c.max_queued_bytes_per_uid, &l.max_queued_bytes_per_uid);
  set(c.max_queued_bytes_per_connection, &l.max_queued_bytes_per_connection);
  set(c.max_fds_per_frame, &l.max_fds_per_frame);
  if (!c.max_fds_per_uid && c.max_fds) {
    l.max_fds_per_uid = std::max(l.max_fds_per_uid, l.max_fds_per_frame);
  }
  set(c.max_fds_per_uid, &l.max_fds_per_uid);
  set(c.max_request_bytes, &l.max_request_bytes);
  if (c.hello_timeout) l.hello_timeout = *c.hello_timeout;
  if (c.idle_timeout) l.idle_timeout = *c.idle_timeout;
  if (c.frame_timeout) l.frame_timeout = *c.frame_timeout;
  if (c.send_timeout) l.send_timeout = *c.send_timeout;
  if (c.max_busy_per_uid) l.max_busy_per_uid = *c.max_busy_per_uid;
  CXLPOOL_RETURN_IF_ERROR(l.Validate(wire::kDefaultMaxFrameBytes));
  // What is left of the fd table must hold some leases.
  if (l.FdsReserved() + 256 > nofile) {
    return Status(Code::kInvalidArgument,
                  "limits: " + std::to_string(l.max_connections) +
                      " connections (2 fds each) and max_fds = " + std::to_string(l.max_fds) +
                      " take " + std::to_string(l.FdsReserved()) + " of RLIMIT_NOFILE " +
                      std::to_string(nofile) +
                      ", leaving under 256 for leases; lower them or raise LimitNOFILE=");
  }
  return l;
}

std::optional<std::chrono::milliseconds> ParseGracePeriod(const std::string& text) {
  auto d = ParseDuration(text, "--grace-period");
  if (!d.ok() || *d > std::chrono::hours(1)) return std::nullopt;
  return *d;
}

std::optional<DaemonSettings> LoadDaemonSettings(const DaemonFlags& command_line, int* exit_code) {
  DaemonSettings s;
  s.flags = command_line;
  DaemonFlags& flags = s.flags;
  for (std::string* p : {&flags.config, &flags.socket, &flags.sysfs_root, &flags.state_dir}) {
    MakeAbsolute(p);
  }
  *exit_code = 2;
  auto cfg = flags.config.empty() ? ParseConfig(DefaultConfigText(), "<default>")
                                  : LoadConfigFile(flags.config);
  if (!cfg.ok()) {
    CXLPOOL_LOG(kError) << cfg.status().ToString();
    return std::nullopt;
  }
  LogLevel level = cfg->log_level;
  if (!flags.log_level.empty() && !ParseLogLevel(flags.log_level, &level)) {
    CXLPOOL_LOG(kError) << "--log-level: unknown level '" << flags.log_level
                        << "' (debug, info, warning, error)";
    return std::nullopt;
  }
  SetLogLevel(level);
  s.nofile = RaiseFdLimit();
  Result<ServerLimits> limits = ResolveLimits(cfg->limits, s.nofile);
  if (!limits.ok()) {
    std::fprintf(stderr, "cxlpoold: %s: %s\n",
                 flags.config.empty() ? "<default>" : flags.config.c_str(),
                 limits.status().message().c_str());
    return std::nullopt;
  }
  if (flags.check_config) {
    for (const auto& w : cfg->warnings) std::fprintf(stderr, "cxlpoold: warning: %s\n", w.c_str());
    std::printf("config OK\n");
    *exit_code = 0;
    return std::nullopt;
  }
  for (const auto& w : cfg->warnings) CXLPOOL_LOG(kWarning) << "config: " << w;
  s.socket_group = ResolveGroup(cfg->socket_group);
  if (!cfg->socket_group.empty() && !s.socket_group) {
    CXLPOOL_LOG(kError) << "daemon.socket_group: no such group '" << cfg->socket_group
                        << "' (create it, or set socket_group = \"\")";
    return std::nullopt;
  }
  s.socket_path = !flags.socket.empty() ? flags.socket
                  : !cfg->socket_path.empty()
                      ? cfg->socket_path
                      : DefaultSocketPath(::geteuid(), ::getenv("XDG_RUNTIME_DIR"));
  // Under systemd (Type=notify) the main pid must stay: never fork there.
  s.under_systemd = ::getenv("NOTIFY_SOCKET") != nullptr || ::getenv("INVOCATION_ID") != nullptr;
  s.config = std::move(*cfg);
  s.limits = *limits;
  *exit_code = 0;
  return s;
}

}  // namespace cxlpool
