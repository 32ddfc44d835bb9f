// TieringRequests: the tiering messages of the wire protocol (docs/protocol.md,
// "Tiering") between the server and the TieringEngine: signal batches,
// per-lease settings, the cooperative migration's MIGRATION_READY (answered
// after the move) and the report; and the HolderChannel the engine pushes
// MIGRATION_EVENTs through.
//
// DaemonHandler hands it every message for which Handles() is true; without
// a TieringRequests (tiering off) those get UNSUPPORTED.
//
// Thread safety: the event-loop thread only, like the handler.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <functional>
#include <unordered_map>

#include "lease/lease_manager.h"
#include "server/handler.h"
#include "tiering/engine.h"

namespace cxlpool {

class TieringRequests final : public tiering::HolderChannel {
 public:
  using PushFn = std::function<Status(ConnectionId, Reply)>;

  // `engine` may be set later (SetEngine): the engine needs this object as
  // its HolderChannel first.
  explicit TieringRequests(const LeaseManager* leases) : leases_(leases) {}
  void SetEngine(tiering::TieringEngine* engine) { engine_ = engine; }
  void SetPush(PushFn push) { push_ = std::move(push); }
  // The event loop, for holding the reply to a frame whose urgent hints were
  // refused for rate (TieringEngine::UrgentWaitNs); unset: answered at once.
  void SetLoop(boost::asio::any_io_executor loop) { loop_ = std::move(loop); }

  static bool Handles(proto::MsgType type);
  // Answers now (returns the reply) or later through `reply` (*deferred).
  Reply Handle(ConnectionId conn, const Request& req, const ReplyFn& reply, bool* deferred);
  void OnDisconnect(ConnectionId conn);

  // HolderChannel
  Status Ask(tiering::ConnId conn, const tiering::MigrationAsk& ask) override;
  void Tell(tiering::ConnId conn, const tiering::MigrationNotice& notice) override;
  void Moved(tiering::ConnId conn, uint64_t lease_id, int numa_node,
             const std::string& pool) override;

  // Most signals one frame may carry.
  static constexpr int kMaxSignalsPerFrame = 4096;

 private:
  // One request: what each message's function gets.
  struct Call {
    ConnectionId conn;
    const Request& req;
    const ReplyFn& reply;
    bool* deferred;
  };
  using Method = Reply (TieringRequests::*)(const Call&);
  // The message types this object serves, and the function for each.
  static const std::unordered_map<proto::MsgType, Method>& Table();

  Reply Signals(const Call& call);
  Reply LeaseOptions(const Call& call);
  Reply MigrationReady(const Call& call);
  Reply Report(const Call& call);

  // The connection's uid and admin rights, for the engine's checks.
  tiering::Caller CallerOf(ConnectionId conn) const;

  const LeaseManager* leases_;
  tiering::TieringEngine* engine_ = nullptr;
  PushFn push_;
  boost::asio::any_io_executor loop_;
};

}  // namespace cxlpool
