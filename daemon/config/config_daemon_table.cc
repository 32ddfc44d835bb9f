// [daemon]: the socket, who may use it, the state directory and the daemon's
// threads.
#include <optional>

#include "config/config_tables.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {

// socket_mode: octal, readable and writable by the daemon's own user.
Status ReadSocketMode(TableReader& r, DaemonConfig* cfg) {
  std::string mode;
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("socket_mode", &mode));
  if (mode.empty()) return Status::Ok();
  auto m = ParseU64(mode, 8);
  if (!m || *m > 0777) return BadValue("daemon.socket_mode", "bad octal mode '" + mode + "'");
  if ((*m & 0600) != 0600) {
    return BadValue("daemon.socket_mode",
                    "'" + mode + "' does not let the daemon's own user read and write the socket");
  }
  cfg->socket_mode = static_cast<uint32_t>(*m);
  if (*m & 0002) {
    cfg->warnings.push_back("daemon.socket_mode '" + mode +
                            "' is world-writable: every local user (and every container "
                            "that sees the socket) may lease pinned memory; use 0660 with "
                            "socket_group for a chosen group");
  }
  return Status::Ok();
}

// Where the daemon listens and keeps its state, and who may use it.
Status ReadDaemonAccess(TableReader& r, DaemonConfig* cfg) {
  CXLPOOL_RETURN_IF_ERROR(r.ReadPath("socket", &cfg->socket_path));
  CXLPOOL_RETURN_IF_ERROR(r.ReadPath("state_dir", &cfg->state_dir));
  uint64_t grace = cfg->grace_period_s;
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint("grace_period", 3600, &grace));
  cfg->grace_period_s = static_cast<uint32_t>(grace);
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("socket_group", &cfg->socket_group));
  if (!cfg->socket_group.empty() && !LookupGroup(cfg->socket_group) &&
      !ParseU64(cfg->socket_group)) {
    return BadValue("daemon.socket_group", "no such group '" + cfg->socket_group + "'");
  }
  CXLPOOL_RETURN_IF_ERROR(ReadSocketMode(r, cfg));
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("admin_group", &cfg->admin_group));
  if (!cfg->admin_group.empty()) {
    auto num = ParseU64(cfg->admin_group);
    auto gid =
        num ? std::optional<uint32_t>(static_cast<uint32_t>(*num)) : LookupGroup(cfg->admin_group);
    if (!gid) return BadValue("daemon.admin_group", "no such group '" + cfg->admin_group + "'");
    cfg->admin_gid = *gid;
  }
  std::string level;
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("log_level", &level));
  if (!level.empty() && !ParseLogLevel(level, &cfg->log_level)) {
    return BadValue("daemon.log_level",
                    "unknown level '" + level + "' (debug, info, warning, error)");
  }
  return Status::Ok();
}

// A count of threads 1..max.
Status ReadThreads(TableReader& r, std::string_view key, uint64_t max, uint32_t* out) {
  uint64_t v = *out;
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint(key, max, &v));
  if (v == 0) return BadValue(r.Key(key), "must be at least 1");
  *out = static_cast<uint32_t>(v);
  return Status::Ok();
}

// The daemon's threads and how leases are built.
Status ReadDaemonWork(TableReader& r, DaemonConfig* cfg) {
  CXLPOOL_RETURN_IF_ERROR(ReadThreads(r, "workers", 256, &cfg->workers));
  CXLPOOL_RETURN_IF_ERROR(ReadThreads(r, "stock_workers", 64, &cfg->stock_workers));
  uint64_t stock_nice = static_cast<uint64_t>(cfg->stock_nice);
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint("stock_nice", 19, &stock_nice));
  cfg->stock_nice = static_cast<int>(stock_nice);
  CXLPOOL_RETURN_IF_ERROR(r.ReadBool("stock_idle", &cfg->stock_idle));
  std::optional<uint64_t> inline_max;
  CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("inline_max", &inline_max));
  if (inline_max) {
    if (*inline_max > (16ull << 20)) {
      return BadValue("daemon.inline_max", "at most 16M (the event loop must not stall)");
    }
    cfg->inline_max_bytes = *inline_max;
  }
  std::optional<uint64_t> max_extent;
  CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("max_extent", &max_extent));
  if (max_extent) {
    if (*max_extent % (2ull << 20) != 0) {
      return BadValue("daemon.max_extent", "must be a multiple of 2M (0: one memfd per lease)");
    }
    cfg->max_extent_bytes = *max_extent;
  }
  std::optional<std::chrono::milliseconds> watch;
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("memory_watch_interval", &watch));
  if (watch) {
    if (watch->count() != 0 && watch->count() < 100) {
      return BadValue("daemon.memory_watch_interval", "at least 100ms (or 0 to turn it off)");
    }
    cfg->memory_watch_interval = *watch;
  }
  return Status::Ok();
}

}  // namespace

Status ReadDaemonTable(TableReader& top, DaemonConfig* cfg) {
  return ReadTable(top, "daemon", [&](TableReader& r) -> Status {
    CXLPOOL_RETURN_IF_ERROR(ReadDaemonAccess(r, cfg));
    return ReadDaemonWork(r, cfg);
  });
}

}  // namespace cxlpool
