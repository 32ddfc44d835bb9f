// A named periodic job on an Asio loop: once started, `job` runs every
// `interval` until Stop (or a Start with another interval). The daemon's
// periodic jobs (the systemd watchdog ping, the memory watch) are each one.
//
// Thread safety: Start, Stop and the job run on the loop's thread (or before
// the loop runs). Destroy the timer only while the loop is not running (its
// pending wait then completes as cancelled, or is dropped with the loop).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace cxlpool {

class PeriodicTimer {
 public:
  PeriodicTimer(boost::asio::io_context& io, std::string name, std::function<void()> job);
  PeriodicTimer(const PeriodicTimer&) = delete;
  PeriodicTimer& operator=(const PeriodicTimer&) = delete;

  // Runs the job `interval` from now and every `interval` after; replaces
  // the schedule of an earlier Start. A zero interval stops the timer.
  void Start(std::chrono::nanoseconds interval);
  // No more runs until the next Start. The job may stop or restart its own
  // timer.
  void Stop();

  const std::string& name() const { return name_; }
  // Zero while stopped.
  std::chrono::nanoseconds interval() const { return interval_; }
  bool running() const { return interval_.count() > 0; }
  // How many times the job ran.
  uint64_t runs() const { return runs_; }

 private:
  void Arm();

  boost::asio::steady_timer timer_;
  std::string name_;
  std::function<void()> job_;
  std::chrono::nanoseconds interval_{0};
  // Bumped by every Start and Stop: a wait armed under an older schedule
  // that completes anyway (already queued when cancelled) does nothing.
  uint64_t schedule_ = 0;
  uint64_t runs_ = 0;
};

}  // namespace cxlpool
