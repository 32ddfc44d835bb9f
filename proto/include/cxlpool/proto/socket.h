// Unix stream sockets for cxlpool: create a listening socket at a path
// (mode, group, stale-file handling), connect to one, check an inherited
// listening fd (systemd socket activation, tests), and read the peer's
// credentials and pidfd.
//
// Thread safety: free functions; safe from any thread. ListenUnix must not
// race another ListenUnix on the same path.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool::wire {

struct ListenOptions {
  std::string path;
  mode_t mode = 0660;
  std::optional<gid_t> group;  // chown the socket file to this group
  int backlog = 128;
};

// Creates, binds and listens on `path` (CLOEXEC, NONBLOCK). An existing
// socket file is removed only if nothing accepts connections on it.
// INVALID_ARGUMENT: path empty or longer than sun_path. ALREADY_EXISTS:
// another process listens there, or the path exists and is not a socket.
// NOT_FOUND: the parent directory is missing. PERMISSION_DENIED, IO.
Result<UniqueFd> ListenUnix(const ListenOptions& options);

// Checks that `fd` is an AF_UNIX SOCK_STREAM socket in the listening state.
// INVALID_ARGUMENT otherwise (naming what is wrong).
Status CheckListeningUnixSocket(int fd);

// Connects (blocking, CLOEXEC) to `path`. NOT_FOUND (no file),
// UNAVAILABLE (nobody listening), PERMISSION_DENIED, INVALID_ARGUMENT, IO.
Result<UniqueFd> ConnectUnix(const std::string& path);

struct PeerCred {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

// SO_PEERCRED of a connected Unix socket. IO on failure.
Result<PeerCred> GetPeerCred(int sock);

// A pidfd for the peer: SO_PEERPIDFD when the kernel has it (race-free: the
// process that connected), else pidfd_open(pid). UNSUPPORTED when neither
// works (old kernel), NOT_FOUND when the process is already gone.
Result<UniqueFd> GetPeerPidfd(int sock, pid_t pid);

}  // namespace cxlpool::wire
