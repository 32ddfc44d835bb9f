#include "tiering/lease_book.h"

#include <algorithm>
#include <utility>

#include "cxlpool/common/strings.h"

namespace cxlpool::tiering {

uint64_t Overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
  uint64_t lo = std::max(a, b), hi = std::min(a + alen, b + blen);
  return hi > lo ? hi - lo : 0;
}

LeaseBook::LeaseTrack& LeaseBook::Track(const LeaseFacts& f) {
  LeaseTrack& t = tracks_[f.id];
  SyncUnits(t, f);
  return t;
}

const LeaseBook::LeaseTrack* LeaseBook::Find(uint64_t id) const {
  auto it = tracks_.find(id);
  return it == tracks_.end() ? nullptr : &it->second;
}

LeaseBook::UnitTrack* LeaseBook::Unit(uint64_t id, uint32_t unit) {
  auto it = tracks_.find(id);
  if (it == tracks_.end() || unit >= it->second.units.size()) return nullptr;
  return &it->second.units[unit];
}

void LeaseBook::SyncUnits(LeaseTrack& t, const LeaseFacts& f) {
  bool same = t.units.size() == f.units.size();
  for (size_t i = 0; same && i < f.units.size(); ++i) {
    same = t.units[i].offset == f.units[i].offset && t.units[i].length == f.units[i].length;
  }
  if (same) return;
  // The lease was cut differently (extents): carry the heat over by overlap.
  int64_t now = clock_->MonotonicNs();
  std::vector<UnitTrack> units(f.units.size());
  for (size_t i = 0; i < f.units.size(); ++i) {
    UnitTrack& n = units[i];
    n.offset = f.units[i].offset;
    n.length = f.units[i].length;
    double heat = 0;
    for (const UnitTrack& o : t.units) {
      uint64_t ov = Overlap(n.offset, n.length, o.offset, o.length);
      if (ov == 0 || o.length == 0) continue;
      heat += o.heat.At(now, options_.half_life_ns) * static_cast<double>(ov) /
              static_cast<double>(o.length);
      n.last_moved_ns = std::max(n.last_moved_ns, o.last_moved_ns);
      n.last_moved_unix = std::max(n.last_moved_unix, o.last_moved_unix);
    }
    n.heat.Set(heat, now);
  }
  t.units = std::move(units);
}

double LeaseBook::Temperature(const UnitTrack& u) const {
  if (u.length == 0) return 0;
  return u.heat.At(clock_->MonotonicNs(), options_.half_life_ns) / static_cast<double>(u.length);
}

std::string LeaseBook::Evidence(const UnitTrack& u) const {
  std::string s;
  if (u.bytes_read + u.bytes_written != 0) {
    s += "holders copied " + HumanBytes(u.bytes_written) + " in, " + HumanBytes(u.bytes_read) +
         " out since start";
  }
  if (u.hints != 0) s += std::string(s.empty() ? "" : "; ") + std::to_string(u.hints) + " hint(s)";
  if (u.sampled != 0) {
    s += std::string(s.empty() ? "" : "; ") + "sampler saw " + std::to_string(u.accessed) + " of " +
         std::to_string(u.sampled) + " sampled pages accessed";
  }
  return s;
}

void LeaseBook::ApplyHint(UnitTrack& u, Hint h, bool whole, int64_t now) {
  const double boost =
      options_.hint_boost * options_.policy.hot_threshold * static_cast<double>(u.length);
  switch (h) {
    case Hint::kHot:
    case Hint::kWillNeed:
      if (u.heat.At(now, options_.half_life_ns) < boost) u.heat.Set(boost, now);
      if (h == Hint::kWillNeed) {
        u.urgent = Hint::kWillNeed;
        u.urgent_ns = now;
      } else if (u.urgent == Hint::kDontNeed) {
        u.urgent.reset();
      }
      break;
    case Hint::kCold:
    case Hint::kDontNeed:
      if (!whole) return;  // a part of the unit may still be in use
      u.heat.Set(0, now);
      if (h == Hint::kDontNeed) {
        u.urgent = Hint::kDontNeed;
        u.urgent_ns = now;
      } else if (u.urgent == Hint::kWillNeed) {
        u.urgent.reset();
      }
      break;
  }
}

void LeaseBook::Signal(const LeaseFacts& f, const RangeSignal& s, bool steers, int64_t now) {
  LeaseTrack& t = Track(f);
  const double bytes = static_cast<double>(s.bytes_read) + static_cast<double>(s.bytes_written);
  for (UnitTrack& u : t.units) {
    uint64_t ov = Overlap(s.offset, s.length, u.offset, u.length);
    if (ov == 0) continue;
    double share = static_cast<double>(ov) / static_cast<double>(s.length);
    if (bytes > 0) u.heat.Add(bytes * share, now, options_.half_life_ns);
    u.bytes_read += static_cast<uint64_t>(static_cast<double>(s.bytes_read) * share);
    u.bytes_written += static_cast<uint64_t>(static_cast<double>(s.bytes_written) * share);
    if (!s.hint) continue;
    ++u.hints;
    if (steers) {
      ApplyHint(u, *s.hint, ov == u.length, now);
    } else if (*s.hint == Hint::kHot || *s.hint == Hint::kWillNeed) {
      // Still in use by another holder: warm (halfway between the
      // thresholds), so never demoted as cold, never hot by this alone.
      const double warm = (options_.policy.cold_threshold + options_.policy.hot_threshold) / 2 *
                          static_cast<double>(u.length);
      if (u.heat.At(now, options_.half_life_ns) < warm) u.heat.Set(warm, now);
    }
  }
}

std::optional<uint64_t> LeaseBook::Sampled(const std::vector<SampleResult>& results) {
  std::optional<uint64_t> pages;
  const int64_t t = clock_->MonotonicNs();
  for (const SampleResult& r : results) {
    UnitTrack* u = Unit(r.lease_id, r.unit);
    if (u == nullptr) continue;
    u->sampled += r.sampled;
    u->accessed += r.accessed;
    if (r.sampled != 0) {
      u->heat.Add(r.AccessedShare() * static_cast<double>(u->length), t, options_.half_life_ns);
    }
    pages = pages.value_or(0) + r.sampled;
  }
  return pages;
}

std::vector<uint64_t> LeaseBook::KeepOnly(const std::set<uint64_t>& live) {
  std::vector<uint64_t> gone;
  for (auto it = tracks_.begin(); it != tracks_.end();) {
    if (live.count(it->first) == 0) {
      gone.push_back(it->first);
      it = tracks_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

void LeaseBook::SetVerdicts(const PolicyOutput& out, bool first_moves) {
  for (size_t i = 0; i < out.decisions.size(); ++i) {
    const Decision& d = out.decisions[i];
    if (UnitTrack* u = Unit(d.lease_id, d.unit)) {
      u->verdict = std::string(i == 0 && first_moves ? "moving: " : "next: ") + d.why;
    }
  }
  for (const auto& [key, why] : out.stays) {
    if (UnitTrack* u = Unit(key.first, key.second)) u->verdict = why;
  }
}

void LeaseBook::DropPins(ConnId conn) {
  for (auto& [id, t] : tracks_) t.pinned_by.erase(conn);
}

void LeaseBook::Refuse(uint64_t id, uint32_t unit, int64_t until, const std::string& why,
                       bool as_verdict) {
  UnitTrack* u = Unit(id, unit);
  if (u == nullptr) return;
  u->refused_until_ns = until;
  u->refused_why = why;
  if (as_verdict) u->verdict = why;
}

void LeaseBook::Moved(uint64_t id, uint32_t unit, Direction direction) {
  UnitTrack* u = Unit(id, unit);
  if (u == nullptr) return;
  u->last_moved_ns = clock_->MonotonicNs();
  u->last_moved_unix = clock_->WallSeconds();
  if ((u->urgent == Hint::kWillNeed && direction == Direction::kPromote) ||
      (u->urgent == Hint::kDontNeed && direction == Direction::kDemote)) {
    u->urgent.reset();
  }
}

void LeaseBook::CoopSkipped(uint64_t id, int64_t until, const std::string& why) {
  auto it = tracks_.find(id);
  if (it == tracks_.end()) return;
  it->second.coop_retry_ns = until;
  it->second.coop_why = why;
}

}  // namespace cxlpool::tiering
