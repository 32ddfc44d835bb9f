// DaemonHandler: cxlpoold's RequestHandler. Looks each request's type up in
// its table (the tiering ones go to TieringRequests); the function there
// decodes the request (translate.h), checks who may do what, calls the
// LeaseManager, and answers with the reply (plus the lease fds on ALLOC and
// ATTACH) or an ErrorReply with a code and a human message. Revokes are
// pushed to every holder as a LeaseEvent.
//
// A new message: its proto (proto/cxlpool.proto), its Decode/Encode in
// translate.h, and one function here with its line in Table().
//
// Peer facts it derives at connect: supplementary groups from
// /proc/<pid>/status "Groups:" (read through `proc`, a FileSystem rooted at
// the real "/"), and admin = uid 0 or a member (primary or supplementary)
// of the configured admin group.
//
// Thread safety: like RequestHandler, every call on the event-loop thread.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "cxlpool/common/clock.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/common/proc.h"  // ParseStatusGroups
#include "handler/daemon_metrics.h"
#include "handler/tiering_requests.h"
#include "handler/translate.h"
#include "lease/lease_manager.h"
#include "server/handler.h"

namespace cxlpool {

struct HandlerOptions {
  std::optional<gid_t> admin_gid;
  std::string server_version = "cxlpoold 0.1.0";
  std::string instance_id;
  uint64_t max_frame_bytes = 1u << 20;
  // The most fds one request frame may bring (limits.max_fds_per_frame),
  // told to clients in HelloReply.max_fds_per_frame.
  uint32_t max_fds_per_frame = 64;
  // The largest request payload (limits.max_request_bytes), in
  // HelloReply.max_request_bytes.
  uint64_t max_request_bytes = 64u << 10;
  // The topology describes this machine: the caller's CPU picks its home
  // node for placement. False for --sysfs-root trees.
  bool topology_is_local = true;
  // Times grants for the latency histograms; null: the system clock.
  const Clock* clock = nullptr;
};

class DaemonHandler final : public RequestHandler {
 public:
  // Sends a server-initiated frame (the server's Push).
  using PushFn = std::function<Status(ConnectionId, Reply)>;

  DaemonHandler(LeaseManager* leases, const FileSystem* proc, HandlerOptions options);
  void SetPush(PushFn push) { push_ = std::move(push); }
  // Tells each holder connection that lease `id` was revoked (a pushed
  // LeaseEvent); on the loop.
  void TellRevoked(uint64_t id, const std::vector<ConnectionId>& holders);
  // The tiering messages go to `tiering` (null: UNSUPPORTED, tiering off).
  void SetTiering(TieringRequests* tiering) { tiering_ = tiering; }
  // Entries from outside the lease manager (the server's limits) for STATS
  // and for the metrics text.
  using StatsFn = std::function<void(std::map<std::string, uint64_t>* counters,
                                     std::map<std::string, uint64_t>* gauges)>;
  void SetExtraStats(StatsFn stats, std::function<void(MetricsRegistry*)> metrics) {
    extra_stats_ = std::move(stats);
    metrics_.SetExtra(std::move(metrics));
  }

  void OnConnect(ConnectionId conn, const PeerInfo& peer) override;
  void OnRequest(ConnectionId conn, Request request, ReplyFn reply) override;
  void OnDisconnect(ConnectionId conn) override;
  bool HoldsResources(ConnectionId conn) const override { return leases_->HoldsLeases(conn); }

  // The Prometheus exposition (MSG_METRICS_REQUEST, the HTTP endpoint).
  // `tenants`: with the per-tenant families (quota rules and usage), which
  // only admins get over the socket; the HTTP endpoint serves them.
  std::string MetricsText(bool tenants = true);
  const DaemonMetrics& metrics() const { return metrics_; }

 private:
  // One request: what each message's function gets. A function answers now
  // (returns the reply) or later through `reply` (it sets *deferred).
  struct Call {
    ConnectionId conn;
    const Request& req;
    const ReplyFn& reply;
    bool* deferred;
  };
  using Method = Reply (DaemonHandler::*)(const Call&);
  // The message types this handler serves (the tiering ones aside), and the
  // function for each.
  static const std::unordered_map<proto::MsgType, Method>& Table();

  Reply Handle(ConnectionId conn, const Request& req, const ReplyFn& reply, bool* deferred);
  Reply Hello(const Call& call);
  Reply Alloc(const Call& call);
  Reply Release(const Call& call);
  Reply ListLeases(const Call& call);
  Reply Stat(const Call& call);
  Reply Attach(const Call& call);
  Reply Pools(const Call& call);
  Reply Topology(const Call& call);
  Reply Stats(const Call& call);
  Reply Revoke(const Call& call);
  Reply Quotas(const Call& call);
  Reply QuotaSet(const Call& call);
  Reply Metrics(const Call& call);
  Reply LeaseMoved(const Call& call);
  Reply Reclaim(const Call& call);

  // The node the caller runs on, where the request names neither a node nor
  // a GPU and the topology is this machine's.
  void SetHomeNode(ConnectionId conn, AllocParams* params) const;
  // Tells the lease's other holders it moved (one event, as from a tiering move).
  void TellOtherHolders(ConnectionId conn, uint64_t lease_id);
  // An ALLOC_REPLY or ATTACH_REPLY for `g`, its fds split into frames as
  // the connection takes them.
  Reply LeaseReply(ConnectionId conn, GrantReply kind, const Granted& g) const;

  LeaseManager* leases_;
  const FileSystem* proc_;
  HandlerOptions options_;
  PushFn push_;
  TieringRequests* tiering_ = nullptr;
  StatsFn extra_stats_;
  DaemonMetrics metrics_;  // lives as long as the handler
  // The topology never changes after start (the lease manager holds it by
  // const pointer), so its JSON is rendered once, on the first TOPOLOGY.
  std::string topology_json_;
  // The most fds one frame may bring each client (its HELLO's
  // max_fds_per_frame; 0 there means 64).
  std::unordered_map<ConnectionId, size_t> fds_per_frame_;
  // Connections that negotiated version 1 (one fd per lease reply).
  std::unordered_set<ConnectionId> version1_;
};

}  // namespace cxlpool
