#include "lease/restart_tracker.h"

#include <algorithm>
#include <string>

namespace cxlpool {

RestartTracker::RestartTracker(boost::asio::any_io_executor loop)
    : loop_(loop), grace_timer_(loop) {}

void RestartTracker::StartGrace(std::chrono::milliseconds length, std::function<void()> on_over) {
  grace_ = true;
  grace_end_ = std::chrono::steady_clock::now() + length;
  grace_timer_.expires_at(grace_end_);
  grace_timer_.async_wait([on_over = std::move(on_over)](const boost::system::error_code& ec) {
    if (ec) return;
    on_over();
  });
}

bool RestartTracker::EndGrace() {
  if (!grace_) return false;
  grace_ = false;
  grace_timer_.cancel();
  return true;
}

Status RestartTracker::Refusal() const {
  if (!grace_) return Status::Ok();
  auto left = grace_end_ - std::chrono::steady_clock::now();
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(left).count() + 1;
  return Status(Code::kUnavailable, "daemon restarting: reclaim in progress, retry in " +
                                        std::to_string(std::max<int64_t>(secs, 1)) + " s");
}

void RestartTracker::Watch(const HolderId& h, UniqueFd pidfd,
                           std::function<void(const HolderId&)> on_exit) {
  auto sd = std::make_unique<boost::asio::posix::stream_descriptor>(loop_, pidfd.Release());
  auto* waiting = sd.get();
  watches_[KeyOf(h)] = std::move(sd);
  waiting->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                      [h, on_exit = std::move(on_exit)](const boost::system::error_code& ec) {
                        if (ec) return;
                        on_exit(h);
                      });
}

std::unique_ptr<boost::asio::posix::stream_descriptor> RestartTracker::Unwatch(const HolderId& h) {
  auto it = watches_.find(KeyOf(h));
  if (it == watches_.end()) return nullptr;
  auto sd = std::move(it->second);
  watches_.erase(it);
  return sd;
}

void RestartTracker::Stop() {
  watches_.clear();
  grace_timer_.cancel();
}

}  // namespace cxlpool
