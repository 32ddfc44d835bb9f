// SliceStock: this host's share of one shared device. It keeps
// `claim_ahead` owned, zeroed, unused slices ready, gives back those beyond
// that which stayed unused for `idle_release`, re-adopts after a rejoin the
// slices its leases still sit on and frees the rest, and refuses every Take
// while the session is lost (the host fences itself).
//
// Reconcile does the etcd work and the zeroing; it runs on the cluster
// thread, never on a request path. Take and Return only touch memory.
//
// A slice that changes hands is zeroed by its new owner before Take can
// return it: claimed slices wait in `zeroing` until Zero succeeded.
//
// Thread safety: Take, Return, Fence and the counters from any thread;
// Reconcile from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cxlpool/cluster/cluster_view.h"
#include "cxlpool/cluster/shared_device.h"
#include "cxlpool/cluster/slice_registry.h"
#include "cxlpool/common/clock.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool::cluster {

struct StockOptions {
  uint32_t claim_ahead = 1;
  std::chrono::milliseconds idle_release{60000};
};

struct SliceGrant {
  std::string device;
  uint32_t index = 0;
  uint64_t offset = 0;  // on the device (header included)
  uint64_t length = 0;
  int64_t epoch = 0;
};

struct ReconcileStep {
  uint32_t claimed = 0;
  uint32_t released = 0;
  uint32_t readopted = 0;
  uint32_t freed_stale = 0;  // earlier epochs' slices without leases, freed
  uint32_t races = 0;        // guards that failed (someone else moved first)
  uint32_t dropped = 0;      // slices the view says are no longer ours
  // Slices a lease of ours sits on that are no longer ours (an operator
  // fenced this host and another claimed them, or they are gone): the
  // daemon revokes those leases, then calls ForgetLost. Each is reported
  // once, and never claimed again by this host until ForgetLost.
  std::vector<uint32_t> lost;
};

class SliceStock {
 public:
  // `used_after_restart`: the slices the journal says hold leases.
  // `certainly_live`: whether the session is sure to be live now (Take asks
  // it every time, so a grant never outruns a loss not declared yet); none:
  // only Fence stops Take.
  SliceStock(SliceRegistry* registry, SharedDevice* device, DeviceRecord record, std::string host,
             StockOptions options, const Clock* clock, std::set<uint32_t> used_after_restart = {},
             std::function<bool()> certainly_live = {});

  Result<ReconcileStep> Reconcile(const ClusterView& view, int64_t epoch);

  // An owned, zeroed, unused slice; UNAVAILABLE while fenced,
  // RESOURCE_EXHAUSTED when none is ready (Reconcile claims more).
  Result<SliceGrant> Take();
  // A lease on `index` ended. Ignored for a slice reported lost: that lease
  // no longer had it.
  void Return(uint32_t index);
  // The leases on lost slice `index` are revoked and their memory is back:
  // the slice may be claimed again.
  void ForgetLost(uint32_t index);
  // The session is lost: no more Take until Reconcile runs with a new epoch.
  void Fence();
  // Clean exit: gives back every owned slice no lease sits on; how many.
  uint32_t ReleaseUnused(int64_t epoch);

  bool fenced() const;
  uint32_t owned() const;
  uint32_t used() const;
  std::set<uint32_t> used_slices() const;
  const std::string& device_id() const { return device_->id(); }

 private:
  struct Owned {
    bool used = false;
    bool zeroed = false;
    int64_t free_since_ns = 0;
    int64_t mod_revision = 0;  // the slice key's, guard of our next write
  };
  void Readopt(const ClusterView& view, int64_t epoch, ReconcileStep* step);
  void AdoptStray(const ClusterView& view, int64_t epoch);
  void FindLost(const ClusterView& view, ReconcileStep* step);
  void Drop(const ClusterView& view, int64_t epoch, ReconcileStep* step);
  void Claim(const ClusterView& view, int64_t epoch, ReconcileStep* step);
  void ReleaseIdle(int64_t epoch, ReconcileStep* step);
  uint32_t ReadyCount() const REQUIRES(mu_);
  Result<bool> ReleaseOwned(uint32_t index, int64_t mod_revision, int64_t epoch);

  SliceRegistry* registry_;
  SharedDevice* device_;
  const DeviceRecord record_;
  const std::string host_;
  const StockOptions options_;
  const Clock* clock_;
  const std::function<bool()> certainly_live_;

  mutable Mutex mu_;
  uint64_t fences_ GUARDED_BY(mu_) = 0;  // Fence calls: a Reconcile begun before one
                                         // must not lift it
  std::map<uint32_t, Owned> owned_ GUARDED_BY(mu_);
  std::set<uint32_t> used_after_restart_ GUARDED_BY(mu_);
  std::set<uint32_t> lost_ GUARDED_BY(mu_);  // reported lost, not yet forgotten
  int64_t epoch_ GUARDED_BY(mu_) = 0;        // 0: fenced
};

}  // namespace cxlpool::cluster
