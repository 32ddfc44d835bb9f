#include "tiering/round_planner.h"

#include <algorithm>
#include <climits>
#include <map>
#include <utility>

#include "tiering/migration_log.h"

namespace cxlpool::tiering {

RoundPlanner::RoundPlanner(LeaseTable* table, LeaseBook* book, MoveRunner* runner,
                           RateLimiter* limiter, const Clock* clock, const TieringOptions& options,
                           std::function<void(int64_t)> schedule_round)
    : table_(table),
      book_(book),
      runner_(runner),
      limiter_(limiter),
      clock_(clock),
      options_(options),
      schedule_round_(std::move(schedule_round)) {}

std::vector<PoolState> RoundPlanner::RefreshPools() {
  std::vector<PoolState> ps;
  std::map<std::string, int> nodes;
  for (const PoolFacts& p : table_->Pools()) {
    nodes[p.name] = p.numa_node;
    PoolState s;
    s.name = p.name;
    s.numa_node = p.numa_node;
    s.kind = p.kind;
    s.tier = TierClassOfKind(p.kind, p.movable);
    s.capacity_bytes = p.capacity_bytes;
    s.free_bytes = p.free_bytes;
    ps.push_back(std::move(s));
  }
  runner_->SetPoolNodes(std::move(nodes));
  return ps;
}

std::string RoundPlanner::CooperativeBlocked(const LeaseFacts& f, const LeaseBook::LeaseTrack& t,
                                             uint64_t length, int64_t now) const {
  if (now < t.coop_retry_ns) return t.coop_why + "; next try in " + Secs(t.coop_retry_ns - now);
  if (t.pinned_by.empty()) {
    return "long-term pinned, and no holder takes part in cooperative migration "
           "(cxlpool_lease_set_migration_callback, or a CUDA registration by libcxlpool)";
  }
  // The holders map the lease as one range: every unit of it moves in the one pause.
  const uint64_t paused = f.units.size() > 1 ? f.size_bytes : length;
  int64_t pause = static_cast<int64_t>(static_cast<double>(paused) * 1e9 / runner_->measured_bps());
  if (pause > options_.max_pause_ns) {
    return "moving it would pause its holders about " + Secs(pause) + " (max_pause " +
           Secs(options_.max_pause_ns) + ")";
  }
  return "";
}

std::vector<UnitState> RoundPlanner::UnitStates(const std::vector<LeaseFacts>& leases,
                                                int64_t now) {
  std::vector<UnitState> us;
  const MoveRunner::Move* move = runner_->current();
  for (const LeaseFacts& f : leases) {
    LeaseBook::LeaseTrack& t = book_->Track(f);
    const bool coop = f.long_term_pin || !t.pinned_by.empty();
    for (uint32_t i = 0; i < f.units.size(); ++i) {
      LeaseBook::UnitTrack& ut = t.units[i];
      if (ut.urgent && now - ut.urgent_ns >= options_.urgent_ttl_ns) ut.urgent.reset();
      UnitState u;
      u.lease_id = f.id;
      u.unit = i;
      u.offset = f.units[i].offset;
      u.length = f.units[i].length;
      u.pool = f.units[i].pool;
      u.temperature = book_->Temperature(ut);
      u.urgent = ut.urgent;
      u.priority = f.priority;
      u.opted_out = t.opted_out;
      u.not_movable = f.not_movable;
      if (u.not_movable.empty() && move != nullptr && move->d.lease_id == f.id) {
        u.not_movable = "a move of this lease is under way";
      }
      if (u.not_movable.empty() && !f.moving_to.empty()) {
        u.not_movable = "an unfinished move of unit " + std::to_string(f.moving_unit) + " to " +
                        f.moving_to + " comes first" +
                        (f.moving_note.empty() ? "" : " (" + f.moving_note + ")");
      }
      if (u.not_movable.empty() && !runner_->off().empty()) {
        u.not_movable = "moves are off: " + runner_->off();
      }
      if (u.not_movable.empty() && now < ut.refused_until_ns) u.not_movable = ut.refused_why;
      u.cooperative = coop;
      if (coop) u.cooperative_blocked = CooperativeBlocked(f, t, u.length, now);
      u.last_moved_ns = ut.last_moved_ns;
      u.promote_pool = f.promote_pool;
      u.demote_pool = f.demote_pool;
      u.evidence = book_->Evidence(ut);
      us.push_back(std::move(u));
    }
  }
  return us;
}

void RoundPlanner::Plan(const std::vector<LeaseFacts>& leases, bool urgent_only) {
  const int64_t now = clock_->MonotonicNs();
  std::vector<PoolState> ps = RefreshPools();
  std::vector<UnitState> us = UnitStates(leases, now);

  // A full bucket lets the next range go whatever its size; else what it holds.
  double avail = limiter_->Available(now);
  int64_t budget = limiter_->Full(now) ? INT64_MAX / 2
                   : avail >= 1        ? static_cast<int64_t>(std::min(avail, 4e18))
                                       : 0;
  PolicyOutput out = Decide(options_.policy, ps, us, now, budget);
  if (urgent_only) {
    // Only what the hints asked for: the other rules need every lease.
    std::erase_if(out.decisions,
                  [](const Decision& d) { return d.rule != "will_need" && d.rule != "dont_need"; });
  }
  pressure_ = out.pressure;
  const bool idle = runner_->current() == nullptr && runner_->off().empty();
  book_->SetVerdicts(out, idle);
  if (!idle) return;

  if (ResumeUnfinished(leases, now)) return;
  BeginFirst(out, leases, now);
}

void RoundPlanner::BeginFirst(const PolicyOutput& out, const std::vector<LeaseFacts>& leases,
                              int64_t now) {
  if (out.decisions.empty()) return;
  const Decision& d = out.decisions.front();
  auto fit = std::find_if(leases.begin(), leases.end(),
                          [&](const LeaseFacts& f) { return f.id == d.lease_id; });
  if (fit == leases.end()) return;
  if (!limiter_->TryTake(d.length, now)) {
    schedule_round_(limiter_->NsUntil(d.length, now));
    return;
  }
  std::vector<uint32_t> also;
  for (size_t i = 1; i < out.decisions.size(); ++i) {
    const Decision& o = out.decisions[i];
    if (o.lease_id == d.lease_id && o.to_pool == d.to_pool && o.unit != d.unit) {
      also.push_back(o.unit);
    }
  }
  runner_->Begin(d, *fit, false, also);
}

bool RoundPlanner::ResumeUnfinished(const std::vector<LeaseFacts>& leases, int64_t now) {
  // A move someone began and nobody finished (a daemon killed mid-migration):
  // finish it before anything new.
  for (const LeaseFacts& f : leases) {
    if (f.moving_to.empty() || !f.not_movable.empty()) continue;
    if (f.moving_unit >= f.units.size()) continue;
    LeaseBook::LeaseTrack& t = book_->Slot(f.id);
    if (now < t.units[f.moving_unit].refused_until_ns) continue;
    if (now < t.coop_retry_ns && (f.long_term_pin || !t.pinned_by.empty())) continue;
    Decision d;
    d.direction = Direction::kPromote;
    const UnitFacts& uf = f.units[f.moving_unit];
    d.lease_id = f.id;
    d.unit = f.moving_unit;
    d.offset = uf.offset;
    d.length = uf.length;
    d.from_pool = uf.pool;
    d.to_pool = f.moving_to;
    d.cooperative = f.long_term_pin || !t.pinned_by.empty();
    if (d.cooperative && t.pinned_by.empty()) d.cooperative = false;
    d.rule = f.moving_back ? "rollback" : "resume";
    const std::string note = f.moving_note.empty() ? "" : " (" + f.moving_note + ")";
    if (f.moving_back) {
      d.why = "move unit " + std::to_string(f.moving_unit) + " of lease " + std::to_string(f.id) +
              " back to " + f.moving_to +
              ", the pool that accounts it, from where an unfinished move left its pages" + note;
    } else {
      d.why = "finish the move of unit " + std::to_string(f.moving_unit) + " of lease " +
              std::to_string(f.id) + " from " + uf.pool + " to " + f.moving_to +
              " that was begun and not finished" + note;
    }
    limiter_->Charge(d.length, now);
    runner_->Begin(d, f, true);
    return true;
  }
  return false;
}

}  // namespace cxlpool::tiering
