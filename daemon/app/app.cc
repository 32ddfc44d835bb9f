#include "app.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "cxlpool/common/log.h"
#include "daemon.h"

namespace cxlpool {
namespace {

// Background mode (no --foreground, not under systemd): fork; the child
// carries on in a new session with its working directory at / and stdin and
// stdout on /dev/null; the parent exits 0 once the child is serving, 1 if it
// failed to start. The child keeps the launcher's stderr until it is ready, so
// a start-up error still reaches the terminal; FinishDaemonize then moves
// logging to syslog and stderr to /dev/null.
int Daemonize(int* ready_fd) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    ::close(p[1]);
    char c = 0;
    ssize_t n = ::read(p[0], &c, 1);
    std::_Exit(n == 1 && c == 'R' ? 0 : 1);
  }
  ::close(p[0]);
  ::setsid();
  if (::chdir("/") != 0) return -1;
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::close(devnull);
  }
  *ready_fd = p[1];
  return 0;
}

void FinishDaemonize(int ready_fd) {
  LogToSyslog("cxlpoold");
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 2);
    ::close(devnull);
  }
  (void)!::write(ready_fd, "R", 1);
  ::close(ready_fd);
}

}  // namespace

int RunDaemon(const DaemonFlags& flags) {
  ::prctl(PR_SET_DUMPABLE, 0);  // no /proc/<pid>/fd access to lease memfds
  std::signal(SIGPIPE, SIG_IGN);
  int exit_code = 0;
  std::optional<DaemonSettings> settings = LoadDaemonSettings(flags, &exit_code);
  if (!settings) return exit_code;
  int ready_fd = -1;
  if (!settings->flags.foreground && !settings->under_systemd && Daemonize(&ready_fd) != 0) {
    CXLPOOL_LOG(kError) << "background mode: " << std::strerror(errno)
                        << " (--foreground runs without forking)";
    return 1;
  }
  // After the fork: the daemon's threads start here.
  Daemon daemon(std::move(*settings));
  if (int code = daemon.Start(); code != 0) return code;
  if (ready_fd >= 0) FinishDaemonize(ready_fd);
  return daemon.Run();
}

}  // namespace cxlpool
