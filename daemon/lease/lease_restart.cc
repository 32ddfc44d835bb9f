// RestartRules: recovery of journalled leases, RECLAIM, the grace period and
// its end, and the sweeps of awaited holders. See lease/restart_rules.h,
// lease/restart.h and docs/daemon.md.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <set>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "lease/restart_rules.h"
#include "pool/shared_slice_pool.h"

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

RestartRules::RestartRules(LeaseManager& manager) : m_(manager), tracker_(manager.loop_) {}

LeaseManager::RecoveryReport RestartRules::Recover(std::vector<DurableLease> journalled,
                                                   std::map<uint64_t, std::vector<UniqueFd>> stored,
                                                   std::chrono::milliseconds grace,
                                                   const JournalHealth& health) {
  RecoveryReport r;
  tracker_.health() = health;
  std::set<std::string> carved_seen;  // dynamic sub-devices counted back in
  for (DurableLease& d : journalled) {
    ++r.journalled;
    m_.journal_.TakeJournalledId(d.id);
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
  m_.journal_.ReserveTaken();
  CXLPOOL_LOG(kInfo) << "restart: " << r.journalled << " journalled leases, " << r.adopted
                     << " adopted from the fd store, " << r.awaiting << " awaiting reclaim, "
                     << r.dropped << " dropped, " << r.orphans << " found only in the fd store";
  if (health.damaged || r.orphans > 0) tracker_.health().damaged = true;
  // Journal damage: leases may exist that nobody has told this daemon of.
  // Their holders reclaim them once they see the restart; until the grace
  // period is over nothing new is granted, so they always find room.
  tracker_.set_full(health.may_have_lost_leases || r.orphans > 0 || dax_orphans > 0);
  if (tracker_.full()) {
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

void RestartRules::RecoverLease(DurableLease& d, std::vector<UniqueFd> fds,
                                std::set<std::string>* carved_seen, RecoveryReport* r) {
  auto drop = [&](const std::string& why) {
    CXLPOOL_LOG(kWarning) << "restart: lease " << d.id << " (" << HumanBytes(d.size_bytes)
                          << ", uid " << d.owner_uid << ") dropped: " << why;
    m_.Unpersist(d.id);
    m_.Count("restart_drops");
    ++r->dropped;
  };
  Pool* pool = nullptr;
  for (Pool* p : m_.pool_ptrs_) {
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
  if (auto* shared = dynamic_cast<SharedSlicePool*>(pool); shared != nullptr) {
    // The daemon opens the device itself; stored fds add nothing.
    fds.clear();
    if (!d.shared_slice) {
      drop("journalled on " + pool->name() + " without its slice");
      return;
    }
    if (::access(shared->path().c_str(), R_OK | W_OK) != 0) {
      drop("its shared device " + shared->path() + " cannot be opened");
      return;
    }
  }
  if (d.holders.empty()) d.holders.push_back(HolderId{d.owner_pid, d.owner_start_time});
  std::vector<HolderId> alive;
  for (const HolderId& h : d.holders) {
    if (tracker_.probe() != nullptr && HolderAlive(*tracker_.probe(), h)) alive.push_back(h);
  }
  CheckStoredFds(d, dax_pool, &fds);
  if (alive.empty()) {
    ReleaseUnheldStored(d, dax_pool, &fds);
    drop("every holder exited while the daemon was down");
    return;
  }
  // Its holders may still write to its slice, whatever becomes of the lease:
  // the slice stays this host's (a lease dropped below leaves it held).
  if (auto* shared = dynamic_cast<SharedSlicePool*>(pool); shared != nullptr) {
    shared->Hold(*d.shared_slice);
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
  m_.extra_extents_ += backing.size() - 1;
  fresh.extents = std::move(backing);
  fresh.awaiting = alive;
  fresh.awaited_memory = !adopted;
  fresh.identity = extents;
  fresh.extent_pools = std::move(extent_pools);
  if (!fresh.extent_pools.empty()) {
    Pool* first = fresh.extent_pools.front();
    fresh.SetExtentPool(0, first);  // settles pool (and tier) on the one holding most
  }
  Lease& l = m_.table_.Add(std::move(fresh));  // indexed by owner and name
  m_.ChargeTiers(l, true);
  m_.RecoverPoolMove(l, d.migrating_to_pool, d.migrating_back_from_pool,
                     d.migrating_extent.value_or(FirstNotOn(d)));
  if (alive.size() != d.holders.size()) (void)m_.Persist(l, {});
  tracker_.set_awaiting_any(true);
  m_.Count(adopted ? "restart_adopted" : "restart_awaiting");
  ++(adopted ? r->adopted : r->awaiting);
}

std::optional<std::string> RestartRules::RecoverDaxDevice(DevdaxPool* dax_pool, DurableLease& d,
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

void RestartRules::CheckStoredFds(const DurableLease& d, DevdaxPool* dax_pool,
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

void RestartRules::ReleaseUnheldStored(const DurableLease& d, DevdaxPool* dax_pool,
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

std::vector<Pool*> RestartRules::RecoveredExtentPools(const DurableLease& d, Pool* pool,
                                                      bool devdax) const {
  std::vector<Pool*> extent_pools;
  const size_t n = ExtentsOf(d).size();
  if (devdax || d.extent_pools.size() != n || n <= 1) return extent_pools;
  for (const std::string& name : d.extent_pools) {
    Pool* p = name.empty() ? pool : m_.PoolNamed(name);
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

std::vector<std::pair<Pool*, uint64_t>> RestartRules::BytesByPool(
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

LeaseManager::Extents RestartRules::RecoveredBacking(const DurableLease& d, Pool* pool,
                                                     std::vector<UniqueFd> fds, bool* adopted) {
  Extents backing;
  if (auto* shared = dynamic_cast<SharedSlicePool*>(pool); shared != nullptr) {
    auto b = shared->Recovered(*d.shared_slice, d.device_offset, d.size_bytes);
    if (b.ok()) {
      backing.push_back(std::move(*b));
      *adopted = true;
    } else {
      CXLPOOL_LOG(kWarning) << "restart: lease " << d.id << ": " << b.status().ToString();
    }
  } else if (auto* dax_pool = dynamic_cast<DevdaxPool*>(pool); dax_pool != nullptr) {
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

LeaseRecord RestartRules::FromDurable(const DurableLease& d, Pool* pool) {
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

void RestartRules::ReadoptStoreOrphans(std::map<uint64_t, std::vector<UniqueFd>> stored,
                                       RecoveryReport* r) {
  // The fd store kept leases the journal does not know: the journal lost
  // them. Their memory is live (the store holds it), so it is accounted
  // again now, in the pool its pages are on, with no owner until a holder
  // reclaims it; the id is taken (the store's names are a floor for ids).
  for (auto& [id, fds] : stored) {
    std::erase_if(fds, [](const UniqueFd& fd) { return !fd.valid(); });
    if (fds.empty()) continue;
    m_.journal_.TakeStoredId(id);
    bool revoked = false;
    const size_t stored_extents = fds.size();
    auto a = Readopt(id, std::move(fds), nullptr, nullptr, &revoked);
    if (!a.ok()) {
      CXLPOOL_LOG(kError) << "restart: fd store lease-" << id
                          << " has no journal record and cannot be accounted again: "
                          << a.status().message();
      m_.journal_.ForgetStoredFd(id, stored_extents);
      m_.Count("fd_store_orphans_dropped");
      continue;
    }
    CXLPOOL_LOG(kError) << "restart: fd store lease-" << id << " ("
                        << HumanBytes(m_.table_.leases().at(id).size) << " in "
                        << m_.table_.leases().at(id).pool->name()
                        << ") has no journal record: accounted again, awaiting its holders";
    m_.Count("fd_store_orphans");
    ++r->orphans;
  }
}

void RestartRules::StartGrace(std::chrono::milliseconds grace, bool awaiting,
                              bool may_have_lost_leases) {
  if ((awaiting || tracker_.full()) && grace.count() > 0) {
    std::weak_ptr<bool> alive = m_.alive_;
    tracker_.StartGrace(grace, [this, alive] {
      auto a = alive.lock();
      if (!a || !*a) return;
      EndGrace("grace period over");
    });
    CXLPOOL_LOG(kInfo) << "restart: grace period of " << grace.count()
                       << " ms: grants wait until every lease is reclaimed";
  } else {
    tracker_.set_full(false);
    EndGrace(awaiting || may_have_lost_leases ? "no grace period configured"
                                              : "nothing awaits reclaim");
  }
}

size_t RestartRules::FindDaxOrphans(const std::set<std::string>& journalled) {
  size_t found = 0;
  for (Pool* p : m_.pool_ptrs_) {
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
      tracker_.health().damaged = true;
      m_.Count("dax_orphans");
      CXLPOOL_LOG(kError) << "restart: DAX sub-device " << device << " (" << HumanBytes(size)
                          << " of " << dax->name()
                          << ") was carved by the previous daemon and no journalled lease names "
                             "it: the journal lost its lease";
    }
  }
  DestroyDaxOrphans("at start");
  return found;
}

void RestartRules::DestroyDaxOrphans(const char* when) {
  std::vector<DaxOrphan> kept;
  for (DaxOrphan& o : dax_orphans_) {
    Status st = o.pool->DestroyDevice(o.device);
    if (st.ok()) {
      o.pool->BeginReclaim(o.size);
      o.pool->ReleaseLeased(o.size);
      m_.Count("dax_orphans_destroyed");
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

void RestartRules::MaybeEndGrace() {
  if (!tracker_.in_grace() || tracker_.full()) return;
  for (const auto& [id, l] : m_.table_.leases()) {
    if (l.awaited_memory) return;
  }
  EndGrace("every journalled lease is accounted for");
}

void RestartRules::EndGrace(const char* why) {
  if (tracker_.EndGrace()) {
    CXLPOOL_LOG(kInfo) << "restart: grace period ended: " << why;
  }
  tracker_.set_full(false);
  DestroyDaxOrphans("at the end of the grace period");
  // Holders that never reclaimed: struck off if dead or provably without the
  // memfd; the rest are watched until they exit (their lease stays counted).
  SweepAwaiting(true);
  for (const auto& [id, l] : m_.table_.leases()) {
    for (const HolderId& h : l.awaiting) WatchHolder(h);
  }
  // Leases the journal lost that no holder reclaimed (fd-store orphans, or
  // one whose reclaimers all let go): nobody accounts for them any more, so
  // their memory is taken back, as a revoke would.
  std::vector<uint64_t> unclaimed;
  for (const auto& [id, l] : m_.table_.leases()) {
    if (l.unjournalled && m_.Unheld(l)) unclaimed.push_back(id);
  }
  for (uint64_t id : unclaimed) {
    CXLPOOL_LOG(kWarning) << "restart: lease " << id << " ("
                          << HumanBytes(m_.table_.leases().at(id).size)
                          << "), which the journal had lost, was not reclaimed by the end of the "
                             "grace period: its memory is taken back";
    m_.Free(id, "unjournalled_unclaimed");
  }
}

void RestartRules::SweepAwaiting(bool check_files, std::optional<HolderId> exited) {
  const ProcessProbe* probe = tracker_.probe();
  if (!tracker_.awaiting_any() || probe == nullptr) return;
  std::vector<uint64_t> unheld;
  bool any = false;
  for (auto& [id, l] : m_.table_.leases()) {
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
    if (m_.Unheld(l)) {
      unheld.push_back(id);
    } else {
      (void)m_.Persist(l, {});
    }
  }
  tracker_.set_awaiting_any(any);
  for (uint64_t id : unheld) m_.Free(id, "restart_drops");
  MaybeEndGrace();
}

void RestartRules::CheckHolderOf(pid_t pid) {
  const ProcessProbe* probe = tracker_.probe();
  if (!tracker_.awaiting_any() || probe == nullptr || pid <= 0) return;
  auto start = probe->StartTime(pid);
  if (!start) return;
  std::vector<uint64_t> unheld;
  for (auto& [id, l] : m_.table_.leases()) {
    auto it = std::find_if(l.awaiting.begin(), l.awaiting.end(),
                           [&](const HolderId& h) { return SameHolder(h, pid, *start); });
    if (it == l.awaiting.end()) continue;
    // It is back on a new connection, so its old one is drained: if it holds
    // no fd or mapping of the memfd now, the grant never reached it.
    if (probe->HoldsFile(pid, l.inode_dev, l.inode) != Holding::kNo) continue;
    l.awaiting.erase(it);
    if (m_.Unheld(l)) {
      unheld.push_back(id);
    } else {
      (void)m_.Persist(l, {});
    }
  }
  for (uint64_t id : unheld) m_.Free(id, "restart_drops");
  MaybeEndGrace();
}

void RestartRules::WatchHolder(const HolderId& h) {
  const ProcessProbe* probe = tracker_.probe();
  if (probe == nullptr || tracker_.Watching(h)) return;
  UniqueFd pidfd = probe->OpenPidfd(h.pid);
  if (!pidfd.valid()) {
    CXLPOOL_LOG(kWarning) << "restart: cannot watch pid " << h.pid
                          << " (no pidfd); its awaited leases stay until a later sweep";
    return;
  }
  std::weak_ptr<bool> alive = m_.alive_;
  if (!HolderAlive(*probe, h)) {  // exited (or the pid was reused) meanwhile
    boost::asio::post(m_.loop_, [this, alive] {
      auto a = alive.lock();
      if (a && *a && !m_.journal_.handed_over()) SweepAwaiting(false);
    });
    return;
  }
  tracker_.Watch(h, std::move(pidfd), [this, alive](const HolderId& exited) {
    auto a = alive.lock();
    if (!a || !*a || m_.journal_.handed_over()) return;
    auto keep = tracker_.Unwatch(exited);  // closed after this handler
    SweepAwaiting(false, exited);
  });
}

LeaseManager::ReclaimOutcome RestartRules::Reclaim(ConnId conn, std::vector<ReclaimItem> items) {
  ReclaimOutcome out;
  auto c = m_.conns_.find(conn);
  for (ReclaimItem& item : items) {
    std::optional<std::string> why;
    if (c == m_.conns_.end()) {
      why = "unknown connection";
    } else if (m_.table_.leases().count(item.id) == 0) {
      why = ReclaimLost(conn, c->second, item);
    } else {
      why = ReclaimJournalled(conn, c->second, item);
    }
    if (why) {
      out.rejected.emplace_back(item.id, *why);
      m_.Count("reclaim_rejects");
      continue;
    }
    out.accepted.push_back(item.id);
    m_.Count("reclaims");
  }
  MaybeEndGrace();
  return out;
}

std::optional<std::string> RestartRules::ReclaimLost(ConnId conn, Conn& c, ReclaimItem& item) {
  const uint64_t id = item.id;
  const CallerInfo& who = c.caller;
  // Nothing to learn from a refusal: an id that ended, one never
  // granted, one revoked from someone else and one whose fds do not
  // pass are refused alike (the log has the details).
  const std::vector<uid_t>* told = m_.table_.RevokedFor(id);
  if (told != nullptr &&
      (who.uid == 0 || std::find(told->begin(), told->end(), who.uid) != told->end())) {
    return "lease " + std::to_string(id) +
           " was revoked (by an admin, or its host lost the shared slice under it)";
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
  Lease& l = m_.table_.leases().at(id);
  l.holders[conn] += 1;
  l.refs += 1;
  c.held.insert(id);
  const std::vector<int> fds = l.Fds();
  (void)m_.Persist(l, fds);
  CXLPOOL_LOG(kWarning) << "reclaim: lease " << id << " (" << HumanBytes(l.size) << " in "
                        << l.pool->name() << ", uid " << who.uid
                        << ") was not in the journal: accounted again";
  return std::nullopt;
}

std::optional<std::string> RestartRules::ReclaimJournalled(ConnId conn, Conn& c,
                                                           ReclaimItem& item) {
  const uint64_t id = item.id;
  const CallerInfo& who = c.caller;
  Lease& l = m_.table_.leases().at(id);
  DurableLease d = m_.ToDurable(l);
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
  (void)m_.Persist(l, {});
  return std::nullopt;
}

std::optional<std::string> RestartRules::CheckReclaimItem(const Lease& l, const DurableLease& d,
                                                          const CallerInfo& who,
                                                          const ReclaimItem& item) const {
  const uint64_t id = item.id;
  // A lease accounted again after journal damage has no ACL any more: the
  // memfd itself (checked below) shows the caller holds it.
  if (!l.unjournalled && !m_.InAcl(l, who)) return NotYours(id);
  if (item.size_bytes != l.size) {
    return "lease " + std::to_string(id) + " is " + std::to_string(l.size) + " bytes, not " +
           std::to_string(item.size_bytes);
  }
  // Its extents as the holder tells them: as many as the lease has, of
  // the same sizes, one fd each.
  if (Status st = CheckReclaimExtents(id, ExtentsOf(d), item); !st.ok()) return st.message();
  if (auto* shared = dynamic_cast<SharedSlicePool*>(l.pool); shared != nullptr) {
    if (Status st = shared->CheckFd(item.fds[0].get()); !st.ok()) {
      return "lease " + std::to_string(id) + " (" + shared->name() + "): " + st.message();
    }
  } else if (auto* dax_pool = dynamic_cast<DevdaxPool*>(l.pool); dax_pool != nullptr) {
    Status st = dax_pool->CheckFd(item.fds[0].get(), d.dax_device, d.dax_rdev);
    if (!st.ok()) {
      return "lease " + std::to_string(id) + " (devdax " + d.dax_device + "): " + st.message();
    }
  } else if (Status st = CheckLeaseFds(item.fds, d); !st.ok()) {
    return st.message();
  }
  return std::nullopt;
}

std::optional<std::string> RestartRules::AdoptReclaimed(Lease& l, const DurableLease& d,
                                                        ReclaimItem& item) {
  if (!l.awaited_memory) return std::nullopt;
  if (dynamic_cast<SharedSlicePool*>(l.pool) != nullptr) {
    return "lease " + std::to_string(item.id) + ": its shared device could not be reopened";
  }
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

}  // namespace cxlpool
