// Restart support of the lease manager: what a lease looks like on disk
// (DurableLease), the durable side it is written to (LeaseStore: the journal
// and, under systemd, the fd store), how the daemon looks at other processes
// after a restart (ProcessProbe: alive? same process? still holding the
// memfd?), and how a memfd handed back by a client is checked and adopted.
//
// The protocol: every grant is Put before its reply leaves; attach and
// detach of a shared lease Put the new holder list; every free is a Delete.
// After a restart the journalled leases come back as "awaiting" their
// holders: a holder's RECLAIM (or the fd store) gives the memory back to the
// daemon; a holder that died, or that provably no longer holds the memfd, is
// struck off. See docs/daemon.md, "Restart without losing a lease".
//
// Thread safety: LeaseStore and ProcessProbe implementations are used from
// the event-loop thread only; the free functions are reentrant.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "pool/backing.h"

namespace cxlpool {

// One process that holds (a reference to) a lease: pid plus its start time
// (/proc/<pid>/stat field 22), so a reused pid is not mistaken for it.
struct HolderId {
  pid_t pid = -1;
  uint64_t start_time = 0;  // 0: unknown (then the pid alone is trusted)
  bool operator==(const HolderId& o) const { return pid == o.pid && start_time == o.start_time; }
};

// One extent of a lease as journalled: its size and the memfd's identity
// (fstat st_ino / st_dev), to match an fd handed back.
struct DurableExtent {
  uint64_t size_bytes = 0;
  uint64_t inode = 0;
  uint64_t inode_dev = 0;
  bool operator==(const DurableExtent&) const = default;
};

// What the journal keeps of a lease.
struct DurableLease {
  uint64_t id = 0;
  uint64_t size_bytes = 0;
  uint64_t requested_bytes = 0;
  uint64_t page_size = 0;
  int numa_node = -1;
  std::string pool;
  std::string kind;
  std::string backing;  // "memfd", "memfd-thp", "hugetlb-2m", "devdax"
  std::string label;
  std::string name;
  pid_t owner_pid = -1;
  uid_t owner_uid = 0;
  gid_t owner_gid = 0;
  uint64_t owner_start_time = 0;
  std::string owner_comm;
  std::string owner_cgroup;
  // Placement facts reported in LeaseInfo (lease_table.h).
  bool long_term_pin = false;
  std::optional<int> placed_numa_node;
  std::string moved_reason;
  std::optional<int> pages_numa_node;
  std::vector<uint32_t> acl_uids;
  std::vector<uint32_t> acl_gids;
  int64_t created_unix = 0;
  uint64_t inode = 0;      // fstat st_ino of the (first) memfd (devdax: of /dev/daxR.N)
  uint64_t inode_dev = 0;  // fstat st_dev of the (first) memfd
  // A lease of several extents: every one, in mapping order (the first is
  // inode/inode_dev above). Empty: one extent of size_bytes (every older
  // journal, devdax, and any lease built whole).
  std::vector<DurableExtent> extents;
  std::string dax_device;  // devdax: the device ("dax0.1"), else ""
  uint64_t dax_rdev = 0;   // devdax: its device number (st_rdev); 0 unknown
  // A shared device's slice: which one, and where the lease starts on the device.
  std::optional<uint32_t> shared_slice;
  uint64_t device_offset = 0;
  std::vector<HolderId> holders;  // every process holding a reference
  // A move of one extent to another pool was begun and not finished
  // (tiering): that pool and the extent (unset in an older daemon's record:
  // FirstNotOn); the extent's own pool: a move back from
  // migrating_back_from_pool.
  std::string migrating_to_pool;
  std::string migrating_back_from_pool;
  std::optional<uint32_t> migrating_extent;
  // A lease of several extents split between pools: the pool accounting
  // each extent ("" the lease's pool), parallel to `extents`; empty when
  // every extent is on `pool`.
  std::vector<std::string> extent_pools;
};

// What the durable side found wrong at start (the journal's damage report,
// daemon/journal), as the lease manager needs it.
struct JournalHealth {
  // The journal lost or may have lost records (missing, empty, a damaged
  // stretch or tail); a torn last record alone does not count.
  bool damaged = false;
  // Leases of the running boot may be missing from what was replayed: the
  // grace period runs its full length so their holders can reclaim them.
  bool may_have_lost_leases = false;
  uint64_t skipped_regions = 0;
  uint64_t skipped_bytes = 0;
  uint64_t dropped_tail_bytes = 0;  // torn or unreadable tail
  std::string description;          // "" when nothing was found
};

// The durable side. Errors are IO-like Statuses with the path in them.
class LeaseStore {
 public:
  virtual ~LeaseStore() = default;
  // Ids below `next_id` are taken; called before any of them is granted.
  virtual Status ReserveIds(uint64_t next_id) = 0;
  // Records a lease (new, or its holders changed). `fds` (one per extent,
  // in order) only for a new lease: the store may keep duplicates
  // (systemd's fd store); empty otherwise.
  virtual Status Put(const DurableLease& lease, std::span<const int> fds) = 0;
  // The lease ended (released, revoked, dropped).
  virtual Status Delete(uint64_t id) = 0;
  // Drops the stored fds (systemd's fd store) of a lease of `extents` the
  // journal has no record of.
  virtual void ForgetStoredFd(uint64_t id, size_t extents = 1) {
    (void)id;
    (void)extents;
  }
};

enum class Holding { kYes, kNo, kUnknown };

// How the daemon looks at other processes. The real one reads /proc.
class ProcessProbe {
 public:
  virtual ~ProcessProbe() = default;
  // The process's start time, or nullopt if there is no such process.
  virtual std::optional<uint64_t> StartTime(pid_t pid) const = 0;
  // Does `pid` hold the file (dev, ino) as an open fd or a mapping?
  // kUnknown when its /proc entries cannot be read (other uid, no root).
  virtual Holding HoldsFile(pid_t pid, uint64_t dev, uint64_t ino) const = 0;
  // A pidfd (readable once the process exits), or an invalid fd.
  virtual UniqueFd OpenPidfd(pid_t pid) const = 0;
};

// /proc-backed probe (pidfd_open(2) for OpenPidfd).
std::unique_ptr<ProcessProbe> MakeProcProbe();

// True if `holder` is still the same live process.
bool HolderAlive(const ProcessProbe& probe, const HolderId& holder);

// The extents of `lease` in mapping order: `extents`, or the one extent of
// size_bytes that an empty list means.
std::vector<DurableExtent> ExtentsOf(const DurableLease& lease);

// The extent an older daemon's journalled move (no migrating_extent) was
// on: the first not on migrating_to_pool yet (0 when none is).
uint32_t FirstNotOn(const DurableLease& lease);

// Checks that `fd` is the memfd of extent `index` of `lease`: a regular file
// with the journalled inode (and device when known), exactly that extent's
// size, sealed against growing. INVALID_ARGUMENT names what does not match.
Status CheckLeaseFd(int fd, const DurableLease& lease, size_t index = 0);
// Checks a holder's (or the fd store's) fds for every extent of `lease`:
// exactly one per extent, in order, each CheckLeaseFd. INVALID_ARGUMENT
// naming the count or the extent that does not match.
Status CheckLeaseFds(const std::vector<UniqueFd>& fds, const DurableLease& lease);

// Checks that `fd` can be a cxlpool lease memfd the journal lost: a regular
// file, not empty, sealed the way the daemon seals (F_SEAL_GROW and
// F_SEAL_SEAL, never F_SEAL_SHRINK or a write seal, so it can be revoked).
// Fills its size (fstat), inode, device, whether it is hugetlbfs, and its
// page size. INVALID_ARGUMENT names what does not fit.
struct MemfdFacts {
  uint64_t size_bytes = 0;
  uint64_t inode = 0;
  uint64_t dev = 0;
  bool hugetlb = false;
  uint64_t page_size = 4096;
};
Result<MemfdFacts> CheckUnknownMemfd(int fd);

// Where the pages of a mapping are, by node: up to `samples` pages spread
// over [addr, addr + size), of those the page cache holds (mincore), as
// move_pages(2) reports them, each mapped with MADV_POPULATE_READ first. No
// byte is read: the file may be a holder's, truncated at any moment. Pages
// never touched are not counted (and not allocated). Empty when none is
// resident or the kernel cannot tell.
std::map<int, uint64_t> ResidentNodes(void* addr, uint64_t size, uint32_t samples = 64);

// Takes checked memfds back, one per extent (CheckLeaseFds): maps each
// MAP_SHARED in the daemon and, when `pin`, mlocks it (a failed mlock is
// logged, not fatal: the memory exists). Each backing's Reclaim truncates,
// unmaps and closes, like a built one. On error nothing is kept mapped (the
// fds are closed, not truncated).
Result<std::vector<std::unique_ptr<Backing>>> AdoptMemfds(std::vector<UniqueFd> fds,
                                                          const DurableLease& lease, bool pin);
// One extent of `size` (a lease of one: size_bytes).
Result<std::unique_ptr<Backing>> AdoptMemfd(UniqueFd fd, const DurableLease& lease, bool pin,
                                            uint64_t size = 0);

// Stands in for the memory of a journalled lease nobody has handed back yet,
// one per extent: no fd (-1), the journalled kind, page size and extent
// size; Reclaim does nothing.
std::vector<std::unique_ptr<Backing>> MakeAwaitedBackings(const DurableLease& lease);

}  // namespace cxlpool
