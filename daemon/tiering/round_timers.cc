#include "tiering/round_timers.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace cxlpool::tiering {

RoundTimers::RoundTimers(boost::asio::any_io_executor loop, const Clock* clock,
                         int64_t urgent_interval_ns, std::function<void()> round,
                         std::function<void()> urgent_round)
    : clock_(clock),
      urgent_interval_ns_(urgent_interval_ns),
      round_(std::move(round)),
      urgent_round_(std::move(urgent_round)),
      timer_(loop),
      urgent_timer_(std::move(loop)) {}

RoundTimers::~RoundTimers() {
  Stop();
  *alive_ = false;
}

bool RoundTimers::Start() {
  if (started_ || stopped_) return false;
  started_ = true;
  return true;
}

bool RoundTimers::Stop() {
  if (stopped_) return false;
  stopped_ = true;
  timer_.cancel();
  urgent_timer_.cancel();
  return true;
}

void RoundTimers::ScheduleRound(int64_t delay_ns) {
  if (stopped_ || !started_) return;
  auto when =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::max<int64_t>(delay_ns, 0));
  if (round_scheduled_ && timer_.expiry() <= when) return;
  round_scheduled_ = true;
  timer_.expires_at(when);
  std::weak_ptr<bool> alive = alive_;
  timer_.async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !*alive.lock()) return;
    round_scheduled_ = false;
    round_();
  });
}

void RoundTimers::ScheduleUrgent() {
  if (stopped_ || !started_ || urgent_scheduled_) return;
  const int64_t delay =
      std::max<int64_t>(last_urgent_round_ns_ + urgent_interval_ns_ - clock_->MonotonicNs(), 0);
  urgent_scheduled_ = true;
  urgent_timer_.expires_after(std::chrono::nanoseconds(delay));
  std::weak_ptr<bool> alive = alive_;
  urgent_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !*alive.lock()) return;
    urgent_round_();
  });
}

}  // namespace cxlpool::tiering
