#include "cxlpool/proto/socket.h"

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; glibc 2.36 headers do not have it yet
#endif

namespace cxlpool::wire {
namespace {

Status MakeAddr(const std::string& path, struct sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (path.empty()) return Status(Code::kInvalidArgument, "empty socket path");
  if (path.size() >= sizeof addr->sun_path) {
    return Status(Code::kInvalidArgument,
                  "socket path '" + path + "' is " + std::to_string(path.size()) +
                      " bytes; the limit is " + std::to_string(sizeof addr->sun_path - 1));
  }
  std::memcpy(addr->sun_path, path.data(), path.size());
  return Status::Ok();
}

// OK if someone accepts connections at `path`; UNAVAILABLE if the socket is
// stale (ECONNREFUSED); other errors as they come.
Status ProbeListener(const struct sockaddr_un& addr, const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::FromErrno(errno, "socket");
  int r;
  do {
    r = ::connect(fd.get(), reinterpret_cast<const struct sockaddr*>(&addr), sizeof addr);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return Status::Ok();
  if (errno == ECONNREFUSED) return Status(Code::kUnavailable, path + ": stale socket");
  return Status::FromErrno(errno, "probe " + path);
}

}  // namespace

Result<UniqueFd> ListenUnix(const ListenOptions& options) {
  const std::string& path = options.path;
  struct sockaddr_un addr;
  CXLPOOL_RETURN_IF_ERROR(MakeAddr(path, &addr));

  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(Code::kAlreadyExists, path + " exists and is not a socket; not removing it");
    }
    Status probe = ProbeListener(addr, path);
    if (probe.ok()) {
      return Status(Code::kAlreadyExists, "another process is listening on " + path);
    }
    if (probe.code() != Code::kUnavailable) return probe;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::FromErrno(errno, "remove stale socket " + path);
    }
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, "stat " + path);
  }

  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Status::FromErrno(errno, "socket");
  // Linux creates the socket file with the socket inode's mode (less the
  // umask), so it is never wider than `mode`, not even for an instant.
  if (::fchmod(fd.get(), options.mode) != 0) return Status::FromErrno(errno, "fchmod socket");
  if (::bind(fd.get(), reinterpret_cast<const struct sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    if (err == EADDRINUSE) return Status(Code::kAlreadyExists, path + " appeared while binding");
    if (err == ENOENT) {
      return Status(Code::kNotFound, "bind " + path + ": parent directory does not exist");
    }
    return Status::FromErrno(err, "bind " + path);
  }
  auto fail = [&](int err, const std::string& what) {
    ::unlink(path.c_str());
    return Status::FromErrno(err, what);
  };
  if (::chmod(path.c_str(), options.mode) != 0) return fail(errno, "chmod " + path);
  if (options.group && ::chown(path.c_str(), static_cast<uid_t>(-1), *options.group) != 0) {
    return fail(errno, "chown " + path + " to gid " + std::to_string(*options.group));
  }
  if (::listen(fd.get(), options.backlog) != 0) return fail(errno, "listen " + path);
  return fd;
}

Status CheckListeningUnixSocket(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) != 0) {
    return Status(Code::kInvalidArgument,
                  "fd " + std::to_string(fd) + " is not a socket: " + std::strerror(errno));
  }
  if (v != AF_UNIX) {
    return Status(Code::kInvalidArgument, "fd " + std::to_string(fd) + " is not an AF_UNIX socket");
  }
  len = sizeof v;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) != 0 || v != SOCK_STREAM) {
    return Status(Code::kInvalidArgument, "fd " + std::to_string(fd) + " is not SOCK_STREAM");
  }
  len = sizeof v;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0 || v == 0) {
    return Status(Code::kInvalidArgument, "fd " + std::to_string(fd) + " is not listening");
  }
  return Status::Ok();
}

Result<UniqueFd> ConnectUnix(const std::string& path) {
  struct sockaddr_un addr;
  CXLPOOL_RETURN_IF_ERROR(MakeAddr(path, &addr));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::FromErrno(errno, "socket");
  int r;
  do {
    r = ::connect(fd.get(), reinterpret_cast<const struct sockaddr*>(&addr), sizeof addr);
  } while (r < 0 && errno == EINTR);
  if (r != 0) {
    int err = errno;
    if (err == ECONNREFUSED || err == EAGAIN) {
      return Status(Code::kUnavailable,
                    "nothing accepts connections on " + path + " (" + std::strerror(err) + ")");
    }
    return Status::FromErrno(err, "connect " + path);
  }
  return fd;
}

Result<PeerCred> GetPeerCred(int sock) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "getsockopt SO_PEERCRED");
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

Result<UniqueFd> GetPeerPidfd(int sock, pid_t pid) {
  int pidfd = -1;
  socklen_t len = sizeof pidfd;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
    return UniqueFd(pidfd);
  }
  int err = errno;
  if (err != ENOPROTOOPT && err != EINVAL && err != EOPNOTSUPP && err != ESRCH) {
    return Status::FromErrno(err, "getsockopt SO_PEERPIDFD");
  }
#ifdef SYS_pidfd_open
  if (pid <= 0) return Status(Code::kNotFound, "peer has no pid in this pid namespace");
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    // pidfd_open fds are CLOEXEC already.
    return UniqueFd(static_cast<int>(fd));
  }
  if (errno == ESRCH)
    return Status(Code::kNotFound, "peer pid " + std::to_string(pid) + " is gone");
  return Status::FromErrno(errno, "pidfd_open");
#else
  (void)pid;
  return Status(Code::kUnsupported, "no SO_PEERPIDFD and no pidfd_open on this system");
#endif
}

}  // namespace cxlpool::wire
