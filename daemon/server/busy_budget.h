// BusyBudget: the daemon time (event loop and workers) each uid's requests
// take, and the limit `limits.max_busy_per_uid` on it: a uid that asks for
// far more than another active uid is held to that much busy time per
// second, so a flood of cheap requests, builds and reclaims from one tenant
// cannot take the daemon's CPU from a lighter one.
//
// Each uid has a token bucket of busy time: it refills at `per_second` per
// second up to a tenth of that (a burst of 100 ms' worth), and every charge
// (a request handled on the loop, a reply sent, a build or reclaim on a
// worker) takes its measured duration out of it (a debt of at most one
// second's worth). A uid is throttled while
//   * its bucket is empty (below zero), and
//   * another uid is active (a request in flight, or charged within the
//     last kActiveWindow) that asks for much less: this uid has more than
//     twice as many requests in flight (at least 3).
// What sets a flood apart is its demand, not the daemon time a request
// costs: one client doing cheap requests back to back takes as much loop
// time as a flood held to its budget, and must not be throttled by it. Two
// tenants with similar demand are never throttled (the daemon stays
// work-conserving); a heavy one next to a light one is held to `per_second`
// until the light one goes quiet. Throttled means: the server stops reading
// that uid's sockets and the build queue starts none of its builds
// (backpressure, no error: its requests wait, they are not refused).
//
// Thread safety: single-owner (the event-loop thread). Durations measured
// on workers are charged once their completion is back on the loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>

namespace cxlpool {

class BusyBudget {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kActiveWindow{50};

  // `per_second` zero: off (nothing is ever throttled; charges are still
  // kept, for stats).
  explicit BusyBudget(std::chrono::nanoseconds per_second = std::chrono::nanoseconds(0))
      : per_second_(per_second) {}

  bool enabled() const { return per_second_.count() > 0; }
  std::chrono::nanoseconds per_second() const { return per_second_; }

  void Charge(uid_t uid, std::chrono::nanoseconds busy, Clock::time_point now);
  // The uid's requests in flight now (its demand), kept up to date by the
  // server.
  void SetInFlight(uid_t uid, uint64_t n, Clock::time_point now);
  bool Throttled(uid_t uid, Clock::time_point now);
  // The earliest time Throttled(uid) may turn false (its bucket back at
  // zero); `now` when it is not throttled.
  Clock::time_point RefilledAt(uid_t uid, Clock::time_point now);

  // Busy time charged to `uid` in all (ns), and the times a caller asked
  // Throttled and was told yes.
  uint64_t charged_ns(uid_t uid) const;
  uint64_t throttled() const { return throttled_; }

 private:
  struct Account {
    int64_t balance_ns = 0;  // the bucket; starts full (set on first use)
    uint64_t total_ns = 0;   // all charges
    uint64_t in_flight = 0;
    Clock::time_point updated;  // of balance_ns
    Clock::time_point last_charge;
  };
  Account& Get(uid_t uid, Clock::time_point now);
  void Advance(Account& a, Clock::time_point now) const;
  int64_t capacity_ns() const { return per_second_.count() / 10; }
  void Prune(Clock::time_point now);

  std::chrono::nanoseconds per_second_;
  std::unordered_map<uid_t, Account> accounts_;
  uint64_t throttled_ = 0;
  uint64_t charges_since_prune_ = 0;
};

}  // namespace cxlpool
