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

#include "cxlpool/common/log.h"
#include "cxlpool/common/status.h"

namespace cxlpool {

// A capacity written as bytes ("64G", 1073741824) or percent ("90%").
struct CapacitySpec {
  bool is_percent = true;
  double percent = 90.0;  // when is_percent, in (0, 100]
  uint64_t bytes = 0;     // when !is_percent

  // The capacity on a node with `node_bytes` of memory: never more than the
  // node has.
  uint64_t Resolve(uint64_t node_bytes) const;
  std::string ToString() const;
};

// Leases that will be long-term pinned (CUDA registration, RDMA, io_uring
// fixed buffers) on a node: kAuto decides from the node's zones (never
// where a pin would move the pages off the node); kAllow places them even
// on ZONE_MOVABLE memory (an admin override: the pin then migrates them,
// and the client's check reports where to); kRefuse never places them.
enum class LongTermPinPolicy { kAuto, kAllow, kRefuse };
const char* LongTermPinPolicyName(LongTermPinPolicy p);  // "auto", "allow", "refuse"

// Settings of a NUMA-node pool. Per-node overrides start from the defaults.
struct PoolConfig {
  bool enabled = true;
  // `enabled` was written in this node's own table. A node of unknown kind
  // is pooled only then (NotPooledReason in topology.h).
  bool enabled_explicitly = false;
  LongTermPinPolicy long_term_pins = LongTermPinPolicy::kAuto;
  CapacitySpec capacity;
  bool pin = true;
  bool thp = true;
  bool hugetlb = false;
  // The warm reserve of extents (pool/extent_reserve.h): refilled in the
  // background when ready + building falls to `reserve_low`, up to
  // `reserve_high`; bytes or percent of the pool's capacity. Default 0: none.
  CapacitySpec reserve_low{false, 0, 0};
  CapacitySpec reserve_high{false, 0, 0};
};

// A devdax pool on a DAX region ("dax_region0") or a static device ("dax0.0").
struct DevdaxPoolConfig {
  std::string region;
  std::optional<uint64_t> align;  // sub-device alignment; default: the region's
};

enum class QuotaScope { kUid, kGid, kCgroup };
const char* QuotaScopeName(QuotaScope s);  // "uid" / "gid" / "cgroup"

// Priority classes run 0 (the default, refused first) .. kMaxPriority.
inline constexpr int32_t kMaxPriority = 1000;

// A per-uid, per-gid or per-cgroup limit, for one tier (node kind) or all
// (""). A cgroup rule covers that cgroup and every cgroup below it.
struct QuotaRule {
  QuotaScope scope = QuotaScope::kUid;
  uint32_t id = 0;          // uid or gid; 0 for a cgroup rule
  std::string subject;      // as written: "1000" or "alice"; a cgroup's normalized path
  std::string tier;         // "", "dram", "cxl", ... or "devdax"
  uint64_t max_bytes = 0;   // 0: unlimited
  uint64_t max_leases = 0;  // 0: unlimited
  int32_t priority = 0;     // the tenant's priority class (0..kMaxPriority)
};

// "/system.slice//x.service/" -> "/system.slice/x.service". INVALID_ARGUMENT
// for a relative path, "." or ".." components, or control characters.
Result<std::string> NormalizeCgroupPath(std::string_view path);

// True when the cgroup `path` is `rule_path` or below it (both normalized).
bool CgroupCovers(std::string_view rule_path, std::string_view path);

// [tiering]: the engine that moves hot ranges of leases to DRAM and cold
// ones to CXL (docs/daemon.md, "Tiering").
struct TieringConfig {
  bool enabled = true;
  std::chrono::milliseconds interval{1000};    // one policy round
  std::chrono::milliseconds half_life{60000};  // of the access heat
  double hot_threshold = 1.0;                  // temperature (passes per half-life)
  double cold_threshold = 0.1;
  std::chrono::milliseconds min_residency{30000};  // no second move sooner
  double dram_low_watermark = 10;                  // percent of a DRAM pool free: pressure below
  double dram_high_watermark = 20;                 // demotions aim for this
  double cxl_reserve = 2;                          // percent a CXL pool keeps free
  uint64_t rate_limit_mbps = 1024;                 // MiB/s of migration, 0: unlimited
  std::chrono::milliseconds cooperative_deadline{2000};
  std::chrono::milliseconds cooperative_retry{300000};
  std::chrono::milliseconds max_pause{2000};
  // Urgent hints: on-demand rounds at least hint_interval apart; at most
  // max_urgent_hints_per_uid a second per uid (0: no limit).
  std::chrono::milliseconds hint_interval{100};
  uint64_t max_urgent_hints_per_uid = 1000;
  // "auto": idle page tracking when usable, else DAMON; "idle_page", "damon"
  // (only that one); "off"
  std::string sampling = "auto";
};

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

struct DaemonConfig {
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
  PoolConfig pool_defaults;
  std::map<int, PoolConfig> node_pools;  // node id -> effective settings
  std::vector<DevdaxPoolConfig> devdax;
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
  TieringConfig tiering;
  LimitsConfig limits;
  // Accepted but dubious settings (a world-writable socket_mode), one
  // sentence each naming the key; the daemon logs them at start.
  std::vector<std::string> warnings;

  // The effective settings of node `id`'s pool.
  const PoolConfig& ForNode(int id) const;
};

// The compiled-in default (the text of daemon/cxlpoold.toml).
std::string_view DefaultConfigText();

// Parses TOML text. `origin` names the source in messages ("<default>", a path).
Result<DaemonConfig> ParseConfig(std::string_view text, const std::string& origin = "<config>");
// Reads and parses a file. NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT
// (also for a directory: never a silent run on the defaults).
Result<DaemonConfig> LoadConfigFile(const std::string& path);

// The [[quota]] tables of a file that holds nothing else (the state
// directory's quotas.toml), and its inverse. Same checks as the config file;
// a rule with no limits is kept (it deletes a config rule).
Result<std::vector<QuotaRule>> ParseQuotaRules(std::string_view text, const std::string& origin);
std::string QuotaRulesToToml(const std::vector<QuotaRule>& rules);

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

// Parses a duration: "10s", "500ms", "2m", "1h", or a bare number of
// seconds ("0", "30"). At most 24 h. INVALID_ARGUMENT names `key`.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text, const std::string& key);

// Parses "90%", "64G", "1073741824". INVALID_ARGUMENT names `key`.
Result<CapacitySpec> ParseCapacity(std::string_view text, const std::string& key);

}  // namespace cxlpool
