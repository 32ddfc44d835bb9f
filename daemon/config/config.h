// Daemon configuration: the TOML schema (toml++), its embedded default, and
// the resolution of values that depend on the machine (socket path, pool
// capacity in percent of a node's memory, user and group names).
//
// Parsing is strict: an unknown key, a wrong type or a bad value is an
// INVALID_ARGUMENT whose message starts with the dotted key ("pools.capacity:
// ..."). toml++ exceptions are caught here and never leave this module.
//
// Thread safety: DaemonConfig is a value; the functions are reentrant.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/cluster_options.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/status.h"
#include "lease/cgroup_match.h"
#include "lease/quota_rules.h"
#include "pool/pool_options.h"
#include "tiering/tiering_options.h"
#include "values/value_parser.h"

namespace cxlpool {

// [limits]: what one client may make the daemon hold, per connection, per
// uid and in all (docs/daemon.md, "Limits"). An unset value is derived at
// start (from RLIMIT_NOFILE) or takes the built-in default; the daemon
// checks the resolved set as a whole (server/limits.h).
struct LimitsConfig {
  std::optional<uint64_t> max_connections, max_connections_per_uid, reserved_connections;
  std::optional<uint64_t> max_requests, max_requests_per_uid, max_requests_per_connection;
  std::optional<uint64_t> max_queued_bytes, max_queued_bytes_per_uid,
      max_queued_bytes_per_connection;
  std::optional<uint64_t> max_fds, max_fds_per_uid, max_fds_per_frame;
  std::optional<uint64_t> max_request_bytes;
  std::optional<std::chrono::milliseconds> hello_timeout, idle_timeout, frame_timeout, send_timeout;
  std::optional<std::chrono::milliseconds> max_busy_per_uid;  // per second; 0: off

  bool operator==(const LimitsConfig&) const = default;
};

// The [pools], [pools.node.N] and [[devdax]] tables are the pool library's
// own settings (PoolsConfig: pool_defaults, node_pools, devdax, ForNode).
struct DaemonConfig : PoolsConfig {
  std::string socket_path;  // empty: DefaultSocketPath()
  std::string socket_group;
  uint32_t socket_mode = 0660;
  std::string admin_group;
  std::optional<gid_t> admin_gid;  // resolved admin_group
  LogLevel log_level = LogLevel::kInfo;
  uint32_t workers = 2;
  // Warm reserve refills run on their own threads at a lower CPU priority,
  // so request-path work (the event loop, cold builds, clients mapping what
  // they were just granted) wins the CPU over refills.
  uint32_t stock_workers = 2;
  int stock_nice = 10;  // nice value of those threads (0..19)
  // SCHED_IDLE for those threads: any other runnable thread (a client being
  // answered, the event loop) preempts a refill at once.
  bool stock_idle = true;
  // Leases up to this size are built and reclaimed on the event-loop thread:
  // a few syscalls cost less than handing the work to a worker and back.
  uint64_t inline_max_bytes = 256 * 1024;
  // A memfd lease built on the request path is cut into extents (memfds)
  // of at most this many bytes, a multiple of 2 MiB; the client maps them
  // back to back as one range. 0: one memfd per lease.
  uint64_t max_extent_bytes = 0;
  // How often each node pool's MemTotal is re-read, so that memory onlined
  // or offlined after start (CXL onlined as system RAM, virtio-mem, balloon)
  // resizes the pool's capacity. 0: never (a SIGHUP still re-reads it).
  std::chrono::milliseconds memory_watch_interval{10000};
  std::vector<QuotaRule> quotas;
  // Where cxlpoold keeps state that survives a restart (live quota changes,
  // lease journal). Empty: DefaultStateDir().
  std::string state_dir;
  // After a restart, how long grants wait for clients to reclaim their
  // journalled leases (ends early once all are back). 0: no grace period.
  uint32_t grace_period_s = 30;
  // [priorities] reserve: class -> room each pool keeps free for higher
  // classes (bytes or percent of the pool's capacity).
  std::map<int32_t, CapacitySpec> priority_reserves;
  // [metrics] http_listen: "127.0.0.1:9464"; empty: no HTTP endpoint.
  std::string metrics_http_listen;
  ClusterOptions cluster;  // [cluster]: empty endpoints, no cluster
  TieringConfig tiering;
  LimitsConfig limits;
  // Accepted but dubious settings (a world-writable socket_mode), one
  // sentence each naming the key; the daemon logs them at start.
  std::vector<std::string> warnings;
};

// The compiled-in default (the text of daemon/cxlpoold.toml).
std::string_view DefaultConfigText();

// Parses TOML text. `origin` names the source in messages ("<default>", a path).
Result<DaemonConfig> ParseConfig(std::string_view text, const std::string& origin = "<config>");
// Reads and parses a file. NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT
// (also for a directory: never a silent run on the defaults).
Result<DaemonConfig> LoadConfigFile(const std::string& path);

// /run/cxlpool/cxlpool.sock for root, else $XDG_RUNTIME_DIR/cxlpool.sock,
// else /tmp/cxlpool-<uid>.sock. `xdg_runtime_dir` may be null.
std::string DefaultSocketPath(uid_t euid, const char* xdg_runtime_dir);

// /var/lib/cxlpool for root, else $XDG_STATE_HOME/cxlpool, else
// $HOME/.local/state/cxlpool, else /tmp/cxlpool-<uid>.state. Either may be null.
std::string DefaultStateDir(uid_t euid, const char* xdg_state_home, const char* home);

// A loopback TCP endpoint "127.0.0.1:9464", "[::1]:9464" or "localhost:9464".
struct LoopbackEndpoint {
  std::string address;  // "127.0.0.1" or "::1"
  uint16_t port = 0;
};
// INVALID_ARGUMENT for anything but a loopback address with a port 1..65535.
Result<LoopbackEndpoint> ParseLoopbackEndpoint(std::string_view text);

}  // namespace cxlpool
