#include "lease/quota.h"

#include "cxlpool/common/strings.h"

namespace cxlpool {

QuotaTable::QuotaTable(std::vector<QuotaRule> rules) {
  for (auto& r : rules) SetRule(r);
}

void QuotaTable::SetRule(const QuotaRule& rule) {
  Key k{static_cast<int>(rule.scope), rule.id, rule.tier};
  if (rule.max_bytes == 0 && rule.max_leases == 0) {
    rules_.erase(k);
    return;
  }
  rules_[k] = rule;
}

Status QuotaTable::CheckOne(QuotaScope scope, uint32_t id, const std::string& tier,
                            uint64_t bytes) const {
  auto it = rules_.find(Key{static_cast<int>(scope), id, tier});
  if (it == rules_.end()) return Status::Ok();
  const QuotaRule& r = it->second;
  auto [used_bytes, used_leases] = Usage(scope, id, tier);
  std::string who = std::string(QuotaScopeName(scope)) + " " + r.subject +
                    (tier.empty() ? " (all tiers)" : " tier " + tier);
  if (r.max_bytes != 0 && used_bytes + bytes > r.max_bytes) {
    return Status(Code::kResourceExhausted,
                  "quota exceeded: " + who + " max_bytes " + HumanBytes(r.max_bytes) + ", used " +
                      HumanBytes(used_bytes) + ", requested " + HumanBytes(bytes));
  }
  if (r.max_leases != 0 && used_leases + 1 > r.max_leases) {
    return Status(Code::kResourceExhausted, "quota exceeded: " + who + " max_leases " +
                                                std::to_string(r.max_leases) + ", used " +
                                                std::to_string(used_leases));
  }
  return Status::Ok();
}

Status QuotaTable::Check(uid_t uid, gid_t gid, const std::string& tier, uint64_t bytes) const {
  if (rules_.empty()) return Status::Ok();
  for (const std::string& t : {tier, std::string()}) {
    CXLPOOL_RETURN_IF_ERROR(CheckOne(QuotaScope::kUid, uid, t, bytes));
    CXLPOOL_RETURN_IF_ERROR(CheckOne(QuotaScope::kGid, gid, t, bytes));
  }
  return Status::Ok();
}

void QuotaTable::Add(QuotaScope scope, uint32_t id, const std::string& tier, uint64_t bytes,
                     int sign) {
  for (const std::string& t : {tier, std::string()}) {
    Used& u = used_[Key{static_cast<int>(scope), id, t}];
    if (sign > 0) {
      u.bytes += bytes;
      u.leases += 1;
    } else {
      CXLPOOL_CHECK(u.bytes >= bytes && u.leases >= 1);
      u.bytes -= bytes;
      u.leases -= 1;
    }
    if (tier.empty()) break;  // "" is both the tier and the total
  }
}

void QuotaTable::Charge(uid_t uid, gid_t gid, const std::string& tier, uint64_t bytes) {
  Add(QuotaScope::kUid, uid, tier, bytes, +1);
  Add(QuotaScope::kGid, gid, tier, bytes, +1);
}

void QuotaTable::Uncharge(uid_t uid, gid_t gid, const std::string& tier, uint64_t bytes) {
  Add(QuotaScope::kUid, uid, tier, bytes, -1);
  Add(QuotaScope::kGid, gid, tier, bytes, -1);
}

std::pair<uint64_t, uint64_t> QuotaTable::Usage(QuotaScope scope, uint32_t id,
                                                const std::string& tier) const {
  auto it = used_.find(Key{static_cast<int>(scope), id, tier});
  if (it == used_.end()) return {0, 0};
  return {it->second.bytes, it->second.leases};
}

std::vector<QuotaUsage> QuotaTable::Rules() const {
  std::vector<QuotaUsage> out;
  for (const auto& [k, r] : rules_) {
    auto [b, n] = Usage(r.scope, r.id, r.tier);
    out.push_back({r, b, n});
  }
  return out;
}

}  // namespace cxlpool
