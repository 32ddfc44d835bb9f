// QuotaTable: the daemon's tenant policy. Per-uid, per-gid and per-cgroup
// limits per tier (bytes and lease count), the usage they are checked
// against, each tenant's priority class with the pool reserve that class must
// leave free, and the persistence of live changes (`cxlpoolctl quota set`).
//
// Charging: a lease is charged to its owner's uid, primary gid and cgroup
// (and every cgroup above it), under the tier of the pool it lives in (the
// node kind, or "devdax"). A rule with tier "" limits the sum over all tiers.
// A cgroup rule on "/a" covers "/a" and everything below it. Attaching to a
// shared lease charges nothing. A refusal is RESOURCE_EXHAUSTED and names the
// rule, its limit, the usage and the request.
//
// Priority: a tenant's class is the highest `priority` of any rule that
// applies to it (uid, gid, its cgroup or an ancestor; any tier); 0 without
// one. A grant of class P into a pool must leave at least reserve(P) of the
// pool uncommitted (leased + being built), where reserve(P) is the largest
// configured reserve of any class >= P: a class never leaves less room than
// a class above it, so under pressure the low classes are refused first.
//
// Rules: the config file's rules, overlaid by live changes (same scope,
// subject and tier: the live one wins; a live rule with no limit and
// priority 0 deletes). Live changes are written to the store file (TOML,
// atomically: temp file, fsync, rename, fsync of the directory) before they
// take effect, and re-applied at start and on every config reload.
//
// Thread safety: none; the event-loop thread owns it. Checks are map
// lookups (uid, gid, and one per cgroup path component), never scans of the
// leases.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cxlpool/common/status.h"
#include "lease/cgroup_match.h"
#include "lease/quota_rules.h"
#include "pool/pool_options.h"

namespace cxlpool {

// Who is charged: the owner of a lease.
struct Tenant {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  std::string cgroup;  // normalized unified-hierarchy path; "" unknown
};

struct QuotaUsage {
  QuotaRule rule;
  uint64_t used_bytes = 0;
  uint64_t used_leases = 0;
};

class QuotaTable {
 public:
  explicit QuotaTable(std::vector<QuotaRule> config_rules = {});

  // OK if a lease of `bytes` in `tier` fits every rule for the tenant.
  Status Check(const Tenant& t, const std::string& tier, uint64_t bytes) const;
  void Charge(const Tenant& t, const std::string& tier, uint64_t bytes);
  // Undoes exactly one Charge with the same arguments.
  void Uncharge(const Tenant& t, const std::string& tier, uint64_t bytes);
  // Part of a lease: `bytes` in `tier` and in the tenant's total, the lease
  // counted in the tier only when `in_tier` and in the total only when
  // `in_total` (a lease split between tiers counts once in each of its
  // tiers and once in all; a move's room counts bytes only).
  void ChargePart(const Tenant& t, const std::string& tier, uint64_t bytes, bool in_tier,
                  bool in_total);
  void UnchargePart(const Tenant& t, const std::string& tier, uint64_t bytes, bool in_tier,
                    bool in_total);

  // ---- priority classes ----
  int32_t PriorityOf(const Tenant& t) const;
  void SetReserves(std::map<int32_t, CapacitySpec> reserves);
  // reserve(P) in a pool of `capacity` bytes.
  uint64_t ReserveFor(int32_t priority, uint64_t capacity) const;
  // OK when granting `bytes` in `pool` (with `committed` bytes leased or
  // being built out of `capacity`) leaves the reserve of the tenant's class.
  // RESOURCE_EXHAUSTED naming the class, the reserve and what would be left.
  Status CheckReserve(const Tenant& t, const std::string& pool, uint64_t capacity,
                      uint64_t committed, uint64_t bytes) const;

  // ---- rules ----
  // Replaces the config file's rules (start, reload); live changes stay on top.
  void SetConfigRules(std::vector<QuotaRule> rules);
  // Reads live changes from `path` (absent: none) and persists later ones
  // there. INVALID_ARGUMENT naming the file if it is garbled, IO errors as is.
  Status OpenStore(const std::string& path);
  // A live change: persisted first (when a store is open), then applied.
  // On a write error nothing changes. INVALID_ARGUMENT for a bad priority.
  Status SetLiveRule(const QuotaRule& rule);
  const std::string& store_path() const { return store_path_; }
  std::vector<QuotaRule> LiveRules() const;

  std::vector<QuotaUsage> Rules() const;
  // Usage of one subject in one tier ("" = all tiers). `subject` is the id
  // in decimal for uid/gid, the path for a cgroup.
  std::pair<uint64_t, uint64_t> Usage(QuotaScope scope, const std::string& subject,
                                      const std::string& tier) const;

 private:
  using Key = std::tuple<int, std::string, std::string>;  // scope, subject key, tier
  struct Used {
    uint64_t bytes = 0;
    uint64_t leases = 0;
  };
  static Key KeyOf(const QuotaRule& r);
  // (scope, subject key) pairs the tenant is charged to.
  static std::vector<std::pair<QuotaScope, std::string>> Subjects(const Tenant& t);
  Status CheckOne(QuotaScope scope, const std::string& subject, const std::string& tier,
                  uint64_t bytes) const;
  void Add(QuotaScope scope, const std::string& subject, const std::string& tier, uint64_t bytes,
           int sign, bool in_tier = true, bool in_total = true);
  void Rebuild();

  std::map<Key, QuotaRule> config_;
  std::map<Key, QuotaRule> live_;
  std::map<Key, QuotaRule> rules_;                             // effective
  std::map<std::pair<int, std::string>, int32_t> priorities_;  // (scope, subject) -> max
  std::map<int32_t, CapacitySpec> reserves_;
  std::map<Key, Used> used_;
  std::string store_path_;
};

// Writes `text` to `path` atomically (temp file, fsync, rename, fsync of the
// directory), creating missing parent directories with mode 0700.
Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace cxlpool
