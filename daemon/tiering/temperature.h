// Temperature and rate: the two small numeric pieces of the tiering engine.
//
// Heat is decayed bytes of access: every access signal (bytes a holder
// copied through the client library's helpers, the share of pages the
// kernel's sampler saw accessed, a hint) adds bytes, and the sum halves
// every `half_life`. A range's temperature is its heat per byte of the
// range: 1.0 means "the equivalent of one full pass over the range within
// about one half-life". Thresholds (policy.h) are in those units, so they
// do not depend on the range's size.
//
// RateLimiter is a token bucket in bytes per second, like the kernel's
// numa_balancing_promote_rate_limit_MBps: tokens accrue at `rate` up to
// `burst`; a migration may start once the bucket holds its size (a range
// larger than the burst: once the bucket is full) and takes its whole size,
// which may leave the bucket in debt (a range is never split to fit the
// budget), so the long-run average stays at or below `rate`.
//
// Thread safety: values; no synchronisation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cxlpool::tiering {

// What an application may say about a range of a lease (cxlpool_lease_hint).
// The values are the wire's and the C ABI's (CXLPOOL_HINT_*).
enum class Hint : int {
  kHot = 1,       // keep it in fast memory: raises the temperature
  kCold = 2,      // may go to slow memory under pressure: temperature to 0
  kWillNeed = 3,  // needed soon: promote now, ahead of the others
  kDontNeed = 4,  // not needed for a while: demote now, pressure or not
};
const char* HintName(Hint h);  // "hot", "cold", "will_need", "dont_need"
std::optional<Hint> HintFromInt(int v);
std::optional<Hint> ParseHint(std::string_view name);

class Heat {
 public:
  // Adds `bytes` of access at `now_ns` (decaying what was there first).
  void Add(double bytes, int64_t now_ns, int64_t half_life_ns);
  // Sets the heat (a hint), as of `now_ns`.
  void Set(double bytes, int64_t now_ns);
  // The decayed heat at `now_ns` (never negative).
  double At(int64_t now_ns, int64_t half_life_ns) const;

 private:
  double bytes_ = 0;
  int64_t at_ns_ = 0;
};

class RateLimiter {
 public:
  // rate 0: unlimited. burst 0: one second of rate.
  RateLimiter(uint64_t bytes_per_s, uint64_t burst_bytes, int64_t now_ns);
  // True (and `bytes` taken) when the bucket holds min(bytes, burst).
  bool TryTake(uint64_t bytes, int64_t now_ns);
  // Takes `bytes` whatever the balance (a move that had to run: a resumed
  // one, a rollback): it still counts against the rate.
  void Charge(uint64_t bytes, int64_t now_ns);
  // Tokens now (negative: debt).
  double Available(int64_t now_ns);
  // Nanoseconds until TryTake(bytes) would succeed (0: now).
  int64_t NsUntil(uint64_t bytes, int64_t now_ns);
  // The bucket is full: the next range may be of any size.
  bool Full(int64_t now_ns);
  uint64_t rate() const { return rate_; }
  void SetRate(uint64_t bytes_per_s, uint64_t burst_bytes, int64_t now_ns);

 private:
  void Refill(int64_t now_ns);
  uint64_t rate_;
  double burst_;
  double tokens_;
  int64_t at_ns_;
};

// "1.25", "0.003", "12.5" for display: three significant digits.
std::string FormatTemperature(double t);

}  // namespace cxlpool::tiering
