#include "handler/translate.h"

#include <grp.h>
#include <pwd.h>

#include "cxlpool/common/strings.h"

namespace cxlpool {

void ToProto(const LeaseSnapshot& s, proto::LeaseInfo* out) {
  out->set_id(s.id);
  out->set_size_bytes(s.size_bytes);
  out->set_requested_bytes(s.requested_bytes);
  out->set_numa_node(s.numa_node);
  out->set_kind(s.kind);
  if (s.memory_tier) out->set_memory_tier(*s.memory_tier);
  out->set_label(s.label);
  out->set_name(s.name);
  out->set_owner_pid(static_cast<uint32_t>(s.owner.pid));
  out->set_owner_uid(s.owner.uid);
  out->set_owner_gid(s.owner.gid);
  out->set_owner_comm(s.owner.comm);
  out->set_created_unix(s.created_unix);
  out->set_holders(s.holders);
  out->set_backing(s.backing);
  out->set_page_size(s.page_size);
  out->set_from_warm_stock(s.from_warm_stock);
  out->set_placement_reason(s.placement_reason);
  out->set_pool(s.pool);
  out->set_cgroup(s.owner.cgroup);
  out->set_long_term_pin(s.long_term_pin);
  if (s.placed_numa_node) out->set_placed_numa_node(*s.placed_numa_node);
  out->set_moved_reason(s.moved_reason);
  out->set_migration(s.migration);
  out->set_spread(s.spread);
  for (size_t i = 0; i < s.extent_bytes.size(); ++i) {
    proto::ExtentInfo* x = out->add_extents();
    x->set_size_bytes(s.extent_bytes[i]);
    x->set_page_size(s.page_size);
    if (i < s.extent_pools.size()) x->set_pool(s.extent_pools[i]);
    if (i < s.extent_nodes.size()) x->set_numa_node(s.extent_nodes[i]);
  }
}

void ToProto(const PoolSnapshot& s, proto::PoolInfo* out) {
  out->set_name(s.name);
  out->set_numa_node(s.numa_node);
  out->set_kind(s.kind);
  if (s.memory_tier) out->set_memory_tier(*s.memory_tier);
  out->set_capacity_bytes(s.capacity_bytes);
  out->set_leased_bytes(s.leased_bytes);
  out->set_free_bytes(s.free_bytes);
  out->set_page_size(s.page_size);
  out->set_backing(s.backing);
  out->set_dynamic_region(s.dynamic_region);
  out->set_lease_count(s.lease_count);
  out->set_reclaiming_bytes(s.reclaiming_bytes);
  if (s.kernel_zone_bytes) out->set_kernel_zone_bytes(*s.kernel_zone_bytes);
  if (s.movable_bytes) out->set_movable_bytes(*s.movable_bytes);
  out->set_long_term_pins(s.long_term_pins);
  out->set_long_term_pin_policy(s.long_term_pin_policy);
  if (s.backing == "memfd") {
    proto::PoolReserve* r = out->mutable_reserve();
    r->set_ready_bytes(s.reserve_ready_bytes);
    r->set_building_bytes(s.reserve_building_bytes);
    r->set_retiring_bytes(s.reserve_retiring_bytes);
    r->set_low_bytes(s.reserve_low_bytes);
    r->set_high_bytes(s.reserve_high_bytes);
    if (s.reserve_below_low_ms) r->set_below_low_ms(*s.reserve_below_low_ms);
  }
}

void ToProto(const QuotaUsage& q, proto::Quota* out) {
  out->set_scope(QuotaScopeName(q.rule.scope));
  out->set_subject(q.rule.subject);
  out->set_tier(q.rule.tier);
  out->set_max_bytes(q.rule.max_bytes);
  out->set_max_leases(q.rule.max_leases);
  out->set_priority(q.rule.priority);
  out->set_used_bytes(q.used_bytes);
  out->set_used_leases(q.used_leases);
}

Result<AllocParams> FromProto(const proto::AllocRequest& req) {
  AllocParams p;
  p.size_bytes = req.size_bytes();
  if (req.has_numa_node()) {
    if (req.numa_node() < 0) {
      return Status(Code::kInvalidArgument,
                    "numa_node " + std::to_string(req.numa_node()) + " is negative");
    }
    p.numa_node = req.numa_node();
  }
  p.gpu = req.gpu();
  p.tiers.assign(req.tier_preference().begin(), req.tier_preference().end());
  p.strict = req.strict();
  p.hugetlb = req.hugetlb();
  p.long_term_pin = req.long_term_pin();
  p.label = req.label();
  p.name = req.name();
  p.acl_uids.assign(req.acl_uids().begin(), req.acl_uids().end());
  p.acl_gids.assign(req.acl_gids().begin(), req.acl_gids().end());
  return p;
}

Result<QuotaRule> FromProto(const proto::Quota& q) {
  QuotaRule r;
  if (q.scope() == "uid") {
    r.scope = QuotaScope::kUid;
  } else if (q.scope() == "gid") {
    r.scope = QuotaScope::kGid;
  } else if (q.scope() == "cgroup") {
    r.scope = QuotaScope::kCgroup;
  } else {
    return Status(Code::kInvalidArgument,
                  "quota scope '" + q.scope() + "' (want uid, gid or cgroup)");
  }
  r.subject = q.subject();
  auto num = ParseU64(q.subject());
  if (r.scope == QuotaScope::kCgroup) {
    auto path = NormalizeCgroupPath(q.subject());
    if (!path.ok()) return path.status();
    r.subject = *path;
  } else if (num && *num < 0xffffffffull) {
    r.id = static_cast<uint32_t>(*num);
  } else {
    char buf[4096];
    if (r.scope == QuotaScope::kUid) {
      struct passwd pw, *res = nullptr;
      if (getpwnam_r(q.subject().c_str(), &pw, buf, sizeof buf, &res) != 0 || res == nullptr) {
        return Status(Code::kNotFound, "no such user '" + q.subject() + "'");
      }
      r.id = res->pw_uid;
    } else {
      struct group gr, *res = nullptr;
      if (getgrnam_r(q.subject().c_str(), &gr, buf, sizeof buf, &res) != 0 || res == nullptr) {
        return Status(Code::kNotFound, "no such group '" + q.subject() + "'");
      }
      r.id = res->gr_gid;
    }
  }
  static const char* kTiers[] = {"", "dram", "cxl", "hbm", "nvm", "unknown", "devdax"};
  bool known = false;
  for (const char* t : kTiers) known = known || q.tier() == t;
  if (!known) return Status(Code::kInvalidArgument, "unknown tier '" + q.tier() + "'");
  r.tier = q.tier();
  r.max_bytes = q.max_bytes();
  r.max_leases = q.max_leases();
  if (q.priority() < 0 || q.priority() > kMaxPriority) {
    return Status(Code::kInvalidArgument, "priority " + std::to_string(q.priority()) +
                                              " out of range (0.." + std::to_string(kMaxPriority) +
                                              ")");
  }
  r.priority = q.priority();
  return r;
}

}  // namespace cxlpool
