// The daemon's components in the order they started. StopAll stops them in
// reverse (on the loop, at the stop request); JoinAll, once the loop has
// returned, waits for their threads and drops them, in reverse too. A
// component that failed to start was never added, so it is never stopped.
//
// Thread safety: none; the daemon calls it on its loop's thread (Started
// before the loop runs, JoinAll after it returned).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cxlpool {

class Lifecycle {
 public:
  struct Hooks {
    std::function<void()> stop;  // on the loop: stop taking work (may be empty)
    std::function<void()> join;  // after the loop: wait for its threads (may be empty)
  };

  void Started(std::string name, Hooks hooks = {});
  // Each component's stop, newest first; only the first call does anything.
  void StopAll();
  // Each component's join, newest first; only the first call does anything.
  void JoinAll();

  // Component names in start order, and in the order StopAll went through them.
  std::vector<std::string> started() const;
  const std::vector<std::string>& stopped() const { return stopped_; }

 private:
  struct Component {
    std::string name;
    Hooks hooks;
  };
  std::vector<Component> components_;
  std::vector<std::string> stopped_;
  bool stop_done_ = false;
  bool join_done_ = false;
};

}  // namespace cxlpool
