// SliceBroker: the shared-slice pools' SliceSource in the daemon. The pools
// exist from the start, before the cluster does (restart recovery runs
// first), so until the ClusterMember is attached the broker remembers which
// slices recovered leases hold and which of them ended, and refuses to take
// any (UNAVAILABLE); Attach starts the member with that list and routes
// everything to it from then on.
//
// Thread safety: every method from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "cluster/cluster_member.h"
#include "cxlpool/common/thread_annotations.h"
#include "pool/shared_slice_pool.h"

namespace cxlpool {

class SliceBroker final : public SliceSource {
 public:
  // `wait`: how long a Take waits for the cluster to claim a slice.
  explicit SliceBroker(std::chrono::milliseconds wait) : wait_(wait) {}

  Result<Slice> Take(const std::string& path) override;
  void Return(const std::string& path, uint32_t index) override;
  void Hold(const std::string& path, uint32_t index) override;

  // Calls `start` with the slices held (device path -> indices) and, when
  // it returns a member, routes to it from then on; no Return or Hold is
  // lost in between. The member must outlive every later call.
  Status Attach(
      const std::function<Result<ClusterMember*>(std::map<std::string, std::set<uint32_t>> held)>&
          start);
  // The member stopped: Take refuses again, Return and Hold are remembered.
  // The member must stay alive until calls begun before this have returned.
  void Detach();

 private:
  const std::chrono::milliseconds wait_;
  Mutex mu_;
  std::map<std::string, std::set<uint32_t>> held_ GUARDED_BY(mu_);
  std::atomic<ClusterMember*> member_{nullptr};
};

}  // namespace cxlpool
