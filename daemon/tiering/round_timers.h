// RoundTimers: when the engine's rounds run, on the loop. The periodic round
// (an earlier request replaces a later one), and the on-demand round for
// urgent hints: at most one pending, no sooner than `urgent_interval_ns`
// after the last one began. Nothing is scheduled before Start or after Stop.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>

#include "cxlpool/common/clock.h"

namespace cxlpool::tiering {

class RoundTimers {
 public:
  RoundTimers(boost::asio::any_io_executor loop, const Clock* clock, int64_t urgent_interval_ns,
              std::function<void()> round, std::function<void()> urgent_round);
  ~RoundTimers();
  RoundTimers(const RoundTimers&) = delete;
  RoundTimers& operator=(const RoundTimers&) = delete;

  // False when started or stopped already.
  bool Start();
  // Cancels both timers; false when stopped already.
  bool Stop();
  bool stopped() const { return stopped_; }

  // The periodic round in `delay_ns` (unless one is due sooner).
  void ScheduleRound(int64_t delay_ns);
  // The on-demand round, unless one is pending.
  void ScheduleUrgent();
  // The on-demand round is running (its timer fired, or a test called it).
  void UrgentBegan(int64_t now) { last_urgent_round_ns_ = now; }
  void UrgentDue() { urgent_scheduled_ = false; }

 private:
  const Clock* clock_;
  int64_t urgent_interval_ns_;
  std::function<void()> round_;
  std::function<void()> urgent_round_;
  boost::asio::steady_timer timer_;
  boost::asio::steady_timer urgent_timer_;
  bool started_ = false;
  bool stopped_ = false;
  bool round_scheduled_ = false;
  bool urgent_scheduled_ = false;
  int64_t last_urgent_round_ns_ = INT64_MIN / 2;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace cxlpool::tiering
