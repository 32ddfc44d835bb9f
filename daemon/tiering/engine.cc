#include "tiering/engine.h"

#include <algorithm>
#include <set>
#include <utility>

namespace cxlpool::tiering {

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

// Why signal `s` on lease `f` is not taken (Ok: it is).
Status CheckRange(const TieringEngine::Signal& s, const LeaseFacts& f) {
  if (s.length == 0) {
    return Status(Code::kInvalidArgument, "empty range at offset " + std::to_string(s.offset) +
                                              " of lease " + std::to_string(s.lease_id));
  }
  if (s.offset >= f.size_bytes || s.length > f.size_bytes - s.offset) {
    return Status(Code::kInvalidArgument,
                  std::string(s.hint ? "hint" : "signal") + " for [" + std::to_string(s.offset) +
                      ", " + std::to_string(s.offset) + " + " + std::to_string(s.length) +
                      ") is outside lease " + std::to_string(s.lease_id) + " (size " +
                      std::to_string(f.size_bytes) + " bytes)");
  }
  return Status::Ok();
}

}  // namespace

TieringEngine::TieringEngine(LeaseTable* table, Migrator* migrator, HolderChannel* holders,
                             const Clock* clock, Executor loop, Executor mover,
                             TieringOptions options)
    : table_(table),
      clock_(clock),
      options_(std::move(options)),
      limiter_(options_.rate_limit_bytes_per_s, 0, clock->MonotonicNs()),
      log_(options_.history),
      book_(clock, options_),
      urgent_(options_.max_urgent_hints_per_uid),
      samples_(table, &book_, &log_, clock, loop, mover, options_.sample_interval_ns),
      timers_(
          loop, clock, options_.urgent_interval_ns, [this] { Tick(); }, [this] { UrgentRound(); }),
      runner_(MoveRunner::Parts{
          .table = table,
          .migrator = migrator,
          .holders = holders,
          .clock = clock,
          .loop = loop,
          .mover = mover,
          .options = &options_,
          .book = &book_,
          .log = &log_,
          .limiter = &limiter_,
          .schedule_round = [this](int64_t delay_ns) { timers_.ScheduleRound(delay_ns); },
          .round_after = [this] { Round(); },
      }),
      planner_(table, &book_, &runner_, &limiter_, clock, options_,
               [this](int64_t delay_ns) { timers_.ScheduleRound(delay_ns); }) {}

TieringEngine::~TieringEngine() { Stop(); }

void TieringEngine::SetSampler(std::unique_ptr<AccessSampler> sampler) {
  samples_.SetSampler(std::move(sampler));
}

void TieringEngine::Start() {
  if (timers_.Start()) timers_.ScheduleRound(options_.interval_ns);
}

void TieringEngine::Stop() {
  if (timers_.Stop()) runner_.Stop();
}

void TieringEngine::Tick() {
  Round();
  timers_.ScheduleRound(options_.interval_ns);
}

void TieringEngine::UrgentRound() {
  timers_.UrgentDue();
  if (timers_.stopped()) return;
  const auto began = std::chrono::steady_clock::now();
  timers_.UrgentBegan(clock_->MonotonicNs());
  std::map<uint64_t, uid_t> queued = urgent_.Drain();
  if (queued.empty()) return;
  log_.Count("urgent_rounds");
  // Only the queued leases: what this costs grows with the hints, not with
  // every tenant's leases. A move under way already: its end starts a full
  // round, which sees the urgent units too.
  std::vector<LeaseFacts> leases;
  for (const auto& [id, uid] : queued) {
    if (std::optional<LeaseFacts> f = table_->Find(id)) leases.push_back(std::move(*f));
  }
  if (!busy() && !leases.empty()) planner_.Plan(leases, true);
  if (!busy_charge_) return;
  // The time goes to the senders, by their share of the queued leases.
  UrgentHints::ChargeShares(queued,
                            std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - began),
                            busy_charge_);
}

int64_t TieringEngine::UrgentWaitNs(uid_t uid, uint64_t n) {
  return urgent_.WaitNs(uid, n, clock_->MonotonicNs());
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
    if (Status st = CheckRange(s, *f); !st.ok()) {
      if (s.length != 0) log_.Count("signals_rejected");
      rejected.emplace_back(i, std::move(st));
      continue;
    }
    // The owner's and an admin's hints steer the lease; another holder's
    // are what they say about its own use, weighed as a signal.
    const bool steers = from.admin || from.uid == f->owner_uid;
    const bool urgent = s.hint && steers && Urgent(s.hint);
    if (urgent) {
      if (Status st = urgent_.Take(from.uid, now); !st.ok()) {
        log_.Count("urgent_hints_refused");
        rejected.emplace_back(i, std::move(st));
        continue;
      }
    }
    book_.Signal(*f, s, steers, now);
    log_.Count("signals");
    if (s.hint) log_.Count(std::string("hints_") + HintName(*s.hint));
    if (s.hint && !steers) log_.Count("hints_as_signals");
    log_.Count("signalled_bytes", s.bytes_read + s.bytes_written);
    if (urgent) urgent_.Queue(s.lease_id, from.uid);
  }
  if (!urgent_.empty()) timers_.ScheduleUrgent();  // act on will_need / dont_need soon
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
  LeaseBook::LeaseTrack& t = book_.Track(*f);
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
  book_.DropPins(conn);
  runner_.OnDisconnect(conn);
}

void TieringEngine::OnMigrationReady(ConnId conn, uint64_t migration_id, bool ready,
                                     const std::string& reason, ReadyDone done) {
  runner_.OnMigrationReady(conn, migration_id, ready, reason, std::move(done));
}

void TieringEngine::Round() {
  if (timers_.stopped()) return;
  const int64_t now = clock_->MonotonicNs();
  runner_.CheckDeadline(now);
  std::vector<LeaseFacts> leases = table_->Leases();
  std::set<uint64_t> live;
  for (const LeaseFacts& f : leases) {
    live.insert(f.id);
    book_.Track(f);
  }
  for (uint64_t id : book_.KeepOnly(live)) {
    samples_.Forget(id);
    urgent_.Forget(id);
  }
  urgent_.ForgetFull(now);
  samples_.MaybeSample(leases);
  planner_.Plan(leases, false);
}

LeaseReport TieringEngine::ReportLease(const LeaseFacts& f) const {
  LeaseReport lr;
  lr.id = f.id;
  lr.label = f.label;
  lr.owner_uid = f.owner_uid;
  lr.priority = f.priority;
  const LeaseBook::LeaseTrack* t = book_.Find(f.id);
  lr.opted_out = t != nullptr && t->opted_out;
  lr.cooperative = f.long_term_pin || (t != nullptr && !t->pinned_by.empty());
  if (t != nullptr && !t->coop_why.empty()) lr.cooperative_state = t->coop_why;
  if (!f.moving_to.empty()) {
    lr.moving = "to " + f.moving_to + (f.moving_note.empty() ? "" : ": " + f.moving_note);
  }
  const MoveRunner::Move* move = runner_.current();
  for (uint32_t i = 0; i < f.units.size(); ++i) {
    UnitReport u;
    u.unit = i;
    u.offset = f.units[i].offset;
    u.length = f.units[i].length;
    u.pool = f.units[i].pool;
    u.numa_node = f.units[i].numa_node;
    if (t != nullptr && i < t->units.size()) {
      const LeaseBook::UnitTrack& ut = t->units[i];
      u.temperature = book_.Temperature(ut);
      u.verdict = ut.verdict;
      u.bytes_read = ut.bytes_read;
      u.bytes_written = ut.bytes_written;
      u.hints = ut.hints;
      u.sampled_pages = ut.sampled;
      u.accessed_pages = ut.accessed;
      u.last_moved_unix = ut.last_moved_unix;
    }
    if (u.verdict.empty() && !f.not_movable.empty()) u.verdict = f.not_movable;
    if (move != nullptr && move->d.lease_id == f.id && move->d.unit == i) {
      u.verdict = "moving now (" + move->kind + " to " + move->d.to_pool + ")";
      if (move->cooperative && !move->running) {
        u.verdict += ": waiting for " + std::to_string(move->waiting.size()) +
                     " holder(s) to reach a safe point, deadline in " +
                     Secs(std::max<int64_t>(move->deadline_ns - clock_->MonotonicNs(), 0));
      }
      u.verdict += "; " + move->d.why;
    }
    lr.units.push_back(std::move(u));
  }
  return lr;
}

TieringReport TieringEngine::Report(std::optional<uint32_t> owner) const {
  TieringReport rep;
  rep.enabled = options_.enabled;
  rep.disabled_why = runner_.off();
  rep.sampler = samples_.name();
  rep.kernel = kernel_;
  rep.rate_limit_bytes_per_s = options_.rate_limit_bytes_per_s;
  rep.hot_threshold = options_.policy.hot_threshold;
  rep.cold_threshold = options_.policy.cold_threshold;
  rep.half_life_ns = options_.half_life_ns;
  rep.pressure = planner_.pressure();
  rep.counters = log_.counters();
  if (const MoveRunner::Move* move = runner_.current()) {
    // "migration 3 (lease 7 unit 2, begun 1.2 s ago): <why>"
    rep.in_flight = "migration " + std::to_string(move->id) + " (lease " +
                    std::to_string(move->d.lease_id) + " unit " + std::to_string(move->d.unit) +
                    ", begun " + Secs(clock_->MonotonicNs() - move->begun_ns) +
                    " ago): " + move->d.why;
  }
  std::set<uint64_t> shown;
  for (const LeaseFacts& f : table_->Leases()) {
    if (owner && f.owner_uid != *owner) continue;
    shown.insert(f.id);
    rep.leases.push_back(ReportLease(f));
  }
  for (const MigrationRecord& r : log_.history()) {
    if (owner && shown.count(r.lease_id) == 0) continue;
    rep.history.push_back(r);
  }
  return rep;
}

}  // namespace cxlpool::tiering
