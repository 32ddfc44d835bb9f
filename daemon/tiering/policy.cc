#include "tiering/policy.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "cxlpool/common/strings.h"

namespace cxlpool::tiering {

const char* TierClassName(TierClass t) {
  switch (t) {
    case TierClass::kFast:
      return "fast";
    case TierClass::kSlow:
      return "slow";
    case TierClass::kOther:
      return "other";
  }
  return "?";
}

TierClass TierClassOfKind(const std::string& kind, bool movable_backing) {
  if (!movable_backing) return TierClass::kOther;
  if (kind == "dram") return TierClass::kFast;
  if (kind == "cxl" || kind == "nvm") return TierClass::kSlow;
  return TierClass::kOther;
}

const char* DirectionName(Direction d) { return d == Direction::kPromote ? "promote" : "demote"; }

std::string CheckPolicyConfig(const PolicyConfig& c) {
  if (!(c.cold_threshold >= 0) || !(c.hot_threshold > c.cold_threshold)) {
    return "hot_threshold must be greater than cold_threshold (and cold_threshold >= 0)";
  }
  if (!(c.fast_low_watermark >= 0) || !(c.fast_high_watermark >= c.fast_low_watermark) ||
      !(c.fast_high_watermark < 1)) {
    return "watermarks must satisfy 0 <= low <= high < 100%";
  }
  if (!(c.slow_reserve >= 0) || !(c.slow_reserve < 1)) return "slow_reserve must be in [0, 100%)";
  if (c.min_residency_ns < 0) return "min_residency must not be negative";
  if (!(c.swap_ratio == 0 || c.swap_ratio >= 1)) return "swap_ratio must be 0 (off) or >= 1";
  return "";
}

namespace {

using Key = std::pair<uint64_t, uint32_t>;

std::string Describe(const UnitState& u) {
  std::string s = "lease " + std::to_string(u.lease_id);
  if (u.unit != 0 || u.offset != 0) {
    s += " extent " + std::to_string(u.unit) + " [" + HumanBytes(u.offset) + ", " +
         HumanBytes(u.offset + u.length) + ")";
  }
  return s + " (" + HumanBytes(u.length) + ")";
}

std::string Temp(double t) { return FormatTemperature(t); }

std::string Seconds(int64_t ns) {
  return std::to_string((ns + 500'000'000) / 1'000'000'000) + " s";
}

class Planner {
 public:
  Planner(const PolicyConfig& c, const std::vector<PoolState>& pools, int64_t now, int64_t budget)
      : c_(c), now_(now), budget_(budget) {
    for (const auto& p : pools) {
      proj_[p.name] = Projected{&p, static_cast<int64_t>(p.free_bytes)};
    }
  }

  PolicyOutput out;

  const PoolState* Pool(const std::string& name) const {
    auto it = proj_.find(name);
    return it == proj_.end() ? nullptr : it->second.pool;
  }
  int64_t Free(const std::string& name) const {
    auto it = proj_.find(name);
    return it == proj_.end() ? 0 : it->second.free;
  }
  int64_t Low(const PoolState& p) const {
    return Fraction(p.capacity_bytes, c_.fast_low_watermark);
  }
  int64_t High(const PoolState& p) const {
    return Fraction(p.capacity_bytes, c_.fast_high_watermark);
  }
  int64_t Keep(const PoolState& p) const {
    return p.tier == TierClass::kFast ? Low(p) : Fraction(p.capacity_bytes, c_.slow_reserve);
  }
  // Would `to` keep its watermark (fast) or reserve (slow) after taking u?
  bool Fits(const UnitState& u, const std::string& to) const {
    const PoolState* p = Pool(to);
    return p != nullptr && Free(to) - static_cast<int64_t>(u.length) >= Keep(*p);
  }
  std::string RoomText(const UnitState& u, const std::string& to) const {
    const PoolState* p = Pool(to);
    if (p == nullptr) return "pool " + to + " is unknown";
    int64_t free = std::max<int64_t>(Free(to), 0);
    return to + " has " + HumanBytes(static_cast<uint64_t>(free)) + " free, needs " +
           HumanBytes(u.length) + " + " + HumanBytes(static_cast<uint64_t>(Keep(*p))) +
           (p->tier == TierClass::kFast ? " (low watermark)" : " (reserve)");
  }

  bool Decided(const UnitState& u) const { return decided_.count(Key{u.lease_id, u.unit}) != 0; }

  // Why `u` cannot move at all this round, or "".
  std::string Blocked(const UnitState& u) const {
    if (u.opted_out) return "opted out: pinned to its tier";
    if (!u.not_movable.empty()) return u.not_movable;
    if (u.cooperative && !u.cooperative_blocked.empty()) return u.cooperative_blocked;
    if (u.last_moved_ns != 0 && now_ - u.last_moved_ns < c_.min_residency_ns) {
      return "moved " + Seconds(now_ - u.last_moved_ns) + " ago; stays at least " +
             Seconds(c_.min_residency_ns) + " (min_residency)";
    }
    return "";
  }

  void Stay(const UnitState& u, std::string why) {
    auto& slot = out.stays[Key{u.lease_id, u.unit}];
    if (slot.empty()) slot = std::move(why);
  }

  // Records a move; false (and a "waits" stay) when the rate budget is spent.
  bool Emit(const UnitState& u, Direction dir, const std::string& to, std::string rule,
            std::string why) {
    if (budget_ < static_cast<int64_t>(u.length)) {
      Stay(u, "would " + std::string(DirectionName(dir)) + " to " + to + " (" + why +
                  "); waits for the rate limit");
      return false;
    }
    budget_ -= static_cast<int64_t>(u.length);
    proj_[u.pool].free += static_cast<int64_t>(u.length);
    proj_[to].free -= static_cast<int64_t>(u.length);
    decided_.insert(Key{u.lease_id, u.unit});
    out.stays.erase(Key{u.lease_id, u.unit});
    Decision d;
    d.direction = dir;
    d.lease_id = u.lease_id;
    d.unit = u.unit;
    d.offset = u.offset;
    d.length = u.length;
    d.from_pool = u.pool;
    d.to_pool = to;
    d.cooperative = u.cooperative;
    d.rule = std::move(rule);
    d.why = std::string(DirectionName(dir)) + " " + Describe(u) + " " + u.pool + " -> " + to +
            ": " + why + (u.evidence.empty() ? "" : " [" + u.evidence + "]") +
            (u.cooperative ? "; its holders drop their long-term pins first (cooperative)" : "");
    out.decisions.push_back(std::move(d));
    return true;
  }

  std::string TempWhy(const UnitState& u) const {
    return "temperature " + Temp(u.temperature) + ", priority " + std::to_string(u.priority);
  }
  // "temperature 3.20 >= hot 1.00, priority 5"
  std::string TempVs(const UnitState& u, const char* op, const char* name, double v) const {
    return "temperature " + Temp(u.temperature) + " " + op + " " + name + " " + Temp(v) +
           ", priority " + std::to_string(u.priority);
  }

  const PolicyConfig& c_;

 private:
  struct Projected {
    const PoolState* pool = nullptr;
    int64_t free = 0;
  };
  static int64_t Fraction(uint64_t capacity, double f) {
    return static_cast<int64_t>(static_cast<double>(capacity) * f);
  }
  int64_t now_;
  int64_t budget_;
  std::map<std::string, Projected> proj_;
  std::set<Key> decided_;
};

bool OnFast(const Planner& p, const UnitState& u) {
  const PoolState* pool = p.Pool(u.pool);
  return pool != nullptr && pool->tier == TierClass::kFast;
}

bool OnSlow(const Planner& p, const UnitState& u) {
  const PoolState* pool = p.Pool(u.pool);
  return pool != nullptr && pool->tier == TierClass::kSlow;
}

// A usable promotion target other than where the range is now.
bool CanPromoteTo(const Planner& p, const UnitState& u) {
  if (u.promote_pool.empty() || u.promote_pool == u.pool) return false;
  const PoolState* to = p.Pool(u.promote_pool);
  return to != nullptr && to->tier == TierClass::kFast;
}

bool CanDemoteTo(const Planner& p, const UnitState& u) {
  if (u.demote_pool.empty() || u.demote_pool == u.pool || !OnFast(p, u)) return false;
  const PoolState* to = p.Pool(u.demote_pool);
  return to != nullptr && to->tier == TierClass::kSlow;
}

// The policy's steps over one round, in order (Decide). Each rule looks only
// at the live units no earlier rule decided.
class Round : public Planner {
 public:
  using Planner::Planner;

  // One line per fast pool: its free bytes against its watermarks.
  void DescribePressure(const std::vector<PoolState>& pools) {
    for (const auto& pool : pools) {
      if (pool.tier != TierClass::kFast) continue;
      int64_t low = Low(pool), high = High(pool);
      int64_t free = static_cast<int64_t>(pool.free_bytes);
      out.pressure.push_back(
          pool.name + " (" + pool.kind + "): " + HumanBytes(pool.free_bytes) + " free of " +
          HumanBytes(pool.capacity_bytes) + "; low watermark " +
          HumanBytes(static_cast<uint64_t>(low)) + ", high " +
          HumanBytes(static_cast<uint64_t>(high)) +
          (free < low ? ": under pressure, demoting cold ranges" : ": no pressure"));
    }
  }

  // Whatever cannot move at all says so first; the rules below skip it.
  void FilterBlocked(const std::vector<UnitState>& units) {
    for (const auto& u : units) {
      std::string b = Blocked(u);
      if (!b.empty()) {
        Stay(u, b);
        continue;
      }
      live_.push_back(&u);
    }
  }

  // 1. Urgent hints.
  void UrgentRules() {
    for (const UnitState* u :
         Sorted([](const UnitState& x) { return x.urgent == Hint::kWillNeed; }, true)) {
      if (!CanPromoteTo(*this, *u)) {
        Stay(*u, u->promote_pool == u->pool || u->promote_pool.empty()
                     ? "will_need: already on the fast pool nearest its holder"
                     : "will_need: no fast pool to promote to");
        continue;
      }
      if (Fits(*u, u->promote_pool)) {
        Emit(*u, Direction::kPromote, u->promote_pool, "will_need",
             "will_need hint; " + TempWhy(*u));
      } else {
        wanting_.push_back(u);
      }
    }
    for (const UnitState* u :
         Sorted([](const UnitState& x) { return x.urgent == Hint::kDontNeed; }, false)) {
      if (!CanDemoteTo(*this, *u)) {
        Stay(*u, OnFast(*this, *u) ? "dont_need: no slow pool to demote to"
                                   : "dont_need: already off fast memory");
        continue;
      }
      if (Fits(*u, u->demote_pool)) {
        Emit(*u, Direction::kDemote, u->demote_pool, "dont_need", "dont_need hint; " + TempWhy(*u));
      } else {
        Stay(*u, "dont_need, but " + RoomText(*u, u->demote_pool));
      }
    }
  }

  // 2. Pressure on fast pools.
  void PressureRule(const std::vector<PoolState>& pools) {
    const double cold = c_.cold_threshold;
    for (const auto& pool : pools) {
      if (pool.tier != TierClass::kFast) continue;
      int64_t low = Low(pool);
      if (Free(pool.name) >= low) continue;
      for (const UnitState* u : Sorted(
               [&](const UnitState& x) {
                 return x.pool == pool.name && x.temperature <= cold && CanDemoteTo(*this, x);
               },
               false)) {
        if (Free(pool.name) >= High(pool)) break;
        if (!Fits(*u, u->demote_pool)) {
          Stay(*u, "cold on " + pool.name + " under pressure, but " + RoomText(*u, u->demote_pool));
          continue;
        }
        Emit(*u, Direction::kDemote, u->demote_pool, "pressure",
             pool.name + " is under pressure (" + HumanBytes(pool.free_bytes) +
                 " free < low watermark " + HumanBytes(static_cast<uint64_t>(low)) +
                 ") and the range is cold (" + TempVs(*u, "<=", "cold", cold) + ")");
      }
    }
  }

  // 3. Promotion of hot ranges.
  void HotRule() {
    const double hot = c_.hot_threshold;
    for (const UnitState* u :
         Sorted([&](const UnitState& x) { return x.temperature >= hot && !x.urgent; }, true)) {
      if (!CanPromoteTo(*this, *u)) {
        Stay(*u, u->promote_pool.empty()
                     ? "hot (" + TempWhy(*u) + "), but no fast pool is reachable"
                     : "hot (" + TempWhy(*u) + ") and already on " + u->pool +
                           ", the fast pool nearest its holder");
        continue;
      }
      if (Fits(*u, u->promote_pool)) {
        Emit(*u, Direction::kPromote, u->promote_pool, "hot",
             "hot (" + TempVs(*u, ">=", "hot", hot) + ") and " + u->promote_pool +
                 " is the fast pool nearest its holder");
      } else {
        wanting_.push_back(u);
      }
    }
  }

  // 4. Demand: demote colder ranges of the same or a lower class to make room.
  void DemandRule() {
    std::stable_sort(wanting_.begin(), wanting_.end(), [](const UnitState* a, const UnitState* b) {
      if (a->priority != b->priority) return a->priority > b->priority;
      return a->temperature > b->temperature;
    });
    for (const UnitState* w : wanting_) MakeRoomFor(*w);
  }

  // Everything else stays; say why.
  void ExplainStays() {
    const double hot = c_.hot_threshold;
    const double cold = c_.cold_threshold;
    for (const UnitState* u : live_) {
      if (Decided(*u)) continue;
      if (u->temperature > cold && u->temperature < hot) {
        Stay(*u, "temperature " + Temp(u->temperature) + " is between cold " + Temp(cold) +
                     " and hot " + Temp(hot) + ": stays (hysteresis)");
      } else if (u->temperature <= cold && OnSlow(*this, *u)) {
        Stay(*u, "cold (" + Temp(u->temperature) + ") and already on slow memory");
      } else if (u->temperature <= cold && OnFast(*this, *u)) {
        const PoolState* pool = Pool(u->pool);
        if (!CanDemoteTo(*this, *u)) {
          Stay(*u, "cold (" + Temp(u->temperature) + "), but no slow pool to demote to");
        } else {
          Stay(*u, "cold (" + Temp(u->temperature) + "), but " + u->pool +
                       " is not under pressure (" + HumanBytes(pool->free_bytes) +
                       " free >= low watermark " + HumanBytes(static_cast<uint64_t>(Low(*pool))) +
                       ")");
        }
      } else {
        Stay(*u, "stays (" + TempWhy(*u) + ")");
      }
    }
  }

 private:
  // The live units not decided yet that match `pred`: by priority, then
  // temperature (highest first or lowest first), then id.
  template <typename Pred>
  std::vector<const UnitState*> Sorted(Pred pred, bool high_priority_first) const {
    std::vector<const UnitState*> v;
    for (const UnitState* u : live_) {
      if (!Decided(*u) && pred(*u)) v.push_back(u);
    }
    std::stable_sort(v.begin(), v.end(), [&](const UnitState* a, const UnitState* b) {
      if (a->priority != b->priority) {
        return high_priority_first ? a->priority > b->priority : a->priority < b->priority;
      }
      if (a->temperature != b->temperature) {
        return high_priority_first ? a->temperature > b->temperature
                                   : a->temperature < b->temperature;
      }
      return std::tie(a->lease_id, a->unit) < std::tie(b->lease_id, b->unit);
    });
    return v;
  }

  // Rule 4 for one hot range `w` that found no room on its fast pool.
  void MakeRoomFor(const UnitState& w) {
    const double hot = c_.hot_threshold;
    const double cold = c_.cold_threshold;
    const std::string& to = w.promote_pool;
    const PoolState* tp = Pool(to);
    int64_t need = static_cast<int64_t>(w.length) + Keep(*tp) - Free(to);
    std::vector<const UnitState*> victims;
    int64_t found = 0;
    const double swap = c_.swap_ratio;
    auto colder = [&](const UnitState& x) {
      return x.temperature <= cold || (swap > 0 && x.temperature * swap <= w.temperature);
    };
    for (const UnitState* v : Sorted(
             [&](const UnitState& x) {
               return x.pool == to && colder(x) && x.priority <= w.priority &&
                      CanDemoteTo(*this, x) && Fits(x, x.demote_pool);
             },
             false)) {
      if (found >= need) break;
      victims.push_back(v);
      found += static_cast<int64_t>(v->length);
    }
    if (found < need) {
      Stay(w, "hot (" + TempWhy(w) + "), but " + RoomText(w, to) +
                  "; ranges of priority <= " + std::to_string(w.priority) +
                  " there that are cold or " + Temp(swap) + "x colder hold " +
                  HumanBytes(static_cast<uint64_t>(found)) + ", not enough to make room");
      return;
    }
    bool all = true;
    for (const UnitState* v : victims) {
      if (!Fits(*v, v->demote_pool)) {
        Stay(*v, "cold, but " + RoomText(*v, v->demote_pool));
        all = false;
        continue;
      }
      std::string why = v->temperature <= cold
                            ? "this range is cold (" + TempVs(*v, "<=", "cold", cold) + ")"
                            : "this range is " + Temp(w.temperature / v->temperature) +
                                  "x colder (temperature " + Temp(v->temperature) + " vs " +
                                  Temp(w.temperature) + "; swap_ratio " + Temp(swap) + ")";
      all = Emit(*v, Direction::kDemote, v->demote_pool, "demand",
                 "makes room on " + to + " for hot lease " + std::to_string(w.lease_id) +
                     " (priority " + std::to_string(w.priority) + "); " + why) &&
            all;
    }
    if (!all) return;
    Emit(w, Direction::kPromote, to, w.urgent == Hint::kWillNeed ? "will_need" : "hot",
         (w.urgent == Hint::kWillNeed ? "will_need hint; " + TempWhy(w)
                                      : "hot (" + TempVs(w, ">=", "hot", hot) + ")") +
             ", after colder ranges make room on " + to);
  }

  std::vector<const UnitState*> live_;
  // Hot ranges (and will_need ones) that found no room, for rule 4.
  std::vector<const UnitState*> wanting_;
};

}  // namespace

PolicyOutput Decide(const PolicyConfig& config, const std::vector<PoolState>& pools,
                    const std::vector<UnitState>& units, int64_t now_ns, int64_t budget_bytes) {
  Round r(config, pools, now_ns, budget_bytes);
  r.DescribePressure(pools);
  r.FilterBlocked(units);
  r.UrgentRules();
  r.PressureRule(pools);
  r.HotRule();
  r.DemandRule();
  r.ExplainStays();
  return std::move(r.out);
}

}  // namespace cxlpool::tiering
