#include "lease/quota_rules.h"

#include <sstream>

#include "cxlpool/common/strings.h"
#include "lease/tier_names.h"
#include "values/table_reader.h"
#include "values/value_parser.h"

namespace cxlpool {

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

namespace {

Status ReadCgroupSubject(TableReader& r, const toml::node& n, QuotaRule* q) {
  if (!n.is_string()) return BadValue(r.Key("cgroup"), "expected a path like \"/system.slice/x\"");
  auto path = NormalizeCgroupPath(*n.value<std::string>());
  if (!path.ok()) return BadValue(r.Key("cgroup"), path.status().message());
  q->scope = QuotaScope::kCgroup;
  q->id = 0;
  q->subject = *path;
  return Status::Ok();
}

// `k`: "uid", "user", "gid" or "group"; a number or a name.
Status ReadIdSubject(TableReader& r, const char* k, const toml::node& n, QuotaRule* q) {
  bool is_uid = k[0] == 'u';
  q->scope = is_uid ? QuotaScope::kUid : QuotaScope::kGid;
  if (n.is_integer()) {
    int64_t v = *n.value<int64_t>();
    if (v < 0 || v > 0xfffffffe) return BadValue(r.Key(k), "bad id " + std::to_string(v));
    q->id = static_cast<uint32_t>(v);
    q->subject = std::to_string(v);
    return Status::Ok();
  }
  if (!n.is_string()) return BadValue(r.Key(k), "expected a number or a name");
  std::string name = *n.value<std::string>();
  auto num = ParseU64(name);
  std::optional<uint32_t> id;
  if (num && *num < 0xffffffffull) {
    id = static_cast<uint32_t>(*num);
  } else {
    id = is_uid ? LookupUser(name) : LookupGroup(name);
  }
  if (!id) {
    return BadValue(r.Key(k),
                    std::string("no such ") + (is_uid ? "user" : "group") + " '" + name + "'");
  }
  q->id = *id;
  q->subject = name;
  return Status::Ok();
}

// One [[quota]] table.
Status ReadQuota(TableReader& r, const std::string& key, QuotaRule* q) {
  int set = 0;
  if (const toml::node* n = r.Get("cgroup")) {
    ++set;
    CXLPOOL_RETURN_IF_ERROR(ReadCgroupSubject(r, *n, q));
  }
  for (const char* k : {"uid", "user", "gid", "group"}) {
    const toml::node* n = r.Get(k);
    if (n == nullptr) continue;
    ++set;
    CXLPOOL_RETURN_IF_ERROR(ReadIdSubject(r, k, *n, q));
  }
  if (set != 1) return BadValue(key, "needs exactly one of uid, user, gid, group, cgroup");
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("tier", &q->tier));
  if (!q->tier.empty() && !IsTierName(q->tier)) {
    return BadValue(r.Key("tier"), "unknown tier '" + q->tier + "' (" + TierNamesHint() + ")");
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

bool SameTarget(const QuotaRule& a, const QuotaRule& b) {
  bool same_subject = a.scope == QuotaScope::kCgroup ? a.subject == b.subject : a.id == b.id;
  return a.scope == b.scope && same_subject && a.tier == b.tier;
}

}  // namespace

Status ReadQuotaTables(TableReader& top, std::vector<QuotaRule>* rules) {
  auto arr = top.Tables("quota");
  if (!arr.ok()) return arr.status();
  if (*arr == nullptr) return Status::Ok();
  return ForEachTable(**arr, "quota", [&](TableReader& r, const std::string& key) -> Status {
    QuotaRule q;
    CXLPOOL_RETURN_IF_ERROR(ReadQuota(r, key, &q));
    for (const auto& o : *rules) {
      if (SameTarget(o, q)) {
        return BadValue(key, "duplicate quota for " + std::string(QuotaScopeName(q.scope)) + " " +
                                 q.subject + " tier '" + q.tier + "'");
      }
    }
    rules->push_back(std::move(q));
    return Status::Ok();
  });
}

Result<std::vector<QuotaRule>> ParseQuotaRules(std::string_view text, const std::string& origin) {
  std::vector<QuotaRule> rules;
  CXLPOOL_RETURN_IF_ERROR(ReadTomlText(text, origin, [&](const toml::table& root) -> Status {
    for (const auto& [k, v] : root) {
      if (k.str() != "quota") {
        return Status(Code::kInvalidArgument,
                      std::string(k.str()) + ": unknown key (only [[quota]] tables)");
      }
    }
    TableReader top(root, "");
    return ReadQuotaTables(top, &rules);
  }));
  return rules;
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

}  // namespace cxlpool
