#include "server/busy_budget.h"

#include <algorithm>
#include <iterator>

namespace cxlpool {

BusyBudget::Account& BusyBudget::Get(uid_t uid, Clock::time_point now) {
  auto [it, fresh] = accounts_.try_emplace(uid);
  Account& a = it->second;
  if (fresh) {
    a.balance_ns = capacity_ns();
    a.updated = now;
  } else {
    Advance(a, now);
  }
  return a;
}

void BusyBudget::Advance(Account& a, Clock::time_point now) const {
  if (now <= a.updated) return;
  const auto dt = std::chrono::duration_cast<std::chrono::nanoseconds>(now - a.updated).count();
  if (enabled()) {
    // Refill at per_second per second, never above a tenth of a second's worth.
    const double add = static_cast<double>(dt) * static_cast<double>(per_second_.count()) / 1e9;
    a.balance_ns = static_cast<int64_t>(std::min<double>(static_cast<double>(capacity_ns()),
                                                         static_cast<double>(a.balance_ns) + add));
  }
  a.updated = now;
}

void BusyBudget::Charge(uid_t uid, std::chrono::nanoseconds busy, Clock::time_point now) {
  if (busy.count() < 0) busy = std::chrono::nanoseconds(0);
  Account& a = Get(uid, now);
  a.balance_ns = std::max(a.balance_ns - busy.count(), -per_second_.count());
  a.total_ns += static_cast<uint64_t>(busy.count());
  a.last_charge = now;
  if (++charges_since_prune_ >= 4096) Prune(now);
}

void BusyBudget::SetInFlight(uid_t uid, uint64_t n, Clock::time_point now) {
  Get(uid, now).in_flight = n;
}

bool BusyBudget::Throttled(uid_t uid, Clock::time_point now) {
  if (!enabled()) return false;
  auto it = accounts_.find(uid);
  if (it == accounts_.end()) return false;
  Account& a = it->second;
  Advance(a, now);
  if (a.balance_ns >= 0 || a.in_flight < 3) return false;
  for (const auto& [other, o] : accounts_) {
    if (other == uid || (o.in_flight == 0 && now - o.last_charge > kActiveWindow)) continue;
    if (a.in_flight > 2 * std::max<uint64_t>(1, o.in_flight)) {
      ++throttled_;
      return true;
    }
  }
  return false;
}

BusyBudget::Clock::time_point BusyBudget::RefilledAt(uid_t uid, Clock::time_point now) {
  auto it = accounts_.find(uid);
  if (!enabled() || it == accounts_.end()) return now;
  Advance(it->second, now);
  if (it->second.balance_ns >= 0) return now;
  const double ns =
      static_cast<double>(-it->second.balance_ns) * 1e9 / static_cast<double>(per_second_.count());
  return now + std::chrono::nanoseconds(static_cast<int64_t>(ns) + 1);
}

uint64_t BusyBudget::charged_ns(uid_t uid) const {
  auto it = accounts_.find(uid);
  return it == accounts_.end() ? 0 : it->second.total_ns;
}

void BusyBudget::Prune(Clock::time_point now) {
  charges_since_prune_ = 0;
  // A uid quiet for a minute with a full bucket is forgotten (it starts
  // full again when it returns); its total goes with it.
  for (auto it = accounts_.begin(); it != accounts_.end();) {
    Advance(it->second, now);
    if (now - it->second.last_charge > std::chrono::minutes(1) && it->second.in_flight == 0 &&
        it->second.balance_ns >= capacity_ns()) {
      it = accounts_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace cxlpool
