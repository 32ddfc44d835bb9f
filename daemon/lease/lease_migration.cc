// LeaseManager's tiering support: the facts the tiering engine reads, and
// the accounting of moving a lease's pages between pools (lease_manager.h,
// "tiering support"; docs/daemon.md, "Tiering").
#include <fcntl.h>

#include <algorithm>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "lease/lease_manager.h"

namespace cxlpool {

namespace {
std::string Room(const Pool* p) {
  return p->name() + " has " + HumanBytes(p->free_bytes()) + " free of " +
         HumanBytes(p->capacity());
}

std::string Node(const Pool* p) { return "node " + std::to_string(p->numa_node()); }

// "extent 3 (2 MiB)", or "its pages" for a lease of one extent.
std::string WhatMoves(const LeaseRecord& l, size_t extent) {
  if (l.extent_count() == 1) return "its pages";
  return "extent " + std::to_string(extent) + " (" + HumanBytes(l.ExtentBytes(extent)) + ")";
}
}  // namespace

std::string LeaseManager::Spread(const Lease& l) {
  std::vector<LeaseRecord::PoolBytes> by = l.BytesByPool();
  if (by.size() == 1) return "";
  std::string out;
  for (const auto& b : by) {
    if (!out.empty()) out += ", ";
    out += std::to_string(b.extents.size()) + " of " + std::to_string(l.extent_count()) +
           " extents (" + HumanBytes(b.bytes) + ") on " + b.pool->name();
  }
  return out;
}

LeaseManager::MigrationFacts LeaseManager::FactsOf(const Lease& l) const {
  MigrationFacts f;
  f.lease = Snapshot(l);
  f.pool = l.pool;
  if (!l.awaited_memory && l.has_memory() && l.first().fd() >= 0) {
    f.extents = l.GrantedExtents();
    if (f.extents.size() == 1) f.fd = f.extents.front().fd;
  }
  for (size_t i = 0; i < l.extent_pools.size(); ++i) f.extent_pools.push_back(l.extent_pools[i]);
  f.moving_extent = l.moving_extent;
  std::vector<ConnId> conns;
  for (const auto& [conn, n] : l.holders) conns.push_back(conn);
  std::sort(conns.begin(), conns.end());
  for (ConnId c : conns) {
    f.holders.push_back(c);
    auto it = conns_.find(c);
    f.holder_pids.push_back(it == conns_.end() ? -1 : it->second.caller.pid);
  }
  f.priority = quotas_.PriorityOf(TenantOf(l.owner));
  f.gpu = l.gpu;
  f.home_node = l.home_node;
  f.moving_to = l.moving_to;
  f.moving_note = l.moving_note;
  return f;
}

std::vector<LeaseManager::MigrationFacts> LeaseManager::LeasesForMigration() const {
  std::vector<MigrationFacts> out;
  out.reserve(table_.leases().size());
  for (const auto& [id, l] : table_.leases()) out.push_back(FactsOf(l));
  std::sort(out.begin(), out.end(), [](const MigrationFacts& a, const MigrationFacts& b) {
    return a.lease.id < b.lease.id;
  });
  return out;
}

std::optional<LeaseManager::MigrationFacts> LeaseManager::LeaseForMigration(uint64_t id) const {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) return std::nullopt;
  return FactsOf(it->second);
}

void LeaseManager::DropPoolMove(Lease& l) {
  if (l.moving_to == nullptr) return;
  if (l.moving_to != l.PoolOf(l.moving_extent)) {
    l.moving_to->CancelReserve(l.MovingBytes());
    quotas_.UnchargePart(TenantOf(l.owner), l.moving_to->quota_tier(), l.MovingBytes(), false,
                         false);
  }
  ClearMove(l);
}

void LeaseManager::ClearMove(Lease& l) {
  l.moving_to = nullptr;
  l.moving_extent = 0;
  l.moving_note.clear();
  l.moving_back_from.clear();
}

Status LeaseManager::BeginExtentMove(uint64_t id, uint32_t extent, Pool* to) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) return Status(Code::kNotFound, "no lease " + std::to_string(id));
  Lease& l = it->second;
  if (l.moving_to != nullptr) {
    return Status(Code::kAlreadyExists, "a move of lease " + std::to_string(id) + " to " +
                                            l.moving_to->name() + " is under way");
  }
  if (extent >= l.extent_count()) {
    return Status(Code::kNotFound,
                  "lease " + std::to_string(id) + " has no extent " + std::to_string(extent));
  }
  Pool* from = l.PoolOf(extent);
  if (to == nullptr || to == from) {
    return Status(Code::kInvalidArgument, "lease " + std::to_string(id) + "'s " +
                                              WhatMoves(l, extent) + " is already on " +
                                              from->name());
  }
  if (std::string(from->backing()) != "memfd" || std::string(to->backing()) != "memfd") {
    return Status(Code::kInvalidArgument, "devdax memory cannot move between pools");
  }
  if (l.awaited_memory || !l.has_memory() || l.first().fd() < 0) {
    return Status(Code::kUnavailable, "lease " + std::to_string(id) +
                                          "'s memory is not back since the daemon restarted");
  }
  const uint64_t bytes = l.ExtentBytes(extent);
  const Tenant tenant = TenantOf(l.owner);
  const std::string tier = to->quota_tier();
  if (Status q = quotas_.Check(tenant, tier, bytes); !q.ok()) {
    return Status(Code::kResourceExhausted, to->name() + ": " + q.message());
  }
  if (Status r = quotas_.CheckReserve(tenant, to->name(), to->capacity(),
                                      to->leased_bytes() + to->reserved_bytes(), bytes);
      !r.ok()) {
    return Status(Code::kResourceExhausted, r.message());
  }
  if (!to->TryReserve(bytes)) {
    return Status(Code::kResourceExhausted, "no room for " + HumanBytes(bytes) + ": " + Room(to));
  }
  quotas_.ChargePart(tenant, tier, bytes, false, false);  // the room only, until Commit
  ClearMove(l);
  l.moving_to = to;
  l.moving_extent = extent;
  if (journal_.writing()) {
    Status st = Persist(l, {});
    if (!st.ok()) {
      DropPoolMove(l);
      return Status(Code::kIo, "cannot journal the move: " + st.message());
    }
  }
  Count("pool_moves_begun");
  return Status::Ok();
}

Result<LeaseManager::Lease*> LeaseManager::MovingLease(uint64_t id, uint32_t extent) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return Status(Code::kNotFound, "lease " + std::to_string(id) + " ended during the move");
  }
  if (it->second.moving_to == nullptr) {
    return Status(Code::kInternal, "no move of lease " + std::to_string(id) + " is under way");
  }
  if (it->second.moving_extent != extent) {
    return Status(Code::kInternal, "the move of lease " + std::to_string(id) + " is of extent " +
                                       std::to_string(it->second.moving_extent) + ", not " +
                                       std::to_string(extent));
  }
  return &it->second;
}

Status LeaseManager::CommitExtentMove(uint64_t id, uint32_t extent) {
  Result<Lease*> moving = MovingLease(id, extent);
  if (!moving.ok()) return moving.status();
  Lease& l = **moving;
  Pool* to = l.moving_to;
  Pool* from = l.PoolOf(extent);
  if (to == from) {
    // A move back (after a restart) finished: the pages are on the pool
    // that accounts them; nothing changes hands.
    CXLPOOL_LOG(kInfo) << "lease " << id << ": " << WhatMoves(l, extent) << " moved back to "
                       << from->name()
                       << (l.moving_back_from.empty() ? "" : " from " + l.moving_back_from);
    ClearMove(l);
    Count("pool_moves_back_done");
    (void)Persist(l, {});
    return Status::Ok();
  }
  // The room reserved and the charge made at Begin become the extent's.
  const uint64_t bytes = l.ExtentBytes(extent);
  const Tenant tenant = TenantOf(l.owner);
  bool from_keeps = false, to_had = false;
  for (size_t i = 0; i < l.extent_count(); ++i) {
    if (i == extent) continue;
    from_keeps = from_keeps || l.PoolOf(i) == from;
    to_had = to_had || l.PoolOf(i) == to;
  }
  from->MoveLeaseOut(bytes, !from_keeps);
  to->CommitReserve(bytes, !to_had);
  quotas_.UnchargePart(tenant, to->quota_tier(), bytes, false, false);
  ChargeTiers(l, false);
  if (!l.placed_node) l.placed_node = l.pool->numa_node();
  l.pages_node.reset();
  l.SetExtentPool(extent, to);
  ChargeTiers(l, true);
  ClearMove(l);
  const std::string spread = Spread(l);
  l.moved_reason = "the tiering engine moved " + WhatMoves(l, extent) + " from " + Node(from) +
                   " to " + Node(to) + (spread.empty() ? "" : "; " + spread) +
                   " (cxlpoolctl tiering --lease " + std::to_string(id) + " says why)";
  if (l.extent_count() > 1) Count("pool_move_extents_done");
  if (spread.empty()) Count("leases_moved");
  (void)Persist(l, {});
  return Status::Ok();
}

void LeaseManager::Rehome(Lease& l, Pool* to, std::string why) {
  if (!l.placed_node) l.placed_node = l.pool->numa_node();
  l.moved_reason = std::move(why);
  l.pages_node.reset();
  // The pages are there already (a long-term pin moved them): counted even
  // past the pool's capacity, which admission then sees as full.
  DropPoolMove(l);
  ChargeTiers(l, false);
  std::vector<LeaseRecord::PoolBytes> by = l.BytesByPool();
  bool to_counts = std::any_of(by.begin(), by.end(), [to](const auto& b) { return b.pool == to; });
  for (const auto& b : by) {
    if (b.pool == to) continue;
    b.pool->MoveLeaseOut(b.bytes);
    to->MoveLeaseIn(b.bytes, !to_counts);
    to_counts = true;
  }
  l.extent_pools.clear();
  l.pool = to;
  l.tier = to->quota_tier();
  ChargeTiers(l, true);
  Count("leases_moved");
  (void)Persist(l, {});
}

Status LeaseManager::AbortExtentMove(uint64_t id, uint32_t extent, const std::string& split_note) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) return Status::Ok();  // Free dropped the move already
  Lease& l = it->second;
  if (l.moving_to == nullptr || l.moving_extent != extent) return Status::Ok();
  Pool* from = l.PoolOf(extent);
  if (split_note.empty() && l.moving_to == from) {
    // A move back: pages may still be where the interrupted move left them,
    // so it is never dropped; a later round tries again.
    l.moving_note = "moving " + WhatMoves(l, extent) + " back to " + from->name() +
                    (l.moving_back_from.empty() ? "" : " from " + l.moving_back_from) +
                    " did not finish; it is tried again";
    Count("pool_moves_back_unfinished");
    CXLPOOL_LOG(kWarning) << "lease " << id << " (" << from->name() << "): " << l.moving_note;
  } else if (split_note.empty()) {
    DropPoolMove(l);
    Count("pool_moves_aborted");
  } else {
    l.moving_note = split_note;
    Count("pool_moves_split");
    CXLPOOL_LOG(kWarning) << "lease " << id << " (" << from->name() << " -> " << l.moving_to->name()
                          << "): " << split_note;
  }
  (void)Persist(l, {});
  return Status::Ok();
}

void LeaseManager::ChargeTiers(const Lease& l, bool charge) {
  const Tenant tenant = TenantOf(l.owner);
  if (l.extent_pools.empty()) {
    if (charge) {
      quotas_.Charge(tenant, l.tier, l.size);
    } else {
      quotas_.Uncharge(tenant, l.tier, l.size);
    }
    return;
  }
  std::vector<std::pair<std::string, uint64_t>> tiers;
  for (const auto& b : l.BytesByPool()) {
    const std::string& tier = b.pool->quota_tier();
    auto it =
        std::find_if(tiers.begin(), tiers.end(), [&](const auto& t) { return t.first == tier; });
    if (it == tiers.end()) it = tiers.insert(tiers.end(), {tier, 0});
    it->second += b.bytes;
  }
  bool first = true;
  for (const auto& [tier, bytes] : tiers) {
    if (charge) {
      quotas_.ChargePart(tenant, tier, bytes, true, first);
    } else {
      quotas_.UnchargePart(tenant, tier, bytes, true, first);
    }
    first = false;
  }
}

Pool* LeaseManager::PoolNamed(const std::string& name) const {
  for (Pool* p : pool_ptrs_) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

void LeaseManager::RecoverPoolMove(Lease& l, const std::string& to_pool,
                                   const std::string& back_from, uint32_t extent) {
  if (to_pool.empty()) return;
  if (extent >= l.extent_count()) {
    CXLPOOL_LOG(kWarning) << "restart: lease " << l.id << ": the journal's move names extent "
                          << extent << " of " << l.extent_count() << "; dropped";
    (void)Persist(l, {});
    return;
  }
  Pool* to = PoolNamed(to_pool);
  Pool* from = l.PoolOf(extent);
  const std::string what = WhatMoves(l, extent);
  l.moving_extent = extent;
  if (to == from) {
    // A move back (an earlier restart found no room on the move's target)
    // that this restart interrupted: it goes on. Its room is its own.
    l.moving_to = from;
    l.moving_back_from = back_from;
    const std::string there = back_from.empty() ? "another pool" : back_from;
    l.moving_note = "a move of " + what + " back to " + to_pool + " from " + there +
                    " was interrupted by a daemon restart; its pages may be on " + there +
                    " until they are moved back";
  } else if (to != nullptr && std::string(to->backing()) == "memfd" &&
             to->TryReserve(l.ExtentBytes(extent))) {
    quotas_.ChargePart(TenantOf(l.owner), to->quota_tier(), l.ExtentBytes(extent), false, false);
    l.moving_to = to;
    l.moving_note = "interrupted by a daemon restart; " + what + " may be on " + from->name() +
                    " and " + to_pool + " until the move is finished";
  } else {
    // Finish it the other way: every page of the extent back on the pool
    // that accounts it. Journalled like a forward move, so that a restart
    // during it goes on with it (the branch above).
    l.moving_to = from;
    l.moving_back_from = to_pool;
    l.moving_note = "a move of " + what + " to " + to_pool +
                    " was interrupted by a daemon restart and " +
                    (to == nullptr ? "that pool is gone" : "it has no room now") +
                    "; its pages may be split until they are moved back";
    (void)Persist(l, {});
  }
  CXLPOOL_LOG(kWarning) << "restart: lease " << l.id << ": " << l.moving_note;
  Count("restart_interrupted_moves");
}

}  // namespace cxlpool
