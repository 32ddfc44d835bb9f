#include "periodic_timer.h"

#include <utility>

namespace cxlpool {

PeriodicTimer::PeriodicTimer(boost::asio::io_context& io, std::string name,
                             std::function<void()> job)
    : timer_(io), name_(std::move(name)), job_(std::move(job)) {}

void PeriodicTimer::Start(std::chrono::nanoseconds interval) {
  Stop();
  if (interval.count() <= 0) return;
  interval_ = interval;
  Arm();
}

void PeriodicTimer::Stop() {
  ++schedule_;
  interval_ = std::chrono::nanoseconds(0);
  timer_.cancel();
}

void PeriodicTimer::Arm() {
  timer_.expires_after(interval_);
  timer_.async_wait([this, schedule = schedule_](const boost::system::error_code& ec) {
    if (ec || schedule != schedule_) return;
    ++runs_;
    job_();
    if (schedule == schedule_) Arm();  // unless the job stopped or restarted it
  });
}

}  // namespace cxlpool
