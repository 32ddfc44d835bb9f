// UrgentHints: the leases an owner's will_need / dont_need hints queued for
// the next on-demand round (each with the uid whose hint queued it), and each
// uid's budget of urgent hints: a bucket of one second's worth of
// `per_uid_per_s` (0: no limit).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>

#include "cxlpool/common/status.h"
#include "tiering/temperature.h"

namespace cxlpool::tiering {

class UrgentHints {
 public:
  // Charges daemon time spent for a uid (BusyBudget::Charge).
  using BusyCharge = std::function<void(uid_t uid, std::chrono::nanoseconds busy)>;

  explicit UrgentHints(uint32_t per_uid_per_s) : rate_(per_uid_per_s) {}

  // Takes one urgent hint from `uid`'s bucket, or RESOURCE_EXHAUSTED naming
  // the limit and when to retry.
  Status Take(uid_t uid, int64_t now);
  // How long `uid` waits until its bucket holds `n` again (0: now; at most a second).
  int64_t WaitNs(uid_t uid, uint64_t n, int64_t now);
  // Buckets back to full are forgotten (a uid starts full when it returns).
  void ForgetFull(int64_t now);

  void Queue(uint64_t lease_id, uid_t uid) { queued_.insert_or_assign(lease_id, uid); }
  void Forget(uint64_t lease_id) { queued_.erase(lease_id); }
  bool empty() const { return queued_.empty(); }
  size_t size() const { return queued_.size(); }
  // The queued leases (-> uid), leaving the queue empty.
  std::map<uint64_t, uid_t> Drain();

  // Charges `spent` to the uids of `served`, by their share of its leases.
  static void ChargeShares(const std::map<uint64_t, uid_t>& served, std::chrono::nanoseconds spent,
                           const BusyCharge& charge);

 private:
  uint32_t rate_;
  std::map<uint64_t, uid_t> queued_;
  std::map<uid_t, RateLimiter> buckets_;
};

}  // namespace cxlpool::tiering
