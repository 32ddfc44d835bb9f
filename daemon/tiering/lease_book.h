// LeaseBook: what the engine knows of each lease, per unit: its heat (from
// signals, hints and samples), a pending urgent hint, when it last moved,
// why a move of it was refused, the last verdict; and per lease: the opt-out,
// the holders that declared a cooperative pin, the cooperative back-off.
//
// Heat decays with the half-life; temperature is heat per byte. When a lease
// is cut differently (extents), the heat carries over by overlap.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cxlpool/common/clock.h"
#include "tiering/engine_types.h"
#include "tiering/lease_table.h"
#include "tiering/policy.h"
#include "tiering/sampler.h"
#include "tiering/temperature.h"

namespace cxlpool::tiering {

class LeaseBook {
 public:
  struct UnitTrack {
    uint64_t offset = 0;
    uint64_t length = 0;
    Heat heat;
    std::optional<Hint> urgent;
    int64_t urgent_ns = 0;
    int64_t last_moved_ns = 0;
    int64_t last_moved_unix = 0;
    int64_t refused_until_ns = 0;
    std::string refused_why;
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    uint64_t hints = 0;
    uint64_t sampled = 0;
    uint64_t accessed = 0;
    std::string verdict;
  };
  struct LeaseTrack {
    std::vector<UnitTrack> units;
    bool opted_out = false;
    std::set<ConnId> pinned_by;
    int64_t coop_retry_ns = 0;
    std::string coop_why;
  };

  LeaseBook(const Clock* clock, const TieringOptions& options) : clock_(clock), options_(options) {}

  // The lease's track, its units cut as `f`'s are (made when new).
  LeaseTrack& Track(const LeaseFacts& f);
  // The track of lease `id`, made empty when there is none.
  LeaseTrack& Slot(uint64_t id) { return tracks_[id]; }
  const LeaseTrack* Find(uint64_t id) const;
  UnitTrack* Unit(uint64_t id, uint32_t unit);

  double Temperature(const UnitTrack& u) const;
  // The signals behind a unit's temperature, in words ("" none).
  std::string Evidence(const UnitTrack& u) const;

  // Takes signal `s` on lease `f`. `steers`: its hints act as hints (the
  // owner's, an admin's); else a hot / will_need one only keeps units warm.
  void Signal(const LeaseFacts& f, const RangeSignal& s, bool steers, int64_t now);
  // Adds what a sampling round saw; the pages sampled, nullopt when no
  // result was for a tracked unit.
  std::optional<uint64_t> Sampled(const std::vector<SampleResult>& results);
  // Drops the leases not in `live`; returns their ids.
  std::vector<uint64_t> KeepOnly(const std::set<uint64_t>& live);
  // The round's verdicts: "moving: " on the first decision when `first_moves`.
  void SetVerdicts(const PolicyOutput& out, bool first_moves);
  void DropPins(ConnId conn);

  // A move of the unit was refused or left it split: not again before `until`.
  // `as_verdict`: the refusal is also its verdict.
  void Refuse(uint64_t id, uint32_t unit, int64_t until, const std::string& why,
              bool as_verdict = false);
  // The unit moved `direction` now; a hint it answered is spent.
  void Moved(uint64_t id, uint32_t unit, Direction direction);
  // A cooperative move of the lease was skipped: not again before `until`.
  void CoopSkipped(uint64_t id, int64_t until, const std::string& why);

 private:
  void SyncUnits(LeaseTrack& t, const LeaseFacts& f);
  void ApplyHint(UnitTrack& u, Hint h, bool whole, int64_t now);

  const Clock* clock_;
  const TieringOptions& options_;
  std::map<uint64_t, LeaseTrack> tracks_;
};

// The bytes [a, a + alen) and [b, b + blen) share.
uint64_t Overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen);

}  // namespace cxlpool::tiering
