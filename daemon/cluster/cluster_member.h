// ClusterMember: this daemon in the rack's cluster. It connects to etcd,
// holds the session (cluster::Session) and publishes the host record, keeps
// a slice stock per shared device (cluster::SliceStock) and reconciles them
// on its own thread whenever etcd changes (a watch), the session joins or is
// lost, or a second passes. Only TakeSlice and ReturnSlice are called from
// the request path (a shared-slice build, on a worker); neither waits on
// etcd, though TakeSlice may wait for a round of the cluster thread.
//
// Leases take slices through TakeSlice and give them back through
// ReturnSlice (pool/shared_slice_pool.h, by way of SliceBroker). After a
// restart the slices that hold leases (the lease journal's, Deps.held) are
// re-adopted under the new epoch; the rest are freed. A loss of the session
// fences the shared devices at once (SliceStock::Fence) and says so in the
// log and the metrics; local pools go on as before.
//
// Thread safety: Start and Stop from one thread; the rest from any.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "cluster/cluster_options.h"
#include "cxlpool/cluster/cluster_view.h"
#include "cxlpool/cluster/etcd_client.h"
#include "cxlpool/cluster/session.h"
#include "cxlpool/cluster/shared_device.h"
#include "cxlpool/cluster/slice_registry.h"
#include "cxlpool/cluster/slice_stock.h"
#include "cxlpool/common/clock.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool {

struct ClusterStats {
  bool live = false;
  int64_t epoch = 0;
  uint64_t joins = 0, losses = 0, publishes = 0, reconcile_errors = 0;
  uint32_t hosts = 0;
  uint32_t slices_owned = 0, slices_used = 0;  // this host's, all shared devices
  uint32_t slices_quarantined = 0;             // in the whole cluster
  uint32_t invalid_records = 0;
  bool shared_fenced = false;
  bool insecure_remote = false;  // an etcd endpoint off loopback, and no TLS
  std::string last_loss;
};

// Whether `o` reaches etcd off loopback without TLS (doctor's error).
bool InsecureRemote(const ClusterOptions& o);

class ClusterMember {
 public:
  struct Deps {
    ClusterOptions options;
    std::string state_dir;   // "" : no restart memory (slices are freed on rejoin)
    std::string sysfs_root;  // for devdax sizes
    std::string version;
    const Clock* clock = nullptr;
    // The host record's pools and GPUs, now (called on the cluster thread).
    std::function<cluster::HostRecord()> describe;
    // Device path -> the slices leases recovered from the journal sit on.
    std::map<std::string, std::set<uint32_t>> held;
    // A slice a lease sits on is no longer this host's (an operator fenced
    // it and another host claimed the slice): revoke the lease. Called on the
    // cluster thread.
    std::function<void(const std::string& path, uint32_t index)> lost;
  };

  // Opens the shared devices and starts the thread; never waits on etcd
  // (an unreachable etcd shows as a session not yet live).
  static Result<std::unique_ptr<ClusterMember>> Start(Deps deps);
  ~ClusterMember();

  // Clean exit: stops the thread, fences the stocks, frees unused slices
  // and leaves the cluster (the host record goes at once). Slices under
  // leases stay this host's (an earlier epoch) for the next start.
  void Stop();

  // An owned, zeroed, unused slice of the shared device at `path`, waiting
  // up to `wait` for the cluster thread to claim one when none is ready.
  // UNAVAILABLE: fenced, or not joined yet; RESOURCE_EXHAUSTED: none came
  // within `wait` (the device is full); NOT_FOUND: no such shared device.
  Result<cluster::SliceGrant> TakeSlice(const std::string& path, std::chrono::milliseconds wait);
  // A lease on the slice ended: zeroed by the next round, then ready again.
  void ReturnSlice(const std::string& path, uint32_t index);
  // The leases on a slice reported lost (Deps.lost) are revoked and their
  // memory is back: this host may claim the slice again.
  void ForgetLost(const std::string& path, uint32_t index);

  ClusterStats stats() const;
  // The stock of shared device `id` (nullptr: no such device).
  cluster::SliceStock* stock(const std::string& id);

 private:
  explicit ClusterMember(Deps deps);
  void Loop();
  void Reconcile();
  std::string InstanceId() const;
  // The id of the shared device at `path`, or "".
  std::string DeviceIdOf(const std::string& path) const;
  void Wake();
  Status OpenDevices(cluster::SliceRegistry* registry);

  Deps deps_;
  std::unique_ptr<etcd::Client> etcd_;
  std::unique_ptr<cluster::SliceRegistry> registry_;
  std::unique_ptr<cluster::Session> session_;
  std::unique_ptr<etcd::Watch> watch_;
  std::vector<std::unique_ptr<cluster::SharedDevice>> devices_;
  std::string boot_id_;

  mutable Mutex mu_;
  // Never erased before the destructor: pointers taken under mu_ stay good.
  std::map<std::string, std::unique_ptr<cluster::SliceStock>> stocks_ GUARDED_BY(mu_);
  std::condition_variable wake_;
  std::condition_variable reconciled_;  // after each round of the cluster thread
  uint64_t rounds_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool dirty_ GUARDED_BY(mu_) = true;
  ClusterStats view_stats_ GUARDED_BY(mu_);
  // Device id -> the slices that held leases at the start, until its stock
  // (built at the first join: the device record needs etcd) takes them over.
  std::map<std::string, std::set<uint32_t>> used_at_start_ GUARDED_BY(mu_);
  std::thread thread_;
  std::atomic<uint64_t> reconcile_errors_{0};
};

}  // namespace cxlpool
