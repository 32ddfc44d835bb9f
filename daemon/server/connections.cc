// Server::Impl: admitting, closing and aborting connections; pushes.
#include <sys/socket.h>

#include <utility>

#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"
#include "server/server_impl.h"

namespace cxlpool {

namespace {

std::string FirstLine(std::string s) {
  size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

const Connection* Server::Impl::Find(ConnectionId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

Server::Impl::ConnPtr Server::Impl::Get(ConnectionId id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second;
}

Result<ConnectionId> Server::Impl::Admit(UniqueFd fd) {
  if (stopped_) return Status(Code::kUnavailable, "server stopped");
  Result<wire::PeerCred> cred = wire::GetPeerCred(fd.get());
  if (!cred.ok()) return cred.status();
  if (std::optional<Refusal> no = admission_.CheckConnection(cred->uid)) {
    counters_.Hit(no->limit);
    Status st(Code::kResourceExhausted, "connection refused: " + no->why);
    counters_.LogLimit(no->limit, st.message() + " (pid " + std::to_string(cred->pid) + ")");
    // The client reads this as the answer to its HELLO (request id 0: the
    // connection's own error), then EOF. Its socket buffer is empty, so the
    // frame fits; if not, the close alone has to say it.
    std::string frame = wire::EncodeFrame(proto::MSG_ERROR_REPLY, 0, wire::EncodeErrorPayload(st),
                                          wire::kHelloWireVersion);
    (void)!::send(fd.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    return st;
  }

  PeerInfo peer;
  peer.pid = cred->pid;
  peer.uid = cred->uid;
  peer.gid = cred->gid;
  Result<UniqueFd> pidfd = wire::GetPeerPidfd(fd.get(), cred->pid);
  if (!pidfd.ok()) {
    CXLPOOL_LOG(kDebug) << "server: no pidfd for pid " << cred->pid << ": "
                        << pidfd.status().ToString();
  }
  if (cred->pid > 0) {
    std::string proc = "/proc/" + std::to_string(cred->pid);
    if (auto comm = fs_->ReadFile(proc + "/comm"); comm.ok())
      peer.comm = SanitizeUtf8(FirstLine(*comm));
    if (auto cg = fs_->ReadFile(proc + "/cgroup"); cg.ok())
      peer.cgroup = SanitizeUtf8(ParseUnifiedCgroup(*cg));
  }
  auto c = std::make_shared<Connection>(
      io_, next_id_, std::move(peer), pidfd.ok() ? std::move(*pidfd) : UniqueFd(),
      wire::RecvLimits{static_cast<uint32_t>(limits().max_request_bytes),
                       limits().max_fds_per_frame},
      &admission_);
  boost::system::error_code ec;
  c->socket().assign(boost::asio::local::stream_protocol(), fd.get(), ec);
  if (ec) return Status(Code::kIo, "adopt connection socket: " + ec.message());
  fd.Release();

  const ConnectionId id = next_id_++;
  conns_[id] = c;
  admission_.AddConnection(c->uid());
  counters_.Accepted();
  c->set_last_input(Clock::now());
  CXLPOOL_LOG(kDebug) << "server: " << c->Describe() << " connected";
  Callback([&] { handler_->OnConnect(id, c->peer()); });
  if (!c->closed() && !c->hello_done()) ArmIdleTimer(c, limits().hello_timeout);
  StartRead(c);
  ScheduleDisconnectFlush();
  return id;
}

void Server::Impl::Abort(const ConnPtr& c, uint64_t request_id, const Status& st,
                         const char* limit) {
  if (c->closed() || c->closing()) return;
  c->reader().DropAssembly();  // a RECLAIM still coming in is refused with the connection
  if (limit != nullptr) {
    counters_.Hit(limit);
    counters_.LogLimit(limit, "closing " + c->Describe() + ": " + st.message());
  } else {
    CXLPOOL_LOG(kInfo) << "server: closing " << c->Describe() << ": " << st.ToString();
  }
  c->queue().DiscardUnsent();
  Result<wire::OutFrame> f = wire::MakeOutFrame(
      proto::MSG_ERROR_REPLY, request_id, wire::EncodeErrorPayload(st), {}, c->frame_version());
  if (!f.ok()) {
    Drop(c, st.message());
    return;
  }
  if (c->queue().empty()) c->queue().set_last_progress(Clock::now());
  c->StartClosing(st.message());     // nothing more is read or queued
  QueueUnchecked(c, std::move(*f));  // Flush closes once the queue is out
  if (c->closed()) return;
  ArmCloseTimer(c);
}

void Server::Impl::CloseAfterFlush(const ConnPtr& c, std::string reason) {
  if (c->closed() || c->closing()) return;
  c->StartClosing(std::move(reason));
  if (c->queue().empty()) {
    Drop(c, c->closing_reason());
    return;
  }
  ArmCloseTimer(c);
}

void Server::Impl::Drop(const ConnPtr& c, const std::string& reason) {
  if (c->closed()) return;
  CXLPOOL_LOG(kInfo) << "server: closing " << c->Describe() << ": " << reason;
  c->Close();
  admission_.RemoveConnection(c->uid());
  conns_.erase(c->id());
  pending_disconnects_.push_back(c->id());
  ScheduleDisconnectFlush();
}

Status Server::Impl::Push(ConnectionId id, Reply reply) {
  ConnPtr c = Get(id);
  if (!c || c->closed()) return Status(Code::kNotFound, "no connection " + std::to_string(id));
  if (!c->hello_done()) {
    return Status(Code::kUnavailable, "connection " + std::to_string(id) + " has not said HELLO");
  }
  if (reply.payload.size() > options_.max_frame_bytes) {
    return Status(Code::kInvalidArgument, "push payload over max_frame_bytes");
  }
  if (reply.fds.size() > wire::kHardMaxFdsPerFrame) {
    return Status(Code::kInvalidArgument, "too many fds on one push");
  }
  if (!Enqueue(c, reply.type, 0, reply.payload, reply.fds)) {
    return Status(Code::kUnavailable,
                  "connection " + std::to_string(id) + " dropped: it does not read its socket");
  }
  return Status::Ok();
}

Status Server::Impl::MarkHelloDone(ConnectionId id, uint32_t version) {
  ConnPtr c = Get(id);
  if (!c || c->closed()) return Status(Code::kNotFound, "no connection " + std::to_string(id));
  if (version < wire::kMinWireVersion || version > wire::kMaxWireVersion) {
    return Status(Code::kInvalidArgument,
                  "version " + std::to_string(version) + " is not one this server speaks");
  }
  if (!c->hello_done()) {
    c->SetHelloDone(version);
    c->UseNegotiatedFrameVersion();
    ArmIdleAfterHello(c);
  }
  return Status::Ok();
}

}  // namespace cxlpool
