// Quota rules: what a per-uid, per-gid or per-cgroup limit says, how the
// [[quota]] tables of a TOML file are read into rules (the config file's,
// and the quota store's, lease/quota.h), and the store's text.
//
// Thread safety: values and reentrant functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/status.h"
#include "lease/cgroup_match.h"

namespace cxlpool {

class TableReader;  // values/table_reader.h

enum class QuotaScope { kUid, kGid, kCgroup };
const char* QuotaScopeName(QuotaScope s);  // "uid" / "gid" / "cgroup"

// Priority classes run 0 (the default, refused first) .. kMaxPriority.
inline constexpr int32_t kMaxPriority = 1000;

// A per-uid, per-gid or per-cgroup limit, for one tier (lease/tier_names.h)
// or all (""). A cgroup rule covers that cgroup and every cgroup below it.
struct QuotaRule {
  QuotaScope scope = QuotaScope::kUid;
  uint32_t id = 0;          // uid or gid; 0 for a cgroup rule
  std::string subject;      // as written: "1000" or "alice"; a cgroup's normalized path
  std::string tier;         // "", "dram", "cxl", ... or "devdax"
  uint64_t max_bytes = 0;   // 0: unlimited
  uint64_t max_leases = 0;  // 0: unlimited
  int32_t priority = 0;     // the tenant's priority class (0..kMaxPriority)
};

// Reads the [[quota]] tables of `top` (none: nothing) and appends their
// rules to `rules`. INVALID_ARGUMENT names the table ("quota[2].tier: ...")
// for a bad value, a rule with not exactly one subject, or a second rule
// for the same subject and tier.
Status ReadQuotaTables(TableReader& top, std::vector<QuotaRule>* rules);

// The [[quota]] tables of a file that holds nothing else (the state
// directory's quotas.toml), and its inverse. Same checks as the config file;
// a rule with no limits is kept (it deletes a config rule).
Result<std::vector<QuotaRule>> ParseQuotaRules(std::string_view text, const std::string& origin);
std::string QuotaRulesToToml(const std::vector<QuotaRule>& rules);

}  // namespace cxlpool
