// RestartTracker: what the lease manager keeps of a restart once the
// journalled leases are back (the rules: restart_rules.h): how holders are looked at
// (the probe), the journal's damage report, whether any lease still awaits a
// holder, the grace period (its end and its timer) and the pidfd watches on
// awaited holders.
//
// Invariants: the grace timer is armed only while the grace period runs; a
// holder is watched at most once; Stop (the hand-over) cancels the timer and
// every watch, and their callbacks never run after it.
//
// Thread safety: the event-loop thread only; callbacks run on `loop`.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "lease/restart.h"

namespace cxlpool {

class RestartTracker {
 public:
  explicit RestartTracker(boost::asio::any_io_executor loop);
  RestartTracker(const RestartTracker&) = delete;
  RestartTracker& operator=(const RestartTracker&) = delete;

  void set_probe(const ProcessProbe* probe) { probe_ = probe; }
  const ProcessProbe* probe() const { return probe_; }
  // The journal's damage as found at start (and found since: orphans).
  JournalHealth& health() { return health_; }
  const JournalHealth& health() const { return health_; }
  // Some lease still awaits a holder's reclaim (the sweeps have work).
  bool awaiting_any() const { return awaiting_any_; }
  void set_awaiting_any(bool any) { awaiting_any_ = any; }

  // ---- the grace period ----
  bool in_grace() const { return grace_; }
  // Journal damage: the grace period runs its full length (unknown leases
  // may still be reclaimed), no early end.
  bool full() const { return full_; }
  void set_full(bool full) { full_ = full; }
  // Starts it; `on_over` runs on the loop when `length` has passed, unless
  // EndGrace or Stop came first.
  void StartGrace(std::chrono::milliseconds length, std::function<void()> on_over);
  // Ends it now (the timer cancelled); false when it was not running.
  bool EndGrace();
  // While it runs: UNAVAILABLE "daemon restarting: reclaim in progress,
  // retry in N s"; else OK.
  Status Refusal() const;

  // ---- holders awaited after a restart ----
  bool Watching(const HolderId& h) const { return watches_.count(KeyOf(h)) != 0; }
  // Calls `on_exit` on the loop once `pidfd` (of `h`) is readable: the
  // process exited. The callback calls Unwatch(h).
  void Watch(const HolderId& h, UniqueFd pidfd, std::function<void(const HolderId&)> on_exit);
  // Forgets the watch of `h`; the returned descriptor (null when none) is
  // closed when the caller drops it.
  std::unique_ptr<boost::asio::posix::stream_descriptor> Unwatch(const HolderId& h);

  // The daemon hands its leases over: the timer and every watch cancelled.
  void Stop();

 private:
  using Key = std::pair<pid_t, uint64_t>;
  static Key KeyOf(const HolderId& h) { return {h.pid, h.start_time}; }

  boost::asio::any_io_executor loop_;
  const ProcessProbe* probe_ = nullptr;
  JournalHealth health_;
  bool awaiting_any_ = false;
  bool grace_ = false;
  bool full_ = false;
  std::chrono::steady_clock::time_point grace_end_;
  boost::asio::steady_timer grace_timer_;
  std::map<Key, std::unique_ptr<boost::asio::posix::stream_descriptor>> watches_;
};

}  // namespace cxlpool
