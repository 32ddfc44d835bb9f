#include "client_core.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "cxlpool/common/log.h"
#include "cxlpool/common/page_census.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/extents.h"

namespace cxlpool::detail {
namespace {
// A RECLAIM entry's extents: listed when the lease has several (one: the
// lease's own size says it all, as every older client sent it).
void AddExtents(const HandBack& back, proto::LeaseInfo* out) {
  if (back.extent_sizes.size() < 2) return;
  for (uint64_t size : back.extent_sizes) out->add_extents()->set_size_bytes(size);
}

// How long hello may take before the daemon counts as unresponsive. Requests
// after hello wait as long as the daemon needs (prefaulting large leases).
constexpr int kHelloTimeoutMs = 30000;
constexpr char kSystemSocket[] = "/run/cxlpool/cxlpool.sock";
// How long a reconnect may keep trying (CXLPOOL_RECONNECT_TIMEOUT_MS).
constexpr int kReconnectTimeoutMs = 60000;
constexpr int kMaxBackoffMs = 1000;

int ReconnectTimeoutMs() {
  const char* e = std::getenv("CXLPOOL_RECONNECT_TIMEOUT_MS");
  if (e == nullptr || *e == '\0') return kReconnectTimeoutMs;
  char* end = nullptr;
  long v = std::strtol(e, &end, 10);
  if (end == e || *end != '\0' || v < 0 || v > 3600000) return kReconnectTimeoutMs;
  return static_cast<int>(v);
}

// The connection is gone (the daemon died or restarted), as opposed to a
// request the daemon refused or a protocol violation.
bool ConnectionLost(const Status& s) {
  return s.code() == Code::kUnavailable || s.code() == Code::kIo;
}

// The daemon is in its post-restart grace period: try again shortly.
bool DaemonRestarting(const Status& s) {
  return s.code() == Code::kUnavailable && s.message().rfind("daemon restarting", 0) == 0;
}

Result<UniqueFd> ConnectSocket(const std::string& path);

Status ConnectError(int err, const std::string& path) {
  switch (err) {
    case ENOENT:
      return Status(Code::kNotFound, "no cxlpoold socket at " + path + " (is cxlpoold running?)");
    case ECONNREFUSED:
      return Status(Code::kUnavailable, "cxlpoold is not accepting connections on " + path);
    case EACCES:
    case EPERM:
      return Status(Code::kPermissionDenied,
                    "no permission to connect to " + path + " (socket group?)");
    default:
      return Status::FromErrno(err, "connect(" + path + ")");
  }
}

std::string ProcessComm() {
  char buf[64] = {};
  FILE* f = std::fopen("/proc/self/comm", "re");
  if (f == nullptr) return "";
  std::string out;
  if (std::fgets(buf, sizeof(buf), f) != nullptr) out = buf;
  std::fclose(f);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

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

namespace {
Result<UniqueFd> ConnectSocket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty()) return Status(Code::kInvalidArgument, "empty socket path");
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status(
        Code::kInvalidArgument,
        "socket path longer than " + std::to_string(sizeof(addr.sun_path) - 1) + " bytes: " + path);
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Status::FromErrno(errno, "socket(AF_UNIX)");
  int rc;
  do {
    rc = ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return ConnectError(errno, path);
  return sock;
}
}  // namespace

Result<std::shared_ptr<ClientCore>> ClientCore::Connect(const std::string& path) {
  Result<UniqueFd> sock = ConnectSocket(path);
  if (!sock.ok()) return sock.status();
  Result<std::shared_ptr<ClientCore>> core = FromSocket(std::move(*sock), path);
  if (core.ok()) (*core)->socket_path_ = path;
  return core;
}

ClientCore::~ClientCore() {
  stopping_.store(true);
  if (stop_fd_.valid()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof one);
  }
  {
    std::lock_guard<std::mutex> lock(tier_mu_);
    tier_cv_.notify_all();
  }
  if (flusher_.joinable()) flusher_.join();
  if (watcher_.joinable()) watcher_.join();
}

Result<std::shared_ptr<ClientCore>> ClientCore::FromSocket(UniqueFd sock, const std::string& peer) {
  if (!sock.valid()) return Status(Code::kInvalidArgument, "no socket");
  std::shared_ptr<ClientCore> core(new ClientCore(std::move(sock), peer));
  Status s = core->Hello();
  if (!s.ok()) return s;
  return core;
}

Status ClientCore::Broken(Status s) {
  if (broken_.ok()) {
    broken_ = Status(s.code() == Code::kProtocol ? Code::kProtocol : Code::kUnavailable,
                     "connection to cxlpoold (" + peer_ + ") unusable: " + s.message());
    sock_.Reset();
  }
  return s;
}

Status ClientCore::Hello() {
  std::lock_guard<std::mutex> lock(mu_);
  return HelloLocked();
}

Status ClientCore::HelloLocked() {
  HelloOutcome o;
  Status s = HelloOn(sock_.get(), next_request_id_++, &o);
  if (!s.ok()) return Broken(s);
  ApplyHelloLocked(o);
  return Status::Ok();
}

Status ClientCore::HelloOn(int sock, uint64_t id, HelloOutcome* out) {
  proto::HelloRequest req;
  req.set_min_version(wire::kMinWireVersion);
  req.set_max_version(wire::kMaxWireVersion);
  req.set_client_name("libcxlpool/" + std::string(cxlpool_version()) + " " + ProcessComm());
  req.set_max_fds_per_frame(static_cast<uint32_t>(wire::kHardMaxFdsPerFrame));
  Result<std::string> payload = wire::Encode(req);
  if (!payload.ok()) return payload.status();
  Status s = wire::SendFrame(sock, proto::MSG_HELLO_REQUEST, id, *payload, {}, kHelloTimeoutMs,
                             wire::kHelloWireVersion);
  if (!s.ok()) {
    // A daemon that refused the connection (a limit) wrote why and closed
    // before our HELLO went out: read that rather than report EPIPE.
    Result<wire::Frame> why = wire::RecvFrame(sock, {}, 100);
    if (why.ok()) {
      if (std::optional<Status> err = wire::ConnectionError(*why)) return *err;
    }
    return s;
  }
  Result<wire::Frame> frame = wire::RecvFrame(sock, {}, kHelloTimeoutMs);
  if (!frame.ok()) return frame.status();
  if (std::optional<Status> err = wire::ConnectionError(*frame)) return *err;
  if (frame->request_id() != id) {
    return Status(Code::kProtocol, "hello reply carries request id " +
                                       std::to_string(frame->request_id()) + ", expected " +
                                       std::to_string(id));
  }
  proto::HelloReply reply;
  s = wire::DecodeReply(*frame, &reply);
  if (!s.ok()) return s;
  if (reply.version() < wire::kMinWireVersion || reply.version() > wire::kMaxWireVersion) {
    return Status(Code::kProtocol, "cxlpoold chose protocol version " +
                                       std::to_string(reply.version()) + ", this library speaks " +
                                       std::to_string(wire::kMinWireVersion) + ".." +
                                       std::to_string(wire::kMaxWireVersion));
  }
  out->version = reply.version();
  out->server_version = reply.server_version();
  out->instance_id = reply.instance_id();
  out->max_payload_bytes = wire::kDefaultMaxFrameBytes;
  if (reply.max_frame_bytes() > 0) {
    out->max_payload_bytes = static_cast<uint32_t>(
        std::min<uint64_t>(reply.max_frame_bytes(), wire::kHardMaxFrameBytes));
  }
  if (reply.max_fds_per_frame() > 0) {
    out->request_fds_per_frame =
        std::min<size_t>(reply.max_fds_per_frame(), wire::kMaxExtentFdsPerFrame);
  }
  if (reply.max_request_bytes() > 0) out->max_request_bytes = reply.max_request_bytes();
  return Status::Ok();
}

void ClientCore::ApplyHelloLocked(const HelloOutcome& o) {
  version_ = o.version;
  server_version_ = o.server_version;
  instance_id_ = o.instance_id;
  max_payload_bytes_ = o.max_payload_bytes;
  request_fds_per_frame_ = o.request_fds_per_frame;
  max_request_bytes_ = o.max_request_bytes;
  wire::RecvLimits limits;
  limits.max_payload_bytes = max_payload_bytes_;
  limits.max_fds = wire::kHardMaxFdsPerFrame;  // as announced in the hello
  reader_ = wire::FrameReader(limits);
}

void ClientCore::HandleEvent(const wire::Frame& frame) {
  proto::LeaseEvent ev;
  Status s = wire::Decode(frame.payload, &ev);
  if (!s.ok()) {
    CXLPOOL_LOG(kWarning) << "ignoring undecodable lease event: " << s.ToString();
    return;
  }
  if (ev.event() == "moved" && ev.has_numa_node()) {
    // The tiering engine moved its pages (in place: the mapping is the same).
    std::lock_guard<std::mutex> lock(leases_mu_);
    auto [begin, end] = leases_.equal_range(ev.lease_id());
    for (auto it = begin; it != end; ++it) it->second->SetNode(ev.numa_node());
    return;
  }
  if (ev.event() != "revoked") {
    CXLPOOL_LOG(kDebug) << "ignoring lease event '" << ev.event() << "' for lease "
                        << ev.lease_id();
    return;
  }
  std::lock_guard<std::mutex> lock(leases_mu_);
  auto [begin, end] = leases_.equal_range(ev.lease_id());
  for (auto it = begin; it != end; ++it) it->second->MarkRevoked();
}

Result<wire::Frame> ClientCore::Call(proto::MsgType type, const std::string& payload,
                                     std::span<const int> fds) {
  // mu_ is held by the caller.
  if (!broken_.ok()) return broken_;
  CallScope scope(this);
  const uint64_t id = next_request_id_++;
  Status s =
      wire::SendFrame(sock_.get(), type, id, payload, fds, -1, static_cast<uint16_t>(version_));
  if (!s.ok()) return Broken(s);
  return AwaitReply(id);
}

Result<wire::Frame> ClientCore::CallReclaim(const proto::ReclaimRequest& req,
                                            std::span<const int> fds) {
  // mu_ is held by the caller.
  if (!broken_.ok()) return broken_;
  Result<std::vector<wire::PlannedFrame>> plan =
      wire::PlanReclaimRequest(req, fds.size(), request_fds_per_frame_, max_payload_bytes_);
  if (!plan.ok()) return plan.status();
  CXLPOOL_RETURN_IF_ERROR(
      wire::CheckReclaimRequestBytes(plan->front(), fds.size(), max_request_bytes_));
  CallScope scope(this);
  const uint64_t id = next_request_id_++;
  for (const wire::PlannedFrame& f : *plan) {
    Status s =
        wire::SendFrame(sock_.get(), f.type, id, f.payload, fds.subspan(f.first_fd, f.fd_count), -1,
                        static_cast<uint16_t>(version_));
    if (!s.ok()) return Broken(s);
  }
  return AwaitReply(id);
}

Result<wire::Frame> ClientCore::AwaitReply(uint64_t id) {
  for (;;) {
    Result<wire::Frame> next = ReadFrame();
    if (!next.ok()) return next.status();
    wire::Frame frame = std::move(*next);
    if (HandlePush(frame)) continue;
    // The daemon closes this connection and says why (an idle timeout: the
    // next call reconnects).
    if (std::optional<Status> err = wire::ConnectionError(frame)) return Broken(*err);
    if (frame.request_id() != id) {
      return Broken(Status(Code::kProtocol, "reply " + wire::MsgTypeName(frame.header.type) +
                                                " carries request id " +
                                                std::to_string(frame.request_id()) + ", expected " +
                                                std::to_string(id)));
    }
    return frame;
  }
}

Result<wire::Frame> ClientCore::ReadFrame() {
  for (;;) {
    Result<wire::FrameReader::Progress> p = reader_.Read(sock_.get(), -1);
    if (!p.ok()) return Broken(p.status());
    if (*p == wire::FrameReader::Progress::kEof) {
      return Broken(Status(Code::kUnavailable, "cxlpoold closed the connection"));
    }
    if (*p == wire::FrameReader::Progress::kFrame) return reader_.TakeFrame();
  }
}

Result<std::unique_ptr<LeaseState>> ClientCore::MapReply(wire::Frame frame) {
  wire::LeaseReplyAssembler reply;
  Status st = reply.Start(std::move(frame));
  // A reply whose fds come on several frames, read to its end; a reply
  // that does not add up leaves the stream where nothing can be trusted.
  const bool multi = st.ok() && !reply.complete();
  if (multi) {
    CallScope scope(this);  // the reply's EXTENT_FDS frames are read here, not the mapping
    while (st.ok() && !reply.complete()) {
      Result<wire::Frame> next = ReadFrame();
      if (!next.ok()) return next.status();
      st = reply.Add(std::move(*next));
    }
  }
  if (!st.ok() && (multi || reply.frames_left() > 0)) return Broken(st);
  const proto::LeaseInfo& info = reply.lease();
  if (st.ok() && info.id() == 0) st = Status(Code::kProtocol, "lease reply without an id");
  Result<ExtentMapping> m = Result<ExtentMapping>(st);
  if (st.ok()) {
    std::vector<ExtentMapping::Piece> pieces;
    for (wire::ReceivedExtent& e : reply.TakeExtents()) {
      pieces.push_back({std::move(e.fd), e.place.size, e.place.page_size});
    }
    m = ExtentMapping::Map(std::move(pieces), info.backing());
  }
  if (!m.ok()) {
    // Do not leave the daemon holding memory we cannot use.
    if (info.id() != 0) {
      proto::ReleaseRequest rel;
      rel.set_lease_id(info.id());
      Result<wire::Frame> ignored = CallMessage(rel);
      (void)ignored;
    }
    return m.status();
  }
  return std::make_unique<LeaseState>(shared_from_this(), std::move(*m), FromProto(info));
}

Result<std::unique_ptr<LeaseState>> ClientCore::Allocate(const proto::AllocRequest& req) {
  std::unique_ptr<LeaseState> lease;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(ReconnectTimeoutMs());
  for (int backoff_ms = 5;; backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs)) {
    std::unique_lock<std::mutex> lock(mu_);
    Result<wire::Frame> frame = CallMessageRecovering(lock, req);
    if (!frame.ok()) return frame.status();
    proto::AllocReply reply;
    Status st = wire::DecodeReply(*frame, &reply);
    if (DaemonRestarting(st) && !socket_path_.empty() &&
        std::chrono::steady_clock::now() < deadline) {
      lock.unlock();
      if (!Nap(backoff_ms)) return st;
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

Result<std::unique_ptr<LeaseState>> ClientCore::Attach(const std::string& name,
                                                       std::optional<uint32_t> owner_uid) {
  std::unique_ptr<LeaseState> lease;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(ReconnectTimeoutMs());
  for (int backoff_ms = 5;; backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs)) {
    std::unique_lock<std::mutex> lock(mu_);
    proto::AttachRequest req;
    req.set_name(name);
    if (owner_uid) req.set_owner_uid(*owner_uid);
    Result<wire::Frame> frame = CallMessageRecovering(lock, req);
    if (!frame.ok()) return frame.status();
    proto::AttachReply reply;
    Status st = wire::DecodeReply(*frame, &reply);
    if (DaemonRestarting(st) && !socket_path_.empty() &&
        std::chrono::steady_clock::now() < deadline) {
      lock.unlock();
      if (!Nap(backoff_ms)) return st;
      continue;
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

Result<proto::LeaseMovedReply> ClientCore::ReportMoved(const proto::LeaseMovedRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  Result<wire::Frame> frame = CallMessageRecovering(lock, req);
  if (!frame.ok()) return frame.status();
  proto::LeaseMovedReply reply;
  CXLPOOL_RETURN_IF_ERROR(wire::DecodeReply(*frame, &reply));
  return reply;
}

Result<HandBack> HandBack::Of(const ExtentMapping& m) {
  HandBack b;
  b.size = m.size();
  for (const ExtentMapping::Extent& e : m.extents()) {
    UniqueFd dup(::fcntl(e.fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!dup.valid()) return Status::FromErrno(errno, "dup lease fd");
    b.fds.push_back(std::move(dup));
    b.extent_sizes.push_back(e.size);
  }
  return b;
}

Status ClientCore::Release(uint64_t lease_id, const ExtentMapping* mapping) {
  std::lock_guard<std::mutex> lock(mu_);
  proto::ReleaseRequest req;
  req.set_lease_id(lease_id);
  Result<wire::Frame> frame = CallMessage(req);
  proto::ReleaseReply reply;
  Status st = frame.ok() ? wire::DecodeReply(*frame, &reply) : frame.status();
  if (st.ok() || mapping == nullptr || !mapping->mapped() || socket_path_.empty()) return st;
  // The lease is no longer tracked, so a reconnect (ours, or the watcher's
  // just before) did not hand it back.
  if (!frame.ok()) {
    if (!ConnectionLost(st)) return st;
    // The daemon is gone. Waiting here for it to come back would hold the
    // caller for up to the reconnect timeout: the reconnect (the watcher's,
    // or the next call's) hands the lease back and releases it.
    Result<HandBack> back = HandBack::Of(*mapping);
    if (!back.ok())
      return Status(back.status().code(), back.status().message() + " (deferred release)");
    DeferredRelease d;
    d.lease_id = lease_id;
    d.back = std::move(*back);
    deferred_.push_back(std::move(d));
    CXLPOOL_LOG(kDebug) << "lease " << lease_id << ": cxlpoold is gone; released at reconnect";
    return Status::Ok();
  }
  if ((st.code() != Code::kPermissionDenied && st.code() != Code::kNotFound) || generation_ == 0) {
    // After a reconnect the new daemon may not know the lease yet (a
    // non-owner gets NOT_FOUND, its owner PERMISSION_DENIED).
    return st;
  }
  // Hand it back now, alone, and release it.
  Result<HandBack> mine = HandBack::Of(*mapping);
  if (!mine.ok()) return mine.status();
  Result<bool> back = ReclaimOne(lease_id, *mine);
  if (!back.ok()) return back.status();
  if (!*back) return Status::Ok();  // the new daemon no longer has it: gone already
  frame = CallMessage(req);
  if (!frame.ok()) return frame.status();
  return wire::DecodeReply(*frame, &reply);
}

void ClientCore::ToReclaimInfo(const LeaseInfo& l, const HandBack& back, proto::LeaseInfo* out) {
  out->set_id(l.id);
  out->set_size_bytes(back.size);
  out->set_requested_bytes(l.requested_bytes);
  out->set_numa_node(l.numa_node);
  out->set_kind(l.kind);
  out->set_label(l.label);
  out->set_name(l.name);
  out->set_owner_uid(l.owner_uid);
  out->set_owner_gid(l.owner_gid);
  out->set_backing(l.backing);
  out->set_page_size(l.page_size);
  out->set_pool(l.pool);
  AddExtents(back, out);
}

Result<bool> ClientCore::ReclaimOne(uint64_t lease_id, const HandBack& back) {
  proto::ReclaimRequest rr;
  proto::LeaseInfo* info = rr.add_leases();
  info->set_id(lease_id);
  info->set_size_bytes(back.size);
  AddExtents(back, info);
  std::vector<int> fds;
  for (const UniqueFd& fd : back.fds) fds.push_back(fd.get());
  Result<wire::Frame> frame = CallReclaim(rr, fds);
  if (!frame.ok()) return frame.status();
  proto::ReclaimReply rep;
  CXLPOOL_RETURN_IF_ERROR(wire::DecodeReply(*frame, &rep));
  return rep.accepted_size() == 1;
}

Status ClientCore::Reconnect() {
  std::unique_lock<std::mutex> lock(mu_);
  return Reestablish(lock);
}

bool ClientCore::Nap(int ms) {
  if (stopping_.load()) return false;
  if (!stop_fd_.valid()) {
    ::usleep(static_cast<useconds_t>(ms) * 1000);
    return !stopping_.load();
  }
  pollfd p{stop_fd_.get(), POLLIN, 0};
  int r = ::poll(&p, 1, ms);
  return r == 0 && !stopping_.load();
}

Status ClientCore::Reestablish(std::unique_lock<std::mutex>& lock) {
  if (socket_path_.empty()) {
    return broken_.ok() ? Status(Code::kUnavailable, "this connection cannot be re-established")
                        : broken_;
  }
  const uint64_t seen = generation_;
  lock.unlock();
  std::lock_guard<std::mutex> one_at_a_time(reconnect_mu_);
  lock.lock();
  // Another thread reconnected while this one waited: use its connection.
  if (generation_ != seen && broken_.ok()) return Status::Ok();
  const uint64_t hello_id = next_request_id_++;
  const std::string old_instance = instance_id_;
  lock.unlock();

  // Without mu_: every other thread's call fails fast on the broken
  // connection (a release is deferred) instead of waiting here.
  const int limit_ms = ReconnectTimeoutMs();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  int backoff_ms = 5;
  Status last;
  UniqueFd fresh;
  HelloOutcome hello;
  for (;;) {
    Result<UniqueFd> sock = ConnectSocket(socket_path_);
    if (sock.ok()) {
      last = HelloOn(sock->get(), hello_id, &hello);
      if (last.ok()) {
        fresh = std::move(*sock);
        break;
      }
    } else {
      last = sock.status();
    }
    if (std::chrono::steady_clock::now() >= deadline || !Nap(backoff_ms)) break;
    backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
  }

  lock.lock();
  if (!fresh.valid()) {
    broken_ = stopping_.load()
                  ? Status(Code::kUnavailable, "the client is closing")
                  : Status(Code::kUnavailable,
                           "cxlpoold at " + socket_path_ + " did not come back within " +
                               std::to_string(limit_ms) + " ms: " + last.message());
    sock_.Reset();
    if (!deferred_.empty() && !stopping_.load()) {
      // Nobody to hand them back to: holding their memory longer helps no
      // one (a daemon that comes back later has them in its fd store, or
      // drops them).
      CXLPOOL_LOG(kWarning) << deferred_.size()
                            << " released leases could not be handed back: " << broken_.message();
      deferred_.clear();
    }
    return broken_;
  }
  sock_ = std::move(fresh);
  broken_ = Status::Ok();
  ApplyHelloLocked(hello);
  ++generation_;
  reconnects_.fetch_add(1);
  CXLPOOL_LOG(kInfo) << "reconnected to cxlpoold at " << socket_path_
                     << (old_instance != instance_id_ ? " (a new daemon instance)" : "");
  {
    // Asks of the old connection are void: its daemon will not wait for them.
    std::lock_guard<std::mutex> tier_lock(tier_mu_);
    migrations_.clear();
  }
  CXLPOOL_RETURN_IF_ERROR(ReclaimLocked());
  ResendTieringLocked();
  return FlushDeferredLocked();
}

Status ClientCore::FlushDeferredLocked() {
  std::vector<DeferredRelease> todo = std::move(deferred_);
  deferred_.clear();
  for (size_t i = 0; i < todo.size(); ++i) {
    DeferredRelease& d = todo[i];
    Result<bool> back = ReclaimOne(d.lease_id, d.back);
    Status st = back.ok() ? Status::Ok() : back.status();
    if (back.ok() && *back) {
      proto::ReleaseRequest req;
      req.set_lease_id(d.lease_id);
      Result<wire::Frame> frame = CallMessage(req);
      proto::ReleaseReply reply;
      st = frame.ok() ? wire::DecodeReply(*frame, &reply) : frame.status();
    }
    if (!st.ok() && ConnectionLost(st)) {
      // Gone again: the next reconnect tries the rest.
      for (size_t j = i; j < todo.size(); ++j) deferred_.push_back(std::move(todo[j]));
      return st;
    }
    if (!st.ok()) {
      CXLPOOL_LOG(kWarning) << "deferred release of lease " << d.lease_id << ": " << st.ToString();
    }
  }
  return Status::Ok();
}

Status ClientCore::ReclaimLocked() {
  struct Item {
    uint64_t id;
    HandBack back;
    LeaseInfo info;
  };
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(leases_mu_);
    for (const auto& [id, lease] : leases_) {
      if (lease->revoked() || !lease->mapping().mapped()) continue;
      Result<HandBack> back = HandBack::Of(lease->mapping());
      if (!back.ok()) return Status(back.status().code(), back.status().message() + " (reclaim)");
      items.push_back(Item{id, std::move(*back), lease->info()});
    }
  }
  size_t accepted = 0;
  for (size_t at = 0, end = 0; at < items.size(); at = end) {
    // As many leases as fit one frame's fds, each with all of its extents;
    // a lease of more extents than one frame carries goes alone, its fds
    // over several frames (CallReclaim).
    size_t nfds = items[at].back.fds.size();
    for (end = at + 1; end < items.size() && nfds <= request_fds_per_frame_; ++end) {
      if (nfds + items[end].back.fds.size() > request_fds_per_frame_) break;
      nfds += items[end].back.fds.size();
    }
    proto::ReclaimRequest rr;
    std::vector<int> fds;
    for (size_t i = at; i < end; ++i) {
      ToReclaimInfo(items[i].info, items[i].back, rr.add_leases());
      for (const UniqueFd& fd : items[i].back.fds) fds.push_back(fd.get());
    }
    Result<wire::Frame> f = CallReclaim(rr, fds);
    if (!f.ok() && !broken_.ok()) return f.status();
    proto::ReclaimReply rep;
    Status d = f.ok() ? wire::DecodeReply(*f, &rep) : f.status();
    if (!d.ok()) {
      // The whole request refused: every lease in it is lost to us.
      for (size_t i = at; i < end; ++i) rep.add_rejected(items[i].id);
      CXLPOOL_LOG(kWarning) << "reclaim refused: " << d.ToString();
    }
    accepted += static_cast<size_t>(rep.accepted_size());
    std::lock_guard<std::mutex> lock(leases_mu_);
    for (int i = 0; i < rep.rejected_size(); ++i) {
      uint64_t lid = rep.rejected(i);
      auto [b, e] = leases_.equal_range(lid);
      for (auto it = b; it != e; ++it) it->second->MarkRevoked();
      CXLPOOL_LOG(kWarning) << "lease " << lid << " was not taken back by the restarted cxlpoold"
                            << (i < rep.rejected_reasons_size() ? ": " + rep.rejected_reasons(i)
                                                                : std::string())
                            << "; it is marked revoked";
    }
  }
  if (!items.empty()) {
    CXLPOOL_LOG(kInfo) << "handed " << accepted << " of " << items.size()
                       << " leases back to cxlpoold";
  }
  return Status::Ok();
}

Result<wire::Frame> ClientCore::CallRecovering(std::unique_lock<std::mutex>& lock,
                                               proto::MsgType type, const std::string& payload) {
  Result<wire::Frame> f = Call(type, payload);
  if (f.ok() || socket_path_.empty() || !ConnectionLost(f.status())) return f;
  CXLPOOL_RETURN_IF_ERROR(Reestablish(lock));
  return Call(type, payload);
}

template <typename Req>
Result<wire::Frame> ClientCore::CallMessageRecovering(std::unique_lock<std::mutex>& lock,
                                                      const Req& req) {
  Result<std::string> payload = wire::Encode(req, max_payload_bytes_);
  if (!payload.ok()) return payload.status();
  return CallRecovering(lock, wire::TypeOf<Req>(), *payload);
}

void ClientCore::StartWatcher() {
  std::lock_guard<std::mutex> lock(watcher_mu_);
  if (watcher_.joinable() || socket_path_.empty() || stopping_.load()) return;
  stop_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_.valid()) {
    CXLPOOL_LOG(kWarning) << "no restart watcher (eventfd: " << std::strerror(errno)
                          << "); a restart is noticed at the next call";
    return;
  }
  watch_ep_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = stop_fd_.get();
  if (!watch_ep_.valid() || ::epoll_ctl(watch_ep_.get(), EPOLL_CTL_ADD, stop_fd_.get(), &ev) != 0) {
    CXLPOOL_LOG(kWarning) << "no restart watcher (epoll: " << std::strerror(errno)
                          << "); a restart is noticed at the next call";
    watch_ep_.Reset();
    return;
  }
  watcher_ = std::thread([this] { WatchLoop(); });
}

void ClientCore::WatchFdLocked(int fd) {
  if (watch_fd_ >= 0) (void)::epoll_ctl(watch_ep_.get(), EPOLL_CTL_DEL, watch_fd_, nullptr);
  watch_fd_ = -1;
  if (fd < 0) return;
  epoll_event ev{};
  ev.events = calls_active_ > 0 ? EPOLLRDHUP : EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (::epoll_ctl(watch_ep_.get(), EPOLL_CTL_ADD, fd, &ev) == 0) watch_fd_ = fd;
}

void ClientCore::ArmWatchLocked() {
  if (watch_fd_ < 0) return;
  epoll_event ev{};
  // Hang-ups (EPOLLHUP, EPOLLERR) are reported whatever is asked: a daemon
  // that dies mid-call is seen by the caller and the watcher alike.
  ev.events = calls_active_ > 0 ? EPOLLRDHUP : EPOLLIN | EPOLLRDHUP;
  ev.data.fd = watch_fd_;
  (void)::epoll_ctl(watch_ep_.get(), EPOLL_CTL_MOD, watch_fd_, &ev);
}

ClientCore::CallScope::CallScope(ClientCore* core) : core_(core) {
  if (core_->calls_active_++ == 0) core_->ArmWatchLocked();
}

ClientCore::CallScope::~CallScope() {
  if (--core_->calls_active_ == 0) core_->ArmWatchLocked();
}

void ClientCore::WatchLoop() {
  // Named for top -H and the tests (at most 15 characters).
  (void)::pthread_setname_np(::pthread_self(), "cxlpool-watch");
  uint64_t gen = ~0ull;
  UniqueFd watched;  // a dup of the socket: epoll never sees a reused number
  while (!stopping_.load()) {
    bool reconnect = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gen != generation_ || !watched.valid()) {
        WatchFdLocked(-1);
        watched.Reset(sock_.valid() ? ::fcntl(sock_.get(), F_DUPFD_CLOEXEC, 0) : -1);
        WatchFdLocked(watched.get());
        gen = generation_;
      }
      reconnect = !broken_.ok() && ConnectionLost(broken_);
    }
    if (reconnect || !watched.valid()) {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_.load()) return;
      Status s = Reestablish(lock);
      lock.unlock();
      if (!s.ok()) {
        if (stopping_.load()) return;
        CXLPOOL_LOG(kWarning) << "restart watcher: " << s.ToString();
        if (!Nap(kMaxBackoffMs)) return;
      }
      {
        std::lock_guard<std::mutex> relock(mu_);
        WatchFdLocked(-1);
      }
      watched.Reset();
      continue;
    }
    epoll_event evs[2];
    int r = ::epoll_wait(watch_ep_.get(), evs, 2, -1);
    if (r < 0 && errno != EINTR) return;
    if (stopping_.load()) return;
    bool on_socket = false;
    for (int i = 0; i < r; ++i) {
      if (evs[i].data.fd == stop_fd_.get()) return;
      on_socket = on_socket || evs[i].data.fd == watched.get();
    }
    if (!on_socket) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (gen != generation_) continue;  // a call reconnected meanwhile
    if (!broken_.ok()) continue;       // handled at the top
    // Drain what is there: lease events, or the EOF of a daemon that went.
    for (;;) {
      Result<wire::FrameReader::Progress> pr = reader_.Read(sock_.get(), 0);
      if (!pr.ok()) {
        (void)Broken(pr.status());
        break;
      }
      if (*pr == wire::FrameReader::Progress::kWouldBlock) break;
      if (*pr == wire::FrameReader::Progress::kEof) {
        (void)Broken(Status(Code::kUnavailable, "cxlpoold closed the connection"));
        break;
      }
      if (*pr != wire::FrameReader::Progress::kFrame) continue;
      wire::Frame frame = reader_.TakeFrame();
      if (HandlePush(frame)) continue;
      if (std::optional<Status> err = wire::ConnectionError(frame)) {
        (void)Broken(*err);
        break;
      } else {
        (void)Broken(Status(Code::kProtocol, "unsolicited " + wire::MsgTypeName(frame.header.type) +
                                                 " with no request pending"));
        break;
      }
    }
  }
}

Result<int> ClientCore::ProcessEvents() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok() && !socket_path_.empty() && ConnectionLost(broken_)) {
    CXLPOOL_RETURN_IF_ERROR(Reestablish(lock));
  }
  if (!broken_.ok()) return broken_;
  int handled = 0;
  for (;;) {
    Result<wire::FrameReader::Progress> p = reader_.Read(sock_.get(), 0);
    if (!p.ok()) return Broken(p.status());
    if (*p == wire::FrameReader::Progress::kWouldBlock) return handled;
    if (*p == wire::FrameReader::Progress::kEof) {
      return Broken(Status(Code::kUnavailable, "cxlpoold closed the connection"));
    }
    wire::Frame frame = reader_.TakeFrame();
    if (std::optional<Status> err = wire::ConnectionError(frame)) return Broken(*err);
    if (!HandlePush(frame)) {
      return Broken(Status(Code::kProtocol, "unsolicited " + wire::MsgTypeName(frame.header.type) +
                                                " with no request pending"));
    }
    ++handled;
  }
}

void ClientCore::Track(LeaseState* lease) {
  {
    std::lock_guard<std::mutex> lock(leases_mu_);
    leases_.emplace(lease->info().id, lease);
  }
  StartWatcher();
}

void ClientCore::Untrack(LeaseState* lease) {
  std::lock_guard<std::mutex> lock(leases_mu_);
  auto [begin, end] = leases_.equal_range(lease->info().id);
  for (auto it = begin; it != end; ++it) {
    if (it->second == lease) {
      leases_.erase(it);
      return;
    }
  }
}

// ---------------------------------------------------------------- LeaseState

LeaseState::LeaseState(std::shared_ptr<ClientCore> core, ExtentMapping mapping, LeaseInfo info)
    : core_(std::move(core)),
      mapping_(std::move(mapping)),
      info_(std::move(info)),
      signals_(mapping_.size()) {
  node_.store(info_.numa_node, std::memory_order_relaxed);
}

LeaseState::~LeaseState() {
  Status s = Release();
  if (!s.ok()) {
    CXLPOOL_LOG(kDebug) << "release of lease " << info_.id << ": " << s.ToString();
  }
}

Status LeaseState::CudaRegister(int device) {
  if (released_) return Status(Code::kInvalidArgument, "lease already released");
  if (cuda_.registered()) {
    return Status(Code::kAlreadyExists,
                  "lease already registered with CUDA device " + std::to_string(cuda_.device()));
  }
  if (device < 0) return Status(Code::kInvalidArgument, "negative CUDA device index");
  Result<const cuda::CudaDriver*> driver = cuda::CudaDriver::Default();
  if (!driver.ok()) {
    cuda_status_ = driver.status();
    return cuda_status_;
  }
  Result<cuda::CudaRegistration> reg =
      cuda::RegisterHostMemory(**driver, device, mapping_.data(), mapping_.size());
  if (!reg.ok()) {
    cuda_status_ = reg.status();
    return cuda_status_;
  }
  cuda_ = std::move(*reg);
  cuda_status_ = Status::Ok();
  DeclareCooperative();
  // The registration pinned the pages long-term, which may have migrated
  // them (out of ZONE_MOVABLE): ask the kernel where they are now.
  Placement placement;
  if (Status s = VerifyPlacement("cuda_register", &placement); !s.ok()) {
    CXLPOOL_LOG(kWarning) << "lease " << info_.id
                          << ": placement check after CUDA registration: " << s.ToString();
  } else if (placement.moved) {
    CXLPOOL_LOG(kWarning) << "lease " << info_.id
                          << ": after CUDA registration its pages are on node "
                          << placement.numa_node << ", not node " << placement.placed_numa_node
                          << " where it was placed; the daemon was told";
  }
  return Status::Ok();
}

Status LeaseState::VerifyPlacement(const std::string& cause, Placement* out) {
  *out = Placement();
  // Where the daemon last said the pages are (the grant, a tiering move, a
  // confirmed report): numa_node(), which LeaseEvent "moved" keeps current.
  const int accounted = numa_node();
  out->placed_numa_node = accounted;
  if (released_) return Status(Code::kInvalidArgument, "lease already released");
  if (info_.backing == "devdax") {
    return Status(Code::kUnsupported,
                  "a devdax lease is device memory: move_pages cannot place it (its node is the "
                  "DAX device's target node)");
  }
  Result<PageCensus> census = CensusPages(mapping_.data(), mapping_.size(), 4096, 4096);
  if (!census.ok()) return census.status();
  std::optional<int> node = census->MajorityNode();
  out->numa_node = node.value_or(-1);
  out->pages_sampled = census->sampled;
  out->pages_on_node = node ? census->on_node.at(*node) : 0;
  out->pages_absent = census->absent;
  out->moved = node.has_value() && *node != accounted;
  if (!out->moved) return Status::Ok();
  proto::LeaseMovedRequest req;
  req.set_lease_id(info_.id);
  req.set_numa_node(*node);
  req.set_pages_sampled(census->sampled);
  req.set_pages_on_node(out->pages_on_node);
  req.set_cause(cause);
  Result<proto::LeaseMovedReply> reply = core_->ReportMoved(req);
  if (!reply.ok()) return reply.status();
  info_ = FromProto(reply->lease());
  SetNode(info_.numa_node);
  return Status::Ok();
}

Status LeaseState::CudaUnregister() {
  if (!cuda_.registered()) return Status(Code::kNotFound, "the lease is not registered with CUDA");
  Status s = cuda_.Unregister();
  cuda_status_ = Status(Code::kNotFound, "the lease is not registered with CUDA");
  DeclareCooperative();
  return s;
}

Result<uint64_t> LeaseState::DevicePtr() const {
  if (!cuda_.registered()) return cuda_status_;
  if (!cuda_.contiguous()) {
    return Status(Code::kUnsupported, "the lease's " + std::to_string(cuda_.chunks().size()) +
                                          " CUDA chunks have non-contiguous device pointers;"
                                          " use the per-chunk pointers");
  }
  return cuda_.chunks().front().device_ptr;
}

Status LeaseState::Release() {
  if (released_) return Status::Ok();
  released_ = true;
  Status result;
  if (cuda_.registered()) {
    Status s = cuda_.Unregister();
    if (!s.ok()) {
      CXLPOOL_LOG(kWarning) << "lease " << info_.id << ": " << s.ToString();
    }
  }
  // Untracked first: a reconnect on another thread must not hand back an
  // fd that is about to close. The fd stays open until the daemon answered.
  core_->Untrack(this);
  if (revoked()) {
    result = Status(Code::kRevoked, "lease " + std::to_string(info_.id) + " was revoked");
  }
  Status s = core_->Release(info_.id, revoked() ? nullptr : &mapping_);
  mapping_.Unmap();
  if (result.ok() && !s.ok()) result = s;
  core_.reset();
  return result;
}

}  // namespace cxlpool::detail
