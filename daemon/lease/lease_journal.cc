// LeaseManager's journalling (grants, holder changes, ends through the
// JournalWriter), its hand-over at SIGTERM, and the forwards to the restart
// rules (lease/restart_rules.h). See lease/restart.h and docs/daemon.md.
#include <sys/stat.h>

#include <algorithm>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "cxlpool/common/log.h"
#include "lease/lease_manager.h"
#include "lease/restart_rules.h"

namespace cxlpool {

void LeaseManager::EnableRestart(LeaseStore* store, const ProcessProbe* probe, uint64_t next_id) {
  journal_.Enable(store, next_id);
  rules_->tracker().set_probe(probe);
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
  d.shared_slice = l.first().shared_slice();
  d.device_offset = l.first().device_offset();
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
  rules_->tracker().Stop();
  journal_.HandOver();
  CXLPOOL_LOG(kInfo) << "handing " << n << " leases over to the next daemon (journal kept)";
}

LeaseManager::RecoveryReport LeaseManager::Recover(std::vector<DurableLease> journalled,
                                                   std::map<uint64_t, std::vector<UniqueFd>> stored,
                                                   std::chrono::milliseconds grace,
                                                   const JournalHealth& health) {
  return rules_->Recover(std::move(journalled), std::move(stored), grace, health);
}

LeaseManager::ReclaimOutcome LeaseManager::Reclaim(ConnId conn, std::vector<ReclaimItem> items) {
  return rules_->Reclaim(conn, std::move(items));
}

bool LeaseManager::in_grace() const { return rules_->tracker().in_grace(); }

Status LeaseManager::GraceRefusal() const { return rules_->tracker().Refusal(); }

bool LeaseManager::Unheld(const Lease& l) const {
  return l.refs == 0 && l.awaiting.empty() && !(l.unjournalled && rules_->tracker().in_grace());
}

}  // namespace cxlpool
