// The configuration's tables other than [daemon] (config_daemon_table.cc).
#include "config/config_tables.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {

// `warm_stock` (per-size classes of prefaulted memfds) was replaced by the
// byte reserve: a config that still sets it is refused, naming the key and
// what to set instead, so that no one runs without the warm memory they
// asked for.
Status RefuseWarmStock(TableReader& r) {
  if (r.Get("warm_stock") == nullptr) return Status::Ok();
  return BadValue(r.Key("warm_stock"),
                  "removed; set reserve_low and reserve_high (bytes or a percentage) instead");
}

// A reserve watermark: bytes or percent of the pool's capacity; 0 (or "0"):
// no reserve.
Status ReadReserveMark(TableReader& r, std::string_view key, CapacitySpec* out) {
  const toml::node* n = r.Get(key);
  if (n == nullptr) return Status::Ok();
  if ((n->is_integer() && *n->value<int64_t>() == 0) ||
      (n->is_string() && Trim(*n->value<std::string>()) == "0")) {
    *out = CapacitySpec{false, 0, 0};
    return Status::Ok();
  }
  return r.ReadCapacity(key, out);
}

Status ReadLongTermPins(TableReader& r, LongTermPinPolicy* out) {
  std::string pins;
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("long_term_pins", &pins));
  if (pins == "allow") {
    *out = LongTermPinPolicy::kAllow;
  } else if (pins == "refuse") {
    *out = LongTermPinPolicy::kRefuse;
  } else if (pins.empty() || pins == "auto") {
    *out = LongTermPinPolicy::kAuto;
  } else {
    return BadValue(r.Key("long_term_pins"), "expected \"auto\", \"allow\" or \"refuse\"");
  }
  return Status::Ok();
}

// The keys of [pools] and of [pools.node.N] (only there: enabled,
// long_term_pins).
Status ReadPoolKeys(TableReader& r, PoolConfig* p, bool node_table) {
  if (node_table) {
    p->enabled_explicitly = r.Get("enabled") != nullptr;
    CXLPOOL_RETURN_IF_ERROR(r.ReadBool("enabled", &p->enabled));
    CXLPOOL_RETURN_IF_ERROR(ReadLongTermPins(r, &p->long_term_pins));
  }
  CXLPOOL_RETURN_IF_ERROR(r.ReadCapacity("capacity", &p->capacity));
  CXLPOOL_RETURN_IF_ERROR(r.ReadBool("pin", &p->pin));
  CXLPOOL_RETURN_IF_ERROR(r.ReadBool("thp", &p->thp));
  CXLPOOL_RETURN_IF_ERROR(r.ReadBool("hugetlb", &p->hugetlb));
  CXLPOOL_RETURN_IF_ERROR(RefuseWarmStock(r));
  CXLPOOL_RETURN_IF_ERROR(ReadReserveMark(r, "reserve_low", &p->reserve_low));
  CXLPOOL_RETURN_IF_ERROR(ReadReserveMark(r, "reserve_high", &p->reserve_high));
  if (p->reserve_low.is_percent == p->reserve_high.is_percent &&
      (p->reserve_low.is_percent ? p->reserve_low.percent > p->reserve_high.percent
                                 : p->reserve_low.bytes > p->reserve_high.bytes)) {
    return BadValue(r.Key("reserve_low"), "must not exceed reserve_high");
  }
  return Status::Ok();
}

// A percent below 100 written as a string ("10%").
Status ReadPercentBelow100(TableReader& r, std::string_view key, double* out) {
  std::string text;
  CXLPOOL_RETURN_IF_ERROR(r.ReadString(key, &text));
  if (text.empty()) return Status::Ok();
  auto c = ParseCapacity(text, r.Key(key));
  if (!c.ok()) return c.status();
  if (!c->is_percent || c->percent >= 100) {
    return BadValue(r.Key(key), "expected a percent below 100% (\"10%\")");
  }
  *out = c->percent;
  return Status::Ok();
}

// How the values of [tiering] fit together.
Status CheckTiering(const TieringConfig& t) {
  if (t.sampling != "auto" && t.sampling != "off" && t.sampling != "idle_page" &&
      t.sampling != "damon") {
    return BadValue(
        "tiering.sampling",
        "expected \"auto\", \"idle_page\", \"damon\" or \"off\", not '" + t.sampling + "'");
  }
  if (!(t.hot_threshold > t.cold_threshold)) {
    return BadValue("tiering.hot_threshold", "must be greater than cold_threshold");
  }
  if (t.dram_low_watermark > t.dram_high_watermark) {
    return BadValue("tiering.dram_low_watermark", "must not exceed dram_high_watermark");
  }
  if (t.interval.count() == 0) return BadValue("tiering.interval", "must be greater than 0");
  if (t.half_life.count() == 0) return BadValue("tiering.half_life", "must be greater than 0");
  return Status::Ok();
}

// The [limits] timeouts: hello and frame timeouts must exist (at least
// 10ms); idle and send may be off (0).
Status CheckTimeouts(TableReader& r, const LimitsConfig& l) {
  if (l.max_busy_per_uid &&
      (*l.max_busy_per_uid > std::chrono::seconds(64) ||
       (l.max_busy_per_uid->count() > 0 && *l.max_busy_per_uid < std::chrono::milliseconds(10)))) {
    return BadValue(r.Key("max_busy_per_uid"), "10ms..64s of daemon time a second (or 0: never)");
  }
  const std::pair<const char*, const std::optional<std::chrono::milliseconds>*> timeouts[] = {
      {"hello_timeout", &l.hello_timeout},
      {"frame_timeout", &l.frame_timeout},
      {"idle_timeout", &l.idle_timeout},
      {"send_timeout", &l.send_timeout}};
  for (const auto& [key, value] : timeouts) {
    if (!*value) continue;
    const bool may_be_off = key[0] == 'i' || key[0] == 's';
    if ((*value)->count() == 0 && may_be_off) continue;
    if ((*value)->count() < 10) {
      return BadValue(r.Key(key), may_be_off ? "at least 10ms (or 0: never)" : "at least 10ms");
    }
  }
  return Status::Ok();
}

// A count that may be 0 (reserved_connections, max_fds_per_frame).
Status ReadOptionalUint(TableReader& r, std::string_view key, uint64_t max,
                        std::optional<uint64_t>* out) {
  if (r.Get(key) == nullptr) return Status::Ok();
  uint64_t v = 0;
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint(key, max, &v));
  *out = v;
  return Status::Ok();
}

}  // namespace

Status ReadPoolsTables(TableReader& top, PoolsConfig* pools) {
  std::map<int, const toml::table*> overrides;
  Status st = ReadTable(top, "pools", [&](TableReader& r) -> Status {
    CXLPOOL_RETURN_IF_ERROR(ReadPoolKeys(r, &pools->pool_defaults, /*node_table=*/false));
    auto nodes = r.Table("node", "a table of node ids");
    if (!nodes.ok()) return nodes.status();
    if (*nodes == nullptr) return Status::Ok();
    for (const auto& [k, v] : **nodes) {
      std::string key = "pools.node." + std::string(k.str());
      auto id = ParseU64(k.str());
      if (!id || *id > 4095) return BadValue(key, "not a NUMA node id");
      if (!v.is_table()) return BadValue(key, "expected a table");
      overrides[static_cast<int>(*id)] = v.as_table();
    }
    return Status::Ok();
  });
  if (!st.ok()) return st;
  for (const auto& [id, t] : overrides) {
    PoolConfig p = pools->pool_defaults;
    TableReader r(*t, "pools.node." + std::to_string(id));
    CXLPOOL_RETURN_IF_ERROR(ReadPoolKeys(r, &p, /*node_table=*/true));
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
    pools->node_pools[id] = std::move(p);
  }
  return Status::Ok();
}

Status ReadDevdaxTables(TableReader& top, PoolsConfig* pools) {
  auto arr = top.Tables("devdax");
  if (!arr.ok()) return arr.status();
  if (*arr == nullptr) return Status::Ok();
  return ForEachTable(**arr, "devdax", [&](TableReader& r, const std::string& key) -> Status {
    DevdaxPoolConfig d;
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("region", &d.region));
    if (d.region.empty()) return BadValue(key + ".region", "required");
    CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("align", &d.align));
    if (d.align && (*d.align == 0 || (*d.align & (*d.align - 1)) != 0)) {
      return BadValue(key + ".align", "must be a power of two");
    }
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
    for (const auto& other : pools->devdax) {
      if (other.region == d.region)
        return BadValue(key + ".region", "duplicate '" + d.region + "'");
    }
    pools->devdax.push_back(std::move(d));
    return Status::Ok();
  });
}

Status ReadPrioritiesTable(TableReader& top, std::map<int32_t, CapacitySpec>* reserves) {
  return ReadTable(top, "priorities", [&](TableReader& r) -> Status {
    auto rt = r.Table("reserve", "{ 0 = \"20%\", 1 = \"8G\" }");
    if (!rt.ok()) return rt.status();
    if (*rt == nullptr) return Status::Ok();
    TableReader rr(**rt, "priorities.reserve");
    for (const auto& [k, v] : **rt) {
      std::string key = "priorities.reserve." + std::string(k.str());
      auto cls = ParseU64(k.str());
      if (!cls || *cls > static_cast<uint64_t>(kMaxPriority)) {
        return BadValue(key, "not a priority class (0.." + std::to_string(kMaxPriority) + ")");
      }
      CapacitySpec spec;
      CXLPOOL_RETURN_IF_ERROR(rr.ReadCapacity(k.str(), &spec));
      (*reserves)[static_cast<int32_t>(*cls)] = spec;
    }
    return Status::Ok();
  });
}

Status ReadMetricsTable(TableReader& top, std::string* http_listen) {
  return ReadTable(top, "metrics", [&](TableReader& r) -> Status {
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("http_listen", http_listen));
    if (http_listen->empty()) return Status::Ok();
    auto ep = ParseLoopbackEndpoint(*http_listen);
    if (!ep.ok()) return BadValue("metrics.http_listen", ep.status().message());
    return Status::Ok();
  });
}

Status ReadTieringTable(TableReader& top, TieringConfig* t) {
  return ReadTable(top, "tiering", [&](TableReader& r) -> Status {
    CXLPOOL_RETURN_IF_ERROR(r.ReadBool("enabled", &t->enabled));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("interval", &t->interval));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("half_life", &t->half_life));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("min_residency", &t->min_residency));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("cooperative_deadline", &t->cooperative_deadline));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("cooperative_retry", &t->cooperative_retry));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("max_pause", &t->max_pause));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("hint_interval", &t->hint_interval));
    CXLPOOL_RETURN_IF_ERROR(
        r.ReadUint("max_urgent_hints_per_uid", 1u << 20, &t->max_urgent_hints_per_uid));
    CXLPOOL_RETURN_IF_ERROR(r.ReadNumber("hot_threshold", 0, 1e9, &t->hot_threshold));
    CXLPOOL_RETURN_IF_ERROR(r.ReadNumber("cold_threshold", 0, 1e9, &t->cold_threshold));
    CXLPOOL_RETURN_IF_ERROR(ReadPercentBelow100(r, "dram_low_watermark", &t->dram_low_watermark));
    CXLPOOL_RETURN_IF_ERROR(ReadPercentBelow100(r, "dram_high_watermark", &t->dram_high_watermark));
    CXLPOOL_RETURN_IF_ERROR(ReadPercentBelow100(r, "cxl_reserve", &t->cxl_reserve));
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("rate_limit_mbps", 1u << 24, &t->rate_limit_mbps));
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("sampling", &t->sampling));
    return CheckTiering(*t);
  });
}

// Each value on its own range here; how they fit together (per uid below
// the whole daemon, ...) is checked once the unset ones are derived
// (ServerLimits::Validate).
Status ReadLimitsTable(TableReader& top, LimitsConfig* l) {
  return ReadTable(top, "limits", [&](TableReader& r) -> Status {
    constexpr uint64_t kMaxCount = 1u << 24;
    constexpr uint64_t kMaxQueued = 1ull << 40;
    CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_connections", 1u << 20, &l->max_connections));
    CXLPOOL_RETURN_IF_ERROR(
        r.ReadCount("max_connections_per_uid", 1u << 20, &l->max_connections_per_uid));
    CXLPOOL_RETURN_IF_ERROR(
        ReadOptionalUint(r, "reserved_connections", 1u << 20, &l->reserved_connections));
    CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_requests", kMaxCount, &l->max_requests));
    CXLPOOL_RETURN_IF_ERROR(
        r.ReadCount("max_requests_per_uid", kMaxCount, &l->max_requests_per_uid));
    CXLPOOL_RETURN_IF_ERROR(
        r.ReadCount("max_requests_per_connection", 4096, &l->max_requests_per_connection));
    CXLPOOL_RETURN_IF_ERROR(
        r.ReadByteLimit("max_queued_bytes", 64ull << 10, kMaxQueued, &l->max_queued_bytes));
    CXLPOOL_RETURN_IF_ERROR(r.ReadByteLimit("max_queued_bytes_per_uid", 64ull << 10, kMaxQueued,
                                            &l->max_queued_bytes_per_uid));
    CXLPOOL_RETURN_IF_ERROR(r.ReadByteLimit("max_queued_bytes_per_connection", 64ull << 10,
                                            kMaxQueued, &l->max_queued_bytes_per_connection));
    CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_fds", kMaxCount, &l->max_fds));
    CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_fds_per_uid", kMaxCount, &l->max_fds_per_uid));
    CXLPOOL_RETURN_IF_ERROR(
        ReadOptionalUint(r, "max_fds_per_frame", 253, &l->max_fds_per_frame));  // SCM_MAX_FD
    CXLPOOL_RETURN_IF_ERROR(
        r.ReadByteLimit("max_request_bytes", 1024, 64ull << 20, &l->max_request_bytes));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("hello_timeout", &l->hello_timeout));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("idle_timeout", &l->idle_timeout));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("frame_timeout", &l->frame_timeout));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("send_timeout", &l->send_timeout));
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("max_busy_per_uid", &l->max_busy_per_uid));
    return CheckTimeouts(r, *l);
  });
}

}  // namespace cxlpool
