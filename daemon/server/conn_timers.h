// ConnectionTimers: one connection's three timers. The frame timer bounds a
// frame (or a RECLAIM's frames) from its first byte to its last, and a
// closing connection's last flush; the idle timer is the hello timeout, then
// the idle timeout; the send timer runs while replies are queued. What a
// timer that fires does is the caller's `fn`; the frame and send timers know
// whether they are armed, and a cancelled frame timer never runs its `fn`.
//
// Each `fn` must keep the connection that owns these timers alive (it runs
// from the timer's completion, which may outlive a cancel).
//
// Thread safety: the io_context's thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>

namespace cxlpool {

class ConnectionTimers {
 public:
  using Fn = std::function<void()>;

  explicit ConnectionTimers(boost::asio::io_context& io) : frame_(io), idle_(io), send_(io) {}
  ConnectionTimers(const ConnectionTimers&) = delete;
  ConnectionTimers& operator=(const ConnectionTimers&) = delete;

  // Re-arming replaces the pending `fn`.
  void ArmFrame(std::chrono::milliseconds after, Fn fn);
  void CancelFrame();
  bool frame_armed() const { return frame_armed_; }

  void ArmIdle(std::chrono::milliseconds after, Fn fn);
  void CancelIdle() { idle_.cancel(); }

  void ArmSend(std::chrono::milliseconds after, Fn fn);
  bool send_armed() const { return send_armed_; }

  void CancelAll();

 private:
  boost::asio::steady_timer frame_;
  uint64_t frame_gen_ = 0;
  bool frame_armed_ = false;
  boost::asio::steady_timer idle_;
  boost::asio::steady_timer send_;
  bool send_armed_ = false;
};

}  // namespace cxlpool
