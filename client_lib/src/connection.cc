#include "connection.h"

#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "cxlpool/client.hpp"
#include "cxlpool/proto/extents.h"

namespace cxlpool::detail {
namespace {

// How long hello may take before the daemon counts as unresponsive. Requests
// after hello wait as long as the daemon needs (prefaulting large leases).
constexpr int kHelloTimeoutMs = 30000;

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

Status Unsolicited(const wire::Frame& frame) {
  return Status(Code::kProtocol,
                "unsolicited " + wire::MsgTypeName(frame.header.type) + " with no request pending");
}

Status Closed() { return Status(Code::kUnavailable, "cxlpoold closed the connection"); }

}  // namespace

bool ConnectionLost(const Status& s) {
  return s.code() == Code::kUnavailable || s.code() == Code::kIo;
}

wire::HelloOptions LibraryHello() {
  wire::HelloOptions o;
  o.name = "libcxlpool/" + std::string(cxlpool_version()) + " " + ProcessComm();
  o.timeout_ms = kHelloTimeoutMs;
  return o;
}

Connection::Connection(UniqueFd sock, std::string peer, Hooks hooks)
    : sock_(std::move(sock)), peer_(std::move(peer)), hooks_(std::move(hooks)) {}

Status Connection::Hello() {
  Result<proto::HelloReply> reply = wire::SayHello(sock_.get(), NextRequestId(), LibraryHello());
  if (!reply.ok()) return Broken(reply.status());
  Apply(*reply);
  return Status::Ok();
}

void Connection::Adopt(UniqueFd sock, const proto::HelloReply& reply) {
  sock_ = std::move(sock);
  broken_ = Status::Ok();
  Apply(reply);
  ++generation_;
}

void Connection::Apply(const proto::HelloReply& reply) {
  version_ = reply.version();
  server_version_ = reply.server_version();
  instance_id_ = reply.instance_id();
  max_payload_bytes_ = wire::MaxPayloadBytes(reply);
  const size_t per_frame = wire::RequestFdsPerFrame(reply);
  request_fds_per_frame_ = per_frame > 0 ? per_frame : wire::kDefaultMaxFdsPerFrame;
  max_request_bytes_ =
      reply.max_request_bytes() > 0 ? reply.max_request_bytes() : kDaemonRequestBytes;
  wire::RecvLimits limits;
  limits.max_payload_bytes = max_payload_bytes_;
  limits.max_fds = wire::kHardMaxFdsPerFrame;  // as announced in the hello
  reader_ = wire::FrameReader(limits);
}

void Connection::Fail(Status why) {
  broken_ = std::move(why);
  sock_.Reset();
}

Status Connection::Broken(Status s) {
  if (broken_.ok()) {
    broken_ = Status(s.code() == Code::kProtocol ? Code::kProtocol : Code::kUnavailable,
                     "connection to cxlpoold (" + peer_ + ") unusable: " + s.message());
    sock_.Reset();
  }
  return s;
}

Connection::CallScope::CallScope(Connection* c) : c_(c) {
  if (c_->calls_active_++ == 0 && c_->hooks_.calls_active) c_->hooks_.calls_active(true);
}

Connection::CallScope::~CallScope() {
  if (--c_->calls_active_ == 0 && c_->hooks_.calls_active) c_->hooks_.calls_active(false);
}

Result<wire::Frame> Connection::Call(proto::MsgType type, const std::string& payload,
                                     std::span<const int> fds) {
  if (!broken_.ok()) return broken_;
  CallScope scope(this);
  const uint64_t id = NextRequestId();
  Status s =
      wire::SendFrame(sock_.get(), type, id, payload, fds, -1, static_cast<uint16_t>(version_));
  if (!s.ok()) return Broken(s);
  return AwaitReply(id);
}

Result<wire::Frame> Connection::CallReclaim(const proto::ReclaimRequest& req,
                                            std::span<const int> fds) {
  if (!broken_.ok()) return broken_;
  Result<std::vector<wire::PlannedFrame>> plan =
      wire::PlanReclaimRequest(req, fds.size(), request_fds_per_frame_, max_payload_bytes_);
  if (!plan.ok()) return plan.status();
  CXLPOOL_RETURN_IF_ERROR(
      wire::CheckReclaimRequestBytes(plan->front(), fds.size(), max_request_bytes_));
  CallScope scope(this);
  const uint64_t id = NextRequestId();
  for (const wire::PlannedFrame& f : *plan) {
    Status s =
        wire::SendFrame(sock_.get(), f.type, id, f.payload, fds.subspan(f.first_fd, f.fd_count), -1,
                        static_cast<uint16_t>(version_));
    if (!s.ok()) return Broken(s);
  }
  return AwaitReply(id);
}

Result<wire::Frame> Connection::AwaitReply(uint64_t id) {
  for (;;) {
    Result<wire::Frame> next = ReadFrame();
    if (!next.ok()) return next.status();
    wire::Frame frame = std::move(*next);
    if (frame.request_id() == 0 && hooks_.push(frame)) continue;
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

Result<wire::Frame> Connection::ReadFrame() {
  for (;;) {
    Result<wire::FrameReader::Progress> p = reader_.Read(sock_.get(), -1);
    if (!p.ok()) return Broken(p.status());
    if (*p == wire::FrameReader::Progress::kEof) return Broken(Closed());
    if (*p == wire::FrameReader::Progress::kFrame) return reader_.TakeFrame();
  }
}

Result<int> Connection::DrainPushes() {
  if (!broken_.ok()) return broken_;
  int handled = 0;
  for (;;) {
    Result<wire::FrameReader::Progress> p = reader_.Read(sock_.get(), 0);
    if (!p.ok()) return Broken(p.status());
    if (*p == wire::FrameReader::Progress::kWouldBlock) return handled;
    if (*p == wire::FrameReader::Progress::kEof) return Broken(Closed());
    wire::Frame frame = reader_.TakeFrame();
    if (std::optional<Status> err = wire::ConnectionError(frame)) return Broken(*err);
    if (frame.request_id() != 0 || !hooks_.push(frame)) return Broken(Unsolicited(frame));
    ++handled;
  }
}

}  // namespace cxlpool::detail
