// TieringPolicy: which ranges of which leases move between fast memory
// (DRAM) and slow memory (CXL), and why. Pure logic over a snapshot: the
// engine (engine.h) feeds it temperatures, pools and rates, and carries out
// what it decides. Every decision, and every range that stays, comes with a
// sentence saying why (shown by `cxlpoolctl tiering`).
//
// The rules, in the order decisions are made (docs/daemon.md, "Tiering"):
//  1. Urgent hints first: a `will_need` range is promoted now, a
//     `dont_need` range demoted now (room permitting), whatever their
//     temperature and whether or not DRAM is under pressure.
//  2. Pressure: a fast pool whose free bytes are below its low watermark
//     demotes cold ranges (temperature <= cold threshold) until its free
//     bytes would reach the high watermark; lowest priority class first,
//     then coldest first.
//  3. Promotion: a hot range (temperature >= hot threshold) that is not on
//     the fast pool nearest its holder's GPU moves there, when that leaves
//     the pool at or above its low watermark; highest priority class first,
//     then hottest first.
//  4. Demand: a hot range that found no room may make room by demoting
//     ranges of the same or a lower priority class from that pool that are
//     cold, or `swap_ratio` times colder than it (so that when every range
//     is warm, the hottest still get DRAM; the ratio is the hysteresis).
// Hysteresis: a range between the cold and the hot threshold never moves;
// a range that moved stays put for `min_residency`; and a demotion target
// keeps `slow_reserve` of itself free. Opted-out leases (pinned to their
// tier), leases whose memory cannot move (devdax, not handed back after a
// restart, a move already under way) and cooperative leases whose holders
// did not answer recently are left where they are, each with its reason.
// The rate limit: a decision is made only while `budget_bytes` still holds
// the whole range (a range is never split); the others wait for it.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tiering/temperature.h"

namespace cxlpool::tiering {

// Which side of the tiering a pool is on.
enum class TierClass { kFast, kSlow, kOther };
const char* TierClassName(TierClass t);  // "fast", "slow", "other"
// dram -> fast; cxl, nvm -> slow; anything else (hbm, devdax, unknown) -> other.
TierClass TierClassOfKind(const std::string& kind, bool movable_backing);

struct PolicyConfig {
  double hot_threshold = 1.0;                 // temperature at or above which a range is hot
  double cold_threshold = 0.1;                // at or below which it is cold (< hot_threshold)
  int64_t min_residency_ns = 30'000'000'000;  // after a move, no other for this long
  // Fast pools: pressure below low, demotions aim for high (fractions of
  // the pool's capacity that are free; low <= high).
  double fast_low_watermark = 0.10;
  double fast_high_watermark = 0.20;
  // Slow pools keep this fraction free (room for new grants).
  double slow_reserve = 0.02;
  // Rule 4: a range at most 1/swap_ratio as hot as a hot range that wants
  // its room may be demoted for it. 0: only cold ranges make room.
  double swap_ratio = 4.0;
};

// INVALID_ARGUMENT-style text when the config is inconsistent, "" when fine.
std::string CheckPolicyConfig(const PolicyConfig& c);

struct PoolState {
  std::string name;
  int numa_node = -1;
  std::string kind;
  TierClass tier = TierClass::kOther;
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
};

struct UnitState {
  uint64_t lease_id = 0;
  uint32_t unit = 0;  // index in the lease (an extent; 0 for a one-memfd lease)
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string pool;  // where it is accounted now
  double temperature = 0;
  std::optional<Hint> urgent;       // kWillNeed or kDontNeed, still pending
  int32_t priority = 0;             // the owner's priority class (quota.h)
  bool opted_out = false;           // pinned to its tier by the holder or an admin
  std::string not_movable;          // "" movable; else why not
  bool cooperative = false;         // holders must drop long-term pins first
  std::string cooperative_blocked;  // "" may ask now; else why not yet
  int64_t last_moved_ns = 0;        // 0: never moved
  std::string promote_pool;         // fast pool nearest its holder's GPU ("" none)
  std::string demote_pool;          // slow pool nearest its current pool ("" none)
  std::string evidence;             // the signals behind the temperature, for `why`
};

enum class Direction { kPromote, kDemote };
const char* DirectionName(Direction d);  // "promote", "demote"

struct Decision {
  Direction direction = Direction::kPromote;
  uint64_t lease_id = 0;
  uint32_t unit = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string from_pool;
  std::string to_pool;
  bool cooperative = false;
  std::string rule;  // "will_need", "dont_need", "pressure", "hot", "demand"
  std::string why;
};

struct PolicyOutput {
  std::vector<Decision> decisions;  // in the order they should run
  // Ranges that stay, with why, keyed by (lease id, unit).
  std::map<std::pair<uint64_t, uint32_t>, std::string> stays;
  // One line per fast pool: its free bytes against its watermarks.
  std::vector<std::string> pressure;
};

// Decides. With `budget_bytes` below a range's size that range waits for the
// rate limit (and says so); pass INT64_MAX / 2 for no limit.
PolicyOutput Decide(const PolicyConfig& config, const std::vector<PoolState>& pools,
                    const std::vector<UnitState>& units, int64_t now_ns, int64_t budget_bytes);

}  // namespace cxlpool::tiering
