#include "tenant_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "test_support.h"

namespace cxlpool::testsupport {

Channel::Channel() {
  int a[2], b[2];
  if (::pipe2(a, O_CLOEXEC) == 0 && ::pipe2(b, O_CLOEXEC) == 0) {
    down_r_.Reset(a[0]);
    down_w_.Reset(a[1]);
    up_r_.Reset(b[0]);
    up_w_.Reset(b[1]);
  }
}

void Channel::Write(int fd, const std::string& line) {
  std::string l = line + "\n";
  (void)!::write(fd, l.data(), l.size());
}

std::string Channel::Read(int fd, std::string* buf, int timeout_ms) {
  uint64_t end = NowMicros() + static_cast<uint64_t>(timeout_ms) * 1000;
  for (;;) {
    size_t nl = buf->find('\n');
    if (nl != std::string::npos) {
      std::string line = buf->substr(0, nl);
      buf->erase(0, nl + 1);
      return line;
    }
    uint64_t now = NowMicros();
    if (now >= end) return "<timeout>";
    struct pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>((end - now) / 1000) + 1) <= 0) continue;
    char tmp[4096];
    ssize_t n = ::read(fd, tmp, sizeof tmp);
    if (n <= 0) return "<eof>";
    buf->append(tmp, static_cast<size_t>(n));
  }
}

Tenant::Tenant(uid_t uid, const std::function<int(Channel&)>& body) {
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    struct rlimit rl = {65536, 65536};
    ::setrlimit(RLIMIT_NOFILE, &rl);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!BecomeUid(uid)) std::_Exit(90);
    std::_Exit(body(channel_));
  }
}

Tenant::~Tenant() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

int Tenant::Wait() {
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace cxlpool::testsupport
