// LeaseTable: the daemon's leases and their indexes: by id, by owner uid,
// by shared name (one namespace per owner uid: NameKey), and the ids an
// admin revoked with the uids that could see each (so the others get
// NOT_FOUND for them, as for an id that never existed). Adding, removing and
// re-owning a lease keep the indexes in step; nothing else does.
//
// The lease manager decides; the table only remembers. Its leases' fields
// other than id, owner and name may be changed through leases().
//
// Thread safety: a single-owner value (the lease manager, on its loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lease/lease_types.h"
#include "lease/restart.h"
#include "pool/backing.h"

namespace cxlpool {

class Pool;

struct LeaseRecord {
  uint64_t id = 0;
  uint64_t size = 0;
  uint64_t requested = 0;
  Pool* pool = nullptr;
  std::string tier;  // quota tier: node kind or "devdax"
  std::string label;
  std::string name;
  std::vector<uint32_t> acl_uids;
  std::vector<uint32_t> acl_gids;
  CallerInfo owner;
  int64_t created_unix = 0;
  // Its memory: the extents in mapping order, each mapped at the sum of the
  // sizes before it. One for devdax and for a lease built whole.
  std::vector<std::unique_ptr<Backing>> extents;
  bool from_warm = false;  // granted wholly from the warm reserve
  std::string placement_reason;
  std::unordered_map<ConnId, uint32_t> holders;  // connection -> references
  uint32_t refs = 0;
  // Restart: journalled holders that have not reclaimed yet. The lease
  // lives while refs > 0 or anyone awaits; awaited_memory: no fd yet.
  std::vector<HolderId> awaiting;
  bool awaited_memory = false;
  // Each extent's size and memfd identity (journalled; what fds handed back
  // are matched against). inode/inode_dev: the first extent's.
  std::vector<DurableExtent> identity;
  uint64_t inode = 0;
  uint64_t inode_dev = 0;
  // Journal damage: accounted again without a journal record (a RECLAIM
  // of an unknown lease, or an fd-store orphan). Kept through the grace
  // period even when unheld; any holder of its memfd may reclaim it.
  bool unjournalled = false;
  // The owner is only a stand-in (an orphan, or a reclaimer that said it
  // was not the owner): the first reclaimer whose uid is the owner it was
  // told takes the lease (and its quota charge and name) over.
  bool owner_provisional = false;
  bool long_term_pin = false;
  // CheckMoved found the pages elsewhere: where the lease was placed, what
  // was seen, and (when that node has no pool to move it to) where the
  // pages are while the accounting stays.
  std::optional<int> placed_node;
  std::string moved_reason;
  std::optional<int> pages_node;
  // Tiering (lease_migration.cc): what the holder asked for (its GPU, its
  // node), and where each extent is accounted.
  std::string gpu;
  std::optional<int> home_node;
  // The pool each extent is accounted to, by extent index, when they are
  // not all on `pool` (the tiering engine moves a lease extent by extent,
  // and a lease may stay split: its hot extents on DRAM, its cold ones on
  // CXL); empty when every extent is on `pool`. `pool` is then the one
  // holding most of its bytes, and `tier` its quota tier. The tenant is
  // charged each extent's bytes in its own pool's tier.
  std::vector<Pool*> extent_pools;
  // A move of one extent to another pool under way (room for that extent
  // reserved on moving_to and charged in its tier); nullptr none.
  Pool* moving_to = nullptr;
  uint32_t moving_extent = 0;
  std::string moving_note;
  // moving_to == PoolOf(moving_extent): a move back of pages that an
  // interrupted move to this pool (by name; it may be gone) left there; ""
  // unknown.
  std::string moving_back_from;

  // The first extent: its kind and page size are the lease's (every extent
  // of a lease has the same).
  const Backing& first() const { return *extents.front(); }
  bool has_memory() const { return !extents.empty() && extents.front() != nullptr; }
  // How many extents it has (also before its memory is back after a restart).
  size_t extent_count() const;
  // The pool extent `i` is accounted to, and its bytes.
  Pool* PoolOf(size_t i) const { return i < extent_pools.size() ? extent_pools[i] : pool; }
  uint64_t ExtentBytes(size_t i) const;
  // The bytes of a move under way (its extent's; the lease's when it has one).
  uint64_t MovingBytes() const { return ExtentBytes(moving_extent); }
  // The lease's bytes by the pool accounting them: `pool` first, then the
  // others in extent order; one entry when it is not split.
  struct PoolBytes {
    Pool* pool = nullptr;
    uint64_t bytes = 0;
    std::vector<size_t> extents;  // their indexes
  };
  std::vector<PoolBytes> BytesByPool() const;
  // Extent `i` is accounted to `to` now; a lease whose extents are all on
  // one pool is accounted to it (extent_pools empty), else `pool` becomes
  // the one holding most of its bytes. tier follows pool.
  void SetExtentPool(size_t i, Pool* to);
  // The borrowed fds and places of the extents (for a reply).
  std::vector<GrantedExtent> GrantedExtents() const;
  // The extents' fds, in order (-1 where there is none).
  std::vector<int> Fds() const;
};

class LeaseTable {
 public:
  using Map = std::unordered_map<uint64_t, LeaseRecord>;

  // Every lease by id: look up, iterate, change fields (not id, owner, name).
  Map& leases() { return leases_; }
  const Map& leases() const { return leases_; }

  // Takes `l` (its id not in the table), indexed by owner and, when it has
  // one, by name (which must be free or held for it: HoldName).
  LeaseRecord& Add(LeaseRecord l);
  // Takes the lease out of every index and hands it back.
  LeaseRecord Remove(uint64_t id);
  // A new owner: the lease moves to its uid's index and loses its name.
  void SetOwner(LeaseRecord& l, const CallerInfo& owner);
  // Names the lease in its owner's namespace; false (unchanged) when that
  // name is taken.
  bool SetName(LeaseRecord& l, const std::string& name);
  // Forgets every lease and name (hand-over); revocations are kept.
  void Clear();

  // Shared names: the lease id, 0 while the lease is being built; nullopt
  // when the owner has no such name.
  std::optional<uint64_t> Named(uid_t owner, const std::string& name) const;
  // Holds a name for a lease being built (Named says 0), and lets it go.
  void HoldName(uid_t owner, const std::string& name);
  void DropHeldName(uid_t owner, const std::string& name);
  size_t names() const { return names_.size(); }

  // The ids `owner` owns (none: an empty set).
  const std::unordered_set<uint64_t>& OwnedBy(uid_t owner) const;

  // An admin revoked `id`; `uids` (owner, holders) may hear REVOKED. Once
  // `max_remembered` are remembered, all are forgotten and counting starts
  // again.
  void Revoked(uint64_t id, std::vector<uid_t> uids, size_t max_remembered);
  // The uids told of the revocation of `id`; null when it was not revoked.
  const std::vector<uid_t>* RevokedFor(uint64_t id) const;

 private:
  void Unindex(const LeaseRecord& l);

  Map leases_;
  // Shared names by NameKey(owner uid, name); 0: being built.
  std::unordered_map<std::string, uint64_t> names_;
  std::unordered_map<uid_t, std::unordered_set<uint64_t>> by_uid_;
  std::unordered_map<uint64_t, std::vector<uid_t>> revoked_;
};

}  // namespace cxlpool
