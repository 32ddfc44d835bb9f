// RestartRules: leases the journal lost, accounted again from what their
// holders (or the fd store) hand back. Every fd is checked before anything
// is done to it; the daemon never reads or writes a byte of a memfd it did
// not make (a holder can truncate it at any moment). See docs/daemon.md,
// "Restart without losing a lease".
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "lease/restart_rules.h"

namespace cxlpool {

namespace {

// The node most sampled pages are on, or -1.
int MajorityNode(const std::map<int, uint64_t>& nodes) {
  int best = -1;
  uint64_t most = 0;
  for (const auto& [node, n] : nodes) {
    if (n > most) {
      most = n;
      best = node;
    }
  }
  return best;
}

std::string BackingKindOf(const MemfdFacts& f, const std::string& hint) {
  if (f.hugetlb) return f.page_size >= (1ull << 30) ? "hugetlb-1g" : "hugetlb-2m";
  return hint == "memfd-thp" ? hint : std::string("memfd");
}

using FileId = std::pair<uint64_t, uint64_t>;  // st_dev, st_ino

}  // namespace

bool RestartRules::LostLeaseWindowOpen(uint64_t id) const {
  // Only while the grace period that real damage started runs: a holder of
  // a lease the journal lost has had its chance by its end, and outside it
  // an unknown id is simply one that ended (its memfd was truncated then).
  return m_.journal_.writing() && m_.journal_.MayHaveGranted(id) && tracker_.in_grace() &&
         tracker_.full();
}

std::set<std::pair<uint64_t, uint64_t>> RestartRules::LiveMemfds() const {
  std::set<FileId> out;
  for (const auto& [id, l] : m_.table_.leases()) {
    for (const DurableExtent& x : l.identity) out.emplace(x.inode_dev, x.inode);
    if (l.inode != 0) out.emplace(l.inode_dev, l.inode);
    for (const auto& e : l.extents) {
      struct stat st {};
      if (e != nullptr && e->fd() >= 0 && ::fstat(e->fd(), &st) == 0) {
        out.emplace(st.st_dev, st.st_ino);
      }
    }
  }
  return out;
}

Result<std::vector<MemfdFacts>> RestartRules::CheckLostLease(uint64_t id,
                                                             const std::vector<UniqueFd>& fds,
                                                             const ReclaimItem* hints) const {
  const std::string what = "lease " + std::to_string(id) + " (not in the journal)";
  auto bad = [&](size_t i, const std::string& why) {
    return Status(
        Code::kInvalidArgument,
        what + (fds.size() > 1 ? ": extent " + std::to_string(i) : std::string()) + ": " + why);
  };
  if (fds.empty()) return Status(Code::kInvalidArgument, what + ": no fd handed back");
  if (hints != nullptr && !hints->extent_sizes.empty() &&
      hints->extent_sizes.size() != fds.size()) {
    return Status(Code::kInvalidArgument, what + ": " + std::to_string(fds.size()) + " fds for " +
                                              std::to_string(hints->extent_sizes.size()) +
                                              " extents");
  }
  const std::set<FileId> live = LiveMemfds();
  std::set<FileId> seen;
  std::vector<MemfdFacts> facts;
  for (size_t i = 0; i < fds.size(); ++i) {
    auto f = CheckUnknownMemfd(fds[i].get());
    if (!f.ok()) return bad(i, f.status().message());
    if (live.count({f->dev, f->inode}) != 0) return bad(i, "the fd is the memfd of another lease");
    if (!seen.emplace(f->dev, f->inode).second) return bad(i, "the same memfd is listed twice");
    if (!facts.empty() &&
        (f->hugetlb != facts.front().hugetlb || f->page_size != facts.front().page_size)) {
      return bad(i, "its pages are not of the first extent's kind");
    }
    facts.push_back(*f);  // its size is fstat's, never the holder's word
  }
  return facts;
}

MemfdPool* RestartRules::LostExtentPool(int node, const ReclaimItem* hints) const {
  // Where its pages really are decides (the client's word is only a hint,
  // taken when the kernel cannot tell or agrees).
  MemfdPool* pool = nullptr;
  for (Pool* p : m_.pool_ptrs_) {
    auto* mp = dynamic_cast<MemfdPool*>(p);
    if (mp == nullptr || hints == nullptr || mp->name() != hints->pool) continue;
    if (node < 0 || !mp->binds() || mp->numa_node() == node) pool = mp;
  }
  for (Pool* p : m_.pool_ptrs_) {
    auto* mp = dynamic_cast<MemfdPool*>(p);
    if (pool != nullptr || mp == nullptr) continue;
    if (node < 0 || mp->numa_node() == node) pool = mp;
  }
  return pool;
}

Status RestartRules::ReserveByPool(const std::vector<std::pair<Pool*, uint64_t>>& by_pool) {
  size_t reserved = 0;
  while (reserved < by_pool.size() &&
         by_pool[reserved].first->TryReserve(by_pool[reserved].second)) {
    ++reserved;
  }
  if (reserved < by_pool.size()) {
    Pool* full = by_pool[reserved].first;
    for (size_t i = 0; i < reserved; ++i) by_pool[i].first->CancelReserve(by_pool[i].second);
    return Status(Code::kResourceExhausted, full->name() + ": " + HumanBytes(full->free_bytes()) +
                                                " free of " + HumanBytes(full->capacity()));
  }
  for (const auto& [p, bytes] : by_pool) p->CommitReserve(bytes);
  return Status::Ok();
}

Status RestartRules::CheckLostLeaseFits(const std::vector<std::pair<Pool*, uint64_t>>& by_pool,
                                        const CallerInfo* who) const {
  // The checks an ALLOC of the same bytes passes: an fd nobody can tell
  // from a real lease gets the caller no more than asking for memory would.
  if (who != nullptr) {
    const Tenant tenant = TenantOf(*who);
    std::map<std::string, uint64_t> by_tier;
    for (const auto& [p, bytes] : by_pool) by_tier[p->quota_tier()] += bytes;
    for (const auto& [tier, bytes] : by_tier) {
      CXLPOOL_RETURN_IF_ERROR(m_.quotas_.Check(tenant, tier, bytes));
    }
    for (const auto& [p, bytes] : by_pool) {
      CXLPOOL_RETURN_IF_ERROR(m_.quotas_.CheckReserve(
          tenant, p->name(), p->capacity(), p->leased_bytes() + p->reserved_bytes(), bytes));
    }
  }
  return m_.CheckDaemonLimits();
}

Result<uint64_t> RestartRules::Readopt(uint64_t id, std::vector<UniqueFd> fds,
                                       const ReclaimItem* hints, const CallerInfo* who,
                                       bool* revoked) {
  *revoked = false;
  const std::string what = "lease " + std::to_string(id) + " (not in the journal)";
  if (fds.size() == 1) {
    if (auto dax = ReadoptDevdax(id, fds[0], hints, who); dax.has_value()) return *dax;
  }
  // Every fd checked before anything is done to any of them: one that is
  // not a lease-like memfd, or that belongs to a live lease, is left alone.
  auto facts = CheckLostLease(id, fds, hints);
  if (!facts.ok()) {
    m_.Count("unjournalled_rejects");
    return facts.status();
  }
  // From here on each fd is a memfd sealed as the daemon seals its leases
  // and part of no live lease: what cannot be accounted again is revoked,
  // never left in use uncounted.
  std::vector<std::unique_ptr<Backing>> backings;
  auto revoke = [&](const std::string& why) -> Status {
    for (auto& b : backings) b->Reclaim();  // truncate, unmap, close
    for (size_t i = backings.size(); i < fds.size(); ++i) (void)::ftruncate(fds[i].get(), 0);
    *revoked = true;
    m_.Count("unjournalled_revokes");
    std::string msg =
        what + " cannot be accounted again: " + why + "; its memory was taken back (revoked)";
    CXLPOOL_LOG(kError) << "restart: " << msg;
    return Status(Code::kResourceExhausted, msg);
  };
  DurableLease d;
  d.id = id;
  d.page_size = facts->front().page_size;
  d.backing = BackingKindOf(facts->front(), hints != nullptr ? hints->backing : "");
  std::vector<Pool*> pools;
  std::vector<int> nodes;
  for (size_t i = 0; i < fds.size(); ++i) {
    const MemfdFacts& f = (*facts)[i];
    auto b = AdoptMemfd(UniqueFd(::dup(fds[i].get())), d, false, f.size_bytes);
    if (!b.ok()) return revoke(b.status().message());
    backings.push_back(std::move(*b));
    d.size_bytes += f.size_bytes;
    d.extents.push_back(DurableExtent{f.size_bytes, f.inode, f.dev});
    // Pages the kernel reports (mincore, MADV_POPULATE_READ, move_pages):
    // no byte of the holder's file is read.
    const int node = MajorityNode(ResidentNodes(backings.back()->daemon_addr(), f.size_bytes));
    MemfdPool* pool = LostExtentPool(node, hints);
    if (pool == nullptr) {
      return revoke(node >= 0 ? "its pages are on node " + std::to_string(node) +
                                    ", which no memfd pool serves"
                              : std::string("no memfd pool is configured"));
    }
    auto rounded = pool->RoundSize(f.size_bytes, f.hugetlb);
    if (!rounded.ok() || *rounded != f.size_bytes) {
      return revoke("its size " + std::to_string(f.size_bytes) + " does not fit " + pool->name() +
                    "'s pages");
    }
    pools.push_back(pool);
    nodes.push_back(node);
  }
  fds.clear();  // the backings hold their own duplicates
  std::vector<std::pair<Pool*, uint64_t>> by_pool;
  for (size_t i = 0; i < pools.size(); ++i) {
    auto it = std::find_if(by_pool.begin(), by_pool.end(),
                           [&](const auto& b) { return b.first == pools[i]; });
    if (it == by_pool.end()) it = by_pool.insert(by_pool.end(), {pools[i], 0});
    it->second += d.extents[i].size_bytes;
  }
  if (Status st = CheckLostLeaseFits(by_pool, who); !st.ok()) return revoke(st.message());
  if (Status st = ReserveByPool(by_pool); !st.ok()) return revoke(st.message());
  for (size_t i = 0; i < backings.size(); ++i) {
    auto* mp = static_cast<MemfdPool*>(pools[i]);
    if (mp->config().pin && ::mlock(backings[i]->daemon_addr(), d.extents[i].size_bytes) != 0) {
      CXLPOOL_LOG(kWarning) << "lease " << id << ": mlock after re-adoption failed; kept unpinned";
    }
  }
  Lease fresh;
  fresh.id = id;
  fresh.size = d.size_bytes;
  fresh.requested = d.size_bytes;
  fresh.pool = pools.front();
  fresh.tier = fresh.pool->quota_tier();
  fresh.extents = std::move(backings);
  fresh.identity = d.extents;
  fresh.inode = d.extents.front().inode;
  fresh.inode_dev = d.extents.front().inode_dev;
  for (size_t i = 1; i < pools.size(); ++i) fresh.SetExtentPool(i, pools[i]);
  const int node = nodes.front();
  fresh.placement_reason =
      "accounted again after journal damage (" +
      (pools.size() > 1 ? std::to_string(pools.size()) + " extents"
                        : std::string(node >= 0 ? "pages on node " + std::to_string(node)
                                                : std::string("no page resident"))) +
      (who == nullptr ? ", from the fd store)" : ", from a reclaim)");
  m_.extra_extents_ += fresh.extents.size() - 1;
  return AddReadopted(std::move(fresh), hints, who);
}

std::optional<Result<uint64_t>> RestartRules::ReadoptDevdax(uint64_t id, UniqueFd& fd,
                                                            const ReclaimItem* hints,
                                                            const CallerInfo* who) {
  const std::string what = "lease " + std::to_string(id) + " (not in the journal)";
  for (Pool* p : m_.pool_ptrs_) {
    auto* dax = dynamic_cast<DevdaxPool*>(p);
    if (dax == nullptr) continue;
    std::string device;
    uint64_t size = 0;
    if (!dax->dynamic_region()) {
      const std::string whole = dax->LeaseDevice("");
      if (whole.empty() || !dax->CheckFd(fd.get(), whole, 0).ok()) continue;
      // The static device is leased whole: the journal lost its lease, and
      // its holder is back. Held by another lease, it is not this one.
      if (dax->lease_count() > 0 || dax->reserved_bytes() > 0) {
        m_.Count("unjournalled_rejects");
        return Result<uint64_t>(
            Status(Code::kInvalidArgument, what + ": " + whole + " is held by another lease"));
      }
      size = dax->capacity();
      if (!dax->TryReserve(size)) {
        m_.Count("unjournalled_rejects");
        return Result<uint64_t>(Status(Code::kResourceExhausted,
                                       what + ": " + whole + " is not free in " + dax->name()));
      }
      dax->CommitReserve(size);
      device = whole;
    } else {
      // A sub-device the previous daemon carved, that no journalled lease
      // names and a process held open at start (FindDaxOrphans): its bytes
      // are reserved already and become this lease's.
      auto o = std::find_if(dax_orphans_.begin(), dax_orphans_.end(), [&](const DaxOrphan& x) {
        return x.pool == dax && dax->CheckFd(fd.get(), x.device, 0).ok();
      });
      if (o == dax_orphans_.end()) continue;
      device = o->device;
      size = o->size;
      dax_orphans_.erase(o);
    }
    auto rdev = dax->CurrentDeviceNumber(device);
    std::unique_ptr<DevdaxBacking> backing =
        dax->Recovered(device, size, rdev.ok() ? *rdev : 0, std::move(fd));
    Lease fresh;
    fresh.id = id;
    fresh.size = size;
    fresh.requested = size;
    fresh.pool = dax;
    fresh.tier = dax->quota_tier();
    fresh.extents.push_back(std::move(backing));
    fresh.placement_reason = "accounted again after journal damage (DAX device " + device +
                             (who == nullptr ? ", from the fd store)" : ", from a reclaim)");
    CXLPOOL_LOG(kError) << "restart: " << what << ": DAX device " << device << " ("
                        << HumanBytes(size) << " of " << dax->name()
                        << ") is held again and accounted as this lease";
    m_.Count("unjournalled_dax_adopted");
    return Result<uint64_t>(AddReadopted(std::move(fresh), hints, who));
  }
  return std::nullopt;
}

uint64_t RestartRules::AddReadopted(Lease fresh, const ReclaimItem* hints, const CallerInfo* who) {
  const CallerInfo owner = who != nullptr ? *who : CallerInfo();
  fresh.label = hints != nullptr ? hints->label.substr(0, 256) : std::string();
  fresh.owner = owner;
  fresh.created_unix = m_.clock_->WallSeconds();
  fresh.unjournalled = true;
  fresh.owner_provisional =
      who == nullptr || hints == nullptr || !hints->owner_uid || *hints->owner_uid != who->uid;
  Lease& l = m_.table_.Add(std::move(fresh));  // indexed by owner and name
  m_.ChargeTiers(l, true);
  if (!l.owner_provisional && hints != nullptr && !hints->name.empty() &&
      hints->name.size() <= 255) {
    (void)m_.table_.SetName(l, hints->name);  // unless the owner has that name already
  }
  if (who != nullptr) m_.Count("unjournalled_adopted");
  return l.id;
}

void RestartRules::TakeOver(Lease& l, const CallerInfo& who, const std::string& name,
                            bool confirmed) {
  m_.ChargeTiers(l, false);
  m_.table_.SetOwner(l, who);  // its old name goes with the old owner
  m_.ChargeTiers(l, true);
  if (confirmed && !name.empty() && name.size() <= 255) (void)m_.table_.SetName(l, name);
  l.owner_provisional = !confirmed;
  CXLPOOL_LOG(kInfo) << "reclaim: lease " << l.id << " is now charged to uid " << who.uid
                     << (confirmed ? " (its owner)" : " (its first holder back)");
}

}  // namespace cxlpool
