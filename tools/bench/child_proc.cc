// Child processes of cxlpool-bench: fork, tracking, stop. See child_proc.h.
#include "child_proc.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <vector>

namespace cxlpool::bench {

namespace {

constexpr int kMaxChildren = 64;
std::atomic<pid_t> g_children[kMaxChildren];

void Track(pid_t pid) {
  for (auto& c : g_children) {
    pid_t expected = 0;
    if (c.compare_exchange_strong(expected, pid)) return;
  }
}

void Untrack(pid_t pid) {
  for (auto& c : g_children) {
    pid_t expected = pid;
    if (c.compare_exchange_strong(expected, 0)) return;
  }
}

// SIGTERM, then SIGKILL after `grace_ms`; reaps.
void TermAndReap(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int waited = 0; waited < grace_ms; waited += 10) {
    pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) {
      Untrack(pid);
      return;
    }
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  Untrack(pid);
}

}  // namespace

void KillAllChildren() {
  for (auto& c : g_children) {
    pid_t p = c.exchange(0);
    if (p > 0) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }
}

Status ChildProc::MakeDir(const char* prefix) {
  std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    dir_.clear();
    return Status::FromErrno(errno, "mkdtemp");
  }
  dir_ = buf.data();
  return Status();
}

Result<bool> ChildProc::Fork() {
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    return true;
  }
  pid_ = pid;
  Track(pid);
  return false;
}

bool ChildProc::Exited() {
  int st = 0;
  if (pid_ <= 0 || ::waitpid(pid_, &st, WNOHANG) != pid_) return false;
  Untrack(pid_);
  pid_ = -1;
  return true;
}

void ChildProc::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  Untrack(pid_);
  pid_ = -1;
}

void ChildProc::Stop() {
  if (pid_ > 0) TermAndReap(pid_, grace_ms_);
  pid_ = -1;
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

}  // namespace cxlpool::bench
