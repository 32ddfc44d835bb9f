#include "cxlpool/proto/blocking_client.h"

#include <sys/socket.h>

#include <algorithm>
#include <optional>

#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/hello.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"

namespace cxlpool::wire {

Result<BlockingClient> BlockingClient::Connect(const std::string& socket_path,
                                               BlockingClientOptions options) {
  auto fd = ConnectUnix(socket_path);
  if (!fd.ok()) return fd.status();
  return Handshake(std::move(*fd), std::move(options));
}

Result<BlockingClient> BlockingClient::Handshake(UniqueFd sock, BlockingClientOptions options) {
  BlockingClient c;
  c.sock_ = std::move(sock);
  c.options_ = std::move(options);
  if (auto cred = GetPeerCred(c.sock_.get()); cred.ok()) c.peer_pid_ = cred->pid;
  HelloOptions hello{.name = c.options_.name,
                     .min_version = c.options_.min_version,
                     .max_version = c.options_.max_version,
                     .timeout_ms = c.options_.timeout_ms};
  Result<proto::HelloReply> r = SayHello(c.sock_.get(), c.next_id_++, hello);
  if (!r.ok()) return r.status();
  c.version_ = static_cast<uint16_t>(r->version());
  c.hello_ = std::move(*r);
  return c;
}

Status BlockingClient::Broken(Status why) {
  if (broken_.ok()) broken_ = why;
  return why;
}

Result<Frame> BlockingClient::NextReplyFrame() {
  RecvLimits limits;
  limits.max_fds = kHardMaxFdsPerFrame;
  limits.max_payload_bytes = MaxPayloadBytes(hello_);
  for (;;) {
    Result<Frame> f = RecvFrame(sock_.get(), limits, options_.timeout_ms);
    if (!f.ok()) return f.status();
    if (f->type() != proto::MSG_LEASE_EVENT) return f;
    ++pushes_;
    proto::LeaseEvent ev;
    if (Decode(f->payload, &ev).ok()) events_.push_back(std::move(ev));
  }
}

Status BlockingClient::SendFailed(Status sent) {
  // A daemon that refused the connection (a limit) wrote why and closed
  // before this request went out: that is the answer, not EPIPE.
  if (std::optional<Status> err = ReadRefusal(sock_.get())) return Broken(*err);
  return sent;
}

Result<Frame> BlockingClient::Exchange(proto::MsgType type, const Result<std::string>& payload,
                                       proto::MsgType reply_type, std::span<const int> send_fds) {
  if (!broken_.ok()) {
    return Status(broken_.code(), "connection unusable after: " + broken_.message());
  }
  if (!payload.ok()) return payload.status();
  const uint64_t id = next_id_++;
  const uint16_t version = type == proto::MSG_HELLO_REQUEST ? kHelloWireVersion : version_;
  if (Status sent =
          SendFrame(sock_.get(), type, id, *payload, send_fds, options_.timeout_ms, version);
      !sent.ok()) {
    return SendFailed(sent);
  }
  return AwaitReply(id, reply_type);
}

Result<Frame> BlockingClient::ExchangeReclaim(const proto::ReclaimRequest& req,
                                              std::span<const int> send_fds) {
  if (!broken_.ok()) {
    return Status(broken_.code(), "connection unusable after: " + broken_.message());
  }
  // A daemon that does not say how many fds it reads per frame predates
  // split requests: it gets one frame, and judges it.
  const size_t per_frame = RequestFdsPerFrame(hello_) > 0 ? RequestFdsPerFrame(hello_)
                                                          : std::max<size_t>(send_fds.size(), 1);
  // What fits one frame goes as it is, so the daemon judges it (this client
  // is also the tests' raw one: it sends requests that do not add up).
  if (send_fds.size() <= per_frame) {
    return Exchange(proto::MSG_RECLAIM_REQUEST, Encode(req), proto::MSG_RECLAIM_REPLY, send_fds);
  }
  Result<std::vector<PlannedFrame>> plan =
      PlanReclaimRequest(req, send_fds.size(), per_frame, MaxPayloadBytes(hello_));
  if (!plan.ok()) return plan.status();
  CXLPOOL_RETURN_IF_ERROR(
      CheckReclaimRequestBytes(plan->front(), send_fds.size(), hello_.max_request_bytes()));
  const uint64_t id = next_id_++;
  for (const PlannedFrame& f : *plan) {
    if (Status sent =
            SendFrame(sock_.get(), f.type, id, f.payload, send_fds.subspan(f.first_fd, f.fd_count),
                      options_.timeout_ms, version_);
        !sent.ok()) {
      return SendFailed(sent);
    }
  }
  return AwaitReply(id, proto::MSG_RECLAIM_REPLY);
}

Result<Frame> BlockingClient::AwaitReply(uint64_t id, proto::MsgType reply_type) {
  Result<Frame> f = NextReplyFrame();
  if (!f.ok()) return f.status();
  // The connection's own error (request id 0): the daemon closes it.
  if (std::optional<Status> err = ConnectionError(*f)) return Broken(*err);
  if (f->request_id() != id) {
    return Broken(Status(Code::kProtocol, "reply for request " + std::to_string(f->request_id()) +
                                              ", expected " + std::to_string(id)));
  }
  const bool lease_reply =
      reply_type == proto::MSG_ALLOC_REPLY || reply_type == proto::MSG_ATTACH_REPLY;
  if (!lease_reply || f->type() != reply_type || f->fds_dropped > 0) return f;
  // A lease reply: every extent's fd, from this frame and the EXTENT_FDS
  // frames that follow it.
  Frame head;
  head.header = f->header;
  head.payload = f->payload;
  LeaseReplyAssembler assembler;
  Status st = assembler.Start(std::move(*f));
  while (st.ok() && !assembler.complete()) {
    Result<Frame> next = NextReplyFrame();
    if (!next.ok()) return next.status();
    st = assembler.Add(std::move(*next));
  }
  if (!st.ok()) return Broken(st);
  for (ReceivedExtent& e : assembler.TakeExtents()) head.fds.push_back(std::move(e.fd));
  return head;
}

Result<proto::LeaseEvent> BlockingClient::NextEvent() {
  if (!events_.empty()) {
    proto::LeaseEvent ev = std::move(events_.front());
    events_.pop_front();
    return ev;
  }
  RecvLimits limits;
  limits.max_fds = kHardMaxFdsPerFrame;
  Result<Frame> f = RecvFrame(sock_.get(), limits, options_.timeout_ms);
  if (!f.ok()) return f.status();
  if (f->type() == proto::MSG_LEASE_EVENT) ++pushes_;
  proto::LeaseEvent ev;
  CXLPOOL_RETURN_IF_ERROR(DecodeReply(*f, &ev));
  return ev;
}

}  // namespace cxlpool::wire
