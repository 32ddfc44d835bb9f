#include "handler/daemon_handler.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/codec.h"
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

template <typename M>
Reply Encoded(const M& msg, std::vector<int> fds = {}) {
  auto payload = wire::Encode(msg);
  if (!payload.ok()) return MakeErrorReply(payload.status());
  Reply r;
  r.type = wire::TypeOf<M>();
  r.payload = std::move(*payload);
  r.fds = std::move(fds);
  return r;
}

template <typename M>
Status DecodeAs(const Request& req, M* out) {
  Status st = wire::Decode(req.payload, out);
  if (!st.ok()) return Status(st.code(), wire::MsgTypeName(req.type) + ": " + st.message());
  return Status::Ok();
}

Reply ToReply(wire::PlannedFrame f) {
  Reply r;
  r.type = f.type;
  r.payload = std::move(f.payload);
  return r;
}

Status NeedAdmin(const LeaseManager& m, ConnectionId conn, const char* what) {
  if (m.IsAdmin(conn)) return Status::Ok();
  return Status(Code::kPermissionDenied,
                std::string(what) + " needs admin (root or the configured admin group)");
}

}  // namespace

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
  switch (req.type) {
    case proto::MSG_HELLO_REQUEST: {
      proto::HelloRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      auto v = wire::NegotiateVersion(in.min_version(), in.max_version());
      if (!v.ok()) return MakeErrorReply(v.status());
      proto::HelloReply out;
      out.set_version(*v);
      out.set_server_version(options_.server_version);
      out.set_instance_id(options_.instance_id);
      out.set_in_grace_period(leases_->in_grace());
      out.set_max_frame_bytes(options_.max_frame_bytes);
      out.set_max_fds_per_frame(options_.max_fds_per_frame);
      out.set_max_request_bytes(options_.max_request_bytes);
      out.set_is_admin(leases_->IsAdmin(conn));
      if (*v < 2) {
        version1_.insert(conn);
      } else {
        version1_.erase(conn);
      }
      const uint32_t per_frame = in.max_fds_per_frame();
      fds_per_frame_[conn] =
          std::clamp<size_t>(per_frame == 0 ? wire::kDefaultMaxFdsPerFrame : per_frame, 1,
                             wire::kMaxExtentFdsPerFrame);
      return Encoded(out);
    }
    case proto::MSG_ALLOC_REQUEST: {
      proto::AllocRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      if (Status st = leases_->GraceRefusal(); !st.ok()) return MakeErrorReply(st);
      auto params = FromProto(in);
      if (!params.ok()) return MakeErrorReply(params.status());
      params->one_extent = version1_.count(conn) > 0;
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
      *deferred = true;
      const Clock* clock = options_.clock != nullptr ? options_.clock : &SystemClock::Get();
      int64_t started = clock->MonotonicNs();
      leases_->Allocate(conn, std::move(*params),
                        [this, conn, clock, started, reply](Result<Granted> g) {
                          if (!g.ok()) return reply(MakeErrorReply(g.status()));
                          metrics_.OnGranted(g->lease, clock->MonotonicNs() - started);
                          reply(LeaseReply(conn, proto::MSG_ALLOC_REPLY, *g));
                        });
      return {};
    }
    case proto::MSG_RELEASE_REQUEST: {
      proto::ReleaseRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      if (Status st = leases_->Release(conn, in.lease_id()); !st.ok()) return MakeErrorReply(st);
      return Encoded(proto::ReleaseReply());
    }
    case proto::MSG_LIST_LEASES_REQUEST: {
      proto::ListLeasesRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      auto list = leases_->List(conn, in.all());
      if (!list.ok()) return MakeErrorReply(list.status());
      proto::ListLeasesReply out;
      for (const auto& l : *list) ToProto(l, out.add_leases());
      return Encoded(out);
    }
    case proto::MSG_STAT_REQUEST: {
      proto::StatRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      auto s = leases_->Stat(conn, in.lease_id());
      if (!s.ok()) return MakeErrorReply(s.status());
      proto::StatReply out;
      ToProto(*s, out.mutable_lease());
      return Encoded(out);
    }
    case proto::MSG_ATTACH_REQUEST: {
      proto::AttachRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      if (Status st = leases_->GraceRefusal(); !st.ok()) return MakeErrorReply(st);
      std::optional<uid_t> owner;
      if (in.has_owner_uid()) owner = in.owner_uid();
      auto g = leases_->Attach(conn, in.name(), owner);
      if (!g.ok()) return MakeErrorReply(g.status());
      if (g->extents.size() > 1 && version1_.count(conn)) {
        // Version 1 carries one fd per lease: this holder cannot map it.
        (void)leases_->Release(conn, g->lease.id);
        return MakeErrorReply(
            Status(Code::kUnsupported, "shared lease '" + in.name() + "' has " +
                                           std::to_string(g->extents.size()) +
                                           " extents; protocol version 1 carries one fd per lease "
                                           "(this client speaks 1, the daemon up to " +
                                           std::to_string(wire::kMaxWireVersion) + ")"));
      }
      return LeaseReply(conn, proto::MSG_ATTACH_REPLY, *g);
    }
    case proto::MSG_POOLS_REQUEST: {
      proto::PoolsRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      proto::PoolsReply out;
      for (const auto& p : leases_->Pools()) ToProto(p, out.add_pools());
      return Encoded(out);
    }
    case proto::MSG_TOPOLOGY_REQUEST: {
      proto::TopologyRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      proto::TopologyReply out;
      if (topology_json_.empty()) topology_json_ = TopologyToJsonString(leases_->topology());
      out.set_json(topology_json_);
      return Encoded(out);
    }
    case proto::MSG_STATS_REQUEST: {
      proto::StatsRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      proto::StatsReply out;
      for (const auto& [k, v] : leases_->Counters()) (*out.mutable_counters())[k] = v;
      for (const auto& [k, v] : leases_->Gauges()) (*out.mutable_gauges())[k] = v;
      // Read by `cxlpoolctl doctor`.
      ProcessFacts facts = ReadProcessFacts();
      (*out.mutable_gauges())["dumpable"] = facts.dumpable ? 1 : 0;
      (*out.mutable_gauges())["memlock_limit_bytes"] = facts.memlock_limit_bytes;
      if (extra_stats_) {
        std::map<std::string, uint64_t> counters, gauges;
        extra_stats_(&counters, &gauges);
        for (const auto& [k, v] : counters) (*out.mutable_counters())[k] = v;
        for (const auto& [k, v] : gauges) (*out.mutable_gauges())[k] = v;
      }
      return Encoded(out);
    }
    case proto::MSG_REVOKE_REQUEST: {
      proto::RevokeRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      if (Status st = NeedAdmin(*leases_, conn, "revoke"); !st.ok()) return MakeErrorReply(st);
      // Answered (and the holders told) once the memory is truncated.
      *deferred = true;
      uint64_t id = in.lease_id();
      leases_->Revoke(conn, id, [this, id, reply](Result<std::vector<ConnId>> holders) {
        if (!holders.ok()) return reply(MakeErrorReply(holders.status()));
        proto::LeaseEvent ev;
        ev.set_lease_id(id);
        ev.set_event("revoked");
        for (ConnectionId h : *holders) {
          if (!push_) break;
          Status st = push_(h, Encoded(ev));
          if (!st.ok()) {
            CXLPOOL_LOG(kInfo) << "revoke " << id << ": could not tell connection " << h << ": "
                               << st.ToString();
          }
        }
        CXLPOOL_LOG(kInfo) << "lease " << id << " revoked; " << holders->size()
                           << " holder connection(s) told";
        reply(Encoded(proto::RevokeReply()));
      });
      return {};
    }
    case proto::MSG_QUOTAS_REQUEST: {
      proto::QuotasRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      proto::QuotasReply out;
      // Other tenants' rules and usage are for admins.
      for (const auto& q : leases_->QuotasVisibleTo(conn)) ToProto(q, out.add_quotas());
      return Encoded(out);
    }
    case proto::MSG_QUOTA_SET_REQUEST: {
      proto::QuotaSetRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      if (Status st = NeedAdmin(*leases_, conn, "setting quotas"); !st.ok()) {
        return MakeErrorReply(st);
      }
      auto rule = FromProto(in.quota());
      if (!rule.ok()) return MakeErrorReply(rule.status());
      if (Status st = leases_->SetQuota(conn, *rule); !st.ok()) return MakeErrorReply(st);
      return Encoded(proto::QuotaSetReply());
    }
    case proto::MSG_METRICS_REQUEST: {
      proto::MetricsRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      proto::MetricsReply out;
      // Aggregate families for everyone; per-tenant ones for admins.
      out.set_text(MetricsText(leases_->IsAdmin(conn)));
      return Encoded(out);
    }
    case proto::MSG_LEASE_MOVED_REQUEST: {
      proto::LeaseMovedRequest in;
      if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
      auto check = leases_->CheckMoved(conn, in.lease_id());
      if (!check.ok()) return MakeErrorReply(check.status());
      if (!check->moved) {
        CXLPOOL_LOG(kInfo) << "lease " << in.lease_id() << ": holder saw node " << in.numa_node()
                           << " (" << in.pages_on_node() << " of " << in.pages_sampled()
                           << " pages, after " << SanitizeUtf8(in.cause().substr(0, 32))
                           << "); the daemon's move_pages sees node " << check->lease.numa_node;
      }
      if (check->moved && tiering_ != nullptr) {
        // Its other holders learn it as from a tiering move: one event.
        if (auto facts = leases_->LeaseForMigration(in.lease_id())) {
          for (ConnId c : facts->holders) {
            if (c != conn)
              tiering_->Moved(c, in.lease_id(), facts->lease.numa_node, facts->pool->name());
          }
        }
      }
      proto::LeaseMovedReply out;
      ToProto(check->lease, out.mutable_lease());
      out.set_moved(check->moved);
      return Encoded(out);
    }
    case proto::MSG_RECLAIM_REQUEST:
      return Reclaim(conn, req);
    default:
      return MakeErrorReply(
          Status(Code::kInvalidArgument, "unexpected message " + wire::MsgTypeName(req.type) +
                                             " (not a request this daemon serves)"));
  }
}

Reply DaemonHandler::LeaseReply(ConnectionId conn, proto::MsgType type, const Granted& g) const {
  proto::LeaseInfo info;
  ToProto(g.lease, &info);  // with its extents when it has several
  auto per = fds_per_frame_.find(conn);
  const size_t per_frame = per != fds_per_frame_.end() ? per->second : wire::kDefaultMaxFdsPerFrame;
  auto frames = wire::PlanLeaseReply(type, info, g.extents.size(), per_frame,
                                     static_cast<uint32_t>(options_.max_frame_bytes));
  if (!frames.ok()) {
    CXLPOOL_LOG(kError) << "lease " << g.lease.id << ": reply of " << g.extents.size()
                        << " extents: " << frames.status().ToString();
    return MakeErrorReply(
        Status(Code::kInternal, "lease " + std::to_string(g.lease.id) +
                                    ": cannot send its reply: " + frames.status().message()));
  }
  Reply r;
  for (size_t i = 0; i < frames->size(); ++i) {
    wire::PlannedFrame& f = (*frames)[i];
    const size_t first = f.first_fd, count = f.fd_count;
    Reply one = ToReply(std::move(f));
    for (size_t k = first; k < first + count; ++k) one.fds.push_back(g.extents[k].fd);
    if (i == 0) {
      r = std::move(one);
    } else {
      r.more.push_back(std::move(one));
    }
  }
  return r;
}

// RECLAIM: the leases a client kept across a daemon restart, with their fds
// in the same order: one per extent of each (LeaseInfo.extents; none listed:
// one). A count mismatch refuses the whole frame (the pairing of fds to
// leases would be guesswork); each lease is then judged alone.
Reply DaemonHandler::Reclaim(ConnectionId conn, const Request& req) {
  proto::ReclaimRequest in;
  if (Status st = DecodeAs(req, &in); !st.ok()) return MakeErrorReply(st);
  size_t wanted = 0;
  for (const proto::LeaseInfo& info : in.leases()) {
    if (info.extents_size() > static_cast<int>(wire::kMaxExtentsPerLease)) {
      return MakeErrorReply(
          Status(Code::kInvalidArgument, "RECLAIM_REQUEST: lease " + std::to_string(info.id()) +
                                             " lists " + std::to_string(info.extents_size()) +
                                             " extents (at most " +
                                             std::to_string(wire::kMaxExtentsPerLease) + ")"));
    }
    uint64_t sum = 0;
    for (const proto::ExtentInfo& x : info.extents()) sum += x.size_bytes();
    if (info.extents_size() > 0 && sum != info.size_bytes()) {
      return MakeErrorReply(Status(
          Code::kInvalidArgument, "RECLAIM_REQUEST: lease " + std::to_string(info.id()) +
                                      "'s extents add up to " + std::to_string(sum) +
                                      " bytes, not its size " + std::to_string(info.size_bytes())));
    }
    wanted += static_cast<size_t>(std::max(1, info.extents_size()));
  }
  if (wanted != req.fds.size()) {
    return MakeErrorReply(Status(Code::kInvalidArgument,
                                 "RECLAIM_REQUEST lists " + std::to_string(in.leases_size()) +
                                     " leases of " + std::to_string(wanted) +
                                     " extents but carries " + std::to_string(req.fds.size()) +
                                     " fds; send one fd per extent of each lease, in order"));
  }
  std::vector<LeaseManager::ReclaimItem> items;
  size_t next_fd = 0;
  for (int i = 0; i < in.leases_size(); ++i) {
    LeaseManager::ReclaimItem item;
    const proto::LeaseInfo& info = in.leases(i);
    item.id = info.id();
    item.size_bytes = info.size_bytes();
    item.pool = info.pool();
    item.name = info.name();
    item.label = info.label();
    item.backing = info.backing();
    item.owner_uid = info.owner_uid();
    for (const proto::ExtentInfo& x : info.extents()) item.extent_sizes.push_back(x.size_bytes());
    const size_t n = std::max<size_t>(1, item.extent_sizes.size());
    for (size_t k = 0; k < n; ++k) {
      item.fds.emplace_back(::fcntl(req.fds[next_fd++].get(), F_DUPFD_CLOEXEC, 0));
    }
    items.push_back(std::move(item));
  }
  auto outcome = leases_->Reclaim(conn, std::move(items));
  proto::ReclaimReply out;
  for (uint64_t id : outcome.accepted) out.add_accepted(id);
  for (const auto& [id, why] : outcome.rejected) {
    out.add_rejected(id);
    out.add_rejected_reasons(why);
    CXLPOOL_LOG(kInfo) << "reclaim of lease " << id << " rejected: " << why;
  }
  if (!outcome.accepted.empty() || !outcome.rejected.empty()) {
    CXLPOOL_LOG(kInfo) << "reclaim: " << outcome.accepted.size() << " accepted, "
                       << outcome.rejected.size() << " rejected";
  }
  return Encoded(out);
}

std::string DaemonHandler::MetricsText(bool tenants) {
  return metrics_.Render(*leases_, ReadProcessFacts(), tenants);
}

}  // namespace cxlpool
