#include "tiering/urgent_hints.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "tiering/migration_log.h"

namespace cxlpool::tiering {

Status UrgentHints::Take(uid_t uid, int64_t now) {
  if (rate_ == 0) return Status::Ok();
  auto it = buckets_.find(uid);
  if (it == buckets_.end()) it = buckets_.emplace(uid, RateLimiter(rate_, rate_, now)).first;
  if (it->second.TryTake(1, now)) return Status::Ok();
  return Status(Code::kResourceExhausted,
                "uid " + std::to_string(uid) + " sent more than " + std::to_string(rate_) +
                    " will_need/dont_need hints in a second (tiering.max_urgent_hints_per_uid);"
                    " this one was not taken, retry in " +
                    Ms(it->second.NsUntil(1, now)));
}

int64_t UrgentHints::WaitNs(uid_t uid, uint64_t n, int64_t now) {
  auto it = buckets_.find(uid);
  if (n == 0 || it == buckets_.end()) return 0;
  return std::min<int64_t>(it->second.NsUntil(n, now), 1'000'000'000);
}

void UrgentHints::ForgetFull(int64_t now) {
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    it = it->second.Full(now) ? buckets_.erase(it) : std::next(it);
  }
}

std::map<uint64_t, uid_t> UrgentHints::Drain() {
  std::map<uint64_t, uid_t> queued;
  queued.swap(queued_);
  return queued;
}

void UrgentHints::ChargeShares(const std::map<uint64_t, uid_t>& served,
                               std::chrono::nanoseconds spent, const BusyCharge& charge) {
  if (served.empty()) return;
  std::map<uid_t, int64_t> shares;
  for (const auto& [id, uid] : served) ++shares[uid];
  for (const auto& [uid, n] : shares) charge(uid, spent * n / static_cast<int64_t>(served.size()));
}

}  // namespace cxlpool::tiering
