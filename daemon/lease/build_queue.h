// BuildQueue: cold builds waiting for a worker, started in turns by the
// owner's uid, so that one uid's flood of cold ALLOCs delays another's build
// by at most one build per worker (not by the whole flood, as a FIFO of
// builds would: one uid with 256 builds in flight took another's 64 KiB
// ALLOCs from 4500/s to 4/s).
//
// At most `max_running` builds run at once (the worker count); the rest
// wait, each uid in its own FIFO. A free worker goes to the waiting uid with
// the fewest builds running (the longest waiting among equals), so a
// newcomer waits for one build to finish, however many the others asked
// for. A uid its `may_start` predicate refuses (one over its share of daemon
// time: server/busy_budget.h) starts none; its builds wait (held()) until
// Retry or the next Submit/Done finds it allowed again.
//
// Thread safety: single-owner (the lease manager's loop thread).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>

namespace cxlpool {

class BuildQueue {
 public:
  explicit BuildQueue(size_t max_running = SIZE_MAX) : max_running_(max_running) {}

  // From now on; at least 1. Builds already running keep running.
  void set_max_running(size_t n);

  // Calls `start` now if fewer than max_running builds run, else when the
  // uid's turn comes (from Done). `start` hands the build to a worker; the
  // build's completion calls Done once.
  void Submit(uid_t uid, std::function<void()> start);

  // One build `uid` started by Submit finished: start the next ones.
  void Done(uid_t uid);

  // Which uids may start a build now (default: all).
  void set_may_start(std::function<bool(uid_t)> may_start) { may_start_ = std::move(may_start); }
  // Starts what may start now (after a refused uid's budget refilled).
  void Retry() { StartWaiting(); }
  // True when the last attempt left a free worker idle because every uid
  // waiting was refused by may_start: call Retry later.
  bool held() const { return held_; }

  size_t max_running() const { return max_running_; }
  size_t running() const { return running_; }
  size_t waiting() const { return waiting_count_; }

 private:
  void StartWaiting();

  size_t max_running_;
  size_t running_ = 0;
  size_t waiting_count_ = 0;
  std::map<uid_t, std::deque<std::function<void()>>> waiting_;
  std::map<uid_t, size_t> running_by_uid_;
  std::deque<uid_t> turns_;  // uids with builds waiting, longest waiting first
  std::function<bool(uid_t)> may_start_;
  bool held_ = false;
};

}  // namespace cxlpool
