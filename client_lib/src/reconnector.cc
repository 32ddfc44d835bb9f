#include "reconnector.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "client_core.h"
#include "cxlpool/common/log.h"
#include "lease_registry.h"

namespace cxlpool::detail {
namespace {

// How long a reconnect may keep trying (CXLPOOL_RECONNECT_TIMEOUT_MS).
constexpr int kReconnectTimeoutMs = 60000;

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

// A RECLAIM entry's extents: listed when the lease has several (one: the
// lease's own size says it all, as every older client sent it).
void AddExtents(const HandBack& back, proto::LeaseInfo* out) {
  if (back.extent_sizes.size() < 2) return;
  for (uint64_t size : back.extent_sizes) out->add_extents()->set_size_bytes(size);
}

// What a RECLAIM entry says of a lease: everything the daemon told us
// (hints for a daemon whose journal lost it), and its extents.
void ToReclaimInfo(const LeaseInfo& l, const HandBack& back, proto::LeaseInfo* out) {
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

Status Released(Connection& conn, uint64_t lease_id) {
  proto::ReleaseRequest req;
  req.set_lease_id(lease_id);
  Result<wire::Frame> frame = conn.CallMessage(req);
  proto::ReleaseReply reply;
  return frame.ok() ? wire::DecodeReply(*frame, &reply) : frame.status();
}

}  // namespace

bool DaemonRestarting(const Status& s) {
  return s.code() == Code::kUnavailable && s.message().rfind("daemon restarting", 0) == 0;
}

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

// ---------------------------------------------------------------- Reconnector

int Reconnector::TimeoutMs() {
  const char* e = std::getenv("CXLPOOL_RECONNECT_TIMEOUT_MS");
  if (e == nullptr || *e == '\0') return kReconnectTimeoutMs;
  char* end = nullptr;
  long v = std::strtol(e, &end, 10);
  if (end == e || *end != '\0' || v < 0 || v > 3600000) return kReconnectTimeoutMs;
  return static_cast<int>(v);
}

std::chrono::steady_clock::time_point Reconnector::Deadline() {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(TimeoutMs());
}

Result<Reconnector::Dialed> Reconnector::Dial(uint64_t hello_id) const {
  const int limit_ms = TimeoutMs();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  const wire::HelloOptions hello = LibraryHello();
  Status last;
  for (int backoff_ms = 5;; backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs)) {
    Result<UniqueFd> sock = ConnectSocket(path_);
    if (sock.ok()) {
      Result<proto::HelloReply> reply = wire::SayHello(sock->get(), hello_id, hello);
      if (reply.ok()) return Dialed{std::move(*sock), std::move(*reply)};
      last = reply.status();
    } else {
      last = sock.status();
    }
    if (std::chrono::steady_clock::now() >= deadline || !stop_.Nap(backoff_ms)) break;
  }
  if (stop_.stopping()) return Status(Code::kUnavailable, "the client is closing");
  return Status(Code::kUnavailable, "cxlpoold at " + path_ + " did not come back within " +
                                        std::to_string(limit_ms) + " ms: " + last.message());
}

// --------------------------------------------------------------- LeaseReturns

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

Status LeaseReturns::ReclaimAll(Connection& conn, const LeaseRegistry& leases) {
  struct Item {
    uint64_t id;
    HandBack back;
    LeaseInfo info;
  };
  std::vector<Item> items;
  Status dup_failed;
  leases.ForAll([&](uint64_t id, LeaseState* lease) {
    if (lease->revoked() || !lease->mapping().mapped()) return true;
    Result<HandBack> back = HandBack::Of(lease->mapping());
    if (!back.ok()) {
      dup_failed = Status(back.status().code(), back.status().message() + " (reclaim)");
      return false;
    }
    items.push_back(Item{id, std::move(*back), lease->info()});
    return true;
  });
  CXLPOOL_RETURN_IF_ERROR(dup_failed);
  const size_t per_frame = conn.request_fds_per_frame();
  size_t accepted = 0;
  for (size_t at = 0, end = 0; at < items.size(); at = end) {
    // As many leases as fit one frame's fds, each with all of its extents;
    // a lease of more extents than one frame carries goes alone, its fds
    // over several frames (CallReclaim).
    size_t nfds = items[at].back.fds.size();
    for (end = at + 1; end < items.size() && nfds <= per_frame; ++end) {
      if (nfds + items[end].back.fds.size() > per_frame) break;
      nfds += items[end].back.fds.size();
    }
    proto::ReclaimRequest rr;
    std::vector<int> fds;
    for (size_t i = at; i < end; ++i) {
      ToReclaimInfo(items[i].info, items[i].back, rr.add_leases());
      for (const UniqueFd& fd : items[i].back.fds) fds.push_back(fd.get());
    }
    Result<wire::Frame> f = conn.CallReclaim(rr, fds);
    if (!f.ok() && !conn.ok()) return f.status();
    proto::ReclaimReply rep;
    Status d = f.ok() ? wire::DecodeReply(*f, &rep) : f.status();
    if (!d.ok()) {
      // The whole request refused: every lease in it is lost to us.
      for (size_t i = at; i < end; ++i) rep.add_rejected(items[i].id);
      CXLPOOL_LOG(kWarning) << "reclaim refused: " << d.ToString();
    }
    accepted += static_cast<size_t>(rep.accepted_size());
    for (int i = 0; i < rep.rejected_size(); ++i) {
      uint64_t lid = rep.rejected(i);
      leases.ForId(lid, [](LeaseState* l) { l->MarkRevoked(); });
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

Result<bool> LeaseReturns::ReclaimOne(Connection& conn, uint64_t lease_id, const HandBack& back) {
  proto::ReclaimRequest rr;
  proto::LeaseInfo* info = rr.add_leases();
  info->set_id(lease_id);
  info->set_size_bytes(back.size);
  AddExtents(back, info);
  std::vector<int> fds;
  for (const UniqueFd& fd : back.fds) fds.push_back(fd.get());
  Result<wire::Frame> frame = conn.CallReclaim(rr, fds);
  if (!frame.ok()) return frame.status();
  proto::ReclaimReply rep;
  CXLPOOL_RETURN_IF_ERROR(wire::DecodeReply(*frame, &rep));
  return rep.accepted_size() == 1;
}

Status LeaseReturns::Defer(uint64_t lease_id, const ExtentMapping& mapping) {
  Result<HandBack> back = HandBack::Of(mapping);
  if (!back.ok()) {
    return Status(back.status().code(), back.status().message() + " (deferred release)");
  }
  deferred_.push_back(DeferredRelease{lease_id, std::move(*back)});
  return Status::Ok();
}

Status LeaseReturns::FlushDeferred(Connection& conn) {
  std::vector<DeferredRelease> todo = std::move(deferred_);
  deferred_.clear();
  for (size_t i = 0; i < todo.size(); ++i) {
    DeferredRelease& d = todo[i];
    Result<bool> back = ReclaimOne(conn, d.lease_id, d.back);
    Status st = back.ok() ? Status::Ok() : back.status();
    if (back.ok() && *back) st = Released(conn, d.lease_id);
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

void LeaseReturns::DropDeferred(const Status& why) {
  if (deferred_.empty()) return;
  // Holding their memory longer helps no one (a daemon that comes back
  // later has them in its fd store, or drops them).
  CXLPOOL_LOG(kWarning) << deferred_.size()
                        << " released leases could not be handed back: " << why.message();
  deferred_.clear();
}

}  // namespace cxlpool::detail
