// RestartRules: what the lease manager does about a restart. It takes the
// journalled leases back (Recover), answers RECLAIM, re-adopts leases the
// journal lost (lease_readopt.cc), runs the grace period and its end, and
// sweeps holders that died or let go. It owns the RestartTracker (the probe,
// the damage report, the grace timer, the holder watches) and the DAX
// sub-devices of lost leases.
//
// It reaches the rest of the lease manager as its friend, through a few
// members only: the table, the connections, the journal, quotas and pools,
// and the accounting helpers (Free, Persist, Unpersist, ToDurable, Unheld,
// ChargeTiers, CheckDaemonLimits, InAcl, PoolNamed, RecoverPoolMove, Count).
// A new restart rule goes here (lease_restart.cc; lease_readopt.cc for
// leases the journal lost).
//
// Thread safety: the event-loop thread only, as LeaseManager.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lease/lease_manager.h"
#include "lease/restart_tracker.h"

namespace cxlpool {

class RestartRules {
 public:
  using Lease = LeaseRecord;
  using Conn = LeaseManager::Conn;
  using Extents = LeaseManager::Extents;
  using ReclaimItem = LeaseManager::ReclaimItem;
  using ReclaimOutcome = LeaseManager::ReclaimOutcome;
  using RecoveryReport = LeaseManager::RecoveryReport;

  explicit RestartRules(LeaseManager& manager);
  RestartRules(const RestartRules&) = delete;
  RestartRules& operator=(const RestartRules&) = delete;

  RestartTracker& tracker() { return tracker_; }
  const RestartTracker& tracker() const { return tracker_; }

  // LeaseManager::Recover and LeaseManager::Reclaim.
  RecoveryReport Recover(std::vector<DurableLease> journalled,
                         std::map<uint64_t, std::vector<UniqueFd>> stored,
                         std::chrono::milliseconds grace, const JournalHealth& health);
  ReclaimOutcome Reclaim(ConnId conn, std::vector<ReclaimItem> items);

  // Strikes holders of `pid` off leases they provably no longer hold.
  void CheckHolderOf(pid_t pid);

 private:
  // Strikes dead holders (and `exited`, whose pidfd fired) off every
  // awaiting lease; frees the unheld.
  void SweepAwaiting(bool check_files, std::optional<HolderId> exited = std::nullopt);
  void WatchHolder(const HolderId& h);
  // Journal damage (lease_readopt.cc): accounts an unknown lease's memfds
  // again, one per extent (see Reclaim). `who` null: an fd-store orphan. On
  // error `*revoked` says whether the memfds (cxlpool leases that could not
  // be accounted) were truncated; nothing is done to an fd that fails
  // CheckLostLease.
  Result<uint64_t> Readopt(uint64_t id, std::vector<UniqueFd> fds, const ReclaimItem* hints,
                           const CallerInfo* who, bool* revoked);
  // A RECLAIM of an id the table does not know may re-adopt it: the id is
  // one this daemon may have granted, and the grace period that journal
  // damage started runs.
  bool LostLeaseWindowOpen(uint64_t id) const;
  // Every memfd (st_dev, st_ino) a lease in the table has: journalled
  // identities and the live extents' fds.
  std::set<std::pair<uint64_t, uint64_t>> LiveMemfds() const;
  // The fds of a lease the journal lost, checked without acting on them:
  // as many as the holder lists extents, each a lease-like memfd
  // (CheckUnknownMemfd) of one page kind, listed once, part of no live lease.
  Result<std::vector<MemfdFacts>> CheckLostLease(uint64_t id, const std::vector<UniqueFd>& fds,
                                                 const ReclaimItem* hints) const;
  // The memfd pool an extent whose pages are on `node` (-1: unknown) is
  // accounted to; the holder's pool when it agrees. nullptr: none.
  MemfdPool* LostExtentPool(int node, const ReclaimItem* hints) const;
  // Quota, priority reserve and daemon limits for bytes in each pool.
  Status CheckLostLeaseFits(const std::vector<std::pair<Pool*, uint64_t>>& by_pool,
                            const CallerInfo* who) const;
  // Reserves and commits the bytes in every pool, or none of them
  // (RESOURCE_EXHAUSTED naming the full pool).
  Status ReserveByPool(const std::vector<std::pair<Pool*, uint64_t>>& by_pool);
  // Readopt for a DAX device fd: a static device no lease holds, or a
  // sub-device held as a DaxOrphan, becomes the lease `id` again (a device
  // cannot be revoked like a memfd, so it is accounted even over a quota).
  // nullopt: the fd is no device of a devdax pool here.
  std::optional<Result<uint64_t>> ReadoptDevdax(uint64_t id, UniqueFd& fd, const ReclaimItem* hints,
                                                const CallerInfo* who);
  // The last step of both: `fresh` (id, size, pool, tier, extents, placement
  // and identity set) gets its owner, label and name from the reclaimer,
  // enters the table and is charged.
  uint64_t AddReadopted(Lease fresh, const ReclaimItem* hints, const CallerInfo* who);
  // Moves a lease to a new owner (quota charge, owner's list; and the name
  // when `confirmed`: the caller says it is the owner).
  void TakeOver(Lease& l, const CallerInfo& who, const std::string& name, bool confirmed);
  // Recover's steps for one journalled lease (`fds`: the fd store's).
  void RecoverLease(DurableLease& d, std::vector<UniqueFd> fds, std::set<std::string>* carved_seen,
                    RecoveryReport* r);
  // A devdax lease's device, resolved and counted back into a dynamic
  // region; why it cannot come back otherwise.
  std::optional<std::string> RecoverDaxDevice(DevdaxPool* dax_pool, DurableLease& d,
                                              std::set<std::string>* carved_seen);
  // Closes stored fds that do not match the journal.
  void CheckStoredFds(const DurableLease& d, DevdaxPool* dax_pool, std::vector<UniqueFd>* fds);
  // Every holder is gone: the stored memory is freed (a device given back).
  void ReleaseUnheldStored(const DurableLease& d, DevdaxPool* dax_pool, std::vector<UniqueFd>* fds);
  // The journalled pool of each extent of a split lease (empty: all on `pool`).
  std::vector<Pool*> RecoveredExtentPools(const DurableLease& d, Pool* pool, bool devdax) const;
  static std::vector<std::pair<Pool*, uint64_t>> BytesByPool(
      const DurableLease& d, Pool* pool, const std::vector<Pool*>& extent_pools);
  // The stored memory adopted (`*adopted`), or stand-ins awaiting RECLAIM.
  Extents RecoveredBacking(const DurableLease& d, Pool* pool, std::vector<UniqueFd> fds,
                           bool* adopted);
  static Lease FromDurable(const DurableLease& d, Pool* pool);
  // fd-store leases the journal does not know, accounted again.
  void ReadoptStoreOrphans(std::map<uint64_t, std::vector<UniqueFd>> stored, RecoveryReport* r);
  void StartGrace(std::chrono::milliseconds grace, bool awaiting, bool may_have_lost_leases);
  // Reclaim's steps for one item: the rejection, or nullopt when accepted.
  std::optional<std::string> ReclaimLost(ConnId conn, Conn& c, ReclaimItem& item);
  std::optional<std::string> ReclaimJournalled(ConnId conn, Conn& c, ReclaimItem& item);
  std::optional<std::string> CheckReclaimItem(const Lease& l, const DurableLease& d,
                                              const CallerInfo& who, const ReclaimItem& item) const;
  std::optional<std::string> AdoptReclaimed(Lease& l, const DurableLease& d, ReclaimItem& item);
  void MaybeEndGrace();
  void EndGrace(const char* why);
  // Sub-devices of dynamic DAX regions that no journalled lease names
  // (carved by the previous daemon for a lease the journal lost): destroyed
  // when nothing holds them, else kept reserved (never granted again) and
  // tried again at the end of the grace period. Returns how many it found.
  size_t FindDaxOrphans(const std::set<std::string>& journalled);
  void DestroyDaxOrphans(const char* when);

  LeaseManager& m_;
  struct DaxOrphan {
    DevdaxPool* pool;
    std::string device;
    uint64_t size;
  };
  std::vector<DaxOrphan> dax_orphans_;
  // After a restart: the probe, the grace period, the holder watches.
  RestartTracker tracker_;
};

}  // namespace cxlpool
