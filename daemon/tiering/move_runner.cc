#include "tiering/move_runner.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <utility>

#include "cxlpool/common/log.h"

namespace cxlpool::tiering {

namespace {

// Whether unit `i` of `f` is accounted elsewhere than `to`.
bool Pending(const LeaseFacts& f, uint32_t i, const std::string& to) {
  return f.units[i].pool != to;
}

}  // namespace

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

MoveRunner::MoveRunner(Parts parts) : p_(std::move(parts)), options_(*p_.options) {}

MoveRunner::~MoveRunner() { *alive_ = false; }

int MoveRunner::NodeOfPool(const std::string& pool) const {
  auto it = pool_nodes_.find(pool);
  return it == pool_nodes_.end() ? -1 : it->second;
}

void MoveRunner::Stop() {
  stopped_ = true;
  cancel_->store(true);
  if (move_ && move_->cooperative && !move_->running) CancelCooperative("the daemon is stopping");
}

void MoveRunner::CheckDeadline(int64_t now) {
  if (!move_ || !move_->cooperative || move_->running || now < move_->deadline_ns) return;
  std::string who;
  for (ConnId c : move_->waiting) {
    auto p = move_->pids.find(c);
    who += (who.empty() ? "" : ", ") + std::to_string(p == move_->pids.end() ? -1 : p->second);
  }
  CancelCooperative("holder pid " + who + " did not reach a safe point within " +
                    std::to_string(options_.cooperative_deadline_ms) + " ms");
}

void MoveRunner::OnDisconnect(ConnId conn) {
  if (!move_ || !move_->cooperative) return;
  Move& m = *move_;
  m.waiting.erase(conn);
  m.ready.erase(conn);
  if (!m.running && m.waiting.empty()) Run();  // nobody left to wait for
}

void MoveRunner::OnMigrationReady(ConnId conn, uint64_t migration_id, bool ready,
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
  const int64_t now = p_.clock->MonotonicNs();
  if (m.first_ready_ns == 0) m.first_ready_ns = now;
  if (!ready) {
    auto pid = m.pids.find(conn);
    CancelCooperative("holder pid " + std::to_string(pid == m.pids.end() ? -1 : pid->second) +
                      " declined" + (reason.empty() ? std::string() : ": " + reason));
    return;
  }
  if (m.waiting.empty() && !m.running) Run();
}

void MoveRunner::Begin(const Decision& d, const LeaseFacts& f, bool resume,
                       const std::vector<uint32_t>& also) {
  const int64_t now = p_.clock->MonotonicNs();
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
    Status st = p_.table->BeginMove(d.lease_id, d.unit, d.to_pool);
    if (!st.ok()) {
      p_.book->Refuse(d.lease_id, d.unit,
                      now + std::max(options_.policy.min_residency_ns, 5 * options_.interval_ns),
                      "the last move to " + d.to_pool + " was refused: " + st.message(), true);
      Record(m, "refused", st.ToString(), 0);
      p_.log->Count("moves_refused");
      return;
    }
  }
  if (m.cooperative) {
    for (ConnId c : p_.book->Slot(d.lease_id).pinned_by) {
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
        p_.limiter->Charge(f.units[i].length, now);
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
  Ask(f, now);
}

void MoveRunner::Ask(const LeaseFacts& f, int64_t now) {
  const Decision& d = move_->d;
  MigrationAsk ask;
  ask.migration_id = move_->id;
  ask.lease_id = d.lease_id;
  ask.offset = f.units.size() > 1 && move_->cooperative ? 0 : d.offset;
  ask.length = f.units.size() > 1 && move_->cooperative ? f.size_bytes : d.length;
  ask.target_node = move_->to_node;
  ask.deadline_ms = options_.cooperative_deadline_ms;
  ask.why = d.why;
  move_->deadline_ns = now + int64_t{options_.cooperative_deadline_ms} * 1'000'000;
  p_.log->Count("cooperative_asked");
  std::vector<ConnId> asked(move_->waiting.begin(), move_->waiting.end());
  for (ConnId c : asked) {
    Status st = p_.holders->Ask(c, ask);
    if (!st.ok()) {
      CancelCooperative("holder pid " + std::to_string(move_->pids[c]) +
                        " could not be asked: " + st.message());
      return;
    }
  }
  p_.schedule_round(int64_t{options_.cooperative_deadline_ms} * 1'000'000 + 1'000'000);
}

void MoveRunner::Post(MoveRequest req, UniqueFd fd, std::function<void(Result<MoveReport>)> then) {
  auto owned = std::make_shared<UniqueFd>(std::move(fd));
  std::weak_ptr<bool> alive = alive_;
  Migrator* migrator = p_.migrator;
  auto cancel = cancel_;
  boost::asio::post(p_.mover, [alive, owned, req, migrator, cancel, then = std::move(then),
                               loop = p_.loop]() mutable {
    req.fd = owned->get();
    auto r = std::make_shared<Result<MoveReport>>(migrator->Move(req));
    owned->Reset();
    boost::asio::post(loop, [alive, r, then = std::move(then)] {
      if (alive.expired() || !*alive.lock()) return;
      then(std::move(*r));
    });
  });
}

void MoveRunner::Run() {
  Move& m = *move_;
  m.running = true;
  Result<UnitMemory> mem = p_.table->OpenUnit(m.d.lease_id, m.d.unit);
  if (!mem.ok()) {
    (void)p_.table->AbortMove(m.d.lease_id, m.d.unit, "");
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
  const uint64_t id = m.id;
  Post(req, std::move(mem->fd), [this, id](Result<MoveReport> r) { Moved(id, std::move(r)); });
}

void MoveRunner::Moved(uint64_t id, Result<MoveReport> r) {
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
      (void)p_.table->AbortMove(m.d.lease_id, m.d.unit, "");
      Finish(st.code() == Code::kNotFound ? "gone" : "failed", st.ToString(), 0, false);
      return;
    }
  } else if (r->complete()) {
    Committed(*r);
    return;
  }
  MoveBack(id, r);
}

void MoveRunner::Committed(const MoveReport& r) {
  Move& m = *move_;
  if (!m.cooperative && r.move_ns > 0 && !r.cancelled) {
    double bps = static_cast<double>(r.bytes) * 1e9 / static_cast<double>(r.move_ns);
    measured_bps_ = 0.7 * measured_bps_ + 0.3 * bps;
  }
  m.bytes_moved += m.d.length;
  Status st = p_.table->CommitMove(m.d.lease_id, m.d.unit);
  if (!st.ok()) {
    Finish("gone", "moved, but " + st.ToString(), r.move_ns, true);
    return;
  }
  ++m.units_moved;
  p_.book->Moved(m.d.lease_id, m.d.unit, m.d.direction);
  p_.log->Count(m.kind == "resume"                     ? "bytes_resumed"
                : m.kind == "rollback"                 ? "bytes_moved_back"
                : m.d.direction == Direction::kPromote ? "bytes_promoted"
                                                       : "bytes_demoted",
                m.d.length);
  p_.log->Count("moves_done");
  // Its holders hear where the lease is accounted now (the pool holding
  // most of it) when that changed.
  std::optional<LeaseFacts> now_f = p_.table->Find(m.d.lease_id);
  if (now_f && MostOn(*now_f) == m.d.to_pool && m.lease_pool != m.d.to_pool) {
    m.lease_pool = m.d.to_pool;
    for (const auto& [c, pid] : m.pids) p_.holders->Moved(c, m.d.lease_id, m.to_node, m.d.to_pool);
  }
  if (!m.next_units.empty()) {
    Record(m, "moved", r.ToString(), r.move_ns);
    if (NextUnit()) return;
    Finish("moved", r.ToString(), r.move_ns, true, true);
    return;
  }
  Finish("moved", r.ToString(), r.move_ns, true);
}

void MoveRunner::MoveBack(uint64_t id, const Result<MoveReport>& r) {
  Move& m = *move_;
  std::string first = r.ok() ? r->ToString() : r.status().ToString();
  m.rolling_back = true;
  Result<UnitMemory> mem = p_.table->OpenUnit(m.d.lease_id, m.d.unit);
  if (!mem.ok() || m.from_node < 0) {
    (void)p_.table->AbortMove(
        m.d.lease_id, m.d.unit,
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
  p_.limiter->Charge(m.d.length, p_.clock->MonotonicNs());
  Post(req, std::move(mem->fd),
       [this, id, first](Result<MoveReport> rr) { RolledBack(id, first, std::move(rr)); });
}

bool MoveRunner::NextUnit() {
  Move& m = *move_;
  std::optional<LeaseFacts> f = p_.table->Find(m.d.lease_id);
  while (f && !m.next_units.empty()) {
    const uint32_t u = m.next_units.front();
    m.next_units.pop_front();
    if (u >= f->units.size() || !Pending(*f, u, m.d.to_pool)) continue;
    if (Status st = p_.table->BeginMove(m.d.lease_id, u, m.d.to_pool); !st.ok()) {
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

void MoveRunner::RolledBack(uint64_t id, const std::string& first, Result<MoveReport> r) {
  if (!move_ || move_->id != id) return;
  Move& m = *move_;
  p_.log->Count("moves_failed");
  const int64_t until = p_.clock->MonotonicNs() + options_.policy.min_residency_ns;
  if (r.ok() && r->complete()) {
    (void)p_.table->AbortMove(m.d.lease_id, m.d.unit, "");
    // Whatever held pages back (a pin nobody declared, a full node) may
    // still be there: not again before min_residency.
    p_.book->Refuse(
        m.d.lease_id, m.d.unit, until,
        "the last move to " + m.d.to_pool + " did not finish and was undone (" + first + ")");
    Finish("rolled back", first + "; moved back: " + r->ToString(), r->move_ns, false);
    return;
  }
  std::string where = r.ok() ? r->after.ToString() : r.status().ToString();
  (void)p_.table->AbortMove(m.d.lease_id, m.d.unit,
                            "split: a move to " + m.d.to_pool +
                                " did not finish and the way back neither (" + where +
                                "); room stays reserved on " + m.d.to_pool);
  p_.book->Refuse(m.d.lease_id, m.d.unit, until, "left split by the last move (" + where + ")");
  Finish("split", first + "; moving back: " + where, r.ok() ? r->move_ns : 0, false);
}

void MoveRunner::Finish(const std::string& outcome, const std::string& detail, int64_t move_ns,
                        bool moved, bool recorded) {
  Move m = std::move(*move_);
  move_.reset();
  const int64_t now = p_.clock->MonotonicNs();
  if (!recorded) Record(m, outcome, detail, move_ns);
  if (m.cooperative) Answer(m, outcome, detail, move_ns, moved, now);
  if (m.refused_unit) {
    m.d.unit = *m.refused_unit;
    if (std::optional<LeaseFacts> f = p_.table->Find(m.d.lease_id);
        f && m.d.unit < f->units.size()) {
      m.d.offset = f->units[m.d.unit].offset;
      m.d.length = f->units[m.d.unit].length;
      m.d.from_pool = f->units[m.d.unit].pool;
    }
    Record(m, "refused", m.refused_detail, 0);
    p_.log->Count("moves_refused");
  }
  if (!stopped_) {
    std::weak_ptr<bool> alive = alive_;
    boost::asio::post(p_.loop, [this, alive] {
      if (alive.expired() || !*alive.lock()) return;
      p_.round_after();
    });
  }
}

void MoveRunner::Answer(const Move& m, const std::string& outcome, const std::string& detail,
                        int64_t move_ns, bool moved, int64_t now) {
  MigrationOutcome o;
  // Several units: moved when every unit this pause was for did; the
  // node is one only when the whole lease is on it (else it is split).
  const bool half = !moved && m.units_moved > 0;
  o.moved = moved && m.next_units.empty() && !m.refused_unit;
  bool whole = true;
  if (std::optional<LeaseFacts> f = p_.table->Find(m.d.lease_id)) {
    for (const UnitFacts& u : f->units) whole = whole && u.pool == m.d.to_pool;
  }
  o.numa_node = moved && whole                                    ? m.to_node
                : outcome == "split" || half || (moved && !whole) ? -1
                                                                  : m.from_node;
  o.bytes = m.bytes_moved;
  o.move_ns = move_ns;
  o.detail = outcome + ": " + detail;
  for (const auto& [c, done] : m.ready) done(o);
  if (m.first_ready_ns != 0) {
    p_.log->SetLastPause(now - m.first_ready_ns);
    p_.log->Count("cooperative_pause_ns_total", static_cast<uint64_t>(now - m.first_ready_ns));
  }
  if (moved) p_.log->Count("cooperative_moved");
}

void MoveRunner::CancelCooperative(const std::string& why) {
  Move m = std::move(*move_);
  move_.reset();
  const int64_t now = p_.clock->MonotonicNs();
  (void)p_.table->AbortMove(m.d.lease_id, m.d.unit, "");
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
  for (ConnId c : m.waiting) p_.holders->Tell(c, n);
  p_.book->CoopSkipped(m.d.lease_id, now + options_.cooperative_retry_ns,
                       "the last cooperative move was skipped: " + why);
  Record(m, "skipped", why, 0);
  p_.log->Count("cooperative_skipped");
}

void MoveRunner::Record(const Move& m, const std::string& outcome, const std::string& detail,
                        int64_t move_ns) {
  MigrationRecord r;
  r.migration_id = m.id;
  r.unix_time = p_.clock->WallSeconds();
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
  p_.log->Record(std::move(r));
}

}  // namespace cxlpool::tiering
