#include "lease/lease_manager.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <chrono>
#include <mutex>

#include "cxlpool/common/log.h"
#include "cxlpool/common/page_census.h"
#include "cxlpool/common/strings.h"
#include "lease/allocator.h"
#include "lease/restart_rules.h"

namespace cxlpool {

namespace {
constexpr size_t kMaxRevokedRemembered = 65536;

// Where the kernel says the pages of every extent are (each extent's share
// of `max_samples` by its size, at least one), added up.
Result<PageCensus> CensusExtents(const std::vector<std::unique_ptr<Backing>>& extents,
                                 uint64_t total, uint64_t max_samples) {
  PageCensus all;
  for (const auto& e : extents) {
    const uint64_t share =
        std::max<uint64_t>(1, total == 0 ? max_samples : max_samples * e->size_bytes() / total);
    auto c = CensusPages(e->daemon_addr(), e->size_bytes(), 4096, share);
    if (!c.ok()) return c.status();
    all.sampled += c->sampled;
    all.absent += c->absent;
    all.errors += c->errors;
    for (const auto& [node, n] : c->on_node) all.on_node[node] += n;
  }
  return all;
}

}  // namespace

LeaseManager::LeaseManager(const Topology* topo, std::vector<std::unique_ptr<Pool>> pools,
                           QuotaTable quotas, Executor loop, Executor workers, const Clock* clock)
    : topo_(topo),
      pools_(std::move(pools)),
      quotas_(std::move(quotas)),
      loop_(std::move(loop)),
      workers_(std::move(workers)),
      alloc_(std::make_unique<Allocator>(*this)),
      clock_(clock),
      reclaims_(loop_, workers_,
                [this](Pool* pool, uint64_t size) { BackingReclaimed(pool, size); }),
      rules_(std::make_unique<RestartRules>(*this)),
      stock_(loop_, workers_,
             {.on_freed =
                  [this] {
                    if (!stopping_) RetryWaiting();
                  },
              .on_built =
                  [this](bool ok) { Count(ok ? "reserve_builds" : "reserve_build_failures"); }}) {
  for (auto& p : pools_) {
    pool_ptrs_.push_back(p.get());
    if (ExtentReserve* r = p->reserve()) r->set_clock(clock_);
  }
}

LeaseManager::~LeaseManager() {
  Shutdown();
  *alive_ = false;
}

void LeaseManager::Connect(ConnId conn, CallerInfo caller) {
  pid_t pid = caller.pid;
  conns_[conn].caller = std::move(caller);
  rules_->CheckHolderOf(pid);  // restart: leases this process no longer holds
}

const CallerInfo* LeaseManager::Caller(ConnId conn) const {
  auto it = conns_.find(conn);
  return it == conns_.end() ? nullptr : &it->second.caller;
}

bool LeaseManager::HoldsLeases(ConnId conn) const {
  auto it = conns_.find(conn);
  return it != conns_.end() && !it->second.held.empty();
}

bool LeaseManager::IsAdmin(ConnId conn) const {
  const CallerInfo* c = Caller(conn);
  return c != nullptr && c->is_admin;
}

void LeaseManager::Disconnect(ConnId conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  std::vector<uint64_t> held(it->second.held.begin(), it->second.held.end());
  for (uint64_t id : held) {
    auto l = table_.leases().find(id);
    if (l == table_.leases().end()) continue;
    auto h = l->second.holders.find(conn);
    if (h == l->second.holders.end()) continue;
    DropRef(l->second, conn, h->second);
    if (Unheld(l->second)) {
      Free(id, "disconnect_reclaims");
    } else {
      (void)Persist(l->second, {});  // a shared lease lost a holder
    }
  }
  conns_.erase(conn);
  // Its allocations still waiting for reclaims: nobody to answer any more.
  for (WaitingAlloc& w : waiting_.TakeConn(conn)) {
    Count("abandoned_waits");
    Count("refusals");
    Count("refusals_unavailable");
    w.done(Status(Code::kUnavailable, "connection closed while the allocation waited"));
  }
}

void LeaseManager::DropRef(Lease& lease, ConnId conn, uint32_t n) {
  auto h = lease.holders.find(conn);
  CXLPOOL_CHECK(h != lease.holders.end() && h->second >= n && lease.refs >= n);
  h->second -= n;
  lease.refs -= n;
  if (h->second == 0) {
    lease.holders.erase(h);
    auto c = conns_.find(conn);
    if (c != conns_.end()) c->second.held.erase(lease.id);
  }
}

void LeaseManager::Free(uint64_t id, const char* counter, std::function<void()> then) {
  Lease l = table_.Remove(id);
  Unpersist(id);
  for (const auto& [conn, n] : l.holders) {
    auto c = conns_.find(conn);
    if (c != conns_.end()) c->second.held.erase(id);
  }
  // Each pool keeps counting its bytes (as reclaiming) until a worker has
  // truncated them; the tenant's quota is free now.
  DropPoolMove(l);
  Count(counter);
  extra_extents_ -=
      std::min<uint64_t>(extra_extents_, l.extents.empty() ? 0 : l.extents.size() - 1);
  const Tenant tenant = TenantOf(l.owner);
  std::vector<LeaseRecord::PoolBytes> by = l.BytesByPool();
  if (by.size() == 1) {
    l.pool->BeginReclaim(l.size);
    quotas_.Uncharge(tenant, l.tier, l.size);
    reclaims_.Submit(l.pool, l.size, std::move(l.extents), std::move(then), l.owner.uid);
    return;
  }
  // Split between pools: one reclaim per pool, `then` after the last.
  ChargeTiers(l, false);
  auto left = std::make_shared<size_t>(by.size());
  auto after = std::make_shared<std::function<void()>>(std::move(then));
  for (auto& b : by) {
    b.pool->BeginReclaim(b.bytes);
    std::vector<std::unique_ptr<Backing>> part;
    for (size_t i : b.extents) {
      if (i < l.extents.size()) part.push_back(std::move(l.extents[i]));
    }
    reclaims_.Submit(
        b.pool, b.bytes, std::move(part),
        [left, after] {
          if (--*left == 0 && *after) (*after)();
        },
        l.owner.uid);
  }
}

void LeaseManager::BackingReclaimed(Pool* pool, uint64_t size) {
  pool->ReleaseLeased(size);
  Count("reclaims_done");
  RetryWaiting();
}

namespace {
// One answer for "no such lease" and "not yours to see".
Status NoLease(uint64_t id) { return Status(Code::kNotFound, "no lease " + std::to_string(id)); }
}  // namespace

Status LeaseManager::NotInTable(ConnId conn, uint64_t id) const {
  const std::vector<uid_t>* told = table_.RevokedFor(id);
  const CallerInfo* c = Caller(conn);
  if (told != nullptr && c != nullptr &&
      (c->is_admin || std::find(told->begin(), told->end(), c->uid) != told->end())) {
    return Status(Code::kRevoked,
                  "lease " + std::to_string(id) +
                      " was revoked (by an admin, or its host lost the shared slice under it)");
  }
  return NoLease(id);
}

Status LeaseManager::Release(ConnId conn, uint64_t id) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return NotInTable(conn, id);
  }
  if (!Visible(it->second, conn)) return NoLease(id);
  auto h = it->second.holders.find(conn);
  if (h == it->second.holders.end()) {
    return Status(Code::kPermissionDenied,
                  "lease " + std::to_string(id) + " is not held by this connection");
  }
  DropRef(it->second, conn, 1);
  Count("releases");
  if (Unheld(it->second)) {
    Free(id, "frees");
  } else if (!it->second.holders.count(conn)) {
    (void)Persist(it->second, {});  // a shared lease lost a holder
  }
  return Status::Ok();
}

bool LeaseManager::InAcl(const Lease& l, const CallerInfo& who) {
  auto has = [](const std::vector<uint32_t>& v, uint32_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  if (who.uid == 0 || who.uid == l.owner.uid || has(l.acl_uids, who.uid) ||
      has(l.acl_gids, who.gid)) {
    return true;
  }
  for (gid_t g : who.groups) {
    if (has(l.acl_gids, g)) return true;
  }
  return false;
}

Result<Granted> LeaseManager::Attach(ConnId conn, const std::string& name,
                                     std::optional<uid_t> owner_uid) {
  auto c = conns_.find(conn);
  if (c == conns_.end()) return Status(Code::kInternal, "unknown connection");
  const CallerInfo& who = c->second.caller;
  const uid_t owner = owner_uid.value_or(who.uid);
  // The same answer whether the name does not exist or the caller may not
  // attach to it; the refusal counter counts both alike.
  auto not_found = [&] {
    Count("acl_refusals");
    return Status(Code::kNotFound, "no shared lease '" + name + "' of uid " +
                                       std::to_string(owner) + " that uid " +
                                       std::to_string(who.uid) + " may attach");
  };
  std::optional<uint64_t> named = table_.Named(owner, name);
  if (!named) return not_found();
  if (*named == 0) {
    // Its ACL is not known before the lease exists: only its owner hears.
    if (who.uid != owner) return not_found();
    return Status(Code::kUnavailable, "shared lease '" + name + "' is still being built");
  }
  Lease& l = table_.leases().at(*named);
  if (!InAcl(l, who)) return not_found();
  if (l.awaited_memory) {
    return Status(Code::kUnavailable,
                  "shared lease '" + name + "' awaits its holders' reclaim after a daemon restart");
  }
  bool new_holder = l.holders[conn]++ == 0;
  l.refs += 1;
  c->second.held.insert(l.id);
  Count("attaches");
  if (new_holder) (void)Persist(l, {});
  return Granted{Snapshot(l), l.GrantedExtents()};
}

bool LeaseManager::Visible(const Lease& l, ConnId conn) const {
  const CallerInfo* c = Caller(conn);
  if (c == nullptr) return false;
  return c->is_admin || c->uid == l.owner.uid || l.holders.count(conn) > 0;
}

Result<LeaseSnapshot> LeaseManager::Stat(ConnId conn, uint64_t id) const {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return NotInTable(conn, id);
  }
  if (!Visible(it->second, conn)) return NoLease(id);
  return Snapshot(it->second);
}

std::vector<QuotaUsage> LeaseManager::QuotasVisibleTo(ConnId conn) const {
  const CallerInfo* c = Caller(conn);
  if (c == nullptr) return {};
  std::vector<QuotaUsage> all = quotas_.Rules();
  if (c->is_admin) return all;
  const Tenant t = TenantOf(*c);
  std::vector<QuotaUsage> out;
  for (auto& q : all) {
    bool mine = false;
    switch (q.rule.scope) {
      case QuotaScope::kUid:
        mine = q.rule.id == t.uid;
        break;
      case QuotaScope::kGid:
        mine = q.rule.id == t.gid;
        break;
      case QuotaScope::kCgroup:
        mine = !t.cgroup.empty() && (q.rule.subject == "/" || t.cgroup == q.rule.subject ||
                                     StartsWith(t.cgroup, q.rule.subject + "/"));
        break;
    }
    if (mine) out.push_back(std::move(q));
  }
  return out;
}

Status LeaseManager::CheckDaemonLimits() const {
  // Fds: leases, builds, connections, plus the listening socket, journal,
  // reserve extents and libraries' own. Maps: the same leases, plus the
  // process's ordinary mappings.
  constexpr uint64_t kFdReserve = 128, kMapReserve = 1024;
  uint64_t reserve_extents = 0;  // ready, building and retiring reserve extents
  for (const Pool* p : pool_ptrs_) {
    if (const ExtentReserve* r = p->reserve()) {
      reserve_extents += r->ready_extents();
    }
  }
  reserve_extents += stock_.pending_builds() + stock_.pending_retires();
  const uint64_t per_lease = table_.leases().size() + extra_extents_ + pending_builds_ +
                             reclaims_.pending() + reserve_extents;
  if (per_lease + conns_.size() + kFdReserve >= limits_.max_fds) {
    return Status(Code::kResourceExhausted,
                  "daemon fd limit: " + std::to_string(table_.leases().size()) +
                      " leases held and RLIMIT_NOFILE is " + std::to_string(limits_.max_fds) +
                      "; raise LimitNOFILE= for cxlpoold");
  }
  if (per_lease + kMapReserve >= limits_.max_maps) {
    return Status(Code::kResourceExhausted,
                  "daemon mapping limit: " + std::to_string(table_.leases().size()) +
                      " leases held and vm.max_map_count is " + std::to_string(limits_.max_maps) +
                      "; raise it (sysctl vm.max_map_count)");
  }
  return Status::Ok();
}

Result<std::vector<LeaseSnapshot>> LeaseManager::List(ConnId conn, bool all) const {
  const CallerInfo* c = Caller(conn);
  if (c == nullptr) return Status(Code::kInternal, "unknown connection");
  std::vector<LeaseSnapshot> out;
  if (all) {
    if (!c->is_admin) {
      return Status(Code::kPermissionDenied, "listing every tenant's leases needs admin");
    }
    for (const auto& [id, l] : table_.leases()) out.push_back(Snapshot(l));
  } else {
    std::unordered_set<uint64_t> ids = conns_.at(conn).held;
    const std::unordered_set<uint64_t>& owned = table_.OwnedBy(c->uid);
    ids.insert(owned.begin(), owned.end());
    for (uint64_t id : ids) out.push_back(Snapshot(table_.leases().at(id)));
  }
  std::sort(out.begin(), out.end(),
            [](const LeaseSnapshot& a, const LeaseSnapshot& b) { return a.id < b.id; });
  return out;
}

void LeaseManager::Revoke(ConnId conn, uint64_t id, RevokeDone done) {
  if (!IsAdmin(conn)) return done(Status(Code::kPermissionDenied, "revoke needs admin"));
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    if (table_.RevokedFor(id) != nullptr) {
      return done(Status(Code::kRevoked, "lease " + std::to_string(id) + " was already revoked"));
    }
    return done(NoLease(id));
  }
  RevokeNow(id, "revokes", std::move(done));
}

void LeaseManager::RevokeNow(uint64_t id, const char* counter, RevokeDone done) {
  const Lease& l = table_.leases().at(id);
  std::vector<ConnId> holders;
  std::vector<uid_t> uids{l.owner.uid};
  for (const auto& [h, n] : l.holders) {
    holders.push_back(h);
    if (const CallerInfo* hc = Caller(h); hc != nullptr) uids.push_back(hc->uid);
  }
  std::sort(holders.begin(), holders.end());
  table_.Revoked(id, std::move(uids), kMaxRevokedRemembered);
  // The holders hear of it only once the memory is truncated, so their next
  // access after the event SIGBUSes.
  Free(id, counter, [done = std::move(done), holders = std::move(holders)]() mutable {
    done(std::move(holders));
  });
}

void LeaseManager::RevokeOnSlice(const std::string& pool, uint32_t index,
                                 std::function<void(uint64_t id, std::vector<ConnId> holders)> done,
                                 std::function<void()> all_done) {
  std::vector<uint64_t> ids;
  for (const auto& [id, l] : table_.leases()) {
    if (l.pool->name() == pool && l.has_memory() && l.first().shared_slice() == index)
      ids.push_back(id);
  }
  if (ids.empty()) return all_done();
  auto left = std::make_shared<size_t>(ids.size());
  for (uint64_t id : ids) {
    CXLPOOL_LOG(kError) << "lease " << id << " on " << pool << " slice " << index
                        << " revoked: the slice is no longer this host's";
    RevokeNow(id, "slice_losses", [id, done, all_done, left](Result<std::vector<ConnId>> holders) {
      done(id, holders.ok() ? std::move(*holders) : std::vector<ConnId>{});
      if (--*left == 0) all_done();
    });
  }
}

Status LeaseManager::SetQuota(ConnId conn, const QuotaRule& rule) {
  if (!IsAdmin(conn)) return Status(Code::kPermissionDenied, "setting quotas needs admin");
  return quotas_.SetLiveRule(rule);
}

LeaseSnapshot LeaseManager::Snapshot(const Lease& l) const {
  LeaseSnapshot s;
  s.id = l.id;
  s.size_bytes = l.size;
  s.requested_bytes = l.requested;
  s.numa_node = l.pool->numa_node();
  s.kind = l.pool->kind();
  s.memory_tier = l.pool->memory_tier();
  s.label = l.label;
  s.name = l.name;
  s.owner = l.owner;
  s.created_unix = l.created_unix;
  s.holders = l.refs;
  s.backing = l.first().kind();
  s.page_size = l.first().page_size();
  s.device_offset = l.first().device_offset();
  s.extents = static_cast<uint32_t>(l.extents.size());
  if (l.extents.size() > 1) {
    for (const auto& e : l.extents) s.extent_bytes.push_back(e->size_bytes());
  }
  s.from_warm_stock = l.from_warm;
  s.placement_reason = l.placement_reason;
  s.pool = l.pool->name();
  s.long_term_pin = l.long_term_pin;
  s.placed_numa_node = l.placed_node;
  s.moved_reason = l.moved_reason;
  if (!l.extent_pools.empty()) {
    for (const Pool* p : l.extent_pools) {
      s.extent_pools.push_back(p->name());
      s.extent_nodes.push_back(p->numa_node());
    }
    s.spread = Spread(l);
  }
  if (l.moving_to != nullptr) {
    s.migration =
        "to " + l.moving_to->name() + ": " +
        (l.extent_count() > 1 ? "extent " + std::to_string(l.moving_extent) : "the lease") +
        (l.moving_note.empty() ? "" : "; " + l.moving_note);
  }
  if (l.pages_node) s.numa_node = *l.pages_node;
  return s;
}

Result<LeaseManager::MoveCheck> LeaseManager::CheckMoved(ConnId conn, uint64_t id) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return NotInTable(conn, id);
  }
  Lease& l = it->second;
  if (!Visible(l, conn)) return NoLease(id);  // not yours: as if it did not exist
  if (!l.holders.count(conn)) {
    return Status(Code::kPermissionDenied,
                  "lease " + std::to_string(id) + " is not held by this connection");
  }
  Count("moved_reports");
  const bool mapped = l.has_memory() && std::all_of(l.extents.begin(), l.extents.end(),
                                                    [](const std::unique_ptr<Backing>& e) {
                                                      return e->daemon_addr() != nullptr;
                                                    });
  if (!mapped) {
    return Status(Code::kUnsupported, "lease " + std::to_string(id) + " (" +
                                          (l.has_memory() ? l.first().kind() : std::string("?")) +
                                          ") has no daemon mapping for move_pages to ask about");
  }
  // The daemon's own view of the same pages, over every extent (samples
  // shared out by size): the holder's word moves nothing.
  Result<PageCensus> census = CensusExtents(l.extents, l.size, 4096);
  if (!census.ok()) return census.status();
  MoveCheck out;
  const std::optional<int> now = census->MajorityNode();
  const int accounted = l.pages_node.value_or(l.pool->numa_node());
  bool where_accounted = !now || *now == accounted;
  std::string off_pools;  // a split lease: the groups whose pages are elsewhere
  if (!l.extent_pools.empty() && now) {
    // Split between pools: each pool's extents asked on their own; a pin
    // that moved them all shows as a group off its pool's node.
    where_accounted = true;
    for (const auto& b : l.BytesByPool()) {
      PageCensus part;
      for (size_t i : b.extents) {
        const Backing& e = *l.extents[i];
        auto c = CensusPages(
            e.daemon_addr(), e.size_bytes(), 4096,
            std::max<uint64_t>(1, 4096 * e.size_bytes() / std::max<uint64_t>(1, l.size)));
        if (!c.ok()) return c.status();
        part.sampled += c->sampled;
        for (const auto& [node, n] : c->on_node) part.on_node[node] += n;
      }
      const std::optional<int> there = part.MajorityNode();
      if (there && *there != b.pool->numa_node()) {
        where_accounted = false;
        if (!off_pools.empty()) off_pools += ", ";
        off_pools += std::to_string(b.extents.size()) + " of " + std::to_string(l.extent_count()) +
                     " extents (" + HumanBytes(b.bytes) + ") accounted to " + b.pool->name() +
                     " are on node " + std::to_string(*there);
      }
    }
  }
  if (where_accounted) {
    out.lease = Snapshot(l);
    return out;
  }
  if (l.moving_to != nullptr) {
    // The tiering engine is moving these pages now: its commit (or abort)
    // accounts them, once; a second mover would count the lease twice.
    CXLPOOL_LOG(kInfo) << "lease " << id << ": pages on node " << *now << " while a move to "
                       << l.moving_to->name() << " is under way; that move accounts them";
    out.lease = Snapshot(l);
    return out;
  }
  Pool* to = nullptr;
  for (Pool* p : pool_ptrs_) {
    if (p->numa_node() == *now && std::string(p->backing()) == "memfd") to = p;
  }
  const std::string seen = " (daemon's move_pages: " + census->ToString() + ")";
  std::string why = off_pools.empty()
                        ? "pages moved from node " + std::to_string(accounted) + " to node " +
                              std::to_string(*now) + seen
                        : "pages moved: " + off_pools + "; most of the lease is on node " +
                              std::to_string(*now) + seen;
  if (to == nullptr) {
    // Nowhere to account them: the lease stays on its pool, and says where its pages are.
    if (!l.placed_node) l.placed_node = l.pool->numa_node();
    l.pages_node = *now;
    l.moved_reason = why + "; node " + std::to_string(*now) + " has no pool, so " + l.pool->name() +
                     " still accounts it";
    Count("leases_moved");
    (void)Persist(l, {});
  } else {
    Rehome(l, to, to == l.pool ? why : why + "; accounted to " + to->name() + " now");
  }
  CXLPOOL_LOG(kWarning) << "lease " << id << ": " << l.moved_reason;
  out.moved = true;
  out.lease = Snapshot(l);
  return out;
}

std::vector<PoolSnapshot> LeaseManager::Pools() const {
  std::vector<PoolSnapshot> out;
  for (const Pool* p : pool_ptrs_) {
    PoolSnapshot s;
    s.name = p->name();
    s.numa_node = p->numa_node();
    s.kind = p->kind();
    s.memory_tier = p->memory_tier();
    s.capacity_bytes = p->capacity();
    s.leased_bytes = p->leased_bytes() + p->reserved_bytes();
    s.free_bytes = p->free_bytes();
    s.page_size = p->page_size();
    s.backing = p->backing();
    s.dynamic_region = p->dynamic_region();
    s.lease_count = p->lease_count();
    s.reclaiming_bytes = p->reclaiming_bytes();
    if (const ExtentReserve* r = p->reserve()) {
      s.reserve_ready_bytes = r->ready_bytes();
      s.reserve_building_bytes = r->building_bytes();
      s.reserve_retiring_bytes = r->retiring_bytes();
      s.reserve_low_bytes = r->settings().low_bytes;
      s.reserve_high_bytes = r->settings().high_bytes;
      if (auto since = r->below_low_since_ns()) {
        s.reserve_below_low_ms =
            static_cast<uint64_t>(std::max<int64_t>(0, clock_->MonotonicNs() - *since) / 1000000);
      }
    }
    s.long_term_pin_policy = LongTermPinPolicyName(p->long_term_pin_policy());
    if (const NumaNode* n = topo_->FindNode(p->numa_node());
        n != nullptr && std::string(p->backing()) == "memfd") {
      s.kernel_zone_bytes = n->kernel_zone_bytes;
      s.movable_bytes = n->movable_bytes;
      const char* pins = LongTermPinsName(LongTermPinsOf(*n));
      s.long_term_pins = pins != nullptr ? pins : "";
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::map<std::string, uint64_t> LeaseManager::Gauges() const {
  std::map<std::string, uint64_t> g;
  g["live_leases"] = table_.leases().size();
  g["connections"] = conns_.size();
  // Reserve refills and retirements count as builds and reclaims in flight.
  const uint64_t reserve_builds = stock_.pending_builds();
  const uint64_t reserve_retires = stock_.pending_retires();
  g["pending_builds"] = pending_builds_ + reserve_builds;
  g["pending_reclaims"] = reclaims_.pending() + reserve_retires;
  g["waiting_allocs"] = waiting_.size();
  g["shared_leases"] = table_.names();
  uint64_t leased = 0, cap = 0, reclaiming = 0, ready = 0, reserve = 0;
  for (const Pool* p : pool_ptrs_) {
    if (const ExtentReserve* r = p->reserve()) ready += r->ready_bytes();
    reserve += p->reserve_bytes();
    leased += p->leased_bytes() + p->reserved_bytes();
    cap += p->capacity();
    reclaiming += p->reclaiming_bytes();
  }
  g["leased_bytes"] = leased;
  g["reclaiming_bytes"] = reclaiming;
  g["reserve_bytes"] = reserve;  // ready + building + retiring
  g["reserve_ready_bytes"] = ready;
  g["capacity_bytes"] = cap;
  // What the last start found wrong with the journal (docs/daemon.md).
  g["journal_damaged"] = rules_->tracker().health().damaged ? 1 : 0;
  g["journal_skipped_regions"] = rules_->tracker().health().skipped_regions;
  g["journal_skipped_bytes"] = rules_->tracker().health().skipped_bytes;
  g["journal_dropped_tail_bytes"] = rules_->tracker().health().dropped_tail_bytes;
  return g;
}

void LeaseManager::StartRefills() {
  for (Pool* p : pool_ptrs_) Refill(p);
}

void LeaseManager::Refill(Pool* pool) {
  // Allocations waiting for reclaims come first: stock is built once they
  // are served (BackingReclaimed).
  if (stopping_ || retrying_waiters_ || !waiting_.empty()) return;
  stock_.Kick(pool);
}

void LeaseManager::Shutdown() {
  // Also after a hand-over: nobody will make room for these any more.
  RefuseWaiting(Status(Code::kUnavailable, "daemon is shutting down"));
  if (stopping_ || journal_.handed_over()) return;
  stopping_ = true;
  // Releases of this turn too, and every one from now: the loop may not
  // turn again.
  reclaims_.StartNow();
  std::vector<uint64_t> ids;
  for (const auto& [id, l] : table_.leases()) ids.push_back(id);
  for (uint64_t id : ids) Free(id, "shutdown_frees");
  StopReserves();
}

}  // namespace cxlpool
