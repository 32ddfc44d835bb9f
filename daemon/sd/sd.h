// Systemd integration through libsystemd: readiness/status/watchdog/stopping
// notifications, the file descriptor store (lease memfds survive a daemon
// restart there), and inherited fds (socket activation, fd-store hand-back).
//
// Outside systemd (no $NOTIFY_SOCKET, no $LISTEN_FDS) every call is a cheap
// no-op that reports so; the daemon works the same, minus the fd store.
//
// Thread safety: Notifier methods may be called from any thread (sd_notify is
// a single sendmsg); TakeListenFds must be called once, early, on one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

class Notifier {
 public:
  // Reads $NOTIFY_SOCKET and $WATCHDOG_USEC (for this pid) once.
  Notifier();

  bool enabled() const { return enabled_; }
  // 0 when no watchdog is configured; else ping at least this often.
  uint64_t watchdog_interval_usec() const { return watchdog_usec_ / 2; }

  Status Ready(const std::string& status);
  Status SetStatus(const std::string& status);
  Status Watchdog();
  Status Stopping(const std::string& status);
  Status Reloading();
  // Pushes fd into the service's fd store under `name` (<= 255 chars of
  // [A-Za-z0-9_.-]). The store keeps its own duplicate.
  Status StoreFd(int fd, const std::string& name);
  // Removes every fd named `name` from the store.
  Status RemoveFd(const std::string& name);

 private:
  Status Send(const std::string& state, const int* fds = nullptr, unsigned nfds = 0);
  bool enabled_ = false;
  uint64_t watchdog_usec_ = 0;
};

struct InheritedFd {
  UniqueFd fd;
  std::string name;  // LISTEN_FDNAMES entry ("cxlpoold.socket", "lease-17", ...)
};

// Takes the fds systemd passed ($LISTEN_FDS, $LISTEN_FDNAMES), marks them
// close-on-exec and unsets the variables. Empty when not started by systemd.
std::vector<InheritedFd> TakeListenFds();

// Is the fd a listening AF_UNIX stream socket?
bool IsListeningUnixSocket(int fd);

}  // namespace cxlpool
