// AllocWaitQueue: allocations that fit once reclaims in flight finish, kept
// in arrival order until the lease manager retries them (every reclaim that
// finishes), refuses them (shutdown), or their connection goes.
//
// Thread safety: a single-owner value (the lease manager, on its loop).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "lease/lease_types.h"

namespace cxlpool {

struct WaitingAlloc {
  ConnId conn = 0;
  AllocParams params;
  AllocDone done;
};

class AllocWaitQueue {
 public:
  void Push(WaitingAlloc w) { waiting_.push_back(std::move(w)); }
  // Every waiting allocation, in arrival order; the queue is empty after.
  std::vector<WaitingAlloc> TakeAll() {
    std::vector<WaitingAlloc> out;
    out.swap(waiting_);
    return out;
  }
  // Those of connection `conn`, in arrival order; the others stay.
  std::vector<WaitingAlloc> TakeConn(ConnId conn) {
    std::vector<WaitingAlloc> out;
    std::vector<WaitingAlloc> keep;
    for (WaitingAlloc& w : waiting_) (w.conn == conn ? out : keep).push_back(std::move(w));
    waiting_.swap(keep);
    return out;
  }
  size_t size() const { return waiting_.size(); }
  bool empty() const { return waiting_.empty(); }

 private:
  std::vector<WaitingAlloc> waiting_;
};

}  // namespace cxlpool
