#include "handler/tiering_requests.h"

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>

#include "cxlpool/common/log.h"
#include "handler/translate.h"
#include "handler/translate_tiering.h"

namespace cxlpool {

tiering::Caller TieringRequests::CallerOf(ConnectionId conn) const {
  tiering::Caller c;
  c.conn = conn;
  if (const CallerInfo* info = leases_->Caller(conn)) c.uid = info->uid;
  c.admin = leases_->IsAdmin(conn);
  return c;
}

const std::unordered_map<proto::MsgType, TieringRequests::Method>& TieringRequests::Table() {
  static const std::unordered_map<proto::MsgType, Method> table = {
      {proto::MSG_TIERING_SIGNALS_REQUEST, &TieringRequests::Signals},
      {proto::MSG_TIERING_LEASE_REQUEST, &TieringRequests::LeaseOptions},
      {proto::MSG_MIGRATION_READY_REQUEST, &TieringRequests::MigrationReady},
      {proto::MSG_TIERING_REPORT_REQUEST, &TieringRequests::Report},
  };
  return table;
}

bool TieringRequests::Handles(proto::MsgType type) { return Table().count(type) > 0; }

void TieringRequests::OnDisconnect(ConnectionId conn) {
  if (engine_ != nullptr) engine_->OnDisconnect(conn);
}

Reply TieringRequests::Handle(ConnectionId conn, const Request& req, const ReplyFn& reply,
                              bool* deferred) {
  if (engine_ == nullptr) {
    return MakeErrorReply(
        Status(Code::kUnsupported, "tiering is off in this daemon ([tiering] enabled = false)"));
  }
  auto it = Table().find(req.type);
  if (it == Table().end()) return MakeErrorReply(Status(Code::kInternal, "not a tiering message"));
  return (this->*(it->second))(Call{conn, req, reply, deferred});
}

Reply TieringRequests::Signals(const Call& call) {
  SignalBatch batch;
  if (Status st = DecodeSignals(call.req, kMaxSignalsPerFrame, &batch); !st.ok()) {
    return MakeErrorReply(st);
  }
  // Entries with an unknown hint are refused in the batch; the engine judges the rest.
  const tiering::Caller caller = CallerOf(call.conn);
  uint64_t over_rate = 0;
  for (auto& [j, st] : engine_->OnSignals(caller, batch.good)) {
    if (st.code() == Code::kResourceExhausted) ++over_rate;
    batch.bad.emplace_back(batch.index[j], st);
  }
  // A batch of one that is wrong is the caller's error, said plainly.
  Reply now = batch.total == 1 && batch.bad.size() == 1 ? MakeErrorReply(batch.bad.front().second)
                                                        : EncodeSignalsReply(batch);
  // Hints over the sender's rate: the answer waits until its bucket
  // could have taken them, so a flood costs the loop a frame per refill,
  // not a frame per round trip.
  const int64_t wait = loop_ ? engine_->UrgentWaitNs(caller.uid, over_rate) : 0;
  if (wait <= 0) return now;
  *call.deferred = true;
  auto timer = std::make_shared<boost::asio::steady_timer>(loop_);
  timer->expires_after(std::chrono::nanoseconds(wait));
  timer->async_wait([timer, reply = call.reply,
                     answer = std::move(now)](const boost::system::error_code&) { reply(answer); });
  return {};
}

Reply TieringRequests::LeaseOptions(const Call& call) {
  TieringLeaseAsk in;
  if (Status st = DecodeTieringLease(call.req, &in); !st.ok()) return MakeErrorReply(st);
  Status st =
      engine_->SetLeaseOptions(CallerOf(call.conn), in.lease_id, in.pin_tier, in.cooperative_pin);
  if (!st.ok()) return MakeErrorReply(st);
  return EncodeTieringLeaseReply();
}

Reply TieringRequests::MigrationReady(const Call& call) {
  MigrationReadyAsk in;
  if (Status st = DecodeMigrationReady(call.req, &in); !st.ok()) return MakeErrorReply(st);
  *call.deferred = true;
  engine_->OnMigrationReady(call.conn, in.migration_id, in.ready, in.reason,
                            [reply = call.reply](Result<tiering::MigrationOutcome> o) {
                              if (!o.ok()) return reply(MakeErrorReply(o.status()));
                              reply(EncodeMigrationReadyReply(*o));
                            });
  return {};
}

Reply TieringRequests::Report(const Call& call) {
  bool all = false;
  if (Status st = DecodeReportAll(call.req, &all); !st.ok()) return MakeErrorReply(st);
  const CallerInfo* caller = leases_->Caller(call.conn);
  std::optional<uint32_t> owner;
  if (!all || !leases_->IsAdmin(call.conn)) {
    if (all) {
      return MakeErrorReply(
          Status(Code::kPermissionDenied, "tiering --all needs admin (root or the admin group)"));
    }
    owner = caller != nullptr ? caller->uid : static_cast<uint32_t>(-1);
  }
  return EncodeReportReply(engine_->Report(owner));
}

Status TieringRequests::Ask(tiering::ConnId conn, const tiering::MigrationAsk& ask) {
  if (!push_) return Status(Code::kUnavailable, "no push channel");
  return push_(conn, EncodeMigrationEvent(ask));
}

void TieringRequests::Tell(tiering::ConnId conn, const tiering::MigrationNotice& notice) {
  if (!push_) return;
  Status st = push_(conn, EncodeMigrationEvent(notice));
  if (!st.ok()) {
    CXLPOOL_LOG(kInfo) << "migration " << notice.migration_id << ": could not tell connection "
                       << conn << ": " << st.ToString();
  }
}

void TieringRequests::Moved(tiering::ConnId conn, uint64_t lease_id, int numa_node,
                            const std::string& pool) {
  if (!push_) return;
  Status st = push_(conn, EncodeMovedEvent(lease_id, numa_node, pool));
  if (!st.ok()) {
    CXLPOOL_LOG(kDebug) << "lease " << lease_id << " moved: could not tell connection " << conn
                        << ": " << st.ToString();
  }
}

}  // namespace cxlpool
