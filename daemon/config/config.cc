#include "config/config.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "cxlpool/common/strings.h"

namespace cxlpool {

uint64_t CapacitySpec::Resolve(uint64_t node_bytes) const {
  if (!is_percent) return std::min(bytes, node_bytes);
  double b = std::floor(static_cast<double>(node_bytes) * percent / 100.0);
  uint64_t v = b <= 0 ? 0 : static_cast<uint64_t>(b);
  return std::min(v, node_bytes);
}

std::string CapacitySpec::ToString() const {
  if (!is_percent) return std::to_string(bytes);
  std::ostringstream os;
  os << percent << "%";
  return os.str();
}

const char* QuotaScopeName(QuotaScope s) {
  switch (s) {
    case QuotaScope::kUid:
      return "uid";
    case QuotaScope::kGid:
      return "gid";
    case QuotaScope::kCgroup:
      return "cgroup";
  }
  return "?";
}

Result<std::string> NormalizeCgroupPath(std::string_view path) {
  if (path.empty() || path[0] != '/') {
    return Status(Code::kInvalidArgument,
                  "cgroup path '" + std::string(path) + "' must be absolute (\"/system.slice/x\")");
  }
  if (path.size() > 4096) return Status(Code::kInvalidArgument, "cgroup path longer than 4096");
  std::string out;
  for (const auto& part : Split(path, '/')) {
    if (part.empty()) continue;
    if (part == "." || part == "..") {
      return Status(Code::kInvalidArgument,
                    "cgroup path '" + std::string(path) + "' has a '.' or '..' component");
    }
    for (char c : part) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return Status(Code::kInvalidArgument, "cgroup path has a control character");
      }
    }
    out += "/" + part;
  }
  return out.empty() ? std::string("/") : out;
}

bool CgroupCovers(std::string_view rule_path, std::string_view path) {
  if (path.empty() || rule_path.empty()) return false;
  if (rule_path == "/") return path[0] == '/';
  if (!StartsWith(path, rule_path)) return false;
  return path.size() == rule_path.size() || path[rule_path.size()] == '/';
}

std::string DefaultStateDir(uid_t euid, const char* xdg_state_home, const char* home) {
  if (euid == 0) return "/var/lib/cxlpool";
  if (xdg_state_home != nullptr && xdg_state_home[0] == '/') {
    return std::string(xdg_state_home) + "/cxlpool";
  }
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.local/state/cxlpool";
  return "/tmp/cxlpool-" + std::to_string(euid) + ".state";
}

Result<LoopbackEndpoint> ParseLoopbackEndpoint(std::string_view text) {
  auto bad = [&](const std::string& why) {
    std::string msg = "'";  // appended, not "'" + ...: GCC 12 -O3 -Wrestrict false positive
    msg.append(text).append("': ").append(why);
    return Status(Code::kInvalidArgument, msg);
  };
  std::string_view host, port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("want [::1]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("want HOST:PORT, e.g. 127.0.0.1:9464");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto p = ParseU64(port);
  if (!p || *p == 0 || *p > 65535) return bad("port must be 1..65535");
  LoopbackEndpoint ep;
  ep.port = static_cast<uint16_t>(*p);
  if (host == "localhost") {
    ep.address = "127.0.0.1";
    return ep;
  }
  if (host == "::1") {
    ep.address = "::1";
    return ep;
  }
  auto octets = Split(host, '.');
  bool ipv4 = octets.size() == 4;
  for (const auto& o : octets) {
    auto v = ParseU64(o);
    ipv4 = ipv4 && v && *v <= 255 && !o.empty() && o.size() <= 3;
  }
  if (!ipv4) return bad("host must be a loopback address (127.0.0.1, ::1 or localhost)");
  if (octets[0] != "127") {
    return bad("metrics are only served on loopback (127.0.0.0/8 or ::1); '" + std::string(host) +
               "' is not");
  }
  ep.address = std::string(host);
  return ep;
}

const char* LongTermPinPolicyName(LongTermPinPolicy p) {
  switch (p) {
    case LongTermPinPolicy::kAuto:
      return "auto";
    case LongTermPinPolicy::kAllow:
      return "allow";
    case LongTermPinPolicy::kRefuse:
      return "refuse";
  }
  return "auto";
}

const PoolConfig& DaemonConfig::ForNode(int id) const {
  auto it = node_pools.find(id);
  return it == node_pools.end() ? pool_defaults : it->second;
}

std::string DefaultSocketPath(uid_t euid, const char* xdg_runtime_dir) {
  if (euid == 0) return "/run/cxlpool/cxlpool.sock";
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    return std::string(xdg_runtime_dir) + "/cxlpool.sock";
  }
  return "/tmp/cxlpool-" + std::to_string(euid) + ".sock";
}

Result<CapacitySpec> ParseCapacity(std::string_view text, const std::string& key) {
  std::string_view t = Trim(text);
  CapacitySpec spec;
  if (EndsWith(t, "%")) {
    std::string num(Trim(t.substr(0, t.size() - 1)));
    char* end = nullptr;
    double p = num.empty() ? -1 : std::strtod(num.c_str(), &end);
    if (num.empty() || end == nullptr || *end != '\0' || !(p > 0) || p > 100) {
      return Status(Code::kInvalidArgument,
                    key + ": bad percent '" + std::string(text) + "' (want 0 < N <= 100)");
    }
    spec.is_percent = true;
    spec.percent = p;
    return spec;
  }
  auto b = ParseByteSize(t);
  if (!b.ok()) {
    return Status(Code::kInvalidArgument,
                  key + ": bad capacity '" + std::string(text) +
                      "' (want bytes like \"64G\" or a percent like \"90%\")");
  }
  spec.is_percent = false;
  spec.bytes = *b;
  return spec;
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text, const std::string& key) {
  std::string_view t = Trim(text);
  uint64_t scale = 1000;  // a bare number is seconds
  if (EndsWith(t, "ms")) {
    scale = 1;
    t.remove_suffix(2);
  } else if (EndsWith(t, "s")) {
    t.remove_suffix(1);
  } else if (EndsWith(t, "m")) {
    scale = 60 * 1000;
    t.remove_suffix(1);
  } else if (EndsWith(t, "h")) {
    scale = 3600 * 1000;
    t.remove_suffix(1);
  }
  constexpr uint64_t kMaxMs = 24ull * 3600 * 1000;
  auto v = ParseU64(Trim(t));
  if (!v || *v > kMaxMs / scale) {
    return Status(Code::kInvalidArgument,
                  key + ": bad duration '" + std::string(text) +
                      "' (want e.g. \"10s\", \"500ms\", \"2m\" or \"0\"; at most 24h)");
  }
  return std::chrono::milliseconds(*v * scale);
}

namespace {

Status Bad(const std::string& key, const std::string& what) {
  return Status(Code::kInvalidArgument, key + ": " + what);
}

std::string Join(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

// Reads keys of one table and remembers which were consumed, so that the
// rest can be reported as unknown.
class TableReader {
 public:
  TableReader(const toml::table& t, std::string path) : t_(t), path_(std::move(path)) {}

  const toml::node* Get(std::string_view key) {
    seen_.insert(std::string(key));
    return t_.get(key);
  }
  std::string Key(std::string_view key) const { return Join(path_, key); }

  Status ReadString(std::string_view key, std::string* out) {
    const toml::node* n = Get(key);
    if (n == nullptr) return Status::Ok();
    auto v = n->value<std::string>();
    if (!n->is_string() || !v) return Bad(Key(key), "expected a string");
    *out = *v;
    return Status::Ok();
  }
  Status ReadBool(std::string_view key, bool* out) {
    const toml::node* n = Get(key);
    if (n == nullptr) return Status::Ok();
    if (!n->is_boolean()) return Bad(Key(key), "expected true or false");
    *out = *n->value<bool>();
    return Status::Ok();
  }
  Status ReadUint(std::string_view key, uint64_t max, uint64_t* out) {
    const toml::node* n = Get(key);
    if (n == nullptr) return Status::Ok();
    if (!n->is_integer()) return Bad(Key(key), "expected an integer");
    int64_t v = *n->value<int64_t>();
    if (v < 0 || static_cast<uint64_t>(v) > max) {
      return Bad(Key(key), "out of range (0.." + std::to_string(max) + "): " + std::to_string(v));
    }
    *out = static_cast<uint64_t>(v);
    return Status::Ok();
  }
  // An integer (bytes) or a string with a unit ("2M").
  Status ReadBytes(std::string_view key, std::optional<uint64_t>* out) {
    const toml::node* n = Get(key);
    if (n == nullptr) return Status::Ok();
    if (n->is_integer()) {
      int64_t v = *n->value<int64_t>();
      if (v < 0) return Bad(Key(key), "negative size");
      *out = static_cast<uint64_t>(v);
      return Status::Ok();
    }
    if (n->is_string()) {
      auto b = ParseByteSize(*n->value<std::string>());
      if (!b.ok()) return Bad(Key(key), b.status().message());
      *out = *b;
      return Status::Ok();
    }
    return Bad(Key(key), "expected a size (integer bytes or a string like \"2M\")");
  }
  Status ReadCapacity(std::string_view key, CapacitySpec* out) {
    const toml::node* n = Get(key);
    if (n == nullptr) return Status::Ok();
    CapacitySpec c;
    if (n->is_integer()) {
      int64_t v = *n->value<int64_t>();
      if (v < 0) return Bad(Key(key), "negative capacity");
      c.is_percent = false;
      c.bytes = static_cast<uint64_t>(v);
    } else if (n->is_string()) {
      auto parsed = ParseCapacity(*n->value<std::string>(), Key(key));
      if (!parsed.ok()) return parsed.status();
      c = *parsed;
    } else {
      return Bad(Key(key), "expected bytes (\"64G\") or a percent (\"90%\")");
    }
    if (!c.is_percent && c.bytes < 4096) {
      return Bad(Key(key), "capacity of " + std::to_string(c.bytes) +
                               " bytes holds no page (at least 4K; to turn a node's pool off "
                               "use enabled = false)");
    }
    *out = c;
    return Status::Ok();
  }
  Status ReadDuration(std::string_view key, std::optional<std::chrono::milliseconds>* out) {
    const toml::node* n = Get(key);
    if (n == nullptr) return Status::Ok();
    std::string text;
    if (n->is_integer()) {
      int64_t v = *n->value<int64_t>();
      if (v < 0) return Bad(Key(key), "negative duration");
      text = std::to_string(v);
    } else if (n->is_string()) {
      text = *n->value<std::string>();
    } else {
      return Bad(Key(key), "expected a duration (\"30s\", \"500ms\", \"10m\")");
    }
    auto d = ParseDuration(text, Key(key));
    if (!d.ok()) return d.status();
    *out = *d;
    return Status::Ok();
  }
  // A count 1..max (0 is refused: a limit of nothing).
  Status ReadCount(std::string_view key, uint64_t max, std::optional<uint64_t>* out) {
    if (t_.get(key) == nullptr) {
      Get(key);
      return Status::Ok();
    }
    uint64_t v = 0;
    CXLPOOL_RETURN_IF_ERROR(ReadUint(key, max, &v));
    if (v == 0) return Bad(Key(key), "must be at least 1");
    *out = v;
    return Status::Ok();
  }
  // Bytes min..max.
  Status ReadByteLimit(std::string_view key, uint64_t min, uint64_t max,
                       std::optional<uint64_t>* out) {
    std::optional<uint64_t> v;
    CXLPOOL_RETURN_IF_ERROR(ReadBytes(key, &v));
    if (!v) return Status::Ok();
    if (*v < min || *v > max) {
      return Bad(Key(key), std::to_string(*v) + " bytes is out of range (" + HumanBytes(min) +
                               ".." + HumanBytes(max) + ")");
    }
    *out = v;
    return Status::Ok();
  }

  // Everything not consumed is an unknown key.
  Status CheckUnknown() const {
    for (const auto& [k, v] : t_) {
      if (!seen_.count(std::string(k.str()))) return Bad(Key(k.str()), "unknown key");
    }
    return Status::Ok();
  }

 private:
  const toml::table& t_;
  std::string path_;
  std::set<std::string> seen_;
};

// [tiering] (docs/daemon.md, "Tiering").
Status ReadTiering(const toml::table& t, TieringConfig* out) {
  TableReader r(t, "tiering");
  CXLPOOL_RETURN_IF_ERROR(r.ReadBool("enabled", &out->enabled));
  auto duration = [&](std::string_view key, std::chrono::milliseconds* d) -> Status {
    std::string text;
    CXLPOOL_RETURN_IF_ERROR(r.ReadString(key, &text));
    if (text.empty()) return Status::Ok();
    auto v = ParseDuration(text, r.Key(key));
    if (!v.ok()) return v.status();
    *d = *v;
    return Status::Ok();
  };
  auto number = [&](std::string_view key, double lo, double hi, double* v) -> Status {
    const toml::node* n = r.Get(key);
    if (n == nullptr) return Status::Ok();
    if (!n->is_number()) return Bad(r.Key(key), "expected a number");
    double x = n->is_integer() ? static_cast<double>(*n->value<int64_t>()) : *n->value<double>();
    if (!(x >= lo && x <= hi)) {
      return Bad(r.Key(key), "out of range (" + std::to_string(lo) + ".." + std::to_string(hi) +
                                 "): " + std::to_string(x));
    }
    *v = x;
    return Status::Ok();
  };
  auto percent = [&](std::string_view key, double* v) -> Status {
    std::string text;
    CXLPOOL_RETURN_IF_ERROR(r.ReadString(key, &text));
    if (text.empty()) return Status::Ok();
    auto c = ParseCapacity(text, r.Key(key));
    if (!c.ok()) return c.status();
    if (!c->is_percent || c->percent >= 100) {
      return Bad(r.Key(key), "expected a percent below 100% (\"10%\")");
    }
    *v = c->percent;
    return Status::Ok();
  };
  CXLPOOL_RETURN_IF_ERROR(duration("interval", &out->interval));
  CXLPOOL_RETURN_IF_ERROR(duration("half_life", &out->half_life));
  CXLPOOL_RETURN_IF_ERROR(duration("min_residency", &out->min_residency));
  CXLPOOL_RETURN_IF_ERROR(duration("cooperative_deadline", &out->cooperative_deadline));
  CXLPOOL_RETURN_IF_ERROR(duration("cooperative_retry", &out->cooperative_retry));
  CXLPOOL_RETURN_IF_ERROR(duration("max_pause", &out->max_pause));
  CXLPOOL_RETURN_IF_ERROR(duration("hint_interval", &out->hint_interval));
  CXLPOOL_RETURN_IF_ERROR(
      r.ReadUint("max_urgent_hints_per_uid", 1u << 20, &out->max_urgent_hints_per_uid));
  CXLPOOL_RETURN_IF_ERROR(number("hot_threshold", 0, 1e9, &out->hot_threshold));
  CXLPOOL_RETURN_IF_ERROR(number("cold_threshold", 0, 1e9, &out->cold_threshold));
  CXLPOOL_RETURN_IF_ERROR(percent("dram_low_watermark", &out->dram_low_watermark));
  CXLPOOL_RETURN_IF_ERROR(percent("dram_high_watermark", &out->dram_high_watermark));
  CXLPOOL_RETURN_IF_ERROR(percent("cxl_reserve", &out->cxl_reserve));
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint("rate_limit_mbps", 1u << 24, &out->rate_limit_mbps));
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("sampling", &out->sampling));
  if (out->sampling != "auto" && out->sampling != "off" && out->sampling != "idle_page" &&
      out->sampling != "damon") {
    return Bad("tiering.sampling", "expected \"auto\", \"idle_page\", \"damon\" or \"off\", not '" +
                                       out->sampling + "'");
  }
  if (!(out->hot_threshold > out->cold_threshold)) {
    return Bad("tiering.hot_threshold", "must be greater than cold_threshold");
  }
  if (out->dram_low_watermark > out->dram_high_watermark) {
    return Bad("tiering.dram_low_watermark", "must not exceed dram_high_watermark");
  }
  if (out->interval.count() == 0) return Bad("tiering.interval", "must be greater than 0");
  if (out->half_life.count() == 0) return Bad("tiering.half_life", "must be greater than 0");
  return r.CheckUnknown();
}

// `warm_stock` (per-size classes of prefaulted memfds) was replaced by the
// byte reserve: a config that still sets it is refused, naming the key and
// what to set instead, so that no one runs without the warm memory they
// asked for.
Status RefuseWarmStock(TableReader& r) {
  if (r.Get("warm_stock") == nullptr) return Status::Ok();
  return Bad(r.Key("warm_stock"),
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

Status ReadPoolKeys(TableReader& r, PoolConfig* p, bool allow_enabled) {
  if (allow_enabled) {
    p->enabled_explicitly = r.Get("enabled") != nullptr;
    CXLPOOL_RETURN_IF_ERROR(r.ReadBool("enabled", &p->enabled));
    std::string pins;
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("long_term_pins", &pins));
    if (pins == "allow") {
      p->long_term_pins = LongTermPinPolicy::kAllow;
    } else if (pins == "refuse") {
      p->long_term_pins = LongTermPinPolicy::kRefuse;
    } else if (pins.empty() || pins == "auto") {
      p->long_term_pins = LongTermPinPolicy::kAuto;
    } else {
      return Bad(r.Key("long_term_pins"), "expected \"auto\", \"allow\" or \"refuse\"");
    }
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
    return Bad(r.Key("reserve_low"), "must not exceed reserve_high");
  }
  return Status::Ok();
}

std::optional<uint32_t> LookupUser(const std::string& name) {
  struct passwd pw, *res = nullptr;
  char buf[4096];
  if (getpwnam_r(name.c_str(), &pw, buf, sizeof buf, &res) != 0 || res == nullptr) {
    return std::nullopt;
  }
  return res->pw_uid;
}

std::optional<uint32_t> LookupGroup(const std::string& name) {
  struct group gr, *res = nullptr;
  char buf[4096];
  if (getgrnam_r(name.c_str(), &gr, buf, sizeof buf, &res) != 0 || res == nullptr) {
    return std::nullopt;
  }
  return res->gr_gid;
}

bool IsKnownTier(const std::string& t) {
  return t.empty() || t == "dram" || t == "cxl" || t == "hbm" || t == "nvm" || t == "unknown" ||
         t == "devdax";
}

Status ReadQuota(const toml::table& t, const std::string& key, QuotaRule* q) {
  TableReader r(t, key);
  int set = 0;
  if (const toml::node* n = r.Get("cgroup")) {
    ++set;
    if (!n->is_string()) return Bad(r.Key("cgroup"), "expected a path like \"/system.slice/x\"");
    auto path = NormalizeCgroupPath(*n->value<std::string>());
    if (!path.ok()) return Bad(r.Key("cgroup"), path.status().message());
    q->scope = QuotaScope::kCgroup;
    q->id = 0;
    q->subject = *path;
  }
  for (const char* k : {"uid", "user", "gid", "group"}) {
    const toml::node* n = r.Get(k);
    if (n == nullptr) continue;
    ++set;
    bool is_uid = k[0] == 'u';
    q->scope = is_uid ? QuotaScope::kUid : QuotaScope::kGid;
    if (n->is_integer()) {
      int64_t v = *n->value<int64_t>();
      if (v < 0 || v > 0xfffffffe) return Bad(r.Key(k), "bad id " + std::to_string(v));
      q->id = static_cast<uint32_t>(v);
      q->subject = std::to_string(v);
    } else if (n->is_string()) {
      std::string name = *n->value<std::string>();
      auto num = ParseU64(name);
      std::optional<uint32_t> id;
      if (num && *num < 0xffffffffull)
        id = static_cast<uint32_t>(*num);
      else
        id = is_uid ? LookupUser(name) : LookupGroup(name);
      if (!id)
        return Bad(r.Key(k),
                   std::string("no such ") + (is_uid ? "user" : "group") + " '" + name + "'");
      q->id = *id;
      q->subject = name;
    } else {
      return Bad(r.Key(k), "expected a number or a name");
    }
  }
  if (set != 1) return Bad(key, "needs exactly one of uid, user, gid, group, cgroup");
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("tier", &q->tier));
  if (!IsKnownTier(q->tier)) {
    return Bad(r.Key("tier"), "unknown tier '" + q->tier + "' (dram, cxl, hbm, nvm, devdax)");
  }
  std::optional<uint64_t> mb;
  CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("max_bytes", &mb));
  q->max_bytes = mb.value_or(0);
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint("max_leases", UINT32_MAX, &q->max_leases));
  uint64_t prio = 0;
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint("priority", kMaxPriority, &prio));
  q->priority = static_cast<int32_t>(prio);
  return r.CheckUnknown();
}

// [limits]: each value on its own range here; how they fit together (per
// uid below the whole daemon, ...) is checked once the unset ones are
// derived (ServerLimits::Validate).
Status ReadLimits(TableReader& r, LimitsConfig* l) {
  constexpr uint64_t kMaxCount = 1u << 24;
  CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_connections", 1u << 20, &l->max_connections));
  CXLPOOL_RETURN_IF_ERROR(
      r.ReadCount("max_connections_per_uid", 1u << 20, &l->max_connections_per_uid));
  if (r.Get("reserved_connections") != nullptr) {
    uint64_t v = 0;
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("reserved_connections", 1u << 20, &v));
    l->reserved_connections = v;
  }
  CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_requests", kMaxCount, &l->max_requests));
  CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_requests_per_uid", kMaxCount, &l->max_requests_per_uid));
  CXLPOOL_RETURN_IF_ERROR(
      r.ReadCount("max_requests_per_connection", 4096, &l->max_requests_per_connection));
  CXLPOOL_RETURN_IF_ERROR(
      r.ReadByteLimit("max_queued_bytes", 64ull << 10, 1ull << 40, &l->max_queued_bytes));
  CXLPOOL_RETURN_IF_ERROR(r.ReadByteLimit("max_queued_bytes_per_uid", 64ull << 10, 1ull << 40,
                                          &l->max_queued_bytes_per_uid));
  CXLPOOL_RETURN_IF_ERROR(r.ReadByteLimit("max_queued_bytes_per_connection", 64ull << 10,
                                          1ull << 40, &l->max_queued_bytes_per_connection));
  CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_fds", kMaxCount, &l->max_fds));
  CXLPOOL_RETURN_IF_ERROR(r.ReadCount("max_fds_per_uid", kMaxCount, &l->max_fds_per_uid));
  if (r.Get("max_fds_per_frame") != nullptr) {
    uint64_t v = 0;
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("max_fds_per_frame", 253, &v));  // SCM_MAX_FD
    l->max_fds_per_frame = v;
  }
  CXLPOOL_RETURN_IF_ERROR(
      r.ReadByteLimit("max_request_bytes", 1024, 64ull << 20, &l->max_request_bytes));
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("hello_timeout", &l->hello_timeout));
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("idle_timeout", &l->idle_timeout));
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("frame_timeout", &l->frame_timeout));
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("send_timeout", &l->send_timeout));
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("max_busy_per_uid", &l->max_busy_per_uid));
  if (l->max_busy_per_uid && (*l->max_busy_per_uid > std::chrono::seconds(64) ||
                              (l->max_busy_per_uid->count() > 0 &&
                               *l->max_busy_per_uid < std::chrono::milliseconds(10)))) {
    return Bad(r.Key("max_busy_per_uid"), "10ms..64s of daemon time a second (or 0: never)");
  }
  const std::pair<const char*, const std::optional<std::chrono::milliseconds>*> timeouts[] = {
      {"hello_timeout", &l->hello_timeout},
      {"frame_timeout", &l->frame_timeout},
      {"idle_timeout", &l->idle_timeout},
      {"send_timeout", &l->send_timeout}};
  for (const auto& [key, value] : timeouts) {
    if (!*value) continue;
    // hello and frame timeouts must exist; idle and send may be off (0).
    const bool may_be_off = key[0] == 'i' || key[0] == 's';
    if ((*value)->count() == 0 && may_be_off) continue;
    if ((*value)->count() < 10) {
      return Bad(r.Key(key), may_be_off ? "at least 10ms (or 0: never)" : "at least 10ms");
    }
  }
  return r.CheckUnknown();
}

Status Build(const toml::table& root, DaemonConfig* cfg) {
  TableReader top(root, "");
  if (const toml::node* n = top.Get("daemon")) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return Bad("daemon", "expected a table");
    TableReader r(*t, "daemon");
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("socket", &cfg->socket_path));
    if (!cfg->socket_path.empty() && cfg->socket_path[0] != '/') {
      return Bad("daemon.socket", "must be an absolute path");
    }
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("state_dir", &cfg->state_dir));
    if (!cfg->state_dir.empty() && cfg->state_dir[0] != '/') {
      return Bad("daemon.state_dir", "must be an absolute path");
    }
    uint64_t grace = cfg->grace_period_s;
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("grace_period", 3600, &grace));
    cfg->grace_period_s = static_cast<uint32_t>(grace);
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("socket_group", &cfg->socket_group));
    if (!cfg->socket_group.empty() && !LookupGroup(cfg->socket_group) &&
        !ParseU64(cfg->socket_group)) {
      return Bad("daemon.socket_group", "no such group '" + cfg->socket_group + "'");
    }
    std::string mode;
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("socket_mode", &mode));
    if (!mode.empty()) {
      auto m = ParseU64(mode, 8);
      if (!m || *m > 0777) return Bad("daemon.socket_mode", "bad octal mode '" + mode + "'");
      if ((*m & 0600) != 0600) {
        return Bad("daemon.socket_mode",
                   "'" + mode + "' does not let the daemon's own user read and write the socket");
      }
      cfg->socket_mode = static_cast<uint32_t>(*m);
      if (*m & 0002) {
        cfg->warnings.push_back("daemon.socket_mode '" + mode +
                                "' is world-writable: every local user (and every container "
                                "that sees the socket) may lease pinned memory; use 0660 with "
                                "socket_group for a chosen group");
      }
    }
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("admin_group", &cfg->admin_group));
    if (!cfg->admin_group.empty()) {
      auto num = ParseU64(cfg->admin_group);
      auto gid = num ? std::optional<uint32_t>(static_cast<uint32_t>(*num))
                     : LookupGroup(cfg->admin_group);
      if (!gid) return Bad("daemon.admin_group", "no such group '" + cfg->admin_group + "'");
      cfg->admin_gid = *gid;
    }
    std::string level;
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("log_level", &level));
    if (!level.empty() && !ParseLogLevel(level, &cfg->log_level)) {
      return Bad("daemon.log_level", "unknown level '" + level + "' (debug, info, warning, error)");
    }
    uint64_t workers = cfg->workers;
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("workers", 256, &workers));
    if (workers == 0) return Bad("daemon.workers", "must be at least 1");
    cfg->workers = static_cast<uint32_t>(workers);
    uint64_t stock_workers = cfg->stock_workers;
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("stock_workers", 64, &stock_workers));
    if (stock_workers == 0) return Bad("daemon.stock_workers", "must be at least 1");
    cfg->stock_workers = static_cast<uint32_t>(stock_workers);
    uint64_t stock_nice = static_cast<uint64_t>(cfg->stock_nice);
    CXLPOOL_RETURN_IF_ERROR(r.ReadUint("stock_nice", 19, &stock_nice));
    cfg->stock_nice = static_cast<int>(stock_nice);
    CXLPOOL_RETURN_IF_ERROR(r.ReadBool("stock_idle", &cfg->stock_idle));
    std::optional<uint64_t> inline_max;
    CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("inline_max", &inline_max));
    if (inline_max) {
      if (*inline_max > (16ull << 20)) {
        return Bad("daemon.inline_max", "at most 16M (the event loop must not stall)");
      }
      cfg->inline_max_bytes = *inline_max;
    }
    std::optional<uint64_t> max_extent;
    CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("max_extent", &max_extent));
    if (max_extent) {
      if (*max_extent % (2ull << 20) != 0) {
        return Bad("daemon.max_extent", "must be a multiple of 2M (0: one memfd per lease)");
      }
      cfg->max_extent_bytes = *max_extent;
    }
    if (const toml::node* mw = r.Get("memory_watch_interval")) {
      std::string text;
      if (mw->is_integer()) {
        text = std::to_string(*mw->value<int64_t>());
      } else if (mw->is_string()) {
        text = *mw->value<std::string>();
      } else {
        return Bad("daemon.memory_watch_interval", "expected a duration (\"10s\", \"0\" = off)");
      }
      auto d = ParseDuration(text, "daemon.memory_watch_interval");
      if (!d.ok()) return d.status();
      if (d->count() != 0 && d->count() < 100) {
        return Bad("daemon.memory_watch_interval", "at least 100ms (or 0 to turn it off)");
      }
      cfg->memory_watch_interval = *d;
    }
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
  }
  std::map<int, const toml::table*> overrides;
  if (const toml::node* n = top.Get("pools")) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return Bad("pools", "expected a table");
    TableReader r(*t, "pools");
    CXLPOOL_RETURN_IF_ERROR(ReadPoolKeys(r, &cfg->pool_defaults, /*allow_enabled=*/false));
    if (const toml::node* nn = r.Get("node")) {
      const toml::table* nt = nn->as_table();
      if (nt == nullptr) return Bad("pools.node", "expected a table of node ids");
      for (const auto& [k, v] : *nt) {
        std::string key = "pools.node." + std::string(k.str());
        auto id = ParseU64(k.str());
        if (!id || *id > 4095) return Bad(key, "not a NUMA node id");
        if (!v.is_table()) return Bad(key, "expected a table");
        overrides[static_cast<int>(*id)] = v.as_table();
      }
    }
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
  }
  for (const auto& [id, t] : overrides) {
    PoolConfig p = cfg->pool_defaults;
    TableReader r(*t, "pools.node." + std::to_string(id));
    CXLPOOL_RETURN_IF_ERROR(ReadPoolKeys(r, &p, /*allow_enabled=*/true));
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
    cfg->node_pools[id] = std::move(p);
  }
  if (const toml::node* n = top.Get("devdax")) {
    const toml::array* arr = n->as_array();
    if (arr == nullptr) return Bad("devdax", "expected [[devdax]] tables");
    for (size_t i = 0; i < arr->size(); ++i) {
      std::string key = "devdax[" + std::to_string(i) + "]";
      const toml::table* t = arr->get(i)->as_table();
      if (t == nullptr) return Bad(key, "expected a table");
      TableReader r(*t, key);
      DevdaxPoolConfig d;
      CXLPOOL_RETURN_IF_ERROR(r.ReadString("region", &d.region));
      if (d.region.empty()) return Bad(key + ".region", "required");
      CXLPOOL_RETURN_IF_ERROR(r.ReadBytes("align", &d.align));
      if (d.align && (*d.align == 0 || (*d.align & (*d.align - 1)) != 0)) {
        return Bad(key + ".align", "must be a power of two");
      }
      CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
      for (const auto& other : cfg->devdax) {
        if (other.region == d.region) return Bad(key + ".region", "duplicate '" + d.region + "'");
      }
      cfg->devdax.push_back(std::move(d));
    }
  }
  if (const toml::node* n = top.Get("quota")) {
    const toml::array* arr = n->as_array();
    if (arr == nullptr) return Bad("quota", "expected [[quota]] tables");
    for (size_t i = 0; i < arr->size(); ++i) {
      std::string key = "quota[" + std::to_string(i) + "]";
      const toml::table* t = arr->get(i)->as_table();
      if (t == nullptr) return Bad(key, "expected a table");
      QuotaRule q;
      CXLPOOL_RETURN_IF_ERROR(ReadQuota(*t, key, &q));
      for (const auto& o : cfg->quotas) {
        bool same_subject = q.scope == QuotaScope::kCgroup ? o.subject == q.subject : o.id == q.id;
        if (o.scope == q.scope && same_subject && o.tier == q.tier) {
          return Bad(key, "duplicate quota for " + std::string(QuotaScopeName(q.scope)) + " " +
                              q.subject + " tier '" + q.tier + "'");
        }
      }
      cfg->quotas.push_back(std::move(q));
    }
  }
  if (const toml::node* n = top.Get("priorities")) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return Bad("priorities", "expected a table");
    TableReader r(*t, "priorities");
    if (const toml::node* rn = r.Get("reserve")) {
      const toml::table* rt = rn->as_table();
      if (rt == nullptr) return Bad("priorities.reserve", "expected { 0 = \"20%\", 1 = \"8G\" }");
      TableReader rr(*rt, "priorities.reserve");
      for (const auto& [k, v] : *rt) {
        std::string key = "priorities.reserve." + std::string(k.str());
        auto cls = ParseU64(k.str());
        if (!cls || *cls > static_cast<uint64_t>(kMaxPriority)) {
          return Bad(key, "not a priority class (0.." + std::to_string(kMaxPriority) + ")");
        }
        CapacitySpec spec;
        CXLPOOL_RETURN_IF_ERROR(rr.ReadCapacity(k.str(), &spec));
        cfg->priority_reserves[static_cast<int32_t>(*cls)] = spec;
      }
    }
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
  }
  if (const toml::node* n = top.Get("metrics")) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return Bad("metrics", "expected a table");
    TableReader r(*t, "metrics");
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("http_listen", &cfg->metrics_http_listen));
    if (!cfg->metrics_http_listen.empty()) {
      auto ep = ParseLoopbackEndpoint(cfg->metrics_http_listen);
      if (!ep.ok()) return Bad("metrics.http_listen", ep.status().message());
    }
    CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
  }
  if (const toml::node* n = top.Get("tiering")) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return Bad("tiering", "expected a table");
    CXLPOOL_RETURN_IF_ERROR(ReadTiering(*t, &cfg->tiering));
  }
  if (const toml::node* n = top.Get("limits")) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return Bad("limits", "expected a table");
    TableReader r(*t, "limits");
    CXLPOOL_RETURN_IF_ERROR(ReadLimits(r, &cfg->limits));
  }
  return top.CheckUnknown();
}

}  // namespace

Result<DaemonConfig> ParseConfig(std::string_view text, const std::string& origin) {
  DaemonConfig cfg;
  cfg.pool_defaults.capacity = CapacitySpec{};
  try {
    toml::table root = toml::parse(text, origin);
    Status st = Build(root, &cfg);
    if (!st.ok()) return Status(st.code(), origin + ": " + st.message());
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    return Status(Code::kInvalidArgument, os.str());
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, origin + ": " + e.what());
  }
  return cfg;
}

Result<std::vector<QuotaRule>> ParseQuotaRules(std::string_view text, const std::string& origin) {
  try {
    toml::table root = toml::parse(text, origin);
    for (const auto& [k, v] : root) {
      if (k.str() != "quota")
        return Status(Code::kInvalidArgument, origin + ": " + std::string(k.str()) +
                                                  ": unknown key (only [[quota]] tables)");
    }
    DaemonConfig cfg;
    Status st = Build(root, &cfg);
    if (!st.ok()) return Status(st.code(), origin + ": " + st.message());
    return cfg.quotas;
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    return Status(Code::kInvalidArgument, os.str());
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, origin + ": " + e.what());
  }
}

std::string QuotaRulesToToml(const std::vector<QuotaRule>& rules) {
  toml::array arr;
  for (const auto& r : rules) {
    toml::table t;
    // Names are kept as written (re-resolved at load); ids and paths as is.
    t.insert(QuotaScopeName(r.scope), r.subject);
    if (!r.tier.empty()) t.insert("tier", r.tier);
    t.insert("max_bytes", std::to_string(r.max_bytes));
    t.insert("max_leases", static_cast<int64_t>(r.max_leases));
    t.insert("priority", static_cast<int64_t>(r.priority));
    arr.push_back(std::move(t));
  }
  toml::table root;
  root.insert("quota", std::move(arr));
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

Result<DaemonConfig> LoadConfigFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "config " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "config " + path);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status(Code::kInvalidArgument, "config " + path + ": is a directory, not a TOML file");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "config " + path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (16u << 20)) {
      ::close(fd);
      return Status(Code::kInvalidArgument, "config " + path + ": larger than 16 MiB");
    }
  }
  ::close(fd);
  return ParseConfig(text, path);
}

}  // namespace cxlpool
