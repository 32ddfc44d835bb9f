// StopSignal: tells a core's threads (the event watcher, the flusher) and
// its naps (reconnect backoff, grace-period retries) that the core is being
// destroyed.
//
// Naps wait on an eventfd once Arm made one (the watcher does, when it
// starts); before that they sleep their whole length.
//
// Thread safety: every member may be called from any thread; Arm is called
// before any thread polls fd().
#pragma once

#include <atomic>

#include "cxlpool/common/unique_fd.h"

namespace cxlpool::detail {

class StopSignal {
 public:
  StopSignal() = default;
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  // Makes the eventfd (once); false when the kernel gave none.
  bool Arm();
  // Raises the signal and wakes whoever polls fd() or naps.
  void Stop();
  bool stopping() const { return stopping_.load(); }
  // Sleeps up to `ms`; false when the signal is (or goes) up.
  bool Nap(int ms) const;
  // The eventfd, readable once stopped; -1 before Arm.
  int fd() const { return fd_.load(); }

 private:
  std::atomic<bool> stopping_{false};
  std::atomic<int> fd_{-1};
  UniqueFd owned_;
};

}  // namespace cxlpool::detail
