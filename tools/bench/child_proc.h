// child_proc.h: a child process of cxlpool-bench (a spawned daemon, a bare
// baseline server) with its own temp dir. Forked with PR_SET_PDEATHSIG,
// tracked so KillAllChildren (atexit, signals) can kill it, stopped with
// SIGTERM then SIGKILL; the temp dir is removed with it.
//
// Thread safety: a ChildProc is used by one thread; the tracking behind
// KillAllChildren is lock-free and safe from a signal handler.
#pragma once

#include <sys/types.h>

#include <string>

#include "cxlpool/common/status.h"

namespace cxlpool::bench {

class ChildProc {
 public:
  // `grace_ms`: how long Stop waits after SIGTERM before SIGKILL.
  explicit ChildProc(int grace_ms) : grace_ms_(grace_ms) {}
  ~ChildProc() { Stop(); }
  ChildProc(const ChildProc&) = delete;
  ChildProc& operator=(const ChildProc&) = delete;

  // Creates /tmp/<prefix>-XXXXXX as this child's dir.
  Status MakeDir(const char* prefix);
  // Forks. In the child (true) the parent-death signal is set and the
  // caller must end with _exit; in the parent (false) the child is tracked.
  Result<bool> Fork();
  // Whether the child has already exited; if so it is reaped and forgotten.
  bool Exited();
  // SIGTERM, SIGKILL after the grace period, reap; removes the dir.
  void Stop();
  // SIGKILL and reap at once (a crash); the dir stays, for a next Fork.
  void Kill();

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }

 private:
  int grace_ms_;
  pid_t pid_ = -1;
  std::string dir_;
};

// Kills every child still running (atexit and signal path).
void KillAllChildren();

}  // namespace cxlpool::bench
