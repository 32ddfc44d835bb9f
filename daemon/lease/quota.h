// QuotaTable: per-uid and per-gid limits per tier (bytes and lease count),
// and the usage they are checked against.
//
// A lease is charged to its owner's uid and primary gid, under the tier of
// the pool it lives in (the node kind, or "devdax"). A rule with tier ""
// limits the sum over all tiers. Attaching to a shared lease charges nothing.
// A refusal is RESOURCE_EXHAUSTED and names the rule, its limit, the usage
// and the request.
//
// Thread safety: none; the event-loop thread owns it. Lookups are hash-map
// lookups, not scans of the leases.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "cxlpool/common/status.h"

namespace cxlpool {

struct QuotaUsage {
  QuotaRule rule;
  uint64_t used_bytes = 0;
  uint64_t used_leases = 0;
};

class QuotaTable {
 public:
  explicit QuotaTable(std::vector<QuotaRule> rules = {});

  // OK if a lease of `bytes` in `tier` fits every rule for uid and gid.
  Status Check(uid_t uid, gid_t gid, const std::string& tier, uint64_t bytes) const;
  void Charge(uid_t uid, gid_t gid, const std::string& tier, uint64_t bytes);
  void Uncharge(uid_t uid, gid_t gid, const std::string& tier, uint64_t bytes);

  // Adds or replaces the rule with the same scope, id and tier. A rule with
  // both limits 0 is removed.
  void SetRule(const QuotaRule& rule);
  std::vector<QuotaUsage> Rules() const;
  // Usage of one subject in one tier ("" = all tiers).
  std::pair<uint64_t, uint64_t> Usage(QuotaScope scope, uint32_t id, const std::string& tier) const;

 private:
  using Key = std::tuple<int, uint32_t, std::string>;  // scope, id, tier
  struct Used {
    uint64_t bytes = 0;
    uint64_t leases = 0;
  };
  Status CheckOne(QuotaScope scope, uint32_t id, const std::string& tier, uint64_t bytes) const;
  void Add(QuotaScope scope, uint32_t id, const std::string& tier, uint64_t bytes, int sign);

  std::map<Key, QuotaRule> rules_;
  std::map<Key, Used> used_;
};

}  // namespace cxlpool
