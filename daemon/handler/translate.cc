#include "handler/translate.h"

#include <fcntl.h>

#include <algorithm>

#include "cxlpool.pb.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/extents.h"
#include "handler/translate_codec.h"
#include "lease/tier_names.h"
#include "values/value_parser.h"

namespace cxlpool {

namespace {

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
  out->set_device_offset(s.device_offset);
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

}  // namespace

Result<QuotaRule> ToQuotaRule(const QuotaSpec& q) {
  QuotaRule r;
  if (q.scope == "uid") {
    r.scope = QuotaScope::kUid;
  } else if (q.scope == "gid") {
    r.scope = QuotaScope::kGid;
  } else if (q.scope == "cgroup") {
    r.scope = QuotaScope::kCgroup;
  } else {
    return Status(Code::kInvalidArgument,
                  "quota scope '" + q.scope + "' (want uid, gid or cgroup)");
  }
  r.subject = q.subject;
  auto num = ParseU64(q.subject);
  if (r.scope == QuotaScope::kCgroup) {
    auto path = NormalizeCgroupPath(q.subject);
    if (!path.ok()) return path.status();
    r.subject = *path;
  } else if (num && *num < 0xffffffffull) {
    r.id = static_cast<uint32_t>(*num);
  } else {
    bool user = r.scope == QuotaScope::kUid;
    auto id = user ? LookupUser(q.subject) : LookupGroup(q.subject);
    if (!id) {
      return Status(Code::kNotFound,
                    std::string(user ? "no such user '" : "no such group '") + q.subject + "'");
    }
    r.id = *id;
  }
  if (!q.tier.empty() && !IsTierName(q.tier))
    return Status(Code::kInvalidArgument, "unknown tier '" + q.tier + "'");
  r.tier = q.tier;
  r.max_bytes = q.max_bytes;
  r.max_leases = q.max_leases;
  if (q.priority < 0 || q.priority > kMaxPriority) {
    return Status(Code::kInvalidArgument, "priority " + std::to_string(q.priority) +
                                              " out of range (0.." + std::to_string(kMaxPriority) +
                                              ")");
  }
  r.priority = q.priority;
  return r;
}

// ---- requests ----

namespace {

template <typename M>
Status DecodeOnly(const Request& req) {
  M in;
  return DecodePayload(req, &in);
}

template <typename M>
Status DecodeId(const Request& req, uint64_t* id) {
  M in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  *id = in.lease_id();
  return Status::Ok();
}

}  // namespace

Status DecodeEmpty(const Request& req) {
  switch (req.type) {
    case proto::MSG_POOLS_REQUEST:
      return DecodeOnly<proto::PoolsRequest>(req);
    case proto::MSG_TOPOLOGY_REQUEST:
      return DecodeOnly<proto::TopologyRequest>(req);
    case proto::MSG_STATS_REQUEST:
      return DecodeOnly<proto::StatsRequest>(req);
    case proto::MSG_QUOTAS_REQUEST:
      return DecodeOnly<proto::QuotasRequest>(req);
    case proto::MSG_METRICS_REQUEST:
      return DecodeOnly<proto::MetricsRequest>(req);
    default:
      return Status(Code::kInternal,
                    wire::MsgTypeName(req.type) + " is not a request without fields");
  }
}

Status DecodeLeaseId(const Request& req, uint64_t* id) {
  switch (req.type) {
    case proto::MSG_RELEASE_REQUEST:
      return DecodeId<proto::ReleaseRequest>(req, id);
    case proto::MSG_STAT_REQUEST:
      return DecodeId<proto::StatRequest>(req, id);
    case proto::MSG_REVOKE_REQUEST:
      return DecodeId<proto::RevokeRequest>(req, id);
    default:
      return Status(Code::kInternal, wire::MsgTypeName(req.type) + " does not name a lease");
  }
}

Status DecodeListAll(const Request& req, bool* all) {
  proto::ListLeasesRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  *all = in.all();
  return Status::Ok();
}

Status DecodeHello(const Request& req, HelloAsk* out) {
  proto::HelloRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  out->min_version = in.min_version();
  out->max_version = in.max_version();
  out->max_fds_per_frame = in.max_fds_per_frame();
  return Status::Ok();
}

Status DecodeAlloc(const Request& req, AllocParams* out) {
  proto::AllocRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  AllocParams& p = *out;
  p.size_bytes = in.size_bytes();
  if (in.has_numa_node()) p.numa_node = in.numa_node();
  p.gpu = in.gpu();
  p.tiers.assign(in.tier_preference().begin(), in.tier_preference().end());
  p.strict = in.strict();
  p.hugetlb = in.hugetlb();
  p.long_term_pin = in.long_term_pin();
  p.label = in.label();
  p.name = in.name();
  p.acl_uids.assign(in.acl_uids().begin(), in.acl_uids().end());
  p.acl_gids.assign(in.acl_gids().begin(), in.acl_gids().end());
  return Status::Ok();
}

Status CheckAllocParams(const AllocParams& p) {
  if (p.numa_node && *p.numa_node < 0) {
    return Status(Code::kInvalidArgument,
                  "numa_node " + std::to_string(*p.numa_node) + " is negative");
  }
  return Status::Ok();
}

Status DecodeAttach(const Request& req, AttachAsk* out) {
  proto::AttachRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  out->name = in.name();
  if (in.has_owner_uid()) out->owner = in.owner_uid();
  return Status::Ok();
}

Status DecodeQuotaSet(const Request& req, QuotaSpec* out) {
  proto::QuotaSetRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  const proto::Quota& q = in.quota();
  out->scope = q.scope();
  out->subject = q.subject();
  out->tier = q.tier();
  out->max_bytes = q.max_bytes();
  out->max_leases = q.max_leases();
  out->priority = q.priority();
  return Status::Ok();
}

Status DecodeLeaseMoved(const Request& req, MovedReport* out) {
  proto::LeaseMovedRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  out->lease_id = in.lease_id();
  out->numa_node = in.numa_node();
  out->pages_sampled = in.pages_sampled();
  out->pages_on_node = in.pages_on_node();
  out->cause = in.cause();
  return Status::Ok();
}

namespace {

// The fds a RECLAIM's leases want: one per listed extent (none listed: one).
Result<size_t> ReclaimFdsWanted(const proto::ReclaimRequest& in) {
  size_t wanted = 0;
  for (const proto::LeaseInfo& info : in.leases()) {
    if (info.extents_size() > static_cast<int>(wire::kMaxExtentsPerLease)) {
      return Status(Code::kInvalidArgument, "RECLAIM_REQUEST: lease " + std::to_string(info.id()) +
                                                " lists " + std::to_string(info.extents_size()) +
                                                " extents (at most " +
                                                std::to_string(wire::kMaxExtentsPerLease) + ")");
    }
    uint64_t sum = 0;
    for (const proto::ExtentInfo& x : info.extents()) sum += x.size_bytes();
    if (info.extents_size() > 0 && sum != info.size_bytes()) {
      return Status(Code::kInvalidArgument, "RECLAIM_REQUEST: lease " + std::to_string(info.id()) +
                                                "'s extents add up to " + std::to_string(sum) +
                                                " bytes, not its size " +
                                                std::to_string(info.size_bytes()));
    }
    wanted += static_cast<size_t>(std::max(1, info.extents_size()));
  }
  return wanted;
}

}  // namespace

Status DecodeReclaim(const Request& req, std::vector<LeaseManager::ReclaimItem>* out) {
  proto::ReclaimRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  Result<size_t> wanted = ReclaimFdsWanted(in);
  if (!wanted.ok()) return wanted.status();
  if (*wanted != req.fds.size()) {
    return Status(Code::kInvalidArgument,
                  "RECLAIM_REQUEST lists " + std::to_string(in.leases_size()) + " leases of " +
                      std::to_string(*wanted) + " extents but carries " +
                      std::to_string(req.fds.size()) +
                      " fds; send one fd per extent of each lease, in order");
  }
  size_t next_fd = 0;
  for (int i = 0; i < in.leases_size(); ++i) {
    LeaseManager::ReclaimItem item;
    const proto::LeaseInfo& info = in.leases(i);
    item.id = info.id();
    item.size_bytes = info.size_bytes();
    item.pool = info.pool();
    item.name = info.name();
    item.label = info.label();
    item.backing = info.backing();
    item.owner_uid = info.owner_uid();
    for (const proto::ExtentInfo& x : info.extents()) item.extent_sizes.push_back(x.size_bytes());
    const size_t n = std::max<size_t>(1, item.extent_sizes.size());
    for (size_t k = 0; k < n; ++k) {
      item.fds.emplace_back(::fcntl(req.fds[next_fd++].get(), F_DUPFD_CLOEXEC, 0));
    }
    out->push_back(std::move(item));
  }
  return Status::Ok();
}

// ---- replies ----

Reply EncodeHelloReply(const HelloAnswer& a) {
  proto::HelloReply out;
  out.set_version(a.version);
  out.set_server_version(a.server_version);
  out.set_instance_id(a.instance_id);
  out.set_in_grace_period(a.in_grace_period);
  out.set_max_frame_bytes(a.max_frame_bytes);
  out.set_max_fds_per_frame(a.max_fds_per_frame);
  out.set_max_request_bytes(a.max_request_bytes);
  out.set_is_admin(a.is_admin);
  return EncodeAsReply(out);
}

Reply EncodeGrantReply(GrantReply kind, const Granted& g, size_t fds_per_frame,
                       uint32_t max_frame_bytes) {
  proto::LeaseInfo info;
  ToProto(g.lease, &info);  // with its extents when it has several
  const proto::MsgType type =
      kind == GrantReply::kAlloc ? proto::MSG_ALLOC_REPLY : proto::MSG_ATTACH_REPLY;
  auto frames = wire::PlanLeaseReply(type, info, g.extents.size(), fds_per_frame, max_frame_bytes);
  if (!frames.ok()) {
    CXLPOOL_LOG(kError) << "lease " << g.lease.id << ": reply of " << g.extents.size()
                        << " extents: " << frames.status().ToString();
    return MakeErrorReply(
        Status(Code::kInternal, "lease " + std::to_string(g.lease.id) +
                                    ": cannot send its reply: " + frames.status().message()));
  }
  Reply r;
  for (size_t i = 0; i < frames->size(); ++i) {
    wire::PlannedFrame& f = (*frames)[i];
    Reply one;
    one.type = f.type;
    one.payload = std::move(f.payload);
    for (size_t k = f.first_fd; k < f.first_fd + f.fd_count; ++k) {
      one.fds.push_back(g.extents[k].fd);
    }
    if (i == 0) {
      r = std::move(one);
    } else {
      r.more.push_back(std::move(one));
    }
  }
  return r;
}

Reply EncodeStatsReply(const StatsAnswer& a) {
  proto::StatsReply out;
  for (const auto& [k, v] : a.counters) (*out.mutable_counters())[k] = v;
  for (const auto& [k, v] : a.gauges) (*out.mutable_gauges())[k] = v;
  return EncodeAsReply(out);
}

Reply EncodeReleaseReply() { return EncodeAsReply(proto::ReleaseReply()); }
Reply EncodeRevokeReply() { return EncodeAsReply(proto::RevokeReply()); }
Reply EncodeQuotaSetReply() { return EncodeAsReply(proto::QuotaSetReply()); }

Reply EncodeListLeasesReply(const std::vector<LeaseSnapshot>& leases) {
  proto::ListLeasesReply out;
  for (const auto& l : leases) ToProto(l, out.add_leases());
  return EncodeAsReply(out);
}

Reply EncodeStatReply(const LeaseSnapshot& lease) {
  proto::StatReply out;
  ToProto(lease, out.mutable_lease());
  return EncodeAsReply(out);
}

Reply EncodePoolsReply(const std::vector<PoolSnapshot>& pools) {
  proto::PoolsReply out;
  for (const auto& p : pools) ToProto(p, out.add_pools());
  return EncodeAsReply(out);
}

Reply EncodeTopologyReply(const std::string& json) {
  proto::TopologyReply out;
  out.set_json(json);
  return EncodeAsReply(out);
}

Reply EncodeQuotasReply(const std::vector<QuotaUsage>& quotas) {
  proto::QuotasReply out;
  for (const auto& q : quotas) ToProto(q, out.add_quotas());
  return EncodeAsReply(out);
}

Reply EncodeMetricsReply(const std::string& text) {
  proto::MetricsReply out;
  out.set_text(text);
  return EncodeAsReply(out);
}

Reply EncodeLeaseMovedReply(const LeaseSnapshot& lease, bool moved) {
  proto::LeaseMovedReply out;
  ToProto(lease, out.mutable_lease());
  out.set_moved(moved);
  return EncodeAsReply(out);
}

Reply EncodeReclaimReply(const LeaseManager::ReclaimOutcome& outcome) {
  proto::ReclaimReply out;
  for (uint64_t id : outcome.accepted) out.add_accepted(id);
  for (const auto& [id, why] : outcome.rejected) {
    out.add_rejected(id);
    out.add_rejected_reasons(why);
  }
  return EncodeAsReply(out);
}

// ---- events ----

Reply EncodeRevokedEvent(uint64_t lease_id) {
  proto::LeaseEvent ev;
  ev.set_lease_id(lease_id);
  ev.set_event("revoked");
  return EncodeAsReply(ev);
}

Reply EncodeMovedEvent(uint64_t lease_id, int numa_node, const std::string& pool) {
  // A LeaseEvent: clients of any version accept it (older ones ignore
  // events they do not know).
  proto::LeaseEvent ev;
  ev.set_lease_id(lease_id);
  ev.set_event("moved");
  ev.set_numa_node(numa_node);
  ev.set_pool(pool);
  return EncodeAsReply(ev);
}

}  // namespace cxlpool
