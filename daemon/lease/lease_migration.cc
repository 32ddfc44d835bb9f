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

// "2 of 4 extents on node0 (node 0)": how far a move of several extents is.
std::string ExtentProgress(const LeaseRecord& l) {
  const size_t done =
      static_cast<size_t>(std::count(l.extents_moved.begin(), l.extents_moved.end(), true));
  return std::to_string(done) + " of " + std::to_string(l.extents.size()) + " extents on " +
         l.moving_to->name() + " (node " + std::to_string(l.moving_to->numa_node()) + ")";
}
}  // namespace

LeaseManager::MigrationFacts LeaseManager::FactsOf(const Lease& l) const {
  MigrationFacts f;
  f.lease = Snapshot(l);
  f.pool = l.pool;
  if (!l.awaited_memory && l.has_memory() && l.first().fd() >= 0) {
    f.extents = l.GrantedExtents();
    if (f.extents.size() == 1) f.fd = f.extents.front().fd;
  }
  f.extents_moved = l.extents_moved;
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
  if (l.moving_to != l.pool) {
    l.moving_to->CancelReserve(l.size);
    quotas_.Uncharge(TenantOf(l.owner), l.moving_to->quota_tier(), l.size);
  }
  l.moving_to = nullptr;
  l.moving_note.clear();
  l.moving_back_from.clear();
  l.extents_moved.clear();
}

Status LeaseManager::BeginPoolMove(uint64_t id, Pool* to) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) return Status(Code::kNotFound, "no lease " + std::to_string(id));
  Lease& l = it->second;
  if (l.moving_to != nullptr) {
    return Status(Code::kAlreadyExists, "a move of lease " + std::to_string(id) + " to " +
                                            l.moving_to->name() + " is under way");
  }
  if (to == nullptr || to == l.pool) {
    return Status(Code::kInvalidArgument,
                  "lease " + std::to_string(id) + " is already on " + l.pool->name());
  }
  if (std::string(l.pool->backing()) != "memfd" || std::string(to->backing()) != "memfd") {
    return Status(Code::kInvalidArgument, "devdax memory cannot move between pools");
  }
  if (l.awaited_memory || !l.has_memory() || l.first().fd() < 0) {
    return Status(Code::kUnavailable, "lease " + std::to_string(id) +
                                          "'s memory is not back since the daemon restarted");
  }
  const Tenant tenant = TenantOf(l.owner);
  const std::string tier = to->quota_tier();
  if (Status q = quotas_.Check(tenant, tier, l.size); !q.ok()) {
    return Status(Code::kResourceExhausted, to->name() + ": " + q.message());
  }
  if (Status r = quotas_.CheckReserve(tenant, to->name(), to->capacity(),
                                      to->leased_bytes() + to->reserved_bytes(), l.size);
      !r.ok()) {
    return Status(Code::kResourceExhausted, r.message());
  }
  if (!to->TryReserve(l.size)) {
    return Status(Code::kResourceExhausted, "no room for " + HumanBytes(l.size) + ": " + Room(to));
  }
  quotas_.Charge(tenant, tier, l.size);
  l.moving_to = to;
  l.moving_note.clear();
  l.moving_back_from.clear();
  l.extents_moved.clear();
  if (restart_.store != nullptr && !restart_.handed_over) {
    Status st = Persist(l, {});
    if (!st.ok()) {
      DropPoolMove(l);
      return Status(Code::kIo, "cannot journal the move: " + st.message());
    }
  }
  Count("pool_moves_begun");
  return Status::Ok();
}

Result<LeaseManager::Lease*> LeaseManager::MovingLease(uint64_t id) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return Status(Code::kNotFound, "lease " + std::to_string(id) + " ended during the move");
  }
  if (it->second.moving_to == nullptr) {
    return Status(Code::kInternal, "no move of lease " + std::to_string(id) + " is under way");
  }
  return &it->second;
}

Status LeaseManager::CommitPoolMove(uint64_t id) {
  Result<Lease*> moving = MovingLease(id);
  if (!moving.ok()) return moving.status();
  Lease& l = **moving;
  Pool* to = l.moving_to;
  if (to == l.pool) {
    // A move back (after a restart) finished: every page is on the pool
    // that accounts the lease; nothing changes hands.
    CXLPOOL_LOG(kInfo) << "lease " << id << ": moved back to " << l.pool->name()
                       << (l.moving_back_from.empty() ? "" : " from " + l.moving_back_from);
    l.moving_to = nullptr;
    l.moving_note.clear();
    l.moving_back_from.clear();
    l.extents_moved.clear();
    Count("pool_moves_back_done");
    (void)Persist(l, {});
    return Status::Ok();
  }
  Rehome(l, to,
         "the tiering engine moved its pages from node " + std::to_string(l.pool->numa_node()) +
             " to node " + std::to_string(to->numa_node()) + " (cxlpoolctl tiering --lease " +
             std::to_string(id) + " says why)");
  return Status::Ok();
}

Status LeaseManager::CommitExtentMove(uint64_t id, uint32_t extent) {
  Result<Lease*> moving = MovingLease(id);
  if (!moving.ok()) return moving.status();
  Lease& l = **moving;
  if (extent >= l.extents.size()) {
    return Status(Code::kInternal,
                  "lease " + std::to_string(id) + " has no extent " + std::to_string(extent));
  }
  if (l.extents.size() == 1) return CommitPoolMove(id);
  l.extents_moved.resize(l.extents.size(), false);
  l.extents_moved[extent] = true;
  Count("pool_move_extents_done");
  if (std::all_of(l.extents_moved.begin(), l.extents_moved.end(), [](bool b) { return b; })) {
    return CommitPoolMove(id);
  }
  // Half moved: still accounted where it was, the whole lease's room held
  // on the target, and every extent's place journalled.
  l.moving_note = ExtentProgress(l) + "; the others follow";
  (void)Persist(l, {});
  return Status::Ok();
}

void LeaseManager::Rehome(Lease& l, Pool* to, std::string why) {
  if (!l.placed_node) l.placed_node = l.pool->numa_node();
  l.moved_reason = std::move(why);
  l.pages_node.reset();
  if (to != l.pool) {
    const Tenant tenant = TenantOf(l.owner);
    l.pool->MoveLeaseOut(l.size);
    if (l.moving_to == to) {
      // The tiering engine's move: the room reserved and the charge made
      // at BeginPoolMove become the lease's.
      to->CommitReserve(l.size);
    } else {
      // The pages are there already (a long-term pin moved them): counted
      // even past the pool's capacity, which admission then sees as full.
      DropPoolMove(l);
      to->MoveLeaseIn(l.size);
      quotas_.Charge(tenant, to->quota_tier(), l.size);
    }
    quotas_.Uncharge(tenant, l.tier, l.size);
    l.tier = to->quota_tier();
    l.pool = to;
  }
  l.moving_to = nullptr;
  l.moving_note.clear();
  l.moving_back_from.clear();
  l.extents_moved.clear();
  Count("leases_moved");
  (void)Persist(l, {});
}

Status LeaseManager::AbortPoolMove(uint64_t id, const std::string& split_note) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) return Status::Ok();  // Free dropped the move already
  Lease& l = it->second;
  if (l.moving_to == nullptr) return Status::Ok();
  const bool half_moved =
      std::find(l.extents_moved.begin(), l.extents_moved.end(), true) != l.extents_moved.end();
  if (split_note.empty() && l.moving_to == l.pool) {
    // A move back: pages may still be where the interrupted move left them,
    // so it is never dropped; a later round tries again.
    l.moving_note = (half_moved ? ExtentProgress(l) + "; " : std::string()) + "moving back to " +
                    l.pool->name() +
                    (l.moving_back_from.empty() ? "" : " from " + l.moving_back_from) +
                    " did not finish; it is tried again";
    Count("pool_moves_back_unfinished");
    CXLPOOL_LOG(kWarning) << "lease " << id << " (" << l.pool->name() << "): " << l.moving_note;
  } else if (split_note.empty() && half_moved) {
    // Some extents are on the target already: the room stays reserved
    // there and the lease says how far it got, until a later move finishes.
    l.moving_note = ExtentProgress(l) + "; the move of the others did not finish";
    Count("pool_moves_partial");
    CXLPOOL_LOG(kWarning) << "lease " << id << " (" << l.pool->name() << " -> "
                          << l.moving_to->name() << "): " << l.moving_note;
  } else if (split_note.empty()) {
    DropPoolMove(l);
    Count("pool_moves_aborted");
  } else {
    l.moving_note = half_moved ? ExtentProgress(l) + "; " + split_note : split_note;
    Count("pool_moves_split");
    CXLPOOL_LOG(kWarning) << "lease " << id << " (" << l.pool->name() << " -> "
                          << l.moving_to->name() << "): " << split_note;
  }
  (void)Persist(l, {});
  return Status::Ok();
}

void LeaseManager::RecoverPoolMove(Lease& l, const std::string& to_pool,
                                   const std::string& back_from,
                                   const std::vector<std::string>& extent_pools) {
  if (to_pool.empty()) return;
  Pool* to = nullptr;
  for (Pool* p : pool_ptrs_) {
    if (p->name() == to_pool) to = p;
  }
  // The extents the journal says this move put on `to_pool` are there (each
  // was verified before it was journalled); the others move next.
  auto take_progress = [&] {
    if (l.extents.size() <= 1 || extent_pools.size() != l.extents.size()) return false;
    l.extents_moved.assign(l.extents.size(), false);
    for (size_t i = 0; i < extent_pools.size(); ++i) {
      l.extents_moved[i] = extent_pools[i] == to_pool;
    }
    return true;
  };
  if (to == l.pool) {
    // A move back (an earlier restart found no room on the move's target)
    // that this restart interrupted: it goes on from where it got. Its
    // room is the lease's own.
    l.moving_to = l.pool;
    l.moving_back_from = back_from;
    const std::string from = back_from.empty() ? "another pool" : back_from;
    l.moving_note = "a move back to " + to_pool + " from " + from +
                    " was interrupted by a daemon restart; its pages may be on " + from +
                    " until they are moved back";
    if (take_progress()) {
      l.moving_note = "a move back from " + from + " was interrupted by a daemon restart with " +
                      ExtentProgress(l) + "; the others may be on " + from +
                      " until they are moved back";
    }
  } else if (to != nullptr && std::string(to->backing()) == "memfd" && to->TryReserve(l.size)) {
    quotas_.Charge(TenantOf(l.owner), to->quota_tier(), l.size);
    l.moving_to = to;
    l.moving_note = "interrupted by a daemon restart; its pages may be on " + l.pool->name() +
                    " and " + to_pool + " until the move is finished";
    if (take_progress()) {
      l.moving_note = "interrupted by a daemon restart with " + ExtentProgress(l) +
                      "; the others may be on " + l.pool->name() + " and " + to_pool +
                      " until the move is finished";
    }
  } else {
    // Finish it the other way: every page back on the pool that accounts
    // it, every extent (the one the move was on when the daemon died may be
    // split). Journalled like a forward move, so that a restart during it
    // goes on with it (the branch above).
    l.moving_to = l.pool;
    l.moving_back_from = to_pool;
    l.extents_moved.clear();
    l.moving_note = "a move to " + to_pool + " was interrupted by a daemon restart and " +
                    (to == nullptr ? "that pool is gone" : "it has no room now") +
                    "; its pages may be split until they are moved back";
    (void)Persist(l, {});
  }
  CXLPOOL_LOG(kWarning) << "restart: lease " << l.id << ": " << l.moving_note;
  Count("restart_interrupted_moves");
}

}  // namespace cxlpool
