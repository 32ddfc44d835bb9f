#include "recovery.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string_view>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {

std::string ChooseStateDir(const StateDirChoice& c) {
  if (!c.flag.empty()) return c.flag;
  if (!c.config.empty()) return c.config;
  if (c.state_directory_env != nullptr && c.state_directory_env[0] == '/') {
    std::string env = c.state_directory_env;
    return env.substr(0, env.find(':'));
  }
  if (c.socket_from_flag) return "";
  return c.fallback;
}

journal::LeaseRecord ToRecord(const DurableLease& d) {
  journal::LeaseRecord r;
  r.set_id(d.id);
  r.set_size_bytes(d.size_bytes);
  r.set_requested_bytes(d.requested_bytes);
  r.set_numa_node(d.numa_node);
  r.set_pool(d.pool);
  r.set_backing(d.backing);
  r.set_page_size(d.page_size);
  r.set_owner_pid(static_cast<uint32_t>(d.owner_pid));
  r.set_owner_uid(d.owner_uid);
  r.set_owner_gid(d.owner_gid);
  r.set_owner_start_time(d.owner_start_time);
  r.set_owner_comm(d.owner_comm);
  r.set_owner_cgroup(d.owner_cgroup);
  r.set_long_term_pin(d.long_term_pin);
  if (d.placed_numa_node) r.set_placed_numa_node(*d.placed_numa_node);
  r.set_moved_reason(d.moved_reason);
  if (d.pages_numa_node) r.set_pages_numa_node(*d.pages_numa_node);
  r.set_label(d.label);
  r.set_name(d.name);
  for (uint32_t u : d.acl_uids) r.add_acl_uids(u);
  for (uint32_t g : d.acl_gids) r.add_acl_gids(g);
  r.set_created_unix(d.created_unix);
  r.set_kind(d.kind);
  r.set_inode(d.inode);
  r.set_inode_dev(d.inode_dev);
  r.set_dax_device(d.dax_device);
  r.set_dax_rdev(d.dax_rdev);
  if (d.shared_slice) r.set_shared_slice(*d.shared_slice);
  r.set_device_offset(d.device_offset);
  r.set_migrating_to_pool(d.migrating_to_pool);
  r.set_migrating_back_from_pool(d.migrating_back_from_pool);
  if (d.migrating_extent) r.set_migrating_extent(*d.migrating_extent);
  for (size_t i = 0; i < d.extents.size(); ++i) {
    const DurableExtent& x = d.extents[i];
    journal::ExtentRecord* e = r.add_extents();
    e->set_size_bytes(x.size_bytes);
    e->set_inode(x.inode);
    e->set_inode_dev(x.inode_dev);
    if (i < d.extent_pools.size()) e->set_pool(d.extent_pools[i]);
  }
  for (const HolderId& h : d.holders) {
    journal::Holder* x = r.add_holders();
    x->set_pid(static_cast<uint32_t>(h.pid));
    x->set_start_time(h.start_time);
  }
  return r;
}

JournalHealth HealthOf(const JournalState& state) {
  JournalHealth h;
  h.damaged = state.damage.journal_damaged();
  h.may_have_lost_leases = state.may_have_lost_leases;
  h.skipped_regions = state.damage.skipped_regions;
  h.skipped_bytes = state.damage.skipped_bytes;
  h.dropped_tail_bytes = state.damage.torn_tail_bytes + state.damage.bad_tail_bytes;
  h.description = state.damage.Describe();
  return h;
}

DurableLease FromRecord(const journal::LeaseRecord& r) {
  DurableLease d;
  d.id = r.id();
  d.size_bytes = r.size_bytes();
  d.requested_bytes = r.requested_bytes();
  d.numa_node = r.numa_node();
  d.pool = r.pool();
  d.backing = r.backing();
  d.page_size = r.page_size();
  d.owner_pid = static_cast<pid_t>(r.owner_pid());
  d.owner_uid = r.owner_uid();
  d.owner_gid = r.owner_gid();
  d.owner_start_time = r.owner_start_time();
  d.owner_comm = r.owner_comm();
  d.owner_cgroup = r.owner_cgroup();
  d.long_term_pin = r.long_term_pin();
  if (r.has_placed_numa_node()) d.placed_numa_node = r.placed_numa_node();
  d.moved_reason = r.moved_reason();
  if (r.has_pages_numa_node()) d.pages_numa_node = r.pages_numa_node();
  d.label = r.label();
  d.name = r.name();
  d.acl_uids.assign(r.acl_uids().begin(), r.acl_uids().end());
  d.acl_gids.assign(r.acl_gids().begin(), r.acl_gids().end());
  d.created_unix = r.created_unix();
  d.kind = r.kind();
  d.inode = r.inode();
  d.inode_dev = r.inode_dev();
  d.dax_device = r.dax_device();
  d.dax_rdev = r.dax_rdev();
  if (r.has_shared_slice()) d.shared_slice = r.shared_slice();
  d.device_offset = r.device_offset();
  d.migrating_to_pool = r.migrating_to_pool();
  d.migrating_back_from_pool = r.migrating_back_from_pool();
  if (r.has_migrating_extent()) d.migrating_extent = r.migrating_extent();
  bool any_elsewhere = false;
  for (const auto& e : r.extents()) {
    d.extents.push_back(DurableExtent{e.size_bytes(), e.inode(), e.inode_dev()});
    // An older daemon's extent verified on its move's target is accounted there now.
    d.extent_pools.push_back(!e.pool().empty() ? e.pool() : e.migrated_to_pool());
    any_elsewhere = any_elsewhere || !d.extent_pools.back().empty();
  }
  if (!any_elsewhere) d.extent_pools.clear();
  for (const auto& h : r.holders()) {
    d.holders.push_back(HolderId{static_cast<pid_t>(h.pid()), h.start_time()});
  }
  return d;
}

namespace {
// As many extents as a lease may have on the wire (proto/extents.h).
constexpr uint64_t kMaxStoredExtents = 16384;
}  // namespace

std::string StoredFdName(uint64_t id, size_t extent, size_t extents) {
  std::string name = "lease-" + std::to_string(id);
  if (extents > 1) name += "-extent-" + std::to_string(extent);
  return name;
}

std::map<uint64_t, std::vector<UniqueFd>> TakeLeaseFds(std::vector<InheritedFd>* fds) {
  constexpr std::string_view kExtent = "-extent-";
  std::map<uint64_t, std::vector<UniqueFd>> out;
  std::vector<InheritedFd> rest;
  for (InheritedFd& f : *fds) {
    if (!StartsWith(f.name, "lease-")) {
      rest.push_back(std::move(f));
      continue;
    }
    std::string_view tail = std::string_view(f.name).substr(6);
    std::optional<uint64_t> extent = 0;
    if (size_t at = tail.find(kExtent); at != std::string_view::npos) {
      extent = ParseU64(tail.substr(at + kExtent.size()));
      tail = tail.substr(0, at);
    }
    auto id = ParseU64(tail);
    if (!id || *id == 0 || !extent || *extent >= kMaxStoredExtents) {
      CXLPOOL_LOG(kWarning) << "inherited fd named '" << f.name << "' is not a lease; closed";
      continue;
    }
    std::vector<UniqueFd>& v = out[*id];
    if (v.size() <= *extent) v.resize(*extent + 1);
    if (v[*extent].valid()) {
      CXLPOOL_LOG(kWarning) << "inherited fd " << f.name << " twice; the second closed";
      continue;
    }
    v[*extent] = std::move(f.fd);
  }
  *fds = std::move(rest);
  return out;
}

Result<std::unique_ptr<JournalStore>> JournalStore::Open(const std::string& dir,
                                                         Notifier* notifier) {
  if (dir.empty() || dir[0] != '/') {
    return Status(Code::kInvalidArgument,
                  "state directory must be an absolute path: '" + dir + "'");
  }
  // mkdir -p with 0700 for the last component (the parents usually exist).
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = dir.find('/', pos + 1);
    std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), pos == std::string::npos ? 0700 : 0755) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "create state directory " + part);
    }
  }
  std::string lock_path = dir + "/lock";
  // A lock file from an earlier start: the directory held daemon state, so
  // a journal missing now has been lost (not a first start).
  const bool dir_had_state = ::access(lock_path.c_str(), F_OK) == 0;
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return Status::FromErrno(errno, "open " + lock_path);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status(Code::kAlreadyExists, "another cxlpoold holds " + lock_path +
                                              " (one daemon per state directory; use --state-dir)");
    }
    return Status::FromErrno(errno, "flock " + lock_path);
  }
  auto j = LeaseJournal::Open(dir, CurrentBootId(), dir_had_state);
  if (!j.ok()) return j.status();
  return std::unique_ptr<JournalStore>(new JournalStore(std::move(*j), std::move(lock), notifier));
}

std::vector<DurableLease> JournalStore::JournalledLeases() const {
  std::vector<DurableLease> out;
  for (const auto& [id, rec] : journal_.state().leases) out.push_back(FromRecord(rec));
  return out;
}

Status JournalStore::ReserveIds(uint64_t next_id) { return journal_.ReserveIds(next_id); }

Status JournalStore::Put(const DurableLease& lease, std::span<const int> fds) {
  CXLPOOL_RETURN_IF_ERROR(journal_.Put(ToRecord(lease)));
  if (!fd_store()) return Status::Ok();
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i] < 0) continue;
    Status st = notifier_->StoreFd(fds[i], StoredFdName(lease.id, i, fds.size()));
    if (!st.ok()) {
      // The journal still has it: clients can reclaim it after a restart.
      CXLPOOL_LOG(kWarning) << "fd store: lease " << lease.id << " extent " << i << ": "
                            << st.ToString();
    }
  }
  return Status::Ok();
}

Status JournalStore::Delete(uint64_t id) {
  size_t extents = 1;
  if (auto it = journal_.state().leases.find(id); it != journal_.state().leases.end()) {
    extents = std::max<size_t>(1, static_cast<size_t>(it->second.extents_size()));
  }
  Status st = journal_.Delete(id);
  if (fd_store()) ForgetStoredFd(id, extents);
  if (st.ok()) {
    Status c = journal_.MaybeCompact();
    if (!c.ok()) {
      CXLPOOL_LOG(kWarning) << "journal compaction: " << c.ToString();
    }
  }
  return st;
}

void JournalStore::ForgetStoredFd(uint64_t id, size_t extents) {
  if (!fd_store()) return;
  for (size_t i = 0; i < extents; ++i) {
    const std::string name = StoredFdName(id, i, extents);
    Status st = notifier_->RemoveFd(name);
    if (!st.ok()) {
      CXLPOOL_LOG(kWarning) << "fd store: remove " << name << ": " << st.ToString();
    }
  }
}

}  // namespace cxlpool
