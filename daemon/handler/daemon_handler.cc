#include "handler/daemon_handler.h"

#include <unistd.h>

#include <algorithm>

#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/codec.h"  // NegotiateVersion, MsgTypeName
#include "cxlpool/proto/extents.h"
#include "cxlpool/topology/json.h"
#include "handler/translate.h"
#include "metrics.h"

namespace cxlpool {

DaemonHandler::DaemonHandler(LeaseManager* leases, const FileSystem* proc, HandlerOptions options)
    : leases_(leases), proc_(proc), options_(std::move(options)) {}

void DaemonHandler::OnConnect(ConnectionId conn, const PeerInfo& peer) {
  CallerInfo c;
  c.pid = peer.pid;
  c.uid = peer.uid;
  c.gid = peer.gid;
  c.comm = peer.comm;
  c.cgroup = peer.cgroup;
  if (peer.pid > 0) {
    auto status = proc_->ReadFile("/proc/" + std::to_string(peer.pid) + "/status");
    if (status.ok()) c.groups = ParseStatusGroups(*status);
    // Restart support: the journal tells a holder from a reused pid by this.
    Result<ProcStat> stat = ReadProcStat(*proc_, peer.pid);
    if (stat.ok()) c.start_time = stat->start_time;
  }
  c.is_admin = peer.uid == 0;
  if (!c.is_admin && options_.admin_gid) {
    gid_t g = *options_.admin_gid;
    c.is_admin = peer.gid == g || std::find(c.groups.begin(), c.groups.end(), g) != c.groups.end();
  }
  leases_->Connect(conn, std::move(c));
}

void DaemonHandler::OnDisconnect(ConnectionId conn) {
  fds_per_frame_.erase(conn);
  version1_.erase(conn);
  leases_->Disconnect(conn);
  if (tiering_ != nullptr) tiering_->OnDisconnect(conn);
}

namespace {

Status NeedAdmin(const LeaseManager& m, ConnectionId conn, const char* what) {
  if (m.IsAdmin(conn)) return Status::Ok();
  return Status(Code::kPermissionDenied,
                std::string(what) + " needs admin (root or the configured admin group)");
}

}  // namespace

const std::unordered_map<proto::MsgType, DaemonHandler::Method>& DaemonHandler::Table() {
  static const std::unordered_map<proto::MsgType, Method> table = {
      {proto::MSG_HELLO_REQUEST, &DaemonHandler::Hello},
      {proto::MSG_ALLOC_REQUEST, &DaemonHandler::Alloc},
      {proto::MSG_RELEASE_REQUEST, &DaemonHandler::Release},
      {proto::MSG_LIST_LEASES_REQUEST, &DaemonHandler::ListLeases},
      {proto::MSG_STAT_REQUEST, &DaemonHandler::Stat},
      {proto::MSG_ATTACH_REQUEST, &DaemonHandler::Attach},
      {proto::MSG_POOLS_REQUEST, &DaemonHandler::Pools},
      {proto::MSG_TOPOLOGY_REQUEST, &DaemonHandler::Topology},
      {proto::MSG_STATS_REQUEST, &DaemonHandler::Stats},
      {proto::MSG_REVOKE_REQUEST, &DaemonHandler::Revoke},
      {proto::MSG_QUOTAS_REQUEST, &DaemonHandler::Quotas},
      {proto::MSG_QUOTA_SET_REQUEST, &DaemonHandler::QuotaSet},
      {proto::MSG_METRICS_REQUEST, &DaemonHandler::Metrics},
      {proto::MSG_LEASE_MOVED_REQUEST, &DaemonHandler::LeaseMoved},
      {proto::MSG_RECLAIM_REQUEST, &DaemonHandler::Reclaim},
  };
  return table;
}

void DaemonHandler::OnRequest(ConnectionId conn, Request request, ReplyFn reply) {
  bool deferred = false;
  Reply r = Handle(conn, request, reply, &deferred);
  if (!deferred) reply(std::move(r));
}

Reply DaemonHandler::Handle(ConnectionId conn, const Request& req, const ReplyFn& reply,
                            bool* deferred) {
  if (!req.fds.empty() && req.type != proto::MSG_RECLAIM_REQUEST) {
    return MakeErrorReply(
        Status(Code::kProtocol, wire::MsgTypeName(req.type) + " must not carry file descriptors"));
  }
  if (TieringRequests::Handles(req.type)) {
    if (tiering_ == nullptr) {
      return MakeErrorReply(Status(Code::kUnsupported,
                                   "tiering is off in this daemon"
                                   " ([tiering] enabled = false)"));
    }
    return tiering_->Handle(conn, req, reply, deferred);
  }
  auto it = Table().find(req.type);
  if (it == Table().end()) {
    return MakeErrorReply(
        Status(Code::kInvalidArgument, "unexpected message " + wire::MsgTypeName(req.type) +
                                           " (not a request this daemon serves)"));
  }
  return (this->*(it->second))(Call{conn, req, reply, deferred});
}

Reply DaemonHandler::Hello(const Call& call) {
  HelloAsk in;
  if (Status st = DecodeHello(call.req, &in); !st.ok()) return MakeErrorReply(st);
  auto v = wire::NegotiateVersion(in.min_version, in.max_version);
  if (!v.ok()) return MakeErrorReply(v.status());
  HelloAnswer out;
  out.version = *v;
  out.server_version = options_.server_version;
  out.instance_id = options_.instance_id;
  out.in_grace_period = leases_->in_grace();
  out.max_frame_bytes = options_.max_frame_bytes;
  out.max_fds_per_frame = options_.max_fds_per_frame;
  out.max_request_bytes = options_.max_request_bytes;
  out.is_admin = leases_->IsAdmin(call.conn);
  if (*v < 2) {
    version1_.insert(call.conn);
  } else {
    version1_.erase(call.conn);
  }
  const uint32_t per_frame = in.max_fds_per_frame;
  fds_per_frame_[call.conn] = std::clamp<size_t>(
      per_frame == 0 ? wire::kDefaultMaxFdsPerFrame : per_frame, 1, wire::kMaxExtentFdsPerFrame);
  return EncodeHelloReply(out);
}

void DaemonHandler::SetHomeNode(ConnectionId conn, AllocParams* params) const {
  const CallerInfo* caller = leases_->Caller(conn);
  // The caller's node matters only when the request names neither a node
  // nor a GPU; with one node that has CPUs it is that node, so /proc is
  // read only where the answer can differ.
  const bool placed = params->numa_node.has_value() || !params->gpu.empty();
  if (options_.topology_is_local && caller != nullptr && caller->pid > 0 && !placed) {
    if (auto only = OnlyCpuNode(leases_->topology())) {
      params->home_node = *only;
    } else if (auto cpu = LastCpuOf(*proc_, caller->pid)) {
      params->home_node = NodeOfCpu(leases_->topology(), *cpu);
    }
  }
}

Reply DaemonHandler::Alloc(const Call& call) {
  AllocParams params;
  if (Status st = DecodeAlloc(call.req, &params); !st.ok()) return MakeErrorReply(st);
  if (Status st = leases_->GraceRefusal(); !st.ok()) return MakeErrorReply(st);
  if (Status st = CheckAllocParams(params); !st.ok()) return MakeErrorReply(st);
  params.one_extent = version1_.count(call.conn) > 0;
  SetHomeNode(call.conn, &params);
  *call.deferred = true;
  const Clock* clock = options_.clock != nullptr ? options_.clock : &SystemClock::Get();
  int64_t started = clock->MonotonicNs();
  leases_->Allocate(
      call.conn, std::move(params),
      [this, conn = call.conn, clock, started, reply = call.reply](Result<Granted> g) {
        if (!g.ok()) return reply(MakeErrorReply(g.status()));
        metrics_.OnGranted(g->lease, clock->MonotonicNs() - started);
        reply(LeaseReply(conn, GrantReply::kAlloc, *g));
      });
  return {};
}

Reply DaemonHandler::Release(const Call& call) {
  uint64_t id = 0;
  if (Status st = DecodeLeaseId(call.req, &id); !st.ok()) return MakeErrorReply(st);
  if (Status st = leases_->Release(call.conn, id); !st.ok()) return MakeErrorReply(st);
  return EncodeReleaseReply();
}

Reply DaemonHandler::ListLeases(const Call& call) {
  bool all = false;
  if (Status st = DecodeListAll(call.req, &all); !st.ok()) return MakeErrorReply(st);
  auto list = leases_->List(call.conn, all);
  if (!list.ok()) return MakeErrorReply(list.status());
  return EncodeListLeasesReply(*list);
}

Reply DaemonHandler::Stat(const Call& call) {
  uint64_t id = 0;
  if (Status st = DecodeLeaseId(call.req, &id); !st.ok()) return MakeErrorReply(st);
  auto s = leases_->Stat(call.conn, id);
  if (!s.ok()) return MakeErrorReply(s.status());
  return EncodeStatReply(*s);
}

Reply DaemonHandler::Attach(const Call& call) {
  AttachAsk in;
  if (Status st = DecodeAttach(call.req, &in); !st.ok()) return MakeErrorReply(st);
  if (Status st = leases_->GraceRefusal(); !st.ok()) return MakeErrorReply(st);
  auto g = leases_->Attach(call.conn, in.name, in.owner);
  if (!g.ok()) return MakeErrorReply(g.status());
  if (g->extents.size() > 1 && version1_.count(call.conn)) {
    // Version 1 carries one fd per lease: this holder cannot map it.
    (void)leases_->Release(call.conn, g->lease.id);
    return MakeErrorReply(
        Status(Code::kUnsupported, "shared lease '" + in.name + "' has " +
                                       std::to_string(g->extents.size()) +
                                       " extents; protocol version 1 carries one fd per lease "
                                       "(this client speaks 1, the daemon up to " +
                                       std::to_string(wire::kMaxWireVersion) + ")"));
  }
  return LeaseReply(call.conn, GrantReply::kAttach, *g);
}

Reply DaemonHandler::Pools(const Call& call) {
  if (Status st = DecodeEmpty(call.req); !st.ok()) return MakeErrorReply(st);
  return EncodePoolsReply(leases_->Pools());
}

Reply DaemonHandler::Topology(const Call& call) {
  if (Status st = DecodeEmpty(call.req); !st.ok()) return MakeErrorReply(st);
  if (topology_json_.empty()) topology_json_ = TopologyToJsonString(leases_->topology());
  return EncodeTopologyReply(topology_json_);
}

Reply DaemonHandler::Stats(const Call& call) {
  if (Status st = DecodeEmpty(call.req); !st.ok()) return MakeErrorReply(st);
  StatsAnswer out;
  for (const auto& [k, v] : leases_->Counters()) out.counters.emplace_back(k, v);
  for (const auto& [k, v] : leases_->Gauges()) out.gauges.emplace_back(k, v);
  // Read by `cxlpoolctl doctor`.
  ProcessFacts facts = ReadProcessFacts();
  out.gauges.emplace_back("dumpable", facts.dumpable ? 1 : 0);
  out.gauges.emplace_back("memlock_limit_bytes", facts.memlock_limit_bytes);
  if (extra_stats_) {
    std::map<std::string, uint64_t> counters, gauges;
    extra_stats_(&counters, &gauges);
    out.counters.insert(out.counters.end(), counters.begin(), counters.end());
    out.gauges.insert(out.gauges.end(), gauges.begin(), gauges.end());
  }
  return EncodeStatsReply(out);
}

Reply DaemonHandler::Revoke(const Call& call) {
  uint64_t id = 0;
  if (Status st = DecodeLeaseId(call.req, &id); !st.ok()) return MakeErrorReply(st);
  if (Status st = NeedAdmin(*leases_, call.conn, "revoke"); !st.ok()) return MakeErrorReply(st);
  // Answered (and the holders told) once the memory is truncated.
  *call.deferred = true;
  leases_->Revoke(call.conn, id,
                  [this, id, reply = call.reply](Result<std::vector<ConnId>> holders) {
                    if (!holders.ok()) return reply(MakeErrorReply(holders.status()));
                    TellRevoked(id, *holders);
                    reply(EncodeRevokeReply());
                  });
  return {};
}

void DaemonHandler::TellRevoked(uint64_t id, const std::vector<ConnectionId>& holders) {
  for (ConnectionId h : holders) {
    if (!push_) break;
    Status st = push_(h, EncodeRevokedEvent(id));
    if (!st.ok()) {
      CXLPOOL_LOG(kInfo) << "revoke " << id << ": could not tell connection " << h << ": "
                         << st.ToString();
    }
  }
  CXLPOOL_LOG(kInfo) << "lease " << id << " revoked; " << holders.size()
                     << " holder connection(s) told";
}

Reply DaemonHandler::Quotas(const Call& call) {
  if (Status st = DecodeEmpty(call.req); !st.ok()) return MakeErrorReply(st);
  // Other tenants' rules and usage are for admins.
  return EncodeQuotasReply(leases_->QuotasVisibleTo(call.conn));
}

Reply DaemonHandler::QuotaSet(const Call& call) {
  QuotaSpec spec;
  if (Status st = DecodeQuotaSet(call.req, &spec); !st.ok()) return MakeErrorReply(st);
  if (Status st = NeedAdmin(*leases_, call.conn, "setting quotas"); !st.ok()) {
    return MakeErrorReply(st);
  }
  auto rule = ToQuotaRule(spec);
  if (!rule.ok()) return MakeErrorReply(rule.status());
  if (Status st = leases_->SetQuota(call.conn, *rule); !st.ok()) return MakeErrorReply(st);
  return EncodeQuotaSetReply();
}

Reply DaemonHandler::Metrics(const Call& call) {
  if (Status st = DecodeEmpty(call.req); !st.ok()) return MakeErrorReply(st);
  // Aggregate families for everyone; per-tenant ones for admins.
  return EncodeMetricsReply(MetricsText(leases_->IsAdmin(call.conn)));
}

void DaemonHandler::TellOtherHolders(ConnectionId conn, uint64_t lease_id) {
  if (auto facts = leases_->LeaseForMigration(lease_id)) {
    for (ConnId c : facts->holders) {
      if (c != conn) tiering_->Moved(c, lease_id, facts->lease.numa_node, facts->pool->name());
    }
  }
}

Reply DaemonHandler::LeaseMoved(const Call& call) {
  MovedReport in;
  if (Status st = DecodeLeaseMoved(call.req, &in); !st.ok()) return MakeErrorReply(st);
  auto check = leases_->CheckMoved(call.conn, in.lease_id);
  if (!check.ok()) return MakeErrorReply(check.status());
  if (!check->moved) {
    CXLPOOL_LOG(kInfo) << "lease " << in.lease_id << ": holder saw node " << in.numa_node << " ("
                       << in.pages_on_node << " of " << in.pages_sampled << " pages, after "
                       << SanitizeUtf8(in.cause.substr(0, 32))
                       << "); the daemon's move_pages sees node " << check->lease.numa_node;
  }
  // Its other holders learn it as from a tiering move: one event.
  if (check->moved && tiering_ != nullptr) TellOtherHolders(call.conn, in.lease_id);
  return EncodeLeaseMovedReply(check->lease, check->moved);
}

Reply DaemonHandler::LeaseReply(ConnectionId conn, GrantReply kind, const Granted& g) const {
  auto per = fds_per_frame_.find(conn);
  const size_t per_frame = per != fds_per_frame_.end() ? per->second : wire::kDefaultMaxFdsPerFrame;
  return EncodeGrantReply(kind, g, per_frame, static_cast<uint32_t>(options_.max_frame_bytes));
}

// RECLAIM: the leases a client kept across a daemon restart, with their fds.
// A frame that does not add up is refused whole (DecodeReclaim); each lease
// is then judged alone.
Reply DaemonHandler::Reclaim(const Call& call) {
  std::vector<LeaseManager::ReclaimItem> items;
  if (Status st = DecodeReclaim(call.req, &items); !st.ok()) return MakeErrorReply(st);
  auto outcome = leases_->Reclaim(call.conn, std::move(items));
  for (const auto& [id, why] : outcome.rejected) {
    CXLPOOL_LOG(kInfo) << "reclaim of lease " << id << " rejected: " << why;
  }
  if (!outcome.accepted.empty() || !outcome.rejected.empty()) {
    CXLPOOL_LOG(kInfo) << "reclaim: " << outcome.accepted.size() << " accepted, "
                       << outcome.rejected.size() << " rejected";
  }
  return EncodeReclaimReply(outcome);
}

std::string DaemonHandler::MetricsText(bool tenants) {
  return metrics_.Render(*leases_, ReadProcessFacts(), tenants);
}

}  // namespace cxlpool
