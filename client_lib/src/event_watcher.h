// EventWatcher: the thread (named cxlpool-watch) that keeps a core's
// connection read while no call is: it handles the server pushes that
// arrive between calls (a lease revoked, its pages moved, a migration
// asked for) and notices a daemon that went, and then reconnects at once
// rather than at the next call.
//
// It waits on an epoll set of the stop signal and a dup of the socket (so
// epoll never sees a reused number). While a call is in flight the socket's
// entry asks for hang-ups only, so a reply wakes the caller alone
// (SetCallActive). Started with the core's first lease, stopped by the
// core's StopSignal and joined in the destructor.
//
// The core is reached through hooks, each of which takes the core's
// connection lock itself.
//
// Thread safety: Start, SetCallActive and the destructor are safe from any
// thread; mu_ guards the epoll interest (it is taken after the core's
// connection lock, never before).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>

#include "cxlpool/common/status.h"
#include "cxlpool/common/thread_annotations.h"
#include "cxlpool/common/unique_fd.h"
#include "stop_signal.h"

namespace cxlpool::detail {

class EventWatcher {
 public:
  struct Hooks {
    // The connection's generation, and whether it is lost.
    std::function<void(uint64_t* generation, bool* lost)> look;
    // A dup of the connection's socket (invalid: none) and its generation.
    std::function<UniqueFd(uint64_t* generation)> dup_socket;
    // Reconnects; an error when the daemon did not come back.
    std::function<Status()> reconnect;
    // Handles what waits on the socket, if it is still of `generation`.
    std::function<void(uint64_t generation)> drain;
  };
  EventWatcher(StopSignal& stop, Hooks hooks) : stop_(stop), hooks_(std::move(hooks)) {}
  ~EventWatcher();  // joins; the stop signal must be up
  EventWatcher(const EventWatcher&) = delete;
  EventWatcher& operator=(const EventWatcher&) = delete;

  // Starts the thread once (a warning, and no watcher, when the kernel
  // gives no eventfd or epoll).
  void Start() EXCLUDES(mu_);
  // A call began (true) or the last one ended (false).
  void SetCallActive(bool active) EXCLUDES(mu_);

 private:
  void Loop();
  // Registers `fd` (-1: none) as the watched socket.
  void Watch(int fd) EXCLUDES(mu_);
  void Arm() REQUIRES(mu_);

  StopSignal& stop_;
  const Hooks hooks_;
  Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;
  bool call_active_ GUARDED_BY(mu_) = false;
  int watch_fd_ GUARDED_BY(mu_) = -1;  // the dup registered in epoll_
  UniqueFd epoll_;                     // set before the thread starts, then only read
  std::thread thread_;
};

}  // namespace cxlpool::detail
