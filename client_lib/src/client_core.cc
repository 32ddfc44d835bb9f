#include "client_core.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>
#include <vector>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/extents.h"

namespace cxlpool::detail {
namespace {
constexpr char kSystemSocket[] = "/run/cxlpool/cxlpool.sock";
}  // namespace

std::string DefaultSocketPathFor(uid_t euid, const char* xdg_runtime_dir) {
  if (euid == 0) return kSystemSocket;
  auto is_socket = [](const std::string& path, bool owned_by_euid, uid_t uid) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
           (!owned_by_euid || st.st_uid == uid);
  };
  // The user's own daemon, where cxlpoold puts it when not root
  // (daemon/config DefaultSocketPath), else the system daemon.
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    std::string user = std::string(xdg_runtime_dir) + "/cxlpool.sock";
    if (is_socket(user, false, euid)) return user;
  }
  // /tmp is world-writable: only a socket this user owns counts, so nobody
  // else can plant one there and receive this user's requests.
  std::string tmp = "/tmp/cxlpool-" + std::to_string(euid) + ".sock";
  if (is_socket(tmp, true, euid)) return tmp;
  return kSystemSocket;
}

std::string DefaultSocketPath() {
  const char* env = std::getenv("CXLPOOL_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return DefaultSocketPathFor(::geteuid(), std::getenv("XDG_RUNTIME_DIR"));
}

ClientStatus ToClientStatus(const Status& s) {
  return ClientStatus(static_cast<ErrorCode>(static_cast<int>(s.code())), s.message());
}

LeaseInfo FromProto(const proto::LeaseInfo& p) {
  LeaseInfo i;
  i.id = p.id();
  i.size_bytes = p.size_bytes();
  i.requested_bytes = p.requested_bytes();
  i.page_size = p.page_size();
  i.numa_node = p.numa_node();
  i.memory_tier = p.has_memory_tier() ? p.memory_tier() : -1;
  i.holders = p.holders();
  i.kind = p.kind();
  i.backing = p.backing();
  i.placement_reason = p.placement_reason();
  i.device_offset = p.device_offset();
  i.pool = p.pool();
  i.label = p.label();
  i.name = p.name();
  i.owner_uid = p.owner_uid();
  i.owner_gid = p.owner_gid();
  i.long_term_pin = p.long_term_pin();
  i.placed_numa_node = p.has_placed_numa_node() ? p.placed_numa_node() : -1;
  i.moved_reason = p.moved_reason();
  return i;
}

// ---------------------------------------------------------------- ClientCore

ClientCore::ClientCore(UniqueFd sock, const std::string& peer, std::string socket_path)
    : reconnector_(std::move(socket_path), stop_),
      conn_(std::move(sock), peer,
            Connection::Hooks{
                .push = [this](const wire::Frame& f) { return HandlePush(f); },
                .calls_active = [this](bool active) { watcher_.SetCallActive(active); },
            }),
      watcher_(stop_, WatcherHooks()) {}

Result<std::shared_ptr<ClientCore>> ClientCore::Connect(const std::string& path) {
  Result<UniqueFd> sock = ConnectSocket(path);
  if (!sock.ok()) return sock.status();
  std::shared_ptr<ClientCore> core(new ClientCore(std::move(*sock), path, path));
  MutexLock lock(core->mu_);
  CXLPOOL_RETURN_IF_ERROR(core->conn_.Hello());
  return core;
}

Result<std::shared_ptr<ClientCore>> ClientCore::FromSocket(UniqueFd sock, const std::string& peer) {
  if (!sock.valid()) return Status(Code::kInvalidArgument, "no socket");
  std::shared_ptr<ClientCore> core(new ClientCore(std::move(sock), peer, ""));
  MutexLock lock(core->mu_);
  CXLPOOL_RETURN_IF_ERROR(core->conn_.Hello());
  return core;
}

ClientCore::~ClientCore() {
  stop_.Stop();
  {
    MutexLock lock(tier_mu_);
    tier_cv_.notify_all();
  }
  if (flusher_.joinable()) flusher_.join();
  // watcher_, the last member, joins its thread first.
}

uint32_t ClientCore::protocol_version() {
  MutexLock lock(mu_);
  return conn_.version();
}

std::string ClientCore::server_version() {
  MutexLock lock(mu_);
  return conn_.server_version();
}

// ------------------------------------------------------------------- events

void ClientCore::HandleEvent(const wire::Frame& frame) {
  proto::LeaseEvent ev;
  Status s = wire::Decode(frame.payload, &ev);
  if (!s.ok()) {
    CXLPOOL_LOG(kWarning) << "ignoring undecodable lease event: " << s.ToString();
    return;
  }
  if (ev.event() == "moved" && ev.has_numa_node()) {
    // The tiering engine moved its pages (in place: the mapping is the same).
    leases_.ForId(ev.lease_id(), [&](LeaseState* l) { l->SetNode(ev.numa_node()); });
    return;
  }
  if (ev.event() != "revoked") {
    CXLPOOL_LOG(kDebug) << "ignoring lease event '" << ev.event() << "' for lease "
                        << ev.lease_id();
    return;
  }
  leases_.ForId(ev.lease_id(), [](LeaseState* l) { l->MarkRevoked(); });
}

EventWatcher::Hooks ClientCore::WatcherHooks() {
  EventWatcher::Hooks h;
  h.look = [this](uint64_t* generation, bool* lost) {
    MutexLock lock(mu_);
    *generation = conn_.generation();
    *lost = !conn_.ok() && ConnectionLost(conn_.broken());
  };
  h.dup_socket = [this](uint64_t* generation) {
    MutexLock lock(mu_);
    *generation = conn_.generation();
    return UniqueFd(conn_.fd() >= 0 ? ::fcntl(conn_.fd(), F_DUPFD_CLOEXEC, 0) : -1);
  };
  h.reconnect = [this] {
    MutexLock lock(mu_);
    return Reestablish(lock);
  };
  h.drain = [this](uint64_t generation) {
    MutexLock lock(mu_);
    // A call reconnected meanwhile, or broke it: the loop looks again.
    if (generation != conn_.generation() || !conn_.ok()) return;
    // Lease events, or the EOF of a daemon that went.
    (void)conn_.DrainPushes();
  };
  return h;
}

Result<int> ClientCore::ProcessEvents() {
  MutexLock lock(mu_);
  if (!conn_.ok() && reconnector_.enabled() && ConnectionLost(conn_.broken())) {
    CXLPOOL_RETURN_IF_ERROR(Reestablish(lock));
  }
  return conn_.DrainPushes();
}

void ClientCore::Track(LeaseState* lease) {
  leases_.Add(lease);
  if (reconnector_.enabled()) watcher_.Start();
}

void ClientCore::Untrack(LeaseState* lease) { leases_.Remove(lease); }

// -------------------------------------------------------------- reconnecting

Status ClientCore::Reconnect() {
  MutexLock lock(mu_);
  return Reestablish(lock);
}

Status ClientCore::Reestablish(MutexLock& lock) {
  if (!reconnector_.enabled()) {
    return conn_.ok() ? Status(Code::kUnavailable, "this connection cannot be re-established")
                      : conn_.broken();
  }
  const uint64_t seen = conn_.generation();
  while (dialing_) lock.Wait(dialed_);
  // Another thread reconnected while this one waited: use its connection.
  if (conn_.generation() != seen && conn_.ok()) return Status::Ok();
  const uint64_t hello_id = conn_.NextRequestId();
  const std::string old_instance = conn_.instance_id();
  dialing_ = true;
  // `lock` stays the owner: mu_ is given up and taken again under it.
  mu_.unlock();
  Result<Reconnector::Dialed> fresh = reconnector_.Dial(hello_id);
  mu_.lock();
  dialing_ = false;
  dialed_.notify_all();
  if (!fresh.ok()) {
    conn_.Fail(fresh.status());
    if (!stop_.stopping()) returns_.DropDeferred(conn_.broken());
    return conn_.broken();
  }
  conn_.Adopt(std::move(fresh->sock), fresh->hello);
  reconnects_.fetch_add(1);
  CXLPOOL_LOG(kInfo) << "reconnected to cxlpoold at " << reconnector_.path()
                     << (old_instance != conn_.instance_id() ? " (a new daemon instance)" : "");
  {
    // Asks of the old connection are void: its daemon will not wait for them.
    MutexLock tier_lock(tier_mu_);
    migrations_.clear();
  }
  CXLPOOL_RETURN_IF_ERROR(returns_.ReclaimAll(conn_, leases_));
  ResendTieringLocked();
  return returns_.FlushDeferred(conn_);
}

Result<wire::Frame> ClientCore::CallRecovering(MutexLock& lock, proto::MsgType type,
                                               const std::string& payload) {
  Result<wire::Frame> f = conn_.Call(type, payload);
  if (f.ok() || !reconnector_.enabled() || !ConnectionLost(f.status())) return f;
  CXLPOOL_RETURN_IF_ERROR(Reestablish(lock));
  return conn_.Call(type, payload);
}

template <typename Req>
Result<wire::Frame> ClientCore::CallMessageRecovering(MutexLock& lock, const Req& req) {
  Result<std::string> payload = wire::Encode(req, conn_.max_payload_bytes());
  if (!payload.ok()) return payload.status();
  return CallRecovering(lock, wire::TypeOf<Req>(), *payload);
}

// ------------------------------------------------------------------ granting

Result<std::unique_ptr<LeaseState>> ClientCore::MapReply(wire::Frame frame) {
  wire::LeaseReplyAssembler reply;
  Status st = reply.Start(std::move(frame));
  // A reply whose fds come on several frames, read to its end; a reply
  // that does not add up leaves the stream where nothing can be trusted.
  const bool multi = st.ok() && !reply.complete();
  if (multi) {
    // The reply's EXTENT_FDS frames are read here, not the mapping.
    Connection::CallScope scope(&conn_);
    while (st.ok() && !reply.complete()) {
      Result<wire::Frame> next = conn_.ReadFrame();
      if (!next.ok()) return next.status();
      st = reply.Add(std::move(*next));
    }
  }
  if (!st.ok() && (multi || reply.frames_left() > 0)) return conn_.Broken(st);
  const proto::LeaseInfo& info = reply.lease();
  if (st.ok() && info.id() == 0) st = Status(Code::kProtocol, "lease reply without an id");
  Result<ExtentMapping> m = Result<ExtentMapping>(st);
  if (st.ok()) {
    std::vector<ExtentMapping::Piece> pieces;
    for (wire::ReceivedExtent& e : reply.TakeExtents()) {
      pieces.push_back({std::move(e.fd), e.place.size, e.place.page_size, 0});
    }
    // Map refuses an offset on anything but one shared slice.
    if (!pieces.empty()) pieces[0].device_offset = info.device_offset();
    m = ExtentMapping::Map(std::move(pieces), info.backing());
  }
  if (!m.ok()) {
    // Do not leave the daemon holding memory we cannot use.
    if (info.id() != 0) {
      proto::ReleaseRequest rel;
      rel.set_lease_id(info.id());
      Result<wire::Frame> ignored = conn_.CallMessage(rel);
      (void)ignored;
    }
    return m.status();
  }
  return std::make_unique<LeaseState>(shared_from_this(), std::move(*m), FromProto(info));
}

template <typename Req, typename Rep>
Result<std::unique_ptr<LeaseState>> ClientCore::Grant(const Req& req) {
  std::unique_ptr<LeaseState> lease;
  const auto deadline = Reconnector::Deadline();
  for (int backoff_ms = 5;; backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs)) {
    MutexLock lock(mu_);
    Result<wire::Frame> frame = CallMessageRecovering(lock, req);
    if (!frame.ok()) return frame.status();
    Rep reply;
    Status st = wire::DecodeReply(*frame, &reply);
    if (DaemonRestarting(st) && reconnector_.enabled() &&
        std::chrono::steady_clock::now() < deadline) {
      lock.Unlock();
      if (!stop_.Nap(backoff_ms)) return st;
      continue;  // the grace period after a restart: ask again
    }
    CXLPOOL_RETURN_IF_ERROR(st);
    Result<std::unique_ptr<LeaseState>> l = MapReply(std::move(*frame));
    if (!l.ok()) return l.status();
    lease = std::move(*l);
    break;
  }
  Track(lease.get());
  return lease;
}

Result<std::unique_ptr<LeaseState>> ClientCore::Allocate(const proto::AllocRequest& req) {
  return Grant<proto::AllocRequest, proto::AllocReply>(req);
}

Result<std::unique_ptr<LeaseState>> ClientCore::Attach(const std::string& name,
                                                       std::optional<uint32_t> owner_uid) {
  proto::AttachRequest req;
  req.set_name(name);
  if (owner_uid) req.set_owner_uid(*owner_uid);
  return Grant<proto::AttachRequest, proto::AttachReply>(req);
}

Result<proto::LeaseMovedReply> ClientCore::ReportMoved(const proto::LeaseMovedRequest& req) {
  MutexLock lock(mu_);
  Result<wire::Frame> frame = CallMessageRecovering(lock, req);
  if (!frame.ok()) return frame.status();
  proto::LeaseMovedReply reply;
  CXLPOOL_RETURN_IF_ERROR(wire::DecodeReply(*frame, &reply));
  return reply;
}

Status ClientCore::Release(uint64_t lease_id, const ExtentMapping* mapping) {
  MutexLock lock(mu_);
  proto::ReleaseRequest req;
  req.set_lease_id(lease_id);
  Result<wire::Frame> frame = conn_.CallMessage(req);
  proto::ReleaseReply reply;
  Status st = frame.ok() ? wire::DecodeReply(*frame, &reply) : frame.status();
  if (st.ok() || mapping == nullptr || !mapping->mapped() || !reconnector_.enabled()) return st;
  // The lease is no longer tracked, so a reconnect (ours, or the watcher's
  // just before) did not hand it back.
  if (!frame.ok()) {
    if (!ConnectionLost(st)) return st;
    // The daemon is gone. Waiting here for it to come back would hold the
    // caller for up to the reconnect timeout: the reconnect (the watcher's,
    // or the next call's) hands the lease back and releases it.
    CXLPOOL_RETURN_IF_ERROR(returns_.Defer(lease_id, *mapping));
    CXLPOOL_LOG(kDebug) << "lease " << lease_id << ": cxlpoold is gone; released at reconnect";
    return Status::Ok();
  }
  if ((st.code() != Code::kPermissionDenied && st.code() != Code::kNotFound) ||
      conn_.generation() == 0) {
    // After a reconnect the new daemon may not know the lease yet (a
    // non-owner gets NOT_FOUND, its owner PERMISSION_DENIED).
    return st;
  }
  return ReleaseAfterReconnect(req, *mapping);
}

Status ClientCore::ReleaseAfterReconnect(const proto::ReleaseRequest& req,
                                         const ExtentMapping& mapping) {
  Result<HandBack> mine = HandBack::Of(mapping);
  if (!mine.ok()) return mine.status();
  Result<bool> back = LeaseReturns::ReclaimOne(conn_, req.lease_id(), *mine);
  if (!back.ok()) return back.status();
  if (!*back) return Status::Ok();  // the new daemon no longer has it: gone already
  Result<wire::Frame> frame = conn_.CallMessage(req);
  if (!frame.ok()) return frame.status();
  proto::ReleaseReply reply;
  return wire::DecodeReply(*frame, &reply);
}

}  // namespace cxlpool::detail
