// RoundPlanner: what one round decides. It reads the pools, turns each
// unit's track into the policy's input (UnitState: temperature, urgent hint,
// why it cannot move), asks the policy (policy.h, Decide), writes the
// verdicts into the LeaseBook and, when no move runs, starts one: an
// unfinished move first, else the first decision, within the rate limit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cxlpool/common/clock.h"
#include "tiering/engine_types.h"
#include "tiering/lease_book.h"
#include "tiering/lease_table.h"
#include "tiering/move_runner.h"
#include "tiering/policy.h"
#include "tiering/temperature.h"

namespace cxlpool::tiering {

class RoundPlanner {
 public:
  // `schedule_round`: the periodic round in this many ns (the rate limit's wait).
  RoundPlanner(LeaseTable* table, LeaseBook* book, MoveRunner* runner, RateLimiter* limiter,
               const Clock* clock, const TieringOptions& options,
               std::function<void(int64_t)> schedule_round);

  // Decides over `leases` (all of them, or only those urgent hints queued:
  // `urgent_only`, which keeps only the urgent rules' decisions); starts a
  // move when none runs.
  void Plan(const std::vector<LeaseFacts>& leases, bool urgent_only);
  // The last round's line per fast pool.
  const std::vector<std::string>& pressure() const { return pressure_; }

 private:
  std::vector<PoolState> RefreshPools();
  std::vector<UnitState> UnitStates(const std::vector<LeaseFacts>& leases, int64_t now);
  // Why the cooperative move of a unit of `f` may not be asked for now ("" may).
  std::string CooperativeBlocked(const LeaseFacts& f, const LeaseBook::LeaseTrack& t,
                                 uint64_t length, int64_t now) const;
  // An unfinished move (a daemon killed mid-migration) among `leases`, begun again.
  bool ResumeUnfinished(const std::vector<LeaseFacts>& leases, int64_t now);
  // The first decision, begun with the same pool's other units of its lease.
  void BeginFirst(const PolicyOutput& out, const std::vector<LeaseFacts>& leases, int64_t now);

  LeaseTable* table_;
  LeaseBook* book_;
  MoveRunner* runner_;
  RateLimiter* limiter_;
  const Clock* clock_;
  const TieringOptions& options_;
  std::function<void(int64_t)> schedule_round_;
  std::vector<std::string> pressure_;
};

}  // namespace cxlpool::tiering
