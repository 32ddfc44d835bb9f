#include "handler/tiering_requests.h"

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/codec.h"

namespace cxlpool {

namespace {

template <typename M>
Reply AsReply(const M& msg) {
  auto payload = wire::Encode(msg);
  if (!payload.ok()) return MakeErrorReply(payload.status());
  Reply r;
  r.type = wire::TypeOf<M>();
  r.payload = std::move(*payload);
  return r;
}

template <typename M>
Status Parse(const Request& req, M* out) {
  Status st = wire::Decode(req.payload, out);
  if (!st.ok()) return Status(st.code(), wire::MsgTypeName(req.type) + ": " + st.message());
  return Status::Ok();
}

}  // namespace

tiering::Caller TieringRequests::CallerOf(ConnectionId conn) const {
  tiering::Caller c;
  c.conn = conn;
  if (const CallerInfo* info = leases_->Caller(conn)) c.uid = info->uid;
  c.admin = leases_->IsAdmin(conn);
  return c;
}

bool TieringRequests::Handles(proto::MsgType type) {
  switch (type) {
    case proto::MSG_TIERING_SIGNALS_REQUEST:
    case proto::MSG_TIERING_LEASE_REQUEST:
    case proto::MSG_MIGRATION_READY_REQUEST:
    case proto::MSG_TIERING_REPORT_REQUEST:
      return true;
    default:
      return false;
  }
}

void TieringRequests::OnDisconnect(ConnectionId conn) {
  if (engine_ != nullptr) engine_->OnDisconnect(conn);
}

Reply TieringRequests::Handle(ConnectionId conn, const Request& req, const ReplyFn& reply,
                              bool* deferred) {
  if (engine_ == nullptr) {
    return MakeErrorReply(
        Status(Code::kUnsupported, "tiering is off in this daemon ([tiering] enabled = false)"));
  }
  switch (req.type) {
    case proto::MSG_TIERING_SIGNALS_REQUEST: {
      proto::TieringSignalsRequest in;
      if (Status st = Parse(req, &in); !st.ok()) return MakeErrorReply(st);
      if (in.signals_size() > kMaxSignalsPerFrame) {
        return MakeErrorReply(Status(Code::kInvalidArgument,
                                     "TIERING_SIGNALS_REQUEST carries " +
                                         std::to_string(in.signals_size()) + " signals; at most " +
                                         std::to_string(kMaxSignalsPerFrame) + " per frame"));
      }
      // Entries with an unknown hint are refused here; the engine judges the rest.
      std::vector<tiering::TieringEngine::Signal> good;
      std::vector<size_t> index;  // good[i] is in.signals(index[i])
      std::vector<std::pair<size_t, Status>> bad;
      for (int i = 0; i < in.signals_size(); ++i) {
        const proto::RangeSignal& s = in.signals(i);
        tiering::TieringEngine::Signal x;
        x.lease_id = s.lease_id();
        x.offset = s.offset();
        x.length = s.length();
        x.bytes_read = s.bytes_read();
        x.bytes_written = s.bytes_written();
        if (s.hint() != proto::HINT_NONE) {
          x.hint = tiering::HintFromInt(static_cast<int>(s.hint()));
          if (!x.hint) {
            bad.emplace_back(
                static_cast<size_t>(i),
                Status(Code::kInvalidArgument, "unknown hint " + std::to_string(s.hint()) +
                                                   " (hot 1, cold 2, will_need 3, dont_need 4)"));
            continue;
          }
        }
        good.push_back(x);
        index.push_back(static_cast<size_t>(i));
      }
      const tiering::Caller caller = CallerOf(conn);
      uint64_t over_rate = 0;
      for (auto& [j, st] : engine_->OnSignals(caller, good)) {
        if (st.code() == Code::kResourceExhausted) ++over_rate;
        bad.emplace_back(index[j], st);
      }
      const size_t total = static_cast<size_t>(in.signals_size());
      proto::TieringSignalsReply out;
      out.set_accepted(static_cast<uint32_t>(total - bad.size()));
      for (const auto& [j, st] : bad) {
        proto::SignalRejection* r = out.add_rejected();
        r->set_index(static_cast<uint32_t>(j));
        r->set_code(static_cast<proto::ErrorCode>(st.code()));
        r->set_message(st.message());
      }
      // A batch of one that is wrong is the caller's error, said plainly.
      Reply now = total == 1 && bad.size() == 1 ? MakeErrorReply(bad.front().second) : AsReply(out);
      // Hints over the sender's rate: the answer waits until its bucket
      // could have taken them, so a flood costs the loop a frame per refill,
      // not a frame per round trip.
      const int64_t wait = loop_ ? engine_->UrgentWaitNs(caller.uid, over_rate) : 0;
      if (wait <= 0) return now;
      *deferred = true;
      auto timer = std::make_shared<boost::asio::steady_timer>(loop_);
      timer->expires_after(std::chrono::nanoseconds(wait));
      timer->async_wait([timer, reply, answer = std::move(now)](const boost::system::error_code&) {
        reply(answer);
      });
      return {};
    }
    case proto::MSG_TIERING_LEASE_REQUEST: {
      proto::TieringLeaseRequest in;
      if (Status st = Parse(req, &in); !st.ok()) return MakeErrorReply(st);
      std::optional<bool> pin, coop;
      if (in.has_pin_tier()) pin = in.pin_tier();
      if (in.has_cooperative_pin()) coop = in.cooperative_pin();
      Status st = engine_->SetLeaseOptions(CallerOf(conn), in.lease_id(), pin, coop);
      if (!st.ok()) return MakeErrorReply(st);
      return AsReply(proto::TieringLeaseReply());
    }
    case proto::MSG_MIGRATION_READY_REQUEST: {
      proto::MigrationReadyRequest in;
      if (Status st = Parse(req, &in); !st.ok()) return MakeErrorReply(st);
      *deferred = true;
      engine_->OnMigrationReady(conn, in.migration_id(), in.ready(), in.reason(),
                                [reply](Result<tiering::MigrationOutcome> o) {
                                  if (!o.ok()) return reply(MakeErrorReply(o.status()));
                                  proto::MigrationReadyReply out;
                                  out.set_moved(o->moved);
                                  out.set_numa_node(o->numa_node);
                                  out.set_bytes(o->bytes);
                                  out.set_move_ns(static_cast<uint64_t>(o->move_ns));
                                  out.set_detail(o->detail);
                                  reply(AsReply(out));
                                });
      return {};
    }
    case proto::MSG_TIERING_REPORT_REQUEST: {
      proto::TieringReportRequest in;
      if (Status st = Parse(req, &in); !st.ok()) return MakeErrorReply(st);
      const CallerInfo* caller = leases_->Caller(conn);
      std::optional<uint32_t> owner;
      if (!in.all() || !leases_->IsAdmin(conn)) {
        if (in.all()) {
          return MakeErrorReply(Status(Code::kPermissionDenied,
                                       "tiering --all needs admin (root or the admin group)"));
        }
        owner = caller != nullptr ? caller->uid : static_cast<uint32_t>(-1);
      }
      proto::TieringReportReply out;
      ToProto(engine_->Report(owner), &out);
      return AsReply(out);
    }
    default:
      return MakeErrorReply(Status(Code::kInternal, "not a tiering message"));
  }
}

Status TieringRequests::Ask(tiering::ConnId conn, const tiering::MigrationAsk& ask) {
  if (!push_) return Status(Code::kUnavailable, "no push channel");
  proto::MigrationEvent ev;
  ev.set_migration_id(ask.migration_id);
  ev.set_lease_id(ask.lease_id);
  ev.set_phase("prepare");
  ev.set_offset(ask.offset);
  ev.set_length(ask.length);
  ev.set_target_node(ask.target_node);
  ev.set_deadline_ms(ask.deadline_ms);
  ev.set_reason(ask.why);
  return push_(conn, AsReply(ev));
}

void TieringRequests::Tell(tiering::ConnId conn, const tiering::MigrationNotice& notice) {
  if (!push_) return;
  proto::MigrationEvent ev;
  ev.set_migration_id(notice.migration_id);
  ev.set_lease_id(notice.lease_id);
  ev.set_phase(notice.phase);
  ev.set_reason(notice.why);
  Status st = push_(conn, AsReply(ev));
  if (!st.ok()) {
    CXLPOOL_LOG(kInfo) << "migration " << notice.migration_id << ": could not tell connection "
                       << conn << ": " << st.ToString();
  }
}

void TieringRequests::Moved(tiering::ConnId conn, uint64_t lease_id, int numa_node,
                            const std::string& pool) {
  if (!push_) return;
  // A LeaseEvent: clients of any version accept it (older ones ignore
  // events they do not know).
  proto::LeaseEvent ev;
  ev.set_lease_id(lease_id);
  ev.set_event("moved");
  ev.set_numa_node(numa_node);
  ev.set_pool(pool);
  Status st = push_(conn, AsReply(ev));
  if (!st.ok()) {
    CXLPOOL_LOG(kDebug) << "lease " << lease_id << " moved: could not tell connection " << conn
                        << ": " << st.ToString();
  }
}

void ToProto(const tiering::TieringReport& r, proto::TieringReportReply* out) {
  out->set_enabled(r.enabled);
  out->set_disabled_why(r.disabled_why);
  out->set_sampler(r.sampler);
  out->set_kernel(r.kernel);
  out->set_rate_limit_bytes_per_s(r.rate_limit_bytes_per_s);
  out->set_hot_threshold(r.hot_threshold);
  out->set_cold_threshold(r.cold_threshold);
  out->set_half_life_ms(static_cast<uint64_t>(r.half_life_ns / 1'000'000));
  for (const auto& p : r.pressure) out->add_pressure(p);
  out->set_in_flight(r.in_flight);
  for (const auto& l : r.leases) {
    proto::TieringLease* pl = out->add_leases();
    pl->set_lease_id(l.id);
    pl->set_label(l.label);
    pl->set_owner_uid(l.owner_uid);
    pl->set_priority(l.priority);
    pl->set_pinned_tier(l.opted_out);
    pl->set_cooperative(l.cooperative);
    pl->set_cooperative_state(l.cooperative_state);
    pl->set_moving(l.moving);
    for (const auto& u : l.units) {
      proto::TieringUnit* pu = pl->add_units();
      pu->set_unit(u.unit);
      pu->set_offset(u.offset);
      pu->set_length(u.length);
      pu->set_pool(u.pool);
      pu->set_numa_node(u.numa_node);
      pu->set_temperature(u.temperature);
      pu->set_verdict(u.verdict);
      pu->set_bytes_read(u.bytes_read);
      pu->set_bytes_written(u.bytes_written);
      pu->set_hints(u.hints);
      pu->set_sampled_pages(u.sampled_pages);
      pu->set_accessed_pages(u.accessed_pages);
      pu->set_last_moved_unix(u.last_moved_unix);
    }
  }
  for (const auto& h : r.history) {
    proto::MigrationRecord* ph = out->add_history();
    ph->set_migration_id(h.migration_id);
    ph->set_unix_time(h.unix_time);
    ph->set_lease_id(h.lease_id);
    ph->set_unit(h.unit);
    ph->set_bytes(h.bytes);
    ph->set_from_pool(h.from_pool);
    ph->set_to_pool(h.to_pool);
    ph->set_direction(h.direction);
    ph->set_mode(h.mode);
    ph->set_outcome(h.outcome);
    ph->set_why(h.why);
    ph->set_detail(h.detail);
    ph->set_move_ns(static_cast<uint64_t>(h.move_ns));
    ph->set_pause_ns(static_cast<uint64_t>(h.pause_ns));
  }
  for (const auto& [k, v] : r.counters) (*out->mutable_counters())[k] = v;
}

}  // namespace cxlpool
