// LeaseManager: the daemon's lease state. It places allocations on pools,
// enforces capacity and quotas, builds backings on a worker pool, serves
// requests of any size from each pool's warm reserve of extents, shares named leases under a
// uid/gid ACL with reference counts, and releases everything a connection held when it goes away.
// It decides; its parts remember and run:
//   - LeaseTable (lease_table.h): the leases, indexed by owner and name,
//     and the revocations;
//   - AllocWaitQueue (wait_queue.h): allocations waiting for reclaims;
//   - ReclaimQueue (reclaim_queue.h): ended leases' memory given back;
//   - JournalWriter (journal_writer.h): grants, holder changes and ends
//     written to the LeaseStore; the lease ids;
//   - Allocator (allocator.h): a request checked, placed and admitted,
//     granted from the warm reserve, parked for reclaims or built;
//   - RestartRules (restart_rules.h): recover, reclaim, re-adopt, the grace
//     period and the sweeps after a restart.
//
// Nothing here knows protobuf or sockets; the handler translates.
//
// Names and visibility (docs/daemon.md, "Leases, sharing, disconnect"):
// shared names live in one namespace per owner uid, so nobody can take a
// name another tenant means to use; an attach names the owner (default: the
// caller's own uid) and the reply says who owns the lease. A caller that
// may not see a lease or a name gets the same NOT_FOUND, with the same
// text, as for one that does not exist.
//
// Releasing is asynchronous: a freed lease leaves the table, its names and
// its tenant's quota at once, but its memory (truncate, unmap, close of the
// backing) is reclaimed on `workers`. Until that finishes the pool counts
// the bytes as reclaiming (still used: never overcommitted); an Allocate that
// only fits once those reclaims finish waits for them instead of being
// refused.
//
// Reserve refills run on the `stock` executor when one is set
// (SetStockExecutor; the daemon gives it low-priority threads), else on
// `workers`.
//
// Thread safety: every public method must be called on the event-loop
// executor `loop`. Builds and reclaims run on `workers` (refills on `stock`)
// and post their results back to `loop`; no lease state is touched from a
// worker. The owner must stop the workers and the stock threads (join the
// pools) before destroying the manager (so
// builds and reclaims in flight finish; reclaims never touch the manager),
// must destroy the manager before the `loop` executor's context, and must
// keep the Topology alive as long as the manager.
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cxlpool/common/clock.h"
#include "cxlpool/common/status.h"
#include "cxlpool/topology/topology.h"
#include "lease/build_queue.h"
#include "lease/journal_writer.h"
#include "lease/lease_stock.h"
#include "lease/lease_table.h"
#include "lease/lease_types.h"
#include "lease/placement.h"
#include "lease/quota.h"
#include "lease/reclaim_queue.h"
#include "lease/restart.h"
#include "lease/wait_queue.h"
#include "pool/pool.h"

namespace cxlpool {

class Allocator;
class RestartRules;

class LeaseManager {
 public:
  using Executor = boost::asio::any_io_executor;
  using AllocDone = cxlpool::AllocDone;
  using RevokeDone = std::function<void(Result<std::vector<ConnId>>)>;
  // A lease's memory: its extents in mapping order.
  using Extents = std::vector<std::unique_ptr<Backing>>;

  LeaseManager(const Topology* topo, std::vector<std::unique_ptr<Pool>> pools, QuotaTable quotas,
               Executor loop, Executor workers, const Clock* clock);
  ~LeaseManager();
  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  void Connect(ConnId conn, CallerInfo caller);
  // Drops every reference the connection held; leases nobody holds any more
  // are reclaimed (truncated, unmapped, closed on a worker). Allocations of
  // the connection waiting for reclaims are answered UNAVAILABLE.
  void Disconnect(ConnId conn);

  // Calls `done` exactly once: now (wholly from the warm reserve, refusal) or later on the
  // loop (after a build, or after reclaims in flight made room). Errors: INVALID_ARGUMENT (size 0,
  // bad tier, ...), NOT_FOUND (GPU/node), ALREADY_EXISTS (name), RESOURCE_EXHAUSTED (capacity or
  // quota, naming the limit and usage), and build errors.
  void Allocate(ConnId conn, AllocParams params, AllocDone done);
  // NOT_FOUND (no such lease, or not visible to the caller: one answer),
  // REVOKED (to those who could see it), PERMISSION_DENIED (the caller's
  // own lease, held by another of its connections).
  Status Release(ConnId conn, uint64_t id);
  // The lease named `name` in the namespace of `owner_uid` (default: the
  // caller's uid). NOT_FOUND (no such name, or the caller is not in its ACL:
  // one answer), UNAVAILABLE (still being built, or awaiting its reclaim
  // after a restart; said only to those who may attach).
  Result<Granted> Attach(ConnId conn, const std::string& name,
                         std::optional<uid_t> owner_uid = std::nullopt);
  // Visible to the owner uid, the holders and admins; else NOT_FOUND, as
  // for an id that does not exist.
  Result<LeaseSnapshot> Stat(ConnId conn, uint64_t id) const;
  // Own leases (owner uid or held), or all (admin only).
  Result<std::vector<LeaseSnapshot>> List(ConnId conn, bool all) const;
  // Admin only: frees the lease now (it leaves the table at once) and calls
  // `done` with the connections that held it, to be told with a LeaseEvent,
  // once its memory is truncated (their next access SIGBUSes); errors now.
  void Revoke(ConnId conn, uint64_t id, RevokeDone done);
  // The daemon's own revoke, of every lease on slice `index` of shared
  // pool `pool` (the slice is no longer this host's): as Revoke, `done`
  // once per lease with its id and the connections that held it; then
  // `all_done` once every one's memory is given back (at once when none).
  void RevokeOnSlice(const std::string& pool, uint32_t index,
                     std::function<void(uint64_t id, std::vector<ConnId> holders)> done,
                     std::function<void()> all_done);
  // Admin only: add/replace a quota rule.
  Status SetQuota(ConnId conn, const QuotaRule& rule);
  // A holder of lease `id` saw its pages off the node it is accounted to
  // (MSG_LEASE_MOVED, after a long-term pin). The daemon asks move_pages
  // about its own mapping of the lease (at most 4096 sampled pages, on the
  // loop: a few hundred microseconds) and trusts only that: when most pages
  // are on another node with a memfd pool, the lease's bytes move to that
  // pool and its tenant's quota to that tier, the change is journalled and
  // counted (leases_moved; Rehome, as for a tiering move). While the tiering
  // engine is moving the lease, that move accounts it and this changes
  // nothing. `moved` says whether the accounting changed now.
  // NOT_FOUND (also for another tenant's lease), REVOKED, PERMISSION_DENIED
  // (visible but not held by this connection), UNSUPPORTED (devdax: no
  // daemon mapping to ask about), IO.
  struct MoveCheck {
    LeaseSnapshot lease;
    bool moved = false;
  };
  Result<MoveCheck> CheckMoved(ConnId conn, uint64_t id);

  std::vector<PoolSnapshot> Pools() const;
  std::vector<QuotaUsage> Quotas() const { return quotas_.Rules(); }
  // The rules `conn` may see: all for an admin, else those that apply to
  // the caller itself (its uid, primary gid, its cgroup or one above it).
  std::vector<QuotaUsage> QuotasVisibleTo(ConnId conn) const;
  // Tenant policy and pools, for a config reload (quota/quota.h, reload/).
  QuotaTable* mutable_quotas() { return &quotas_; }
  const std::vector<Pool*>& pools() const { return pool_ptrs_; }
  std::map<std::string, uint64_t> Counters() const { return counters_; }
  std::map<std::string, uint64_t> Gauges() const;
  bool IsAdmin(ConnId conn) const;
  const CallerInfo* Caller(ConnId conn) const;
  // True while `conn` holds a lease or an attachment (the server never
  // closes such a connection for being idle).
  bool HoldsLeases(ConnId conn) const;
  const Topology& topology() const { return *topo_; }

  // Starts refilling every pool's warm reserve in the background (what
  // is below its low watermark; cheap when nothing is).
  void StartRefills();

  // The kernel resources the daemon spends per lease: one fd and one memory
  // mapping each (leases, builds in flight, reserve extents). Allocate refuses
  // with RESOURCE_EXHAUSTED, naming the limit, before either runs out, so a
  // client gets a clear error instead of a reply that cannot carry its fd.
  struct DaemonLimits {
    uint64_t max_fds = UINT64_MAX;   // RLIMIT_NOFILE soft limit
    uint64_t max_maps = UINT64_MAX;  // vm.max_map_count
  };
  void SetDaemonLimits(DaemonLimits limits) { limits_ = limits; }
  // Where to read /proc/zoneinfo for long-term pinned leases on a node with
  // both kernel and movable zones (Candidate::settle): their build moves the
  // pages into the kernel zones and checks they stayed (lease/longterm_pin.h).
  // Null (the default; a topology that is not this machine's): built as any
  // other lease.
  void SetPinSettle(const FileSystem* proc) { settle_fs_ = proc; }
  // Where reserve refills run from now on (default: the workers), and how
  // many threads run them (a large refill's prefault is shared among them).
  void SetStockExecutor(Executor stock, uint32_t threads = 1) {
    stock_.SetExecutor(std::move(stock), threads);
  }
  // Leases up to `bytes` are built and reclaimed on the loop thread itself
  // (their completion is still posted, as from a worker). Default 0: never.
  void SetInlineMax(uint64_t bytes) {
    inline_max_ = bytes;
    reclaims_.set_inline_max(bytes);
  }
  // At most `n` cold builds for requests run at once (the worker count);
  // the rest wait, the owners' uids taking turns (lease/build_queue.h).
  // Default: no limit, in the order asked.
  void SetBuildConcurrency(size_t n);
  // Daemon time per uid (server/busy_budget.h): `charge` is told how long
  // each build and reclaim of a uid's lease took on a worker (on the loop,
  // once it is back); a uid `throttled` says yes to starts none of its cold
  // builds until it says no (asked again every kBusyRetry). Default: none.
  using BusyCharge = std::function<void(uid_t, std::chrono::nanoseconds)>;
  void SetBusyHooks(BusyCharge charge, std::function<bool(uid_t)> throttled);
  // A memfd lease built on the request path is cut into extents of at most
  // `bytes` (a multiple of 2 MiB; the last extent holds the rest), each its
  // own memfd, mapped back to back by the client. Default 0: one extent.
  // Devdax leases are always one.
  void SetMaxExtentBytes(uint64_t bytes) { max_extent_ = bytes; }
  // Stops refills and reclaims every lease and all stock (daemon exit).
  void Shutdown();

  // For tests: builds in flight (leases and stock), reclaims in flight, and
  // allocations waiting for reclaims.
  uint32_t pending_builds() const { return pending_builds_; }
  uint32_t pending_reclaims() const { return reclaims_.pending(); }
  size_t waiting_allocs() const { return waiting_.size(); }

  // ---- restart support (lease/restart_rules.h, docs/daemon.md) ----
  // Journals every grant, holder change and free through `store` (before
  // the grant's reply leaves; a failed Put refuses the grant), grants ids
  // from `next_id` on (reserved in batches), and uses `probe` to look at
  // holders after a restart. Call once, before Recover and any request.
  void EnableRestart(LeaseStore* store, const ProcessProbe* probe, uint64_t next_id);
  struct RecoveryReport {
    uint64_t journalled = 0;
    uint64_t adopted = 0;   // memory taken from the fd store
    uint64_t awaiting = 0;  // waiting for their holders' RECLAIM
    uint64_t dropped = 0;   // every holder gone, or unplaceable
    uint64_t orphans = 0;   // fd-store leases the journal did not know, accounted again
  };
  // At start, before StartRefills: takes the journalled leases back. They
  // are accounted at once (pool, quota, name). `stored` fds (by lease id,
  // from the fd store) are checked and adopted now; the rest await RECLAIM.
  // Holders that died meanwhile are struck off; a lease with none left is
  // dropped. Starts a grace period of `grace` (ends early once every lease
  // has its memory back or is dropped).
  // Journal damage (`health`, docs/daemon.md "Journal damage"): a stored fd
  // without a journal record is accounted again as an orphan in the pool
  // holding its pages (its owner is whoever reclaims it first); when leases
  // of this boot may be missing, or orphans were found, the grace period
  // runs its full length so their holders can reclaim them before anything
  // new is granted, and re-adopted leases are kept through it even if
  // unheld. The damage shows in Gauges() (journal_*) and the log; a later
  // RECLAIM of a lease the journal did not know sets journal_damaged too.
  // `stored`: by lease id, one fd per extent in order (an fd the store did
  // not have is invalid).
  RecoveryReport Recover(std::vector<DurableLease> journalled,
                         std::map<uint64_t, std::vector<UniqueFd>> stored,
                         std::chrono::milliseconds grace, const JournalHealth& health = {});
  bool in_grace() const;
  // During the grace period: UNAVAILABLE "daemon restarting: reclaim in
  // progress, retry in N s"; else OK.
  Status GraceRefusal() const;
  struct ReclaimItem {
    uint64_t id = 0;
    uint64_t size_bytes = 0;
    // One fd per extent, in mapping order, with the sizes the client was
    // told (empty sizes: one extent of size_bytes).
    std::vector<UniqueFd> fds;
    std::vector<uint64_t> extent_sizes;
    // What the client remembers of the lease (hints for one the journal
    // lost; never trusted for accounting): its pool, name, backing, and the
    // owner uid it was told.
    std::string pool;
    std::string name;
    std::string label;
    std::string backing;
    std::optional<uid_t> owner_uid;
  };
  struct ReclaimOutcome {
    std::vector<uint64_t> accepted;
    std::vector<std::pair<uint64_t, std::string>> rejected;  // id, why
  };
  // A client hands its leases back after a restart. Each is accepted when
  // the lease is journalled (awaiting or live), the caller may hold it
  // (owner uid, ACL, root), and the fd is that lease's memfd; it is then
  // held by `conn` (one reference per item: a lease attached twice on one
  // connection is listed twice). Accepted at any time, not only in grace.
  // A lease the journal does not know (lost to damage) with an id this
  // daemon may have granted is accounted again: its size from fstat, its
  // pool from where its pages are (move_pages), charged to the caller after
  // the checks an ALLOC passes (quota, priority reserve, pool room, daemon
  // limits). One that cannot be accounted is revoked (truncated), never left
  // mapped uncounted. Either way the counters say so.
  ReclaimOutcome Reclaim(ConnId conn, std::vector<ReclaimItem> items);
  // ---- tiering support (lease/lease_migration.cc; daemon/tiering/lease_adapter.h) ----
  // What the tiering engine needs of a lease.
  struct MigrationFacts {
    LeaseSnapshot lease;
    const Pool* pool = nullptr;
    // The memfd, borrowed, of a one-extent lease; -1 for devdax, for memory
    // not back after a restart, and for a lease of several extents (fds).
    int fd = -1;
    // Every extent's memfd and size, borrowed, in mapping order (empty when
    // fd would be -1 for a reason other than several extents).
    std::vector<GrantedExtent> extents;
    std::vector<ConnId> holders;
    std::vector<pid_t> holder_pids;
    int32_t priority = 0;  // the owner's priority class
    std::string gpu;       // as asked at allocation ("" none)
    std::optional<int> home_node;
    // Each extent's pool when they are not all on `pool` (LeaseRecord::extent_pools).
    std::vector<const Pool*> extent_pools;
    const Pool* moving_to = nullptr;  // a move of one extent between pools under way
    uint32_t moving_extent = 0;
    std::string moving_note;
  };
  std::vector<MigrationFacts> LeasesForMigration() const;
  std::optional<MigrationFacts> LeaseForMigration(uint64_t id) const;
  // The accounting of moving one extent of a lease (the lease, when it has
  // one) to another pool's node; each extent is accounted to its own pool,
  // so a lease may stay split between pools. Begin: room for the extent on
  // `to` is reserved and the tenant's quota charged in `to`'s tier as well
  // (a move in progress counts in both pools, so nothing is ever
  // overcommitted), and the intent journalled. Commit: the extent's bytes
  // and charge leave its old pool, journalled. Abort with an empty note:
  // the reservation and the second charge go; with a note (pages left
  // split): both stay and the note says why, until a later move finishes.
  // Begin: NOT_FOUND (no lease, no such extent), ALREADY_EXISTS (a move
  // under way), INVALID_ARGUMENT (same pool, devdax), UNAVAILABLE (memory
  // not back after a restart), RESOURCE_EXHAUSTED (room, quota, priority
  // reserve: named), IO (journal). Commit: NOT_FOUND (the lease ended),
  // INTERNAL (no move of that extent under way).
  Status BeginExtentMove(uint64_t id, uint32_t extent, Pool* to);
  Status CommitExtentMove(uint64_t id, uint32_t extent);
  Status AbortExtentMove(uint64_t id, uint32_t extent, const std::string& split_note);

  // SIGTERM with restart support: forget every lease WITHOUT freeing its
  // memory or journalling its end, so the clients keep their mappings and
  // reclaim from the next daemon. Stops refills; Shutdown is then a no-op.
  void HandOver();

 private:
  // The allocator and the restart rules reach the table, the connections,
  // the journal and the helpers below (lease/allocator.h,
  // lease/restart_rules.h).
  friend class Allocator;
  friend class RestartRules;
  using Lease = LeaseRecord;
  struct Conn {
    CallerInfo caller;
    std::unordered_set<uint64_t> held;
  };

  // Waiting allocations run again (room came back).
  void RetryWaiting();
  // No more reserve refills; ready stock is retired (shutdown, hand-over).
  void StopReserves();
  // Ends a lease: bookkeeping now, memory reclaimed off the request path
  // (reclaims_).
  // `then` runs on the loop once the memory is truncated (or never, when
  // the manager is gone by then).
  void Free(uint64_t id, const char* counter, std::function<void()> then = nullptr);
  // Marks lease `id` (in the table) revoked and frees it; `done` gets its
  // holders once its memory is reclaimed.
  void RevokeNow(uint64_t id, const char* counter, RevokeDone done);
  // Back on the loop after a reclaim: the bytes are free; waiting
  // allocations run again, then reserve refills.
  void BackingReclaimed(Pool* pool, uint64_t size);
  // Refuses every waiting allocation (shutdown, hand-over).
  void RefuseWaiting(const Status& why);
  void DropRef(Lease& lease, ConnId conn, uint32_t n);
  void Refill(Pool* pool);
  LeaseSnapshot Snapshot(const Lease& l) const;
  // The answer for an id not in the table: REVOKED to those who could see
  // it when an admin revoked it, else NOT_FOUND.
  Status NotInTable(ConnId conn, uint64_t id) const;
  bool Visible(const Lease& l, ConnId conn) const;
  void Count(const std::string& name, uint64_t by = 1) { counters_[name] += by; }
  // The refusal, if any, of the daemon's own fd and mapping limits.
  Status CheckDaemonLimits() const;
  // A caller that may attach to / hold a shared lease: root, its owner uid,
  // or in its ACL (uid, primary or supplementary gid).
  static bool InAcl(const Lease& l, const CallerInfo& who);
  // Journalling and restart support (lease_journal.cc).
  bool Unheld(const Lease& l) const;
  DurableLease ToDurable(const Lease& l) const;
  MigrationFacts FactsOf(const Lease& l) const;
  // The second charge and the reservation of a move under way go (Free, Abort).
  void DropPoolMove(Lease& l);
  // Forgets the move under way (its accounting already settled).
  static void ClearMove(Lease& l);
  // The lease `id` with a move of `extent` under way: NOT_FOUND (it
  // ended), INTERNAL (no such move).
  Result<Lease*> MovingLease(uint64_t id, uint32_t extent);
  // "3 of 16 extents (6 MiB) on node0, 13 of 16 extents (26 MiB) on node2";
  // "" when the lease is on one pool.
  static std::string Spread(const Lease& l);
  Pool* PoolNamed(const std::string& name) const;
  // The tenant's quota charge of all of a lease: each tier its bytes, the
  // lease counted once in each of its tiers and once in all.
  void ChargeTiers(const Lease& l, bool charge);
  // Recover: a journalled move of `extent` to `to_pool` that was not
  // finished is accounted again as it was (or, without room there, as a
  // move back); `to_pool` the extent's own pool: a move back (from
  // `back_from`) that was not finished goes on.
  void RecoverPoolMove(Lease& l, const std::string& to_pool, const std::string& back_from,
                       uint32_t extent);
  // A long-term pin moved all of a lease's pages (CheckMoved): its bytes
  // and its tenant's charge go from every pool accounting them to `to`,
  // where it was placed and `why` are kept for LeaseInfo
  // (placed_numa_node, moved_reason), counted (leases_moved) and
  // journalled (lease_migration.cc). The tiering engine's moves go extent
  // by extent (CommitExtentMove).
  void Rehome(Lease& l, Pool* to, std::string why);
  // Journals a new grant (with its extents' fds) or a holder change (no
  // fds). OK when disabled.
  Status Persist(const Lease& l, std::span<const int> fds);
  // Journals the end of a lease (errors logged).
  void Unpersist(uint64_t id);
  // A new grant just inserted: records its extents' identity, and journals
  // it or takes it back. False: refused.
  bool PersistGrant(uint64_t id, const AllocDone& done);

  const Topology* topo_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::vector<Pool*> pool_ptrs_;
  QuotaTable quotas_;
  Executor loop_;
  Executor workers_;
  uint64_t inline_max_ = 0;
  uint64_t max_extent_ = 0;
  // Extents beyond the first of every lease in the table (each one more fd
  // and mapping: CheckDaemonLimits).
  uint64_t extra_extents_ = 0;
  // The path from a request to a finished build (lease/allocator.h).
  std::unique_ptr<Allocator> alloc_;
  const FileSystem* settle_fs_ = nullptr;
  const Clock* clock_;
  bool stopping_ = false;
  uint32_t pending_builds_ = 0;
  std::unordered_map<uid_t, uint32_t> pending_builds_by_uid_;  // request builds
  DaemonLimits limits_;
  // Flipped when the manager dies so late completions do nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  // Ended leases' memory, given back on the workers (or the loop).
  ReclaimQueue reclaims_;
  // Allocations that fit once reclaims in flight finish.
  AllocWaitQueue waiting_;
  bool retrying_waiters_ = false;

  // The leases and their indexes (owner, name, revocations).
  LeaseTable table_;
  std::unordered_map<ConnId, Conn> conns_;
  std::map<std::string, uint64_t> counters_;

  // Grants, holder changes and ends journalled; lease ids.
  JournalWriter journal_;
  // After a restart: recover, reclaim, re-adopt, the grace period and the
  // sweeps (lease/restart_rules.h).
  std::unique_ptr<RestartRules> rules_;
  // The pools' warm reserves refilled and stopped (destroyed before the pools).
  LeaseStock stock_;
};

}  // namespace cxlpool
