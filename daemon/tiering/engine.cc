#include "tiering/engine.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

namespace cxlpool::tiering {

namespace {

using Timer = boost::asio::steady_timer;

std::string Ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string Secs(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  return buf;
}

uint64_t Overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
  uint64_t lo = std::max(a, b), hi = std::min(a + alen, b + blen);
  return hi > lo ? hi - lo : 0;
}

// Whether unit `i` of `f` is accounted elsewhere than `to`.
bool Pending(const LeaseFacts& f, uint32_t i, const std::string& to) {
  return f.units[i].pool != to;
}

// The pool holding most of a lease's bytes (the first of its units' on a tie).
std::string MostOn(const LeaseFacts& f) {
  std::string best;
  uint64_t best_bytes = 0;
  for (const UnitFacts& u : f.units) {
    uint64_t b = 0;
    for (const UnitFacts& v : f.units) b += v.pool == u.pool ? v.length : 0;
    if (b > best_bytes) {
      best = u.pool;
      best_bytes = b;
    }
  }
  return best;
}

}  // namespace

TieringEngine::TieringEngine(LeaseTable* table, Migrator* migrator, HolderChannel* holders,
                             const Clock* clock, Executor loop, Executor mover,
                             TieringOptions options)
    : table_(table),
      migrator_(migrator),
      holders_(holders),
      clock_(clock),
      loop_(std::move(loop)),
      mover_(std::move(mover)),
      options_(std::move(options)),
      limiter_(options_.rate_limit_bytes_per_s, 0, clock->MonotonicNs()) {
  timer_ = std::make_shared<Timer>(loop_);
  urgent_timer_ = std::make_shared<Timer>(loop_);
}

TieringEngine::~TieringEngine() {
  Stop();
  *alive_ = false;
}

void TieringEngine::SetSampler(std::unique_ptr<AccessSampler> sampler) {
  sampler_ = std::shared_ptr<AccessSampler>(std::move(sampler));
}

void TieringEngine::Start() {
  if (started_ || stopped_) return;
  started_ = true;
  ScheduleRound(options_.interval_ns);
}

void TieringEngine::Stop() {
  if (stopped_) return;
  stopped_ = true;
  cancel_->store(true);
  static_cast<Timer*>(timer_.get())->cancel();
  static_cast<Timer*>(urgent_timer_.get())->cancel();
  if (move_ && move_->cooperative && !move_->running) CancelCooperative("the daemon is stopping");
}

void TieringEngine::ScheduleRound(int64_t delay_ns) {
  if (stopped_ || !started_) return;
  auto* t = static_cast<Timer*>(timer_.get());
  auto when =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::max<int64_t>(delay_ns, 0));
  if (round_scheduled_ && t->expiry() <= when) return;
  round_scheduled_ = true;
  t->expires_at(when);
  std::weak_ptr<bool> alive = alive_;
  t->async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !*alive.lock()) return;
    round_scheduled_ = false;
    Tick();
  });
}

void TieringEngine::Tick() {
  Round();
  ScheduleRound(options_.interval_ns);
}

void TieringEngine::QueueUrgent(uint64_t id, uid_t uid) { urgent_.insert_or_assign(id, uid); }

void TieringEngine::ScheduleUrgent() {
  // One pending on-demand round at most, and no sooner than
  // urgent_interval after the last one.
  if (stopped_ || !started_ || urgent_scheduled_) return;
  const int64_t delay = std::max<int64_t>(
      last_urgent_round_ns_ + options_.urgent_interval_ns - clock_->MonotonicNs(), 0);
  auto* t = static_cast<Timer*>(urgent_timer_.get());
  urgent_scheduled_ = true;
  t->expires_after(std::chrono::nanoseconds(delay));
  std::weak_ptr<bool> alive = alive_;
  t->async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !*alive.lock()) return;
    UrgentRound();
  });
}

void TieringEngine::UrgentRound() {
  urgent_scheduled_ = false;
  if (stopped_) return;
  const auto began = std::chrono::steady_clock::now();
  last_urgent_round_ns_ = clock_->MonotonicNs();
  std::map<uint64_t, uid_t> queued;
  queued.swap(urgent_);
  if (queued.empty()) return;
  Count("urgent_rounds");
  // Only the queued leases: what this costs grows with the hints, not with
  // every tenant's leases. A move under way already: its end starts a full
  // round, which sees the urgent units too.
  std::vector<LeaseFacts> leases;
  for (const auto& [id, uid] : queued) {
    if (std::optional<LeaseFacts> f = table_->Find(id)) leases.push_back(std::move(*f));
  }
  if (!move_ && !leases.empty()) Plan(leases, true);
  if (!busy_charge_) return;
  // The time goes to the senders, by their share of the queued leases.
  const auto spent = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now() - began);
  std::map<uid_t, int64_t> shares;
  for (const auto& [id, uid] : queued) ++shares[uid];
  for (const auto& [uid, n] : shares) {
    busy_charge_(uid, spent * n / static_cast<int64_t>(queued.size()));
  }
}

int TieringEngine::NodeOfPool(const std::string& pool) const {
  auto it = pool_nodes_.find(pool);
  return it == pool_nodes_.end() ? -1 : it->second;
}

TieringEngine::LeaseTrack& TieringEngine::Track(const LeaseFacts& f) {
  LeaseTrack& t = tracks_[f.id];
  SyncUnits(t, f);
  return t;
}

void TieringEngine::SyncUnits(LeaseTrack& t, const LeaseFacts& f) {
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

double TieringEngine::Temperature(const UnitTrack& u) const {
  if (u.length == 0) return 0;
  return u.heat.At(clock_->MonotonicNs(), options_.half_life_ns) / static_cast<double>(u.length);
}

std::string TieringEngine::Evidence(const UnitTrack& u) const {
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

void TieringEngine::ApplyHint(UnitTrack& u, Hint h, bool whole, int64_t now) {
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

namespace {

// One answer for a lease that does not exist and one the caller may not
// signal or change: neither says whether the id is in use.
Status NotHeld(uint64_t id) {
  return Status(Code::kNotFound, "lease " + std::to_string(id) + " is not held by this connection");
}

bool Holds(const LeaseFacts& f, ConnId conn) {
  return std::find(f.holders.begin(), f.holders.end(), conn) != f.holders.end();
}

bool Urgent(const std::optional<Hint>& h) { return h == Hint::kWillNeed || h == Hint::kDontNeed; }

}  // namespace

Status TieringEngine::TakeUrgent(const Caller& from, int64_t now) {
  const uint32_t rate = options_.max_urgent_hints_per_uid;
  if (rate == 0) return Status::Ok();
  auto it = urgent_buckets_.find(from.uid);
  if (it == urgent_buckets_.end()) {
    it = urgent_buckets_.emplace(from.uid, RateLimiter(rate, rate, now)).first;
  }
  if (it->second.TryTake(1, now)) return Status::Ok();
  Count("urgent_hints_refused");
  return Status(Code::kResourceExhausted,
                "uid " + std::to_string(from.uid) + " sent more than " + std::to_string(rate) +
                    " will_need/dont_need hints in a second (tiering.max_urgent_hints_per_uid);"
                    " this one was not taken, retry in " +
                    Ms(it->second.NsUntil(1, now)));
}

int64_t TieringEngine::UrgentWaitNs(uid_t uid, uint64_t n) {
  auto it = urgent_buckets_.find(uid);
  if (n == 0 || it == urgent_buckets_.end()) return 0;
  return std::min<int64_t>(it->second.NsUntil(n, clock_->MonotonicNs()), 1'000'000'000);
}

std::vector<std::pair<size_t, Status>> TieringEngine::OnSignals(const Caller& from,
                                                                const std::vector<Signal>& batch) {
  std::vector<std::pair<size_t, Status>> rejected;
  const int64_t now = clock_->MonotonicNs();
  for (size_t i = 0; i < batch.size(); ++i) {
    const Signal& s = batch[i];
    std::optional<LeaseFacts> f = table_->Find(s.lease_id);
    if (!f || !Holds(*f, from.conn)) {
      rejected.emplace_back(i, NotHeld(s.lease_id));
      continue;
    }
    if (s.length == 0) {
      rejected.emplace_back(
          i, Status(Code::kInvalidArgument, "empty range at offset " + std::to_string(s.offset) +
                                                " of lease " + std::to_string(s.lease_id)));
      continue;
    }
    if (s.offset >= f->size_bytes || s.length > f->size_bytes - s.offset) {
      rejected.emplace_back(
          i, Status(Code::kInvalidArgument,
                    std::string(s.hint ? "hint" : "signal") + " for [" + std::to_string(s.offset) +
                        ", " + std::to_string(s.offset) + " + " + std::to_string(s.length) +
                        ") is outside lease " + std::to_string(s.lease_id) + " (size " +
                        std::to_string(f->size_bytes) + " bytes)"));
      Count("signals_rejected");
      continue;
    }
    // The owner's and an admin's hints steer the lease; another holder's
    // are what they say about its own use, weighed as a signal.
    const bool steers = from.admin || from.uid == f->owner_uid;
    if (s.hint && steers && Urgent(s.hint)) {
      if (Status st = TakeUrgent(from, now); !st.ok()) {
        rejected.emplace_back(i, std::move(st));
        continue;
      }
    }
    LeaseTrack& t = Track(*f);
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
    Count("signals");
    if (s.hint) Count(std::string("hints_") + HintName(*s.hint));
    if (s.hint && !steers) Count("hints_as_signals");
    Count("signalled_bytes", s.bytes_read + s.bytes_written);
    if (s.hint && steers && Urgent(s.hint)) QueueUrgent(s.lease_id, from.uid);
  }
  if (!urgent_.empty()) ScheduleUrgent();  // act on will_need / dont_need soon
  return rejected;
}

Status TieringEngine::SetLeaseOptions(const Caller& from, uint64_t lease_id,
                                      std::optional<bool> opt_out,
                                      std::optional<bool> cooperative_pin) {
  std::optional<LeaseFacts> f = table_->Find(lease_id);
  const bool holder = f && Holds(*f, from.conn);
  const bool owner = f && f->owner_uid == from.uid;
  if (!f || (!holder && !owner && !from.admin)) {
    return Status(Code::kNotFound,
                  "lease " + std::to_string(lease_id) + " is not one this caller may change");
  }
  if (opt_out && !owner && !from.admin) {
    return Status(Code::kPermissionDenied,
                  "only the owner of lease " + std::to_string(lease_id) + " (uid " +
                      std::to_string(f->owner_uid) +
                      ") or an admin may change its tiering options (pin_tier); another holder "
                      "may declare its own pin (cooperative_pin) and send hints, which count "
                      "as signals");
  }
  if (cooperative_pin && !holder) {
    return Status(Code::kPermissionDenied,
                  "only a holder can declare its own pin of lease " + std::to_string(lease_id));
  }
  LeaseTrack& t = Track(*f);
  if (opt_out) t.opted_out = *opt_out;
  if (cooperative_pin) {
    if (*cooperative_pin) {
      t.pinned_by.insert(from.conn);
    } else {
      t.pinned_by.erase(from.conn);
    }
  }
  return Status::Ok();
}

void TieringEngine::OnDisconnect(ConnId conn) {
  for (auto& [id, t] : tracks_) t.pinned_by.erase(conn);
  if (!move_ || !move_->cooperative) return;
  Move& m = *move_;
  m.waiting.erase(conn);
  m.ready.erase(conn);
  if (!m.running && m.waiting.empty()) Run();  // nobody left to wait for
}

void TieringEngine::OnMigrationReady(ConnId conn, uint64_t migration_id, bool ready,
                                     const std::string& reason, ReadyDone done) {
  if (!move_ || move_->id != migration_id || !move_->cooperative) {
    done(Status(Code::kNotFound, "migration " + std::to_string(migration_id) +
                                     " is not waiting for holders (it is over or was cancelled);"
                                     " pin again now"));
    return;
  }
  Move& m = *move_;
  if (m.ready.count(conn) != 0) {
    done(Status(Code::kAlreadyExists,
                "this connection already answered migration " + std::to_string(migration_id)));
    return;
  }
  if (m.waiting.count(conn) == 0) {
    done(Status(Code::kPermissionDenied,
                "this connection was not asked about migration " + std::to_string(migration_id)));
    return;
  }
  m.waiting.erase(conn);
  m.ready[conn] = std::move(done);
  const int64_t now = clock_->MonotonicNs();
  if (m.first_ready_ns == 0) m.first_ready_ns = now;
  if (!ready) {
    auto pid = m.pids.find(conn);
    CancelCooperative("holder pid " + std::to_string(pid == m.pids.end() ? -1 : pid->second) +
                      " declined" + (reason.empty() ? std::string() : ": " + reason));
    return;
  }
  if (m.waiting.empty() && !m.running) Run();
}

void TieringEngine::MaybeSample(const std::vector<LeaseFacts>& leases) {
  const int64_t now = clock_->MonotonicNs();
  if (!sampler_ || sampling_ ||
      (last_sample_ns_ != 0 && now - last_sample_ns_ < options_.sample_interval_ns)) {
    return;
  }
  struct Job {
    std::vector<SampleTarget> targets;
    std::vector<UniqueFd> fds;
  };
  auto job = std::make_shared<Job>();
  for (const LeaseFacts& f : leases) {
    if (!f.not_movable.empty()) continue;
    for (uint32_t i = 0; i < f.units.size(); ++i) {
      auto mem = table_->OpenUnit(f.id, i);
      if (!mem.ok()) continue;
      SampleTarget t;
      t.lease_id = f.id;
      t.unit = i;
      t.fd = mem->fd.get();
      t.offset = mem->file_offset;
      t.length = f.units[i].length;
      t.page_size = f.units[i].page_size;
      job->targets.push_back(t);
      job->fds.push_back(std::move(mem->fd));
    }
  }
  if (job->targets.empty()) return;
  sampling_ = true;
  last_sample_ns_ = now;
  std::weak_ptr<bool> alive = alive_;
  auto sampler = sampler_;
  boost::asio::post(mover_, [this, alive, sampler, job, loop = loop_]() mutable {
    auto results = std::make_shared<std::vector<SampleResult>>(sampler->Sample(job->targets));
    job->fds.clear();
    boost::asio::post(loop, [this, alive, results] {
      if (alive.expired() || !*alive.lock()) return;
      sampling_ = false;
      const int64_t t = clock_->MonotonicNs();
      for (const SampleResult& r : *results) {
        auto it = tracks_.find(r.lease_id);
        if (it == tracks_.end() || r.unit >= it->second.units.size()) continue;
        UnitTrack& u = it->second.units[r.unit];
        u.sampled += r.sampled;
        u.accessed += r.accessed;
        if (r.sampled != 0) {
          u.heat.Add(r.AccessedShare() * static_cast<double>(u.length), t, options_.half_life_ns);
        }
        Count("sampled_pages", r.sampled);
      }
    });
  });
}

std::vector<PoolState> TieringEngine::RefreshPools() {
  std::vector<PoolState> ps;
  pool_nodes_.clear();
  for (const PoolFacts& p : table_->Pools()) {
    pool_nodes_[p.name] = p.numa_node;
    PoolState s;
    s.name = p.name;
    s.numa_node = p.numa_node;
    s.kind = p.kind;
    s.tier = TierClassOfKind(p.kind, p.movable);
    s.capacity_bytes = p.capacity_bytes;
    s.free_bytes = p.free_bytes;
    ps.push_back(std::move(s));
  }
  return ps;
}

void TieringEngine::Round() {
  if (stopped_) return;
  const int64_t now = clock_->MonotonicNs();
  if (move_ && move_->cooperative && !move_->running && now >= move_->deadline_ns) {
    std::string who;
    for (ConnId c : move_->waiting) {
      auto p = move_->pids.find(c);
      who += (who.empty() ? "" : ", ") + std::to_string(p == move_->pids.end() ? -1 : p->second);
    }
    CancelCooperative("holder pid " + who + " did not reach a safe point within " +
                      std::to_string(options_.cooperative_deadline_ms) + " ms");
  }

  std::vector<LeaseFacts> leases = table_->Leases();
  std::set<uint64_t> live;
  for (const LeaseFacts& f : leases) {
    live.insert(f.id);
    Track(f);
  }
  for (auto it = tracks_.begin(); it != tracks_.end();) {
    if (live.count(it->first) == 0) {
      if (sampler_) {
        auto sampler = sampler_;
        uint64_t id = it->first;
        boost::asio::post(mover_, [sampler, id] { sampler->Forget(id); });
      }
      urgent_.erase(it->first);
      it = tracks_.erase(it);
    } else {
      ++it;
    }
  }
  // Buckets back to full are forgotten (a uid starts full when it returns).
  for (auto it = urgent_buckets_.begin(); it != urgent_buckets_.end();) {
    it = it->second.Full(now) ? urgent_buckets_.erase(it) : std::next(it);
  }
  MaybeSample(leases);
  Plan(leases, false);
}

std::vector<UnitState> TieringEngine::UnitStates(const std::vector<LeaseFacts>& leases,
                                                 int64_t now) {
  std::vector<UnitState> us;
  for (const LeaseFacts& f : leases) {
    LeaseTrack& t = Track(f);
    const bool coop = f.long_term_pin || !t.pinned_by.empty();
    for (uint32_t i = 0; i < f.units.size(); ++i) {
      UnitTrack& ut = t.units[i];
      if (ut.urgent && now - ut.urgent_ns >= options_.urgent_ttl_ns) ut.urgent.reset();
      UnitState u;
      u.lease_id = f.id;
      u.unit = i;
      u.offset = f.units[i].offset;
      u.length = f.units[i].length;
      u.pool = f.units[i].pool;
      u.temperature = Temperature(ut);
      u.urgent = ut.urgent;
      u.priority = f.priority;
      u.opted_out = t.opted_out;
      u.not_movable = f.not_movable;
      if (u.not_movable.empty() && move_ && move_->d.lease_id == f.id) {
        u.not_movable = "a move of this lease is under way";
      }
      if (u.not_movable.empty() && !f.moving_to.empty()) {
        u.not_movable = "an unfinished move of unit " + std::to_string(f.moving_unit) + " to " +
                        f.moving_to + " comes first" +
                        (f.moving_note.empty() ? "" : " (" + f.moving_note + ")");
      }
      if (u.not_movable.empty() && !moves_off_.empty())
        u.not_movable = "moves are off: " + moves_off_;
      if (u.not_movable.empty() && now < ut.refused_until_ns) u.not_movable = ut.refused_why;
      u.cooperative = coop;
      if (coop) {
        if (now < t.coop_retry_ns) {
          u.cooperative_blocked = t.coop_why + "; next try in " + Secs(t.coop_retry_ns - now);
        } else if (t.pinned_by.empty()) {
          u.cooperative_blocked =
              "long-term pinned, and no holder takes part in cooperative migration "
              "(cxlpool_lease_set_migration_callback, or a CUDA registration by libcxlpool)";
        } else {
          // The holders map the lease as one range: every unit of it moves
          // in the one pause.
          const uint64_t paused = f.units.size() > 1 ? f.size_bytes : u.length;
          int64_t pause = static_cast<int64_t>(static_cast<double>(paused) * 1e9 / measured_bps_);
          if (pause > options_.max_pause_ns) {
            u.cooperative_blocked = "moving it would pause its holders about " + Secs(pause) +
                                    " (max_pause " + Secs(options_.max_pause_ns) + ")";
          }
        }
      }
      u.last_moved_ns = ut.last_moved_ns;
      u.promote_pool = f.promote_pool;
      u.demote_pool = f.demote_pool;
      u.evidence = Evidence(ut);
      us.push_back(std::move(u));
    }
  }
  return us;
}

void TieringEngine::Plan(const std::vector<LeaseFacts>& leases, bool urgent_only) {
  const int64_t now = clock_->MonotonicNs();
  std::vector<PoolState> ps = RefreshPools();
  std::vector<UnitState> us = UnitStates(leases, now);
  std::map<uint64_t, const LeaseFacts*> by_id;
  for (const LeaseFacts& f : leases) by_id[f.id] = &f;

  // A full bucket lets the next range go whatever its size; else what it holds.
  double avail = limiter_.Available(now);
  int64_t budget = limiter_.Full(now) ? INT64_MAX / 2
                   : avail >= 1       ? static_cast<int64_t>(std::min(avail, 4e18))
                                      : 0;
  PolicyOutput out = Decide(options_.policy, ps, us, now, budget);
  if (urgent_only) {
    // Only what the hints asked for: the other rules need every lease.
    std::erase_if(out.decisions,
                  [](const Decision& d) { return d.rule != "will_need" && d.rule != "dont_need"; });
  }
  pressure_ = out.pressure;
  for (size_t i = 0; i < out.decisions.size(); ++i) {
    const Decision& d = out.decisions[i];
    auto it = tracks_.find(d.lease_id);
    if (it == tracks_.end() || d.unit >= it->second.units.size()) continue;
    it->second.units[d.unit].verdict =
        std::string(i == 0 && !move_ && moves_off_.empty() ? "moving: " : "next: ") + d.why;
  }
  for (const auto& [key, why] : out.stays) {
    auto it = tracks_.find(key.first);
    if (it == tracks_.end() || key.second >= it->second.units.size()) continue;
    it->second.units[key.second].verdict = why;
  }
  if (move_ || !moves_off_.empty()) return;

  if (ResumeUnfinished(leases, now)) return;
  if (out.decisions.empty()) return;
  const Decision& d = out.decisions.front();
  auto fit = by_id.find(d.lease_id);
  if (fit == by_id.end()) return;
  if (!limiter_.TryTake(d.length, now)) {
    ScheduleRound(limiter_.NsUntil(d.length, now));
    return;
  }
  std::vector<uint32_t> also;
  for (size_t i = 1; i < out.decisions.size(); ++i) {
    const Decision& o = out.decisions[i];
    if (o.lease_id == d.lease_id && o.to_pool == d.to_pool && o.unit != d.unit) {
      also.push_back(o.unit);
    }
  }
  Begin(d, *fit->second, false, also);
}

bool TieringEngine::ResumeUnfinished(const std::vector<LeaseFacts>& leases, int64_t now) {
  // A move someone began and nobody finished (a daemon killed mid-migration):
  // finish it before anything new.
  for (const LeaseFacts& f : leases) {
    if (f.moving_to.empty() || !f.not_movable.empty()) continue;
    if (f.moving_unit >= f.units.size()) continue;
    LeaseTrack& t = tracks_[f.id];
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
    if (f.moving_back) {
      d.why = "move unit " + std::to_string(f.moving_unit) + " of lease " + std::to_string(f.id) +
              " back to " + f.moving_to +
              ", the pool that accounts it, from where an unfinished move left its pages" +
              (f.moving_note.empty() ? "" : " (" + f.moving_note + ")");
      limiter_.Charge(d.length, now);
    } else {
      d.why = "finish the move of unit " + std::to_string(f.moving_unit) + " of lease " +
              std::to_string(f.id) + " from " + uf.pool + " to " + f.moving_to +
              " that was begun and not finished" +
              (f.moving_note.empty() ? "" : " (" + f.moving_note + ")");
      limiter_.Charge(d.length, now);
    }
    Begin(d, f, true);
    return true;
  }
  return false;
}

void TieringEngine::Begin(const Decision& d, const LeaseFacts& f, bool resume,
                          const std::vector<uint32_t>& also) {
  const int64_t now = clock_->MonotonicNs();
  Move m;
  m.id = next_migration_id_++;
  m.d = d;
  m.kind = !resume ? DirectionName(d.direction) : d.rule == "rollback" ? "rollback" : "resume";
  m.from_node = NodeOfPool(d.from_pool);
  m.to_node = NodeOfPool(d.to_pool);
  m.page_size = d.unit < f.units.size() ? f.units[d.unit].page_size : 4096;
  m.cooperative = d.cooperative;
  m.begun_ns = now;
  m.lease_pool = MostOn(f);
  for (size_t i = 0; i < f.holders.size(); ++i) {
    m.pids[f.holders[i]] = i < f.holder_pids.size() ? f.holder_pids[i] : -1;
  }
  if (!resume) {
    Status st = table_->BeginMove(d.lease_id, d.unit, d.to_pool);
    if (!st.ok()) {
      LeaseTrack& t = tracks_[d.lease_id];
      if (d.unit < t.units.size()) {
        UnitTrack& u = t.units[d.unit];
        u.refused_until_ns =
            now + std::max(options_.policy.min_residency_ns, 5 * options_.interval_ns);
        u.refused_why = "the last move to " + d.to_pool + " was refused: " + st.message();
        u.verdict = u.refused_why;
      }
      Record(m, "refused", st.ToString(), 0);
      Count("moves_refused");
      return;
    }
  }
  if (m.cooperative) {
    LeaseTrack& t = tracks_[d.lease_id];
    for (ConnId c : t.pinned_by) {
      if (m.pids.count(c) != 0) m.waiting.insert(c);
    }
    if (m.waiting.empty()) m.cooperative = false;  // its pins are gone: move in place
  }
  if (m.cooperative && f.units.size() > 1) {
    // The holders pin the lease as one range: the other units the policy
    // sends to the same pool this round move in the same pause, each begun
    // on its own when its turn comes (NextUnit).
    for (uint32_t i : also) {
      if (i < f.units.size() && i != d.unit && Pending(f, i, d.to_pool)) {
        m.next_units.push_back(i);
        limiter_.Charge(f.units[i].length, now);
      }
    }
    m.units = static_cast<uint32_t>(f.units.size());
    m.first_why = d.why;
  }
  move_ = std::move(m);
  if (!move_->cooperative) {
    Run();
    return;
  }
  MigrationAsk ask;
  ask.migration_id = move_->id;
  ask.lease_id = d.lease_id;
  ask.offset = f.units.size() > 1 && move_->cooperative ? 0 : d.offset;
  ask.length = f.units.size() > 1 && move_->cooperative ? f.size_bytes : d.length;
  ask.target_node = move_->to_node;
  ask.deadline_ms = options_.cooperative_deadline_ms;
  ask.why = d.why;
  move_->deadline_ns = now + int64_t{options_.cooperative_deadline_ms} * 1'000'000;
  Count("cooperative_asked");
  std::vector<ConnId> asked(move_->waiting.begin(), move_->waiting.end());
  for (ConnId c : asked) {
    Status st = holders_->Ask(c, ask);
    if (!st.ok()) {
      CancelCooperative("holder pid " + std::to_string(move_->pids[c]) +
                        " could not be asked: " + st.message());
      return;
    }
  }
  ScheduleRound(int64_t{options_.cooperative_deadline_ms} * 1'000'000 + 1'000'000);
}

void TieringEngine::Run() {
  Move& m = *move_;
  m.running = true;
  Result<UnitMemory> mem = table_->OpenUnit(m.d.lease_id, m.d.unit);
  if (!mem.ok()) {
    (void)table_->AbortMove(m.d.lease_id, m.d.unit, "");
    Finish(mem.status().code() == Code::kNotFound ? "gone" : "failed", mem.status().ToString(), 0,
           false);
    return;
  }
  MoveRequest req;
  req.offset = mem->file_offset;
  req.length = m.d.length;
  req.page_size = m.page_size;
  req.target_node = m.to_node;
  // A cooperative move pauses its holders: as fast as it goes. In place, the
  // holders keep running, so the move is paced to the rate limit.
  req.max_bytes_per_s = m.cooperative ? 0 : options_.rate_limit_bytes_per_s;
  // Paced: steps of about a tenth of a second's worth (2 MiB .. step_bytes).
  req.step_bytes = req.max_bytes_per_s == 0
                       ? options_.step_bytes
                       : std::clamp<uint64_t>(req.max_bytes_per_s / 10, 2ull << 20,
                                              std::max<uint64_t>(options_.step_bytes, 2ull << 20));
  req.cancel = cancel_.get();
  auto fd = std::make_shared<UniqueFd>(std::move(mem->fd));
  std::weak_ptr<bool> alive = alive_;
  uint64_t id = m.id;
  Migrator* migrator = migrator_;
  auto cancel = cancel_;
  boost::asio::post(mover_, [this, alive, id, fd, req, migrator, cancel, loop = loop_]() mutable {
    req.fd = fd->get();
    auto r = std::make_shared<Result<MoveReport>>(migrator->Move(req));
    fd->Reset();
    boost::asio::post(loop, [this, alive, id, r] {
      if (alive.expired() || !*alive.lock()) return;
      Moved(id, std::move(*r));
    });
  });
}

void TieringEngine::Moved(uint64_t id, Result<MoveReport> r) {
  if (!move_ || move_->id != id) return;
  Move& m = *move_;
  if (!r.ok()) {
    const Status& st = r.status();
    if (st.code() == Code::kPermissionDenied || st.code() == Code::kUnsupported) {
      moves_off_ = st.message();
      CXLPOOL_LOG(kError) << "tiering: moves are off: " << st.message();
    }
    if (st.code() == Code::kNotFound || st.code() == Code::kPermissionDenied ||
        st.code() == Code::kUnsupported || st.code() == Code::kInvalidArgument) {
      // Nothing moved (the range could not even be mapped or bound).
      (void)table_->AbortMove(m.d.lease_id, m.d.unit, "");
      Finish(st.code() == Code::kNotFound ? "gone" : "failed", st.ToString(), 0, false);
      return;
    }
  } else if (r->complete()) {
    if (!m.cooperative && r->move_ns > 0 && !r->cancelled) {
      double bps = static_cast<double>(r->bytes) * 1e9 / static_cast<double>(r->move_ns);
      measured_bps_ = 0.7 * measured_bps_ + 0.3 * bps;
    }
    m.bytes_moved += m.d.length;
    Status st = table_->CommitMove(m.d.lease_id, m.d.unit);
    if (!st.ok()) {
      Finish("gone", "moved, but " + st.ToString(), r->move_ns, true);
      return;
    }
    ++m.units_moved;
    auto it = tracks_.find(m.d.lease_id);
    if (it != tracks_.end() && m.d.unit < it->second.units.size()) {
      UnitTrack& u = it->second.units[m.d.unit];
      u.last_moved_ns = clock_->MonotonicNs();
      u.last_moved_unix = clock_->WallSeconds();
      if ((u.urgent == Hint::kWillNeed && m.d.direction == Direction::kPromote) ||
          (u.urgent == Hint::kDontNeed && m.d.direction == Direction::kDemote)) {
        u.urgent.reset();
      }
    }
    Count(m.kind == "resume"                     ? "bytes_resumed"
          : m.kind == "rollback"                 ? "bytes_moved_back"
          : m.d.direction == Direction::kPromote ? "bytes_promoted"
                                                 : "bytes_demoted",
          m.d.length);
    Count("moves_done");
    // Its holders hear where the lease is accounted now (the pool holding
    // most of it) when that changed.
    std::optional<LeaseFacts> now_f = table_->Find(m.d.lease_id);
    if (now_f && MostOn(*now_f) == m.d.to_pool && m.lease_pool != m.d.to_pool) {
      m.lease_pool = m.d.to_pool;
      for (const auto& [c, pid] : m.pids) holders_->Moved(c, m.d.lease_id, m.to_node, m.d.to_pool);
    }
    if (!m.next_units.empty()) {
      Record(m, "moved", r->ToString(), r->move_ns);
      if (NextUnit()) return;
      Finish("moved", r->ToString(), r->move_ns, true, true);
      return;
    }
    Finish("moved", r->ToString(), r->move_ns, true);
    return;
  }
  // Not every page moved (or the state is unknown): move the range back
  // whole to where it is accounted.
  std::string first = r.ok() ? r->ToString() : r.status().ToString();
  m.rolling_back = true;
  Result<UnitMemory> mem = table_->OpenUnit(m.d.lease_id, m.d.unit);
  if (!mem.ok() || m.from_node < 0) {
    (void)table_->AbortMove(m.d.lease_id, m.d.unit,
                            "split: a move to " + m.d.to_pool + " did not finish (" + first + ")");
    Finish("split", first, r.ok() ? r->move_ns : 0, false);
    return;
  }
  MoveRequest req;
  req.offset = mem->file_offset;
  req.length = m.d.length;
  req.page_size = m.page_size;
  req.target_node = m.from_node;
  req.step_bytes = options_.step_bytes;
  req.count_before = false;
  limiter_.Charge(m.d.length, clock_->MonotonicNs());
  auto fd = std::make_shared<UniqueFd>(std::move(mem->fd));
  std::weak_ptr<bool> alive = alive_;
  Migrator* migrator = migrator_;
  boost::asio::post(mover_, [this, alive, id, fd, req, migrator, first, loop = loop_]() mutable {
    req.fd = fd->get();
    auto rr = std::make_shared<Result<MoveReport>>(migrator->Move(req));
    fd->Reset();
    boost::asio::post(loop, [this, alive, id, rr, first] {
      if (alive.expired() || !*alive.lock()) return;
      RolledBack(id, first, std::move(*rr));
    });
  });
}

bool TieringEngine::NextUnit() {
  Move& m = *move_;
  std::optional<LeaseFacts> f = table_->Find(m.d.lease_id);
  while (f && !m.next_units.empty()) {
    const uint32_t u = m.next_units.front();
    m.next_units.pop_front();
    if (u >= f->units.size() || !Pending(*f, u, m.d.to_pool)) continue;
    if (Status st = table_->BeginMove(m.d.lease_id, u, m.d.to_pool); !st.ok()) {
      // No room for more of it: the lease stays split, each extent accounted where it is.
      m.refused_unit = u;
      m.refused_detail = st.ToString();
      m.next_units.clear();
      break;
    }
    m.d.unit = u;
    m.d.offset = f->units[u].offset;
    m.d.length = f->units[u].length;
    m.d.from_pool = f->units[u].pool;
    m.from_node = NodeOfPool(m.d.from_pool);
    m.page_size = f->units[u].page_size;
    m.d.why = "unit " + std::to_string(u) + " of " + std::to_string(m.units) + " of lease " +
              std::to_string(m.d.lease_id) + ", in the same pause (" + m.first_why + ")";
    Run();
    return true;
  }
  return false;
}

void TieringEngine::RolledBack(uint64_t id, std::string first, Result<MoveReport> r) {
  if (!move_ || move_->id != id) return;
  Move& m = *move_;
  Count("moves_failed");
  auto it = tracks_.find(m.d.lease_id);
  UnitTrack* u = it != tracks_.end() && m.d.unit < it->second.units.size()
                     ? &it->second.units[m.d.unit]
                     : nullptr;
  if (r.ok() && r->complete()) {
    (void)table_->AbortMove(m.d.lease_id, m.d.unit, "");
    if (u != nullptr) {
      // Whatever held pages back (a pin nobody declared, a full node) may
      // still be there: not again before min_residency.
      u->refused_until_ns = clock_->MonotonicNs() + options_.policy.min_residency_ns;
      u->refused_why =
          "the last move to " + m.d.to_pool + " did not finish and was undone (" + first + ")";
    }
    Finish("rolled back", first + "; moved back: " + r->ToString(), r->move_ns, false);
    return;
  }
  std::string where = r.ok() ? r->after.ToString() : r.status().ToString();
  (void)table_->AbortMove(m.d.lease_id, m.d.unit,
                          "split: a move to " + m.d.to_pool +
                              " did not finish and the way back neither (" + where +
                              "); room stays reserved on " + m.d.to_pool);
  if (u != nullptr) {
    u->refused_until_ns = clock_->MonotonicNs() + options_.policy.min_residency_ns;
    u->refused_why = "left split by the last move (" + where + ")";
  }
  Finish("split", first + "; moving back: " + where, r.ok() ? r->move_ns : 0, false);
}

void TieringEngine::Finish(const std::string& outcome, const std::string& detail, int64_t move_ns,
                           bool moved, bool recorded) {
  Move m = std::move(*move_);
  move_.reset();
  const int64_t now = clock_->MonotonicNs();
  if (!recorded) Record(m, outcome, detail, move_ns);
  if (m.cooperative) {
    MigrationOutcome o;
    // Several units: moved when every unit this pause was for did; the
    // node is one only when the whole lease is on it (else it is split).
    const bool half = !moved && m.units_moved > 0;
    o.moved = moved && m.next_units.empty() && !m.refused_unit;
    bool whole = true;
    if (std::optional<LeaseFacts> f = table_->Find(m.d.lease_id)) {
      for (const UnitFacts& u : f->units) whole = whole && u.pool == m.d.to_pool;
    }
    o.numa_node = moved && whole                                    ? m.to_node
                  : outcome == "split" || half || (moved && !whole) ? -1
                                                                    : m.from_node;
    o.bytes = m.bytes_moved;
    o.move_ns = move_ns;
    o.detail = outcome + ": " + detail;
    for (auto& [c, done] : m.ready) done(o);
    if (m.first_ready_ns != 0) {
      history_.back().pause_ns = now - m.first_ready_ns;
      Count("cooperative_pause_ns_total", static_cast<uint64_t>(now - m.first_ready_ns));
    }
    if (moved) Count("cooperative_moved");
  }
  if (m.refused_unit) {
    m.d.unit = *m.refused_unit;
    if (std::optional<LeaseFacts> f = table_->Find(m.d.lease_id); f && m.d.unit < f->units.size()) {
      m.d.offset = f->units[m.d.unit].offset;
      m.d.length = f->units[m.d.unit].length;
      m.d.from_pool = f->units[m.d.unit].pool;
    }
    Record(m, "refused", m.refused_detail, 0);
    Count("moves_refused");
  }
  if (!stopped_) {
    std::weak_ptr<bool> alive = alive_;
    boost::asio::post(loop_, [this, alive] {
      if (alive.expired() || !*alive.lock()) return;
      Round();
    });
  }
}

void TieringEngine::CancelCooperative(const std::string& why) {
  Move m = std::move(*move_);
  move_.reset();
  const int64_t now = clock_->MonotonicNs();
  (void)table_->AbortMove(m.d.lease_id, m.d.unit, "");
  MigrationOutcome o;
  o.moved = false;
  o.numa_node = m.from_node;
  o.detail = "cancelled: " + why;
  for (auto& [c, done] : m.ready) done(o);
  MigrationNotice n;
  n.migration_id = m.id;
  n.lease_id = m.d.lease_id;
  n.phase = "cancelled";
  n.why = why;
  for (ConnId c : m.waiting) holders_->Tell(c, n);
  auto it = tracks_.find(m.d.lease_id);
  if (it != tracks_.end()) {
    it->second.coop_retry_ns = now + options_.cooperative_retry_ns;
    it->second.coop_why = "the last cooperative move was skipped: " + why;
  }
  Record(m, "skipped", why, 0);
  Count("cooperative_skipped");
}

void TieringEngine::Record(const Move& m, const std::string& outcome, const std::string& detail,
                           int64_t move_ns) {
  MigrationRecord r;
  r.migration_id = m.id;
  r.unix_time = clock_->WallSeconds();
  r.lease_id = m.d.lease_id;
  r.unit = m.d.unit;
  r.bytes = m.d.length;
  r.from_pool = m.d.from_pool;
  r.to_pool = m.d.to_pool;
  r.direction = m.kind;
  r.mode = m.cooperative ? "cooperative" : "in-place";
  r.outcome = outcome;
  r.why = m.d.why;
  r.detail = detail;
  r.move_ns = move_ns;
  history_.push_back(r);
  while (history_.size() > std::max<size_t>(options_.history, 1)) history_.pop_front();
  Count("migrations_" + std::string(outcome == "rolled back" ? "rolled_back" : outcome));
  std::ostringstream line;
  line << "tiering: " << outcome << " (" << r.mode << " " << r.direction << ", migration " << m.id
       << "): " << r.why << ": " << detail << (move_ns > 0 ? " [" + Ms(move_ns) + "]" : "");
  if (outcome == "moved") {
    CXLPOOL_LOG(kInfo) << line.str();
  } else {
    CXLPOOL_LOG(kWarning) << line.str();
  }
}

TieringReport TieringEngine::Report(std::optional<uint32_t> owner) const {
  TieringReport rep;
  rep.enabled = options_.enabled;
  rep.disabled_why = moves_off_;
  rep.sampler = sampler_ ? sampler_->name() : "none";
  rep.kernel = kernel_;
  rep.rate_limit_bytes_per_s = options_.rate_limit_bytes_per_s;
  rep.hot_threshold = options_.policy.hot_threshold;
  rep.cold_threshold = options_.policy.cold_threshold;
  rep.half_life_ns = options_.half_life_ns;
  rep.pressure = pressure_;
  rep.counters = counters_;
  if (move_) {
    // "migration 3 (lease 7 unit 2, begun 1.2 s ago): <why>"
    rep.in_flight = "migration " + std::to_string(move_->id) + " (lease " +
                    std::to_string(move_->d.lease_id) + " unit " + std::to_string(move_->d.unit) +
                    ", begun " + Secs(clock_->MonotonicNs() - move_->begun_ns) +
                    " ago): " + move_->d.why;
  }
  std::set<uint64_t> shown;
  for (const LeaseFacts& f : table_->Leases()) {
    if (owner && f.owner_uid != *owner) continue;
    shown.insert(f.id);
    LeaseReport lr;
    lr.id = f.id;
    lr.label = f.label;
    lr.owner_uid = f.owner_uid;
    lr.priority = f.priority;
    auto it = tracks_.find(f.id);
    const LeaseTrack* t = it == tracks_.end() ? nullptr : &it->second;
    lr.opted_out = t != nullptr && t->opted_out;
    lr.cooperative = f.long_term_pin || (t != nullptr && !t->pinned_by.empty());
    if (t != nullptr && !t->coop_why.empty()) lr.cooperative_state = t->coop_why;
    if (!f.moving_to.empty()) {
      lr.moving = "to " + f.moving_to + (f.moving_note.empty() ? "" : ": " + f.moving_note);
    }
    for (uint32_t i = 0; i < f.units.size(); ++i) {
      UnitReport u;
      u.unit = i;
      u.offset = f.units[i].offset;
      u.length = f.units[i].length;
      u.pool = f.units[i].pool;
      u.numa_node = f.units[i].numa_node;
      if (t != nullptr && i < t->units.size()) {
        const UnitTrack& ut = t->units[i];
        u.temperature = Temperature(ut);
        u.verdict = ut.verdict;
        u.bytes_read = ut.bytes_read;
        u.bytes_written = ut.bytes_written;
        u.hints = ut.hints;
        u.sampled_pages = ut.sampled;
        u.accessed_pages = ut.accessed;
        u.last_moved_unix = ut.last_moved_unix;
      }
      if (u.verdict.empty() && !f.not_movable.empty()) u.verdict = f.not_movable;
      if (move_ && move_->d.lease_id == f.id && move_->d.unit == i) {
        u.verdict = "moving now (" + move_->kind + " to " + move_->d.to_pool + ")";
        if (move_->cooperative && !move_->running) {
          u.verdict += ": waiting for " + std::to_string(move_->waiting.size()) +
                       " holder(s) to reach a safe point, deadline in " +
                       Secs(std::max<int64_t>(move_->deadline_ns - clock_->MonotonicNs(), 0));
        }
        u.verdict += "; " + move_->d.why;
      }
      lr.units.push_back(std::move(u));
    }
    rep.leases.push_back(std::move(lr));
  }
  for (const MigrationRecord& r : history_) {
    if (owner && shown.count(r.lease_id) == 0) continue;
    rep.history.push_back(r);
  }
  return rep;
}

}  // namespace cxlpool::tiering
