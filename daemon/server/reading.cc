// Server::Impl: reading frames, parking a uid over its busy budget, and
// handing requests to the handler.
#include <algorithm>
#include <utility>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/codec.h"
#include "server/server_impl.h"

namespace cxlpool {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

// Frames one connection may have handled per wakeup before the other ready
// connections get a turn (it is read again on the loop's next pass).
constexpr int kFramesPerTurn = 8;

}  // namespace

// Reading stops while the connection's replies are queued (the client does
// not take them: it gets no more to not read), while it has its maximum of
// requests in flight, and once it is closing. Flush and CompleteRequest
// start it again.
void Server::Impl::StartRead(const ConnPtr& c) {
  if (c->closed() || c->closing() || c->reading() || c->parked() || !c->queue().empty() ||
      c->inflight() >= limits().max_requests_per_connection) {
    return;
  }
  c->set_reading(true);
  c->socket().async_wait(Connection::Socket::wait_read,
                         [weak = weak_from_this(), c](const error_code& ec) {
                           c->set_reading(false);
                           auto self = weak.lock();
                           if (!self || c->closed()) return;
                           if (ec) {
                             self->Drop(c, "wait for input: " + ec.message());
                             return;
                           }
                           self->DoRead(c);
                           self->ScheduleDisconnectFlush();
                         });
}

void Server::Impl::Park(const ConnPtr& c, Clock::time_point now) {
  c->set_parked(true);
  parked_.push_back(c);
  counters_.Hit("max_busy_per_uid");
  counters_.LogLimit("max_busy_per_uid",
                     "uid " + std::to_string(c->uid()) + " took more daemon time than " +
                         Ms(limits().max_busy_per_uid) + " a second next to a lighter tenant: " +
                         c->Describe() + " is not read until its budget refills");
  ArmThrottleTimer(admission_.RefilledAt(c->uid(), now));
}

void Server::Impl::ArmThrottleTimer(Clock::time_point at) {
  // At least 1 ms apart: a refill of a few microseconds is not worth a wakeup.
  at = std::max(at, Clock::now() + std::chrono::milliseconds(1));
  if (throttle_timer_armed_ && throttle_timer_at_ <= at) return;
  throttle_timer_armed_ = true;
  throttle_timer_at_ = at;
  throttle_timer_.expires_at(at);
  throttle_timer_.async_wait([weak = weak_from_this()](const error_code& ec) {
    auto self = weak.lock();
    if (!self || ec == asio::error::operation_aborted) return;
    self->throttle_timer_armed_ = false;
    self->OnThrottleTimer();
    self->ScheduleDisconnectFlush();
  });
}

void Server::Impl::OnThrottleTimer() {
  if (stopped_) return;
  const auto now = Clock::now();
  std::vector<ConnPtr> parked;
  parked.swap(parked_);
  std::optional<Clock::time_point> next;
  for (auto& c : parked) {
    if (c->closed()) continue;
    if (admission_.Throttled(c->uid(), now)) {
      parked_.push_back(c);
      auto at = admission_.RefilledAt(c->uid(), now);
      if (!next || at < *next) next = at;
      continue;
    }
    c->set_parked(false);
    StartRead(c);
  }
  if (next) ArmThrottleTimer(*next);
}

void Server::Impl::RefuseFds(const ConnPtr& c) {
  const wire::FrameReader& r = c->reader().frames();
  const wire::FrameHeader& h = r.header();
  const bool header = r.have_header() && h.magic == wire::kFrameMagic;
  const uint64_t rid = c->reader().CurrentRequestId();
  const size_t per_frame = limits().max_fds_per_frame;
  const size_t type_max =
      header ? std::min(per_frame, wire::MaxFdsForType(h.type, per_frame)) : per_frame;
  const std::string what = header ? wire::MsgTypeName(h.type) : std::string("a frame");
  const size_t refused = r.fds_refused();
  const char* allowance_limit = c->reader().fd_allowance_limit();
  if (r.control_truncated() || refused > type_max || allowance_limit == nullptr) {
    counters_.ProtocolError();
    if (type_max == 0) {
      Abort(c, rid,
            Status(Code::kProtocol, what + " may carry no fds; the " + std::to_string(refused) +
                                        " that arrived were closed"),
            nullptr);
    } else {
      Abort(c, rid,
            Status(Code::kProtocol, what + " carried more than " + std::to_string(type_max) +
                                        " fds (limits.max_fds_per_frame is " +
                                        std::to_string(per_frame) +
                                        "); all were closed as they arrived"),
            "max_fds_per_frame");
    }
    return;
  }
  std::optional<Refusal> no = admission_.CheckFds(c->uid(), refused);
  const char* limit = no ? no->limit : allowance_limit;
  std::string why = no ? no->why : std::string("the daemon's fd budget for clients was used up");
  Abort(c, rid,
        Status(Code::kResourceExhausted,
               what + " refused: its fds were closed as they arrived: " + why),
        limit);
}

void Server::Impl::DoRead(const ConnPtr& c) {
  int frames = 0;
  while (!c->closed() && !c->closing() && c->queue().empty() &&
         c->inflight() < limits().max_requests_per_connection) {
    // A RECLAIM whose EXTENT_FDS frames are coming is read to its end first.
    if (!c->reader().frames().mid_frame() && !c->reader().assembling()) {
      if (frames == kFramesPerTurn) {
        // Its turn is over: read it again after the other ready connections.
        StartRead(c);
        return;
      }
      const auto now = Clock::now();
      if (admission_.Throttled(c->uid(), now)) {
        Park(c, now);
        return;
      }
    }
    Result<wire::FrameReader::Progress> p = c->reader().Read(c->fd());
    if (p.ok() && *p == wire::FrameReader::Progress::kFrame) ++frames;
    if (!OnReadProgress(c, p)) return;
  }
  // Paused (in-flight limit, replies queued) or closing: CompleteRequest and
  // Flush restart reading.
  if (!c->closed() && !c->closing() && c->inflight() >= limits().max_requests_per_connection) {
    counters_.Hit("max_requests_per_connection");
  }
}

bool Server::Impl::OnReadProgress(const ConnPtr& c, const Result<wire::FrameReader::Progress>& p) {
  if (p.ok() && c->reader().frames().fds_refused() > 0) {
    RefuseFds(c);
    return false;
  }
  if (!p.ok()) {
    OnReadError(c, p.status());
    return false;
  }
  switch (*p) {
    case wire::FrameReader::Progress::kWouldBlock:
      if (c->reader().frames().mid_frame() && !c->timers().frame_armed()) {
        ArmFrameTimer(c, limits().frame_timeout);
      }
      if (c->reader().assembling() && !c->timers().frame_armed()) {
        const auto left = c->reader().assembly_deadline() - Clock::now();
        ArmFrameTimer(c, std::max(std::chrono::milliseconds(0),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(left)));
      }
      StartRead(c);
      return false;
    case wire::FrameReader::Progress::kEof:
      Drop(c, "peer closed the connection");
      return false;
    case wire::FrameReader::Progress::kFrame:
      c->timers().CancelFrame();
      HandleFrame(c, c->reader().TakeFrame());
      c->reader().SyncFds();  // the request's fds are closed by now
      // Answered at once: CompleteRequest re-armed the wait for input, and
      // Asio's re-arm (EPOLL_CTL_MOD) reports input already queued. Reading
      // on would only cost a recvmsg that finds nothing (a client waiting
      // for its reply has sent nothing more).
      return !c->reading();
  }
  return true;
}

void Server::Impl::OnReadError(const ConnPtr& c, const Status& st) {
  if (st.code() != Code::kProtocol) {
    Drop(c, st.ToString());
    return;
  }
  counters_.ProtocolError();
  // Echo the request id only from a header that is ours (magic ok).
  const wire::FrameReader& r = c->reader().frames();
  const wire::FrameHeader& h = r.header();
  std::string msg = st.message();
  const char* limit = nullptr;
  // The length is checked last: a bad magic, version or flags is that.
  if (r.have_header() && h.magic == wire::kFrameMagic && h.length > limits().max_request_bytes &&
      wire::ValidateFrameHeader(h, UINT32_MAX).ok()) {
    msg += " (limits.max_request_bytes)";
    limit = "max_request_bytes";
  }
  Abort(c, c->reader().CurrentRequestId(), Status(st.code(), msg), limit);
}

void Server::Impl::HandleFrame(const ConnPtr& c, wire::Frame frame) {
  counters_.FrameIn();
  c->set_last_input(Clock::now());
  if (c->reader().assembling() || (c->hello_done() && frame.header.version == c->version() &&
                                   ConnectionReader::Announces(frame))) {
    uint64_t rid = 0;
    Result<std::optional<wire::Frame>> whole =
        c->reader().Assemble(std::move(frame), c->version(), limits().frame_timeout, &rid);
    if (!whole.ok()) {
      counters_.ProtocolError();
      Abort(c, rid, whole.status(), nullptr);
      return;
    }
    if (!*whole) return;
    c->timers().CancelFrame();
    frame = std::move(**whole);
  }
  if (std::optional<Status> refused = Gate(*c, frame)) {
    QueueError(c, frame.header.request_id, *refused);
    return;
  }
  if (std::optional<Refusal> no = admission_.CheckRequest(c->uid())) {
    counters_.Hit(no->limit);
    Status st(Code::kResourceExhausted, wire::MsgTypeName(frame.header.type) +
                                            " refused: " + no->why + "; retry once replies arrive");
    counters_.LogLimit(no->limit, c->Describe() + ": " + st.message());
    QueueError(c, frame.header.request_id, st);
    return;
  }
  Dispatch(c, std::move(frame));
}

std::optional<Status> Server::Impl::Gate(const Connection& c, const wire::Frame& frame) {
  const uint16_t type = frame.header.type;
  if (!wire::IsKnownType(type)) {
    counters_.ProtocolError();
    return Status(Code::kUnsupported, "unknown message type " + std::to_string(type));
  }
  if (!wire::IsRequestType(type)) {
    counters_.ProtocolError();
    return Status(Code::kProtocol, wire::MsgTypeName(type) + " is not a request");
  }
  if (!c.hello_done()) {
    if (type != proto::MSG_HELLO_REQUEST) {
      return Status(Code::kProtocol, wire::MsgTypeName(type) +
                                         " before a successful HELLO; send "
                                         "MSG_HELLO_REQUEST first");
    }
    if (c.hello_pending()) return Status(Code::kProtocol, "a HELLO is already being answered");
  } else if (type == proto::MSG_HELLO_REQUEST) {
    return Status(Code::kProtocol,
                  "HELLO already done (version " + std::to_string(c.version()) + ")");
  } else if (frame.header.version != c.version()) {
    return Status(Code::kProtocol,
                  "frame written in version " + std::to_string(frame.header.version) +
                      "; this connection negotiated " + std::to_string(c.version()));
  }
  return std::nullopt;
}

void Server::Impl::Dispatch(const ConnPtr& c, wire::Frame frame) {
  const uint16_t type = frame.header.type;
  const uint64_t rid = frame.header.request_id;
  if (type == proto::MSG_HELLO_REQUEST) c->set_hello_pending(true);
  admission_.AddRequest(c->uid(), Clock::now());
  c->AddInflight();
  Request req;
  req.type = static_cast<proto::MsgType>(type);
  req.request_id = rid;
  req.payload = std::move(frame.payload);
  req.fds = std::move(frame.fds);
  ReplyFn reply = MakeReplyFn(c->id(), c->uid(), rid, type);
  const uid_t uid = c->uid();
  const auto start = Clock::now();
  Callback([&] { handler_->OnRequest(c->id(), std::move(req), std::move(reply)); });
  const auto end = Clock::now();
  admission_.busy().Charge(uid, end - start, end);
}

}  // namespace cxlpool
