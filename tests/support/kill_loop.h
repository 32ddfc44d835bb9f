// Pieces of the daemon SIGKILL+restart tests (tests/stress/daemon_restart_test,
// tests/restart/*): the daemon config they run, the pattern written into a
// lease, a MAP_SHARED block the parent shares with its forked workers, the
// set of forked workers, and the checker's bounded poll of the accounting of
// a restarted daemon.
//
// Thread safety: none; the tests fork processes instead of threads. A
// SharedBlock's object is shared across fork, so its fields must be atomics
// or written by one process while the others wait (the tests' pause epochs).
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <new>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "test_support.h"

namespace cxlpool::testsupport {

// A small pool, no warm reserve, a socket anyone may use.
inline constexpr const char* kRestartConfig = R"(
[daemon]
socket_mode = "0666"
log_level = "warning"
[pools]
capacity = "256M"
)";

// The pattern written into a lease: `tag` at every 4 KiB.
void Fill(void* m, uint64_t size, uint64_t tag);
bool Intact(const void* m, uint64_t size, uint64_t tag);

// One value-initialised T in anonymous MAP_SHARED memory, so that forked
// children and the parent see the same object. get() is null if mmap failed.
template <typename T>
class SharedBlock {
 public:
  SharedBlock() {
    void* m = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) ptr_ = new (m) T();
  }
  ~SharedBlock() {
    if (ptr_ != nullptr) {
      ptr_->~T();
      ::munmap(ptr_, sizeof(T));
    }
  }
  SharedBlock(const SharedBlock&) = delete;
  SharedBlock& operator=(const SharedBlock&) = delete;

  T* get() const { return ptr_; }
  T* operator->() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// Forked worker processes, numbered in fork order; the ones still running
// are SIGKILLed and reaped by KillAll() and at destruction.
class Workers {
 public:
  Workers() = default;
  ~Workers() { KillAll(); }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Forks worker number size(), running `main`; the child _Exits(0) if
  // `main` returns. Returns the pid (-1 if fork failed).
  pid_t Fork(const std::function<void()>& main);
  // "worker exited: " + describe(i) for the first worker found to have
  // exited (it is reaped and forgotten); "" while all run.
  std::string Exited(const std::function<std::string(int)>& describe);
  // Polls (every 2 ms, `limit_ms` at most) until ready(i) holds for every
  // worker. "" then; else Exited()'s text, or `timeout_message`.
  std::string WaitAll(const std::function<bool(int)>& ready,
                      const std::function<std::string(int)>& describe, int limit_ms,
                      const std::string& timeout_message);
  void KillAll();

  // The worker's pid; -1 once it exited or was killed.
  pid_t pid(int i) const { return pids_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(pids_.size()); }

 private:
  std::vector<pid_t> pids_;
};

// The checker after a restart: connects to `socket` as `name`, and once the
// daemon is out of its grace period reads its accounting and collects
// Inconsistencies() plus what `check` writes; polls (every 5 ms, `limit_ms`
// at most) until nothing is found. `last` gets the last findings, or why
// nothing could be read.
bool PollUntilAccountingAgrees(const std::string& socket, const std::string& name,
                               const std::function<void(const Accounting&, std::ostream&)>& check,
                               int limit_ms, std::string* last);

// The daemon's lease list against the leases the workers hold: "lease N
// lost; " for each held one not listed, "lease N listed but held by no
// worker; " for each listed one not held.
void CompareLeases(const Accounting& a, const std::set<uint64_t>& held, std::ostream& out);

}  // namespace cxlpool::testsupport
