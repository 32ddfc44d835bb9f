// Server::Impl: the per-connection time limits (limits.hello_timeout,
// idle_timeout, frame_timeout, send_timeout) on ConnectionTimers.
#include <algorithm>

#include "server/server_impl.h"

namespace cxlpool {

ConnectionTimers::Fn Server::Impl::OnLoop(const ConnPtr& c, void (Impl::*on)(const ConnPtr&)) {
  return [weak = weak_from_this(), c, on] {
    auto self = weak.lock();
    if (!self || c->closed()) return;
    ((*self).*on)(c);
    self->ScheduleDisconnectFlush();
  };
}

void Server::Impl::ArmIdleTimer(const ConnPtr& c, std::chrono::milliseconds after) {
  c->timers().ArmIdle(after, OnLoop(c, &Impl::OnIdleTimer));
}

void Server::Impl::ArmIdleAfterHello(const ConnPtr& c) {
  if (limits().idle_timeout.count() > 0) {
    ArmIdleTimer(c, limits().idle_timeout);
  } else {
    c->timers().CancelIdle();
  }
}

void Server::Impl::OnIdleTimer(const ConnPtr& c) {
  if (c->closing()) return;
  if (!c->hello_done()) {
    Abort(c, 0,
          Status(Code::kUnavailable, "no successful HELLO within " + Ms(limits().hello_timeout) +
                                         " (limits.hello_timeout)"),
          "hello_timeout");
    return;
  }
  const auto idle = limits().idle_timeout;
  if (idle.count() == 0) return;
  const auto quiet =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - c->last_input());
  if (quiet < idle) {
    ArmIdleTimer(c, idle - quiet);
    return;
  }
  // Holding a lease, a request in flight, a reply queued or a frame begun is
  // not idle: a client that holds memory and says nothing keeps it.
  if (c->inflight() > 0 || !c->queue().empty() || c->reader().frames().mid_frame() ||
      handler_->HoldsResources(c->id())) {
    ArmIdleTimer(c, idle);
    return;
  }
  Abort(c, 0,
        Status(Code::kUnavailable, "closed after " + Ms(idle) +
                                       " without a request while holding no lease "
                                       "(limits.idle_timeout); connect again to continue"),
        "idle_timeout");
}

void Server::Impl::ArmSendTimer(const ConnPtr& c, std::chrono::milliseconds after) {
  c->timers().ArmSend(after, OnLoop(c, &Impl::OnSendTimer));
}

void Server::Impl::OnSendTimer(const ConnPtr& c) {
  if (c->queue().empty() || c->closing()) return;
  const auto limit = limits().send_timeout;
  const auto stuck = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::now() - c->queue().last_progress());
  if (stuck < limit) {
    ArmSendTimer(c, limit - stuck);
    return;
  }
  Abort(c, 0,
        Status(Code::kResourceExhausted,
               "replies not read for " + Ms(limit) + " (" + std::to_string(c->queue().bytes()) +
                   " bytes queued; limits.send_timeout); read the socket"),
        "send_timeout");
}

void Server::Impl::ArmFrameTimer(const ConnPtr& c, std::chrono::milliseconds after) {
  c->timers().ArmFrame(after, OnLoop(c, &Impl::OnFrameTimer));
}

void Server::Impl::ArmCloseTimer(const ConnPtr& c) {
  // Do not wait forever for a client that does not read its error.
  c->timers().CancelFrame();
  ArmFrameTimer(c, limits().frame_timeout);
}

void Server::Impl::OnFrameTimer(const ConnPtr& c) {
  const std::string within = Ms(limits().frame_timeout) + " (limits.frame_timeout)";
  if (c->closing()) {
    // Its error reply (or the replies before it) not taken within the bound.
    Drop(c, c->closing_reason() + "; error reply not read within " + within);
    return;
  }
  const ConnectionReader& r = c->reader();
  if (r.assembling() && !r.frames().mid_frame()) {
    const uint64_t rid = r.assembly_request_id();
    const std::string left = std::to_string(r.assembly_frames_left());
    Abort(c, rid,
          Status(Code::kUnavailable, "RECLAIM_REQUEST's EXTENT_FDS frames (" + left +
                                         " still to come) not completed within " + within),
          "frame_timeout");
    return;
  }
  Abort(c, r.CurrentRequestId(), Status(Code::kUnavailable, "frame not completed within " + within),
        "frame_timeout");
}

}  // namespace cxlpool
