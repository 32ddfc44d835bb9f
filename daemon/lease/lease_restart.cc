// LeaseManager's restart support: journalling through a LeaseStore,
// recovery of journalled leases, the grace period, RECLAIM, holder watches
// and the hand-over at SIGTERM. See lease/restart.h and docs/daemon.md.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <set>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "lease/lease_manager.h"

namespace cxlpool {

namespace {
// A RECLAIM item's extents against the journalled ones: one fd per extent,
// and the sizes the holder was told (when it says) are the lease's.
Status CheckReclaimExtents(uint64_t id, const std::vector<DurableExtent>& extents,
                           const LeaseManager::ReclaimItem& item) {
  const std::string what = "lease " + std::to_string(id) + ": ";
  if (item.fds.size() != extents.size()) {
    return Status(Code::kInvalidArgument, what + "it has " + std::to_string(extents.size()) +
                                              " extents, " + std::to_string(item.fds.size()) +
                                              " fds were handed back");
  }
  if (item.extent_sizes.empty()) return Status::Ok();
  if (item.extent_sizes.size() != extents.size()) {
    return Status(Code::kInvalidArgument, what + "it has " + std::to_string(extents.size()) +
                                              " extents, not " +
                                              std::to_string(item.extent_sizes.size()));
  }
  for (size_t i = 0; i < extents.size(); ++i) {
    if (item.extent_sizes[i] != extents[i].size_bytes) {
      return Status(Code::kInvalidArgument, what + "extent " + std::to_string(i) + " is " +
                                                std::to_string(extents[i].size_bytes) +
                                                " bytes, not " +
                                                std::to_string(item.extent_sizes[i]));
    }
  }
  return Status::Ok();
}

// The one refusal of a RECLAIM for a lease the caller may not see.
std::string NotYours(uint64_t id) {
  return "lease " + std::to_string(id) + " is not one this caller may hold";
}

bool SameHolder(const HolderId& a, pid_t pid, uint64_t start_time) {
  return a.pid == pid && (a.start_time == 0 || start_time == 0 || a.start_time == start_time);
}

}  // namespace

void LeaseManager::EnableRestart(LeaseStore* store, const ProcessProbe* probe, uint64_t next_id) {
  journal_.Enable(store, next_id);
  restart_.set_probe(probe);
}

DurableLease LeaseManager::ToDurable(const Lease& l) const {
  DurableLease d;
  d.id = l.id;
  d.size_bytes = l.size;
  d.requested_bytes = l.requested;
  d.page_size = l.first().page_size();
  d.numa_node = l.pool->numa_node();
  d.pool = l.pool->name();
  d.kind = l.pool->kind();
  d.backing = l.first().kind();
  d.label = l.label;
  d.name = l.name;
  d.owner_pid = l.owner.pid;
  d.owner_uid = l.owner.uid;
  d.owner_gid = l.owner.gid;
  d.owner_start_time = l.owner.start_time;
  d.owner_comm = l.owner.comm;
  d.owner_cgroup = l.owner.cgroup;
  d.long_term_pin = l.long_term_pin;
  d.placed_numa_node = l.placed_node;
  d.moved_reason = l.moved_reason;
  d.pages_numa_node = l.pages_node;
  d.acl_uids = l.acl_uids;
  d.acl_gids = l.acl_gids;
  d.created_unix = l.created_unix;
  d.inode = l.inode;
  d.inode_dev = l.inode_dev;
  if (l.identity.size() > 1) d.extents = l.identity;
  d.dax_device = l.first().dax_device();
  d.dax_rdev = l.first().device_number();
  if (l.moving_to != nullptr) {
    d.migrating_to_pool = l.moving_to->name();
    d.migrating_back_from_pool = l.moving_back_from;
    d.migrating_extent = l.moving_extent;
  }
  if (!l.extent_pools.empty() && d.extents.size() == l.extent_pools.size()) {
    for (const Pool* p : l.extent_pools) d.extent_pools.push_back(p->name());
  }
  auto add = [&](HolderId h) {
    if (std::find(d.holders.begin(), d.holders.end(), h) == d.holders.end()) {
      d.holders.push_back(h);
    }
  };
  std::vector<ConnId> conns;
  for (const auto& [conn, n] : l.holders) conns.push_back(conn);
  std::sort(conns.begin(), conns.end());
  for (ConnId conn : conns) {
    auto c = conns_.find(conn);
    if (c != conns_.end()) add(HolderId{c->second.caller.pid, c->second.caller.start_time});
  }
  for (const auto& h : l.awaiting) add(h);
  return d;
}

Status LeaseManager::Persist(const Lease& l, std::span<const int> fds) {
  if (!journal_.writing()) return Status::Ok();
  return journal_.Put(ToDurable(l), fds);
}

void LeaseManager::Unpersist(uint64_t id) { journal_.Delete(id); }

bool LeaseManager::PersistGrant(uint64_t id, const AllocDone& done) {
  Lease& l = table_.leases().at(id);
  // Every extent's size and memfd identity: what a RECLAIM is matched
  // against, journalled or not.
  const bool journal = journal_.enabled();
  l.identity.clear();
  for (const auto& e : l.extents) {
    DurableExtent x;
    x.size_bytes = e->size_bytes();
    struct stat st {};
    if (e->Identity(&x.inode, &x.inode_dev)) {  // memfds: read when built, off the loop
    } else if (journal && e->fd() >= 0 && ::fstat(e->fd(), &st) == 0) {
      x.inode = st.st_ino;
      x.inode_dev = st.st_dev;
    }
    l.identity.push_back(x);
  }
  l.inode = l.identity.front().inode;
  l.inode_dev = l.identity.front().inode_dev;
  if (!journal) return true;
  const std::vector<int> fds = l.Fds();
  Status s = Persist(l, fds);
  if (s.ok()) return true;
  // Not journalled means not restart-safe: take the grant back.
  Free(id, "journal_failures");
  Count("refusals");
  done(Status(Code::kUnavailable, "cannot journal the lease (restart safety): " + s.message()));
  return false;
}

LeaseManager::RecoveryReport LeaseManager::Recover(std::vector<DurableLease> journalled,
                                                   std::map<uint64_t, std::vector<UniqueFd>> stored,
                                                   std::chrono::milliseconds grace,
                                                   const JournalHealth& health) {
  RecoveryReport r;
  restart_.health() = health;
  std::set<std::string> carved_seen;  // dynamic sub-devices counted back in
  for (DurableLease& d : journalled) {
    ++r.journalled;
    journal_.TakeJournalledId(d.id);
    // The fd store's fds of its extents, all of them or none.
    std::vector<UniqueFd> fds;
    if (auto s = stored.find(d.id); s != stored.end()) {
      fds = std::move(s->second);
      stored.erase(s);
    }
    RecoverLease(d, std::move(fds), &carved_seen, &r);
  }
  const size_t dax_orphans = FindDaxOrphans(carved_seen);
  ReadoptStoreOrphans(std::move(stored), &r);
  journal_.ReserveTaken();
  CXLPOOL_LOG(kInfo) << "restart: " << r.journalled << " journalled leases, " << r.adopted
                     << " adopted from the fd store, " << r.awaiting << " awaiting reclaim, "
                     << r.dropped << " dropped, " << r.orphans << " found only in the fd store";
  if (health.damaged || r.orphans > 0) restart_.health().damaged = true;
  // Journal damage: leases may exist that nobody has told this daemon of.
  // Their holders reclaim them once they see the restart; until the grace
  // period is over nothing new is granted, so they always find room.
  restart_.set_full(health.may_have_lost_leases || r.orphans > 0 || dax_orphans > 0);
  if (restart_.full()) {
    CXLPOOL_LOG(kError) << "restart: the lease journal was damaged"
                        << (health.description.empty() ? "" : " (" + health.description + ")")
                        << (r.orphans > 0 ? "; the fd store held leases it did not know" : "")
                        << ": leases it lost are accounted again when their holders reclaim them"
                        << (grace.count() > 0
                                ? "; the grace period runs its full length"
                                : "; no grace period is configured, so grants do not wait");
  }
  StartGrace(grace, r.awaiting > 0, health.may_have_lost_leases);
  return r;
}

void LeaseManager::RecoverLease(DurableLease& d, std::vector<UniqueFd> fds,
                                std::set<std::string>* carved_seen, RecoveryReport* r) {
  auto drop = [&](const std::string& why) {
    CXLPOOL_LOG(kWarning) << "restart: lease " << d.id << " (" << HumanBytes(d.size_bytes)
                          << ", uid " << d.owner_uid << ") dropped: " << why;
    Unpersist(d.id);
    Count("restart_drops");
    ++r->dropped;
  };
  Pool* pool = nullptr;
  for (Pool* p : pool_ptrs_) {
    if (p->name() == d.pool) pool = p;
  }
  if (pool == nullptr) {
    drop("pool " + d.pool + " is no longer configured");
    return;
  }
  auto* dax_pool = dynamic_cast<DevdaxPool*>(pool);
  if (dax_pool != nullptr) {
    if (auto why = RecoverDaxDevice(dax_pool, d, carved_seen)) {
      fds.clear();
      drop(*why);
      return;
    }
  }
  if (d.holders.empty()) d.holders.push_back(HolderId{d.owner_pid, d.owner_start_time});
  std::vector<HolderId> alive;
  for (const HolderId& h : d.holders) {
    if (restart_.probe() != nullptr && HolderAlive(*restart_.probe(), h)) alive.push_back(h);
  }
  CheckStoredFds(d, dax_pool, &fds);
  if (alive.empty()) {
    ReleaseUnheldStored(d, dax_pool, &fds);
    drop("every holder exited while the daemon was down");
    return;
  }
  const std::vector<DurableExtent> extents = ExtentsOf(d);
  std::vector<Pool*> extent_pools = RecoveredExtentPools(d, pool, dax_pool != nullptr);
  // Never double-grant: without room on paper its holders cannot keep it.
  if (d.size_bytes == 0) {
    drop("it has no bytes; its holders' reclaim will be rejected");
    return;
  }
  if (Status st = ReserveByPool(BytesByPool(d, pool, extent_pools)); !st.ok()) {
    drop("it does not fit " + st.message() + " any more; its holders' reclaim will be rejected");
    return;
  }
  bool adopted = false;
  Extents backing = RecoveredBacking(d, pool, std::move(fds), &adopted);
  Lease fresh = FromDurable(d, pool);
  extra_extents_ += backing.size() - 1;
  fresh.extents = std::move(backing);
  fresh.awaiting = alive;
  fresh.awaited_memory = !adopted;
  fresh.identity = extents;
  fresh.extent_pools = std::move(extent_pools);
  if (!fresh.extent_pools.empty()) {
    Pool* first = fresh.extent_pools.front();
    fresh.SetExtentPool(0, first);  // settles pool (and tier) on the one holding most
  }
  Lease& l = table_.Add(std::move(fresh));  // indexed by owner and name
  ChargeTiers(l, true);
  RecoverPoolMove(l, d.migrating_to_pool, d.migrating_back_from_pool,
                  d.migrating_extent.value_or(FirstNotOn(d)));
  if (alive.size() != d.holders.size()) (void)Persist(l, {});
  restart_.set_awaiting_any(true);
  Count(adopted ? "restart_adopted" : "restart_awaiting");
  ++(adopted ? r->adopted : r->awaiting);
}

std::optional<std::string> LeaseManager::RecoverDaxDevice(DevdaxPool* dax_pool, DurableLease& d,
                                                          std::set<std::string>* carved_seen) {
  d.dax_device = dax_pool->LeaseDevice(d.dax_device);
  if (d.dax_device.empty() || !dax_pool->DeviceExists(d.dax_device)) {
    return d.dax_device.empty()
               ? std::string("journalled without its DAX device (an older cxlpoold)")
               : "its DAX device " + d.dax_device + " no longer exists";
  }
  if (dax_pool->dynamic_region() && carved_seen->insert(d.dax_device).second) {
    dax_pool->CountCarvedAtStart(d.size_bytes);
  }
  return std::nullopt;
}

void LeaseManager::CheckStoredFds(const DurableLease& d, DevdaxPool* dax_pool,
                                  std::vector<UniqueFd>* fds) {
  if (fds->empty()) return;
  Status st = dax_pool != nullptr
                  ? (fds->size() == 1 ? dax_pool->CheckFd((*fds)[0].get(), d.dax_device, d.dax_rdev)
                                      : Status(Code::kInvalidArgument,
                                               "a devdax lease has one fd, the store had " +
                                                   std::to_string(fds->size())))
                  : CheckLeaseFds(*fds, d);
  if (!st.ok()) {
    CXLPOOL_LOG(kWarning) << "restart: stored fds do not match the journal, closed: "
                          << st.ToString();
    fds->clear();
  }
}

void LeaseManager::ReleaseUnheldStored(const DurableLease& d, DevdaxPool* dax_pool,
                                       std::vector<UniqueFd>* fds) {
  if (dax_pool != nullptr) {
    // The stored fd would keep the device busy: close it, then give a
    // carved sub-device back to its region (a static device is free
    // again once nothing reserves it).
    fds->clear();
    dax_pool->Recovered(d.dax_device, d.size_bytes, d.dax_rdev, UniqueFd())->Reclaim();
    return;
  }
  // Its memory died with its last holder; if the fd store kept it, free it now.
  for (const UniqueFd& fd : *fds) {
    if (fd.valid() && ::ftruncate(fd.get(), 0) != 0) {
      CXLPOOL_LOG(kWarning) << "restart: truncating stored lease " << d.id << " failed";
    }
  }
}

std::vector<Pool*> LeaseManager::RecoveredExtentPools(const DurableLease& d, Pool* pool,
                                                      bool devdax) const {
  std::vector<Pool*> extent_pools;
  const size_t n = ExtentsOf(d).size();
  if (devdax || d.extent_pools.size() != n || n <= 1) return extent_pools;
  for (const std::string& name : d.extent_pools) {
    Pool* p = name.empty() ? pool : PoolNamed(name);
    if (p == nullptr || std::string(p->backing()) != "memfd") {
      CXLPOOL_LOG(kWarning) << "restart: lease " << d.id << ": an extent's pool " << name
                            << " is no longer a memfd pool; accounted to " << pool->name()
                            << " (its pages may be elsewhere)";
      p = pool;
    }
    extent_pools.push_back(p);
  }
  return extent_pools;
}

std::vector<std::pair<Pool*, uint64_t>> LeaseManager::BytesByPool(
    const DurableLease& d, Pool* pool, const std::vector<Pool*>& extent_pools) {
  const std::vector<DurableExtent> extents = ExtentsOf(d);
  std::vector<std::pair<Pool*, uint64_t>> by_pool{{pool, 0}};
  for (size_t i = 0; i < extents.size(); ++i) {
    Pool* p = extent_pools.empty() ? pool : extent_pools[i];
    auto it =
        std::find_if(by_pool.begin(), by_pool.end(), [p](const auto& b) { return b.first == p; });
    if (it == by_pool.end()) it = by_pool.insert(by_pool.end(), {p, 0});
    it->second += extents.size() == 1 ? d.size_bytes : extents[i].size_bytes;
  }
  if (extents.empty()) by_pool.front().second = d.size_bytes;
  return by_pool;
}

LeaseManager::Extents LeaseManager::RecoveredBacking(const DurableLease& d, Pool* pool,
                                                     std::vector<UniqueFd> fds, bool* adopted) {
  Extents backing;
  if (auto* dax_pool = dynamic_cast<DevdaxPool*>(pool); dax_pool != nullptr) {
    *adopted = !fds.empty();
    backing.push_back(dax_pool->Recovered(d.dax_device, d.size_bytes, d.dax_rdev,
                                          fds.empty() ? UniqueFd() : std::move(fds[0])));
  } else if (!fds.empty()) {
    auto* mp = dynamic_cast<MemfdPool*>(pool);
    auto b = AdoptMemfds(std::move(fds), d, mp != nullptr && mp->config().pin);
    if (b.ok()) {
      backing = std::move(*b);
      *adopted = true;
    } else {
      CXLPOOL_LOG(kWarning) << "restart: adopting stored lease " << d.id << ": "
                            << b.status().ToString();
    }
  }
  if (backing.empty()) backing = MakeAwaitedBackings(d);
  return backing;
}

LeaseRecord LeaseManager::FromDurable(const DurableLease& d, Pool* pool) {
  Lease fresh;
  fresh.id = d.id;
  fresh.size = d.size_bytes;
  fresh.requested = d.requested_bytes;
  fresh.pool = pool;
  fresh.tier = pool->quota_tier();
  fresh.label = d.label;
  fresh.name = d.name;
  fresh.acl_uids = d.acl_uids;
  fresh.acl_gids = d.acl_gids;
  fresh.long_term_pin = d.long_term_pin;
  fresh.placed_node = d.placed_numa_node;
  fresh.moved_reason = d.moved_reason;
  fresh.pages_node = d.pages_numa_node;
  fresh.owner.pid = d.owner_pid;
  fresh.owner.uid = d.owner_uid;
  fresh.owner.gid = d.owner_gid;
  fresh.owner.comm = d.owner_comm;
  fresh.owner.cgroup = d.owner_cgroup;
  fresh.owner.start_time = d.owner_start_time;
  fresh.created_unix = d.created_unix;
  fresh.placement_reason = "recovered after a daemon restart";
  fresh.inode = d.inode;
  fresh.inode_dev = d.inode_dev;
  return fresh;
}

void LeaseManager::ReadoptStoreOrphans(std::map<uint64_t, std::vector<UniqueFd>> stored,
                                       RecoveryReport* r) {
  // The fd store kept leases the journal does not know: the journal lost
  // them. Their memory is live (the store holds it), so it is accounted
  // again now, in the pool its pages are on, with no owner until a holder
  // reclaims it; the id is taken (the store's names are a floor for ids).
  for (auto& [id, fds] : stored) {
    std::erase_if(fds, [](const UniqueFd& fd) { return !fd.valid(); });
    if (fds.empty()) continue;
    journal_.TakeStoredId(id);
    bool revoked = false;
    const size_t stored_extents = fds.size();
    auto a = Readopt(id, std::move(fds), nullptr, nullptr, &revoked);
    if (!a.ok()) {
      CXLPOOL_LOG(kError) << "restart: fd store lease-" << id
                          << " has no journal record and cannot be accounted again: "
                          << a.status().message();
      journal_.ForgetStoredFd(id, stored_extents);
      Count("fd_store_orphans_dropped");
      continue;
    }
    CXLPOOL_LOG(kError) << "restart: fd store lease-" << id << " ("
                        << HumanBytes(table_.leases().at(id).size) << " in "
                        << table_.leases().at(id).pool->name()
                        << ") has no journal record: accounted again, awaiting its holders";
    Count("fd_store_orphans");
    ++r->orphans;
  }
}

void LeaseManager::StartGrace(std::chrono::milliseconds grace, bool awaiting,
                              bool may_have_lost_leases) {
  if ((awaiting || restart_.full()) && grace.count() > 0) {
    std::weak_ptr<bool> alive = alive_;
    restart_.StartGrace(grace, [this, alive] {
      auto a = alive.lock();
      if (!a || !*a) return;
      EndGrace("grace period over");
    });
    CXLPOOL_LOG(kInfo) << "restart: grace period of " << grace.count()
                       << " ms: grants wait until every lease is reclaimed";
  } else {
    restart_.set_full(false);
    EndGrace(awaiting || may_have_lost_leases ? "no grace period configured"
                                              : "nothing awaits reclaim");
  }
}

Status LeaseManager::GraceRefusal() const { return restart_.Refusal(); }

size_t LeaseManager::FindDaxOrphans(const std::set<std::string>& journalled) {
  size_t found = 0;
  for (Pool* p : pool_ptrs_) {
    auto* dax = dynamic_cast<DevdaxPool*>(p);
    if (dax == nullptr || !dax->dynamic_region()) continue;
    for (const auto& [device, size] : dax->CarvedDevices()) {
      if (journalled.count(device) != 0) continue;
      // Counted back in and held, so that it is never granted twice; its
      // bytes are free again only once it is destroyed.
      dax->CountCarvedAtStart(size);
      if (!dax->TryReserve(size)) continue;  // cannot happen: counted just now
      dax->CommitReserve(size);
      dax_orphans_.push_back(DaxOrphan{dax, device, size});
      ++found;
      restart_.health().damaged = true;
      Count("dax_orphans");
      CXLPOOL_LOG(kError) << "restart: DAX sub-device " << device << " (" << HumanBytes(size)
                          << " of " << dax->name()
                          << ") was carved by the previous daemon and no journalled lease names "
                             "it: the journal lost its lease";
    }
  }
  DestroyDaxOrphans("at start");
  return found;
}

void LeaseManager::DestroyDaxOrphans(const char* when) {
  std::vector<DaxOrphan> kept;
  for (DaxOrphan& o : dax_orphans_) {
    Status st = o.pool->DestroyDevice(o.device);
    if (st.ok()) {
      o.pool->BeginReclaim(o.size);
      o.pool->ReleaseLeased(o.size);
      Count("dax_orphans_destroyed");
      CXLPOOL_LOG(kError) << "restart: DAX sub-device " << o.device << " (" << HumanBytes(o.size)
                          << ") of a lease the journal lost was destroyed " << when
                          << ": nothing held it";
      continue;
    }
    CXLPOOL_LOG(kError) << "restart: DAX sub-device " << o.device << " (" << HumanBytes(o.size)
                        << ") of a lease the journal lost could not be destroyed " << when << " ("
                        << st.message() << "): a process still holds it; its " << HumanBytes(o.size)
                        << " stay reserved in " << o.pool->name()
                        << " (never granted) until a later start finds it free";
    kept.push_back(std::move(o));
  }
  dax_orphans_ = std::move(kept);
}

void LeaseManager::MaybeEndGrace() {
  if (!restart_.in_grace() || restart_.full()) return;
  for (const auto& [id, l] : table_.leases()) {
    if (l.awaited_memory) return;
  }
  EndGrace("every journalled lease is accounted for");
}

void LeaseManager::EndGrace(const char* why) {
  if (restart_.EndGrace()) {
    CXLPOOL_LOG(kInfo) << "restart: grace period ended: " << why;
  }
  restart_.set_full(false);
  DestroyDaxOrphans("at the end of the grace period");
  // Holders that never reclaimed: struck off if dead or provably without the
  // memfd; the rest are watched until they exit (their lease stays counted).
  SweepAwaiting(true);
  for (const auto& [id, l] : table_.leases()) {
    for (const HolderId& h : l.awaiting) WatchHolder(h);
  }
  // Leases the journal lost that no holder reclaimed (fd-store orphans, or
  // one whose reclaimers all let go): nobody accounts for them any more, so
  // their memory is taken back, as a revoke would.
  std::vector<uint64_t> unclaimed;
  for (const auto& [id, l] : table_.leases()) {
    if (l.unjournalled && Unheld(l)) unclaimed.push_back(id);
  }
  for (uint64_t id : unclaimed) {
    CXLPOOL_LOG(kWarning) << "restart: lease " << id << " ("
                          << HumanBytes(table_.leases().at(id).size)
                          << "), which the journal had lost, was not reclaimed by the end of the "
                             "grace period: its memory is taken back";
    Free(id, "unjournalled_unclaimed");
  }
}

void LeaseManager::SweepAwaiting(bool check_files, std::optional<HolderId> exited) {
  const ProcessProbe* probe = restart_.probe();
  if (!restart_.awaiting_any() || probe == nullptr) return;
  std::vector<uint64_t> unheld;
  bool any = false;
  for (auto& [id, l] : table_.leases()) {
    if (l.awaiting.empty()) continue;
    size_t before = l.awaiting.size();
    // Named copies: a structured binding cannot be captured before C++23's
    // rules in every compiler (clang 14 refuses it).
    const auto dev = l.inode_dev;
    const auto ino = l.inode;
    std::erase_if(l.awaiting, [&](const HolderId& h) {
      if (exited && h == *exited) return true;  // a zombie still has its /proc entry
      if (!HolderAlive(*probe, h)) return true;
      return check_files && probe->HoldsFile(h.pid, dev, ino) == Holding::kNo;
    });
    any |= !l.awaiting.empty();
    if (l.awaiting.size() == before) continue;
    if (Unheld(l)) {
      unheld.push_back(id);
    } else {
      (void)Persist(l, {});
    }
  }
  restart_.set_awaiting_any(any);
  for (uint64_t id : unheld) Free(id, "restart_drops");
  MaybeEndGrace();
}

void LeaseManager::CheckHolderOf(pid_t pid) {
  const ProcessProbe* probe = restart_.probe();
  if (!restart_.awaiting_any() || probe == nullptr || pid <= 0) return;
  auto start = probe->StartTime(pid);
  if (!start) return;
  std::vector<uint64_t> unheld;
  for (auto& [id, l] : table_.leases()) {
    auto it = std::find_if(l.awaiting.begin(), l.awaiting.end(),
                           [&](const HolderId& h) { return SameHolder(h, pid, *start); });
    if (it == l.awaiting.end()) continue;
    // It is back on a new connection, so its old one is drained: if it holds
    // no fd or mapping of the memfd now, the grant never reached it.
    if (probe->HoldsFile(pid, l.inode_dev, l.inode) != Holding::kNo) continue;
    l.awaiting.erase(it);
    if (Unheld(l)) {
      unheld.push_back(id);
    } else {
      (void)Persist(l, {});
    }
  }
  for (uint64_t id : unheld) Free(id, "restart_drops");
  MaybeEndGrace();
}

void LeaseManager::WatchHolder(const HolderId& h) {
  const ProcessProbe* probe = restart_.probe();
  if (probe == nullptr || restart_.Watching(h)) return;
  UniqueFd pidfd = probe->OpenPidfd(h.pid);
  if (!pidfd.valid()) {
    CXLPOOL_LOG(kWarning) << "restart: cannot watch pid " << h.pid
                          << " (no pidfd); its awaited leases stay until a later sweep";
    return;
  }
  std::weak_ptr<bool> alive = alive_;
  if (!HolderAlive(*probe, h)) {  // exited (or the pid was reused) meanwhile
    boost::asio::post(loop_, [this, alive] {
      auto a = alive.lock();
      if (a && *a && !journal_.handed_over()) SweepAwaiting(false);
    });
    return;
  }
  restart_.Watch(h, std::move(pidfd), [this, alive](const HolderId& exited) {
    auto a = alive.lock();
    if (!a || !*a || journal_.handed_over()) return;
    auto keep = restart_.Unwatch(exited);  // closed after this handler
    SweepAwaiting(false, exited);
  });
}

LeaseManager::ReclaimOutcome LeaseManager::Reclaim(ConnId conn, std::vector<ReclaimItem> items) {
  ReclaimOutcome out;
  auto c = conns_.find(conn);
  for (ReclaimItem& item : items) {
    std::optional<std::string> why;
    if (c == conns_.end()) {
      why = "unknown connection";
    } else if (table_.leases().count(item.id) == 0) {
      why = ReclaimLost(conn, c->second, item);
    } else {
      why = ReclaimJournalled(conn, c->second, item);
    }
    if (why) {
      out.rejected.emplace_back(item.id, *why);
      Count("reclaim_rejects");
      continue;
    }
    out.accepted.push_back(item.id);
    Count("reclaims");
  }
  MaybeEndGrace();
  return out;
}

std::optional<std::string> LeaseManager::ReclaimLost(ConnId conn, Conn& c, ReclaimItem& item) {
  const uint64_t id = item.id;
  const CallerInfo& who = c.caller;
  // Nothing to learn from a refusal: an id that ended, one never
  // granted, one revoked from someone else and one whose fds do not
  // pass are refused alike (the log has the details).
  const std::vector<uid_t>* told = table_.RevokedFor(id);
  if (told != nullptr &&
      (who.uid == 0 || std::find(told->begin(), told->end(), who.uid) != told->end())) {
    return "lease " + std::to_string(id) + " was revoked by an admin";
  }
  if (told != nullptr || !LostLeaseWindowOpen(id)) return NotYours(id);
  // An id this daemon may have granted, unknown now, while the grace
  // period that journal damage started runs: the journal lost it.
  bool revoked = false;
  auto a = Readopt(id, std::move(item.fds), &item, &who, &revoked);
  if (!a.ok()) {
    CXLPOOL_LOG(kWarning) << "reclaim from uid " << who.uid << ": " << a.status().message();
    return revoked ? a.status().message() : NotYours(id);
  }
  Lease& l = table_.leases().at(id);
  l.holders[conn] += 1;
  l.refs += 1;
  c.held.insert(id);
  const std::vector<int> fds = l.Fds();
  (void)Persist(l, fds);
  CXLPOOL_LOG(kWarning) << "reclaim: lease " << id << " (" << HumanBytes(l.size) << " in "
                        << l.pool->name() << ", uid " << who.uid
                        << ") was not in the journal: accounted again";
  return std::nullopt;
}

std::optional<std::string> LeaseManager::ReclaimJournalled(ConnId conn, Conn& c,
                                                           ReclaimItem& item) {
  const uint64_t id = item.id;
  const CallerInfo& who = c.caller;
  Lease& l = table_.leases().at(id);
  DurableLease d = ToDurable(l);
  if (auto why = CheckReclaimItem(l, d, who, item)) return why;
  if (auto why = AdoptReclaimed(l, d, item)) return why;
  if (l.unjournalled && l.owner_provisional) {
    if (item.owner_uid && *item.owner_uid == who.uid) {
      TakeOver(l, who, item.name, true);  // its owner is back
    } else if (l.owner.uid == CallerInfo().uid) {
      TakeOver(l, who, "", false);  // an fd-store orphan: charged to its first holder
    }
  }
  l.holders[conn] += 1;
  l.refs += 1;
  c.held.insert(id);
  auto a = std::find_if(l.awaiting.begin(), l.awaiting.end(),
                        [&](const HolderId& h) { return SameHolder(h, who.pid, who.start_time); });
  if (a != l.awaiting.end()) l.awaiting.erase(a);
  (void)Persist(l, {});
  return std::nullopt;
}

std::optional<std::string> LeaseManager::CheckReclaimItem(const Lease& l, const DurableLease& d,
                                                          const CallerInfo& who,
                                                          const ReclaimItem& item) const {
  const uint64_t id = item.id;
  // A lease accounted again after journal damage has no ACL any more: the
  // memfd itself (checked below) shows the caller holds it.
  if (!l.unjournalled && !InAcl(l, who)) return NotYours(id);
  if (item.size_bytes != l.size) {
    return "lease " + std::to_string(id) + " is " + std::to_string(l.size) + " bytes, not " +
           std::to_string(item.size_bytes);
  }
  // Its extents as the holder tells them: as many as the lease has, of
  // the same sizes, one fd each.
  if (Status st = CheckReclaimExtents(id, ExtentsOf(d), item); !st.ok()) return st.message();
  if (auto* dax_pool = dynamic_cast<DevdaxPool*>(l.pool); dax_pool != nullptr) {
    Status st = dax_pool->CheckFd(item.fds[0].get(), d.dax_device, d.dax_rdev);
    if (!st.ok()) {
      return "lease " + std::to_string(id) + " (devdax " + d.dax_device + "): " + st.message();
    }
  } else if (Status st = CheckLeaseFds(item.fds, d); !st.ok()) {
    return st.message();
  }
  return std::nullopt;
}

std::optional<std::string> LeaseManager::AdoptReclaimed(Lease& l, const DurableLease& d,
                                                        ReclaimItem& item) {
  if (!l.awaited_memory) return std::nullopt;
  if (dynamic_cast<DevdaxPool*>(l.pool) != nullptr) {
    auto* db = dynamic_cast<DevdaxBacking*>(l.extents.front().get());
    if (db == nullptr) {
      return "lease " + std::to_string(item.id) + ": no devdax backing to adopt the device into";
    }
    db->AdoptFd(std::move(item.fds[0]));
    l.awaited_memory = false;
    return std::nullopt;
  }
  auto* mp = dynamic_cast<MemfdPool*>(l.pool);
  auto b = AdoptMemfds(std::move(item.fds), d, mp != nullptr && mp->config().pin);
  if (!b.ok()) return b.status().message();
  l.extents = std::move(*b);
  l.awaited_memory = false;
  return std::nullopt;
}

void LeaseManager::HandOver() {
  if (journal_.handed_over()) return;
  stopping_ = true;
  // The leases' memory must outlive this process: the backings are released
  // on purpose without Reclaim (which would truncate); the process exits next
  // and the kernel closes the daemon's fds and mappings only.
  for (auto& [id, l] : table_.leases()) {
    for (auto& e : l.extents) {
      Backing* kept = e.release();
#if defined(__SANITIZE_ADDRESS__)
      __lsan_ignore_object(kept);  // deliberately never freed: see above
#else
      (void)kept;
#endif
    }
  }
  size_t n = table_.leases().size();
  table_.Clear();
  extra_extents_ = 0;
  for (auto& [conn, c] : conns_) c.held.clear();
  StopReserves();
  restart_.Stop();
  journal_.HandOver();
  CXLPOOL_LOG(kInfo) << "handing " << n << " leases over to the next daemon (journal kept)";
}

}  // namespace cxlpool
