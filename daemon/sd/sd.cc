#include "sd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace cxlpool {

Notifier::Notifier() {
  const char* ns = std::getenv("NOTIFY_SOCKET");
  enabled_ = ns != nullptr && *ns != '\0';
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0) watchdog_usec_ = usec;
}

Status Notifier::Send(const std::string& state, const int* fds, unsigned nfds) {
  if (!enabled_) return Status(Code::kUnavailable, "not running under systemd notify");
  int r =
      nfds ? sd_pid_notify_with_fds(0, 0, state.c_str(), fds, nfds) : sd_notify(0, state.c_str());
  if (r < 0) return Status::FromErrno(-r, "sd_notify");
  if (r == 0) return Status(Code::kUnavailable, "sd_notify: no NOTIFY_SOCKET");
  return Status::Ok();
}

Status Notifier::Ready(const std::string& status) { return Send("READY=1\nSTATUS=" + status); }
Status Notifier::SetStatus(const std::string& status) { return Send("STATUS=" + status); }
Status Notifier::Watchdog() { return Send("WATCHDOG=1"); }
Status Notifier::Stopping(const std::string& status) {
  return Send("STOPPING=1\nSTATUS=" + status);
}
Status Notifier::Reloading() { return Send("RELOADING=1"); }

namespace {
bool ValidFdName(const std::string& name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}
}  // namespace

Status Notifier::StoreFd(int fd, const std::string& name) {
  if (!ValidFdName(name)) return Status(Code::kInvalidArgument, "bad fd name " + name);
  return Send("FDSTORE=1\nFDNAME=" + name, &fd, 1);
}

Status Notifier::RemoveFd(const std::string& name) {
  if (!ValidFdName(name)) return Status(Code::kInvalidArgument, "bad fd name " + name);
  return Send("FDSTOREREMOVE=1\nFDNAME=" + name);
}

std::vector<InheritedFd> TakeListenFds() {
  std::vector<InheritedFd> out;
  char** names = nullptr;
  int n = sd_listen_fds_with_names(1, &names);
  if (n <= 0) return out;
  for (int i = 0; i < n; ++i) {
    int fd = SD_LISTEN_FDS_START + i;
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    InheritedFd f;
    f.fd.Reset(fd);
    f.name = names && names[i] ? names[i] : "unknown";
    out.push_back(std::move(f));
  }
  if (names) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  return out;
}

bool IsListeningUnixSocket(int fd) { return sd_is_socket(fd, AF_UNIX, SOCK_STREAM, 1) > 0; }

}  // namespace cxlpool
