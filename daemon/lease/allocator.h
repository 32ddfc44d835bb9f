// Allocator: the path from a request to a finished build. It checks the
// request, plans the candidate pools and admits it in each (size, quota,
// priority reserve), grants what the warm reserve has, parks it until
// reclaims in flight make room, or builds it on a worker (at most so many
// at once, the owners' uids taking turns: BuildQueue) and grants or undoes
// it once built. It owns the build queue and the busy-budget hooks.
//
// It reaches the rest of the lease manager as its friend: the table, the
// connections, quotas and pools, the waiting allocations, the counters and
// a few helpers (PersistGrant, Snapshot, Refill, CheckDaemonLimits).
//
// Thread safety: the event-loop thread only, as LeaseManager; builds run on
// the workers and post their results back to the loop.
#pragma once

#include <sys/types.h>

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lease/build_queue.h"
#include "lease/lease_manager.h"

namespace cxlpool {

class Allocator {
 public:
  using Lease = LeaseRecord;
  using Extents = LeaseManager::Extents;
  using BusyCharge = LeaseManager::BusyCharge;

  explicit Allocator(LeaseManager& manager);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // LeaseManager::Allocate, SetBusyHooks (the build queue's part) and
  // SetBuildConcurrency.
  void Allocate(ConnId conn, AllocParams params, AllocDone done);
  void SetBusyHooks(BusyCharge charge, std::function<bool(uid_t)> throttled);
  void SetBuildConcurrency(size_t n) { build_queue_.set_max_running(n); }

 private:
  // Allocate's steps: check the request, plan the candidate pools, and for
  // each admit it (size, quota, priority reserve), take what the warm
  // reserve has, wait for reclaims, or start a build; else refuse, naming every pool's
  // reason.
  struct PoolRefusals {
    std::string text;
    Code code = Code::kResourceExhausted;
    const char* first_reason = nullptr;  // why the preferred pool refused
    void Add(const std::string& why, const char* reason, Code c = Code::kOk);
  };
  // A build in flight: what its completion needs to grant or undo it.
  struct BuildJob {
    ConnId conn = 0;
    AllocParams params;
    AllocDone done;
    Pool* pool = nullptr;
    uint64_t size = 0;
    std::string reason;
    std::string tier;
    Tenant owner;
    const FileSystem* settle = nullptr;
    // Extents taken from the pool's reserve for this lease (null: none);
    // only the plan's kBuild piece is built.
    std::shared_ptr<ExtentReserve::Taken> taken;
  };
  void Refuse(const AllocDone& done, Status st, const char* reason = nullptr);
  Status CheckRequest(const CallerInfo& caller, const AllocParams& p) const;
  static PlacementRequest PlacementFor(const AllocParams& p);
  // The lease's size in `pool`, or nullopt with why not added to `why`.
  std::optional<uint64_t> Admit(const Tenant& tenant, const AllocParams& p, Pool* pool,
                                PoolRefusals* why) const;
  // Grants a lease wholly made of reserve extents (room already reserved).
  void GrantFromReserve(BuildJob job);
  // Charges and reserves for `job`, then builds on a worker (or the loop).
  void StartBuild(BuildJob job);
  // On the loop: grants the built lease, places it elsewhere (a failed
  // kernel-zone settle), or undoes the hold and refuses.
  void FinishBuild(BuildJob job, Result<Extents> built);
  void UndoBuildHold(const BuildJob& job);
  // A worker's build offers its prefault (pool/shared_fill.h): helpers for
  // the other workers, through the BuildQueue under the owner's uid, one
  // chunk per turn (counters build_helpers, build_helper_chunks).
  void OfferFill(uid_t uid, const std::shared_ptr<SharedFill>& fill);
  void SubmitFillHelper(uid_t uid, const std::shared_ptr<SharedFill>& fill);
  uint64_t Insert(ConnId conn, const AllocParams& p, Pool* pool, uint64_t size, Extents extents,
                  bool from_warm, std::string reason);

  void RetryHeldBuilds();

  LeaseManager& m_;
  BuildQueue build_queue_;
  BusyCharge busy_charge_;
  std::unique_ptr<boost::asio::steady_timer> busy_retry_timer_;  // made once builds are held
  bool busy_retry_armed_ = false;
};

}  // namespace cxlpool
