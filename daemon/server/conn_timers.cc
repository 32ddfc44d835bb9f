#include "server/conn_timers.h"

#include <utility>

namespace cxlpool {

using boost::system::error_code;

void ConnectionTimers::ArmFrame(std::chrono::milliseconds after, Fn fn) {
  frame_armed_ = true;
  const uint64_t gen = ++frame_gen_;
  frame_.expires_after(after);
  frame_.async_wait([this, gen, fn = std::move(fn)](const error_code& ec) {
    // `fn` keeps the owner of `this` alive.
    if (ec || gen != frame_gen_ || !frame_armed_) return;
    frame_armed_ = false;
    fn();
  });
}

void ConnectionTimers::CancelFrame() {
  if (!frame_armed_) return;
  frame_armed_ = false;
  ++frame_gen_;
  frame_.cancel();
}

void ConnectionTimers::ArmIdle(std::chrono::milliseconds after, Fn fn) {
  idle_.expires_after(after);
  idle_.async_wait([fn = std::move(fn)](const error_code& ec) {
    if (!ec) fn();
  });
}

void ConnectionTimers::ArmSend(std::chrono::milliseconds after, Fn fn) {
  send_armed_ = true;
  send_.expires_after(after);
  send_.async_wait([this, fn = std::move(fn)](const error_code& ec) {
    // `fn` keeps the owner of `this` alive.
    send_armed_ = false;
    if (!ec) fn();
  });
}

void ConnectionTimers::CancelAll() {
  frame_armed_ = false;
  frame_.cancel();
  idle_.cancel();
  send_.cancel();
}

}  // namespace cxlpool
