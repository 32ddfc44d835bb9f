#include "handler/translate_tiering.h"

#include "cxlpool.pb.h"
#include "handler/translate_codec.h"

namespace cxlpool {

Status DecodeSignals(const Request& req, int max_signals, SignalBatch* out) {
  proto::TieringSignalsRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  if (in.signals_size() > max_signals) {
    return Status(Code::kInvalidArgument,
                  "TIERING_SIGNALS_REQUEST carries " + std::to_string(in.signals_size()) +
                      " signals; at most " + std::to_string(max_signals) + " per frame");
  }
  out->total = static_cast<size_t>(in.signals_size());
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
        out->bad.emplace_back(
            static_cast<size_t>(i),
            Status(Code::kInvalidArgument, "unknown hint " + std::to_string(s.hint()) +
                                               " (hot 1, cold 2, will_need 3, dont_need 4)"));
        continue;
      }
    }
    out->good.push_back(x);
    out->index.push_back(static_cast<size_t>(i));
  }
  return Status::Ok();
}

Reply EncodeSignalsReply(const SignalBatch& batch) {
  proto::TieringSignalsReply out;
  out.set_accepted(static_cast<uint32_t>(batch.total - batch.bad.size()));
  for (const auto& [j, st] : batch.bad) {
    proto::SignalRejection* r = out.add_rejected();
    r->set_index(static_cast<uint32_t>(j));
    r->set_code(static_cast<proto::ErrorCode>(st.code()));
    r->set_message(st.message());
  }
  return EncodeAsReply(out);
}

Status DecodeTieringLease(const Request& req, TieringLeaseAsk* out) {
  proto::TieringLeaseRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  out->lease_id = in.lease_id();
  if (in.has_pin_tier()) out->pin_tier = in.pin_tier();
  if (in.has_cooperative_pin()) out->cooperative_pin = in.cooperative_pin();
  return Status::Ok();
}

Reply EncodeTieringLeaseReply() { return EncodeAsReply(proto::TieringLeaseReply()); }

Status DecodeMigrationReady(const Request& req, MigrationReadyAsk* out) {
  proto::MigrationReadyRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  out->migration_id = in.migration_id();
  out->ready = in.ready();
  out->reason = in.reason();
  return Status::Ok();
}

Reply EncodeMigrationReadyReply(const tiering::MigrationOutcome& o) {
  proto::MigrationReadyReply out;
  out.set_moved(o.moved);
  out.set_numa_node(o.numa_node);
  out.set_bytes(o.bytes);
  out.set_move_ns(static_cast<uint64_t>(o.move_ns));
  out.set_detail(o.detail);
  return EncodeAsReply(out);
}

Status DecodeReportAll(const Request& req, bool* all) {
  proto::TieringReportRequest in;
  if (Status st = DecodePayload(req, &in); !st.ok()) return st;
  *all = in.all();
  return Status::Ok();
}

Reply EncodeReportReply(const tiering::TieringReport& r) {
  proto::TieringReportReply reply;
  proto::TieringReportReply* out = &reply;
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
  return EncodeAsReply(reply);
}

Reply EncodeMigrationEvent(const tiering::MigrationAsk& ask) {
  proto::MigrationEvent ev;
  ev.set_migration_id(ask.migration_id);
  ev.set_lease_id(ask.lease_id);
  ev.set_phase("prepare");
  ev.set_offset(ask.offset);
  ev.set_length(ask.length);
  ev.set_target_node(ask.target_node);
  ev.set_deadline_ms(ask.deadline_ms);
  ev.set_reason(ask.why);
  return EncodeAsReply(ev);
}

Reply EncodeMigrationEvent(const tiering::MigrationNotice& notice) {
  proto::MigrationEvent ev;
  ev.set_migration_id(notice.migration_id);
  ev.set_lease_id(notice.lease_id);
  ev.set_phase(notice.phase);
  ev.set_reason(notice.why);
  return EncodeAsReply(ev);
}

}  // namespace cxlpool
